//! Timing launches on one device with CUDA events (or the host clock where the driver cannot
//! time events under cudarc's bindings): what `miner bench` and the walk bench measure with.

use super::device::DeviceRuntime;
use super::driver;
use gpu_attest_shared::backend::BackendError;
use std::time::{Duration, Instant};

/// Flags for the events that time launches. cudarc's `new_event(None)` means
/// `CU_EVENT_DISABLE_TIMING`, and `elapsed_ms` between such events fails with an invalid-handle
/// error: the first row of every GPU bench did, before this was spelled out.
const TIMING_EVENT: cudarc::driver::sys::CUevent_flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;

/// Seconds per launch of `run`, timed with events over at least `budget` after a warm-up. On a
/// driver without event timing under cudarc's bindings (before CUDA 12.8, see
/// [`driver::EVENT_TIMING_SYMBOL`]) the host clock times the same launches between two
/// synchronisations instead: over a second or more of work the difference is the launch latency
/// of one synchronisation.
pub(crate) fn time_launches(
    rt: &DeviceRuntime,
    budget: Duration,
    mut run: impl FnMut(u32) -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    for step in 0..3 {
        run(step)?;
    }
    rt.synchronize()?;
    let events = if driver::exports(driver::EVENT_TIMING_SYMBOL) {
        let start = rt.ctx.new_event(Some(TIMING_EVENT)).map_err(|e| rt.err(e))?;
        let end = rt.ctx.new_event(Some(TIMING_EVENT)).map_err(|e| rt.err(e))?;
        start.record(&rt.stream).map_err(|e| rt.err(e))?;
        Some((start, end))
    } else {
        None
    };
    let wall = Instant::now();
    let mut launches = 0u32;
    while launches < 5 || (wall.elapsed() < budget && launches < 2000) {
        run(launches)?;
        launches += 1;
        if launches.is_multiple_of(16) {
            rt.synchronize()?;
        }
    }
    let seconds = match events {
        Some((start, end)) => {
            end.record(&rt.stream).map_err(|e| rt.err(e))?;
            end.synchronize().map_err(|e| rt.err(e))?;
            f64::from(start.elapsed_ms(&end).map_err(|e| rt.err(e))?) / 1e3
        }
        None => {
            rt.synchronize()?;
            wall.elapsed().as_secs_f64()
        }
    };
    Ok(seconds / f64::from(launches))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUevent_flags;

    #[test]
    fn timing_events_keep_timing_enabled() {
        assert_eq!(TIMING_EVENT as u32 & CUevent_flags::CU_EVENT_DISABLE_TIMING as u32, 0);
    }
}
