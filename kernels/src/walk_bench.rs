//! `miner bench`'s memory walk on a device: a pool filled as a challenge's, walked at full speed
//! under version 3 and under version 4 (the same bytes as states, every state in its walker's
//! tree, timed to the walk root), against the device's own copy bandwidth; and small walks on
//! the device and on the CPU, compared state by state (version 3's over two launches, so that
//! a walk carried across launches is checked too; version 4's by its self-check); and the
//! locality walk's time a step over the same bytes, with its self-check.

use super::device::DeviceRuntime;
use super::pool::CudaPool;
use super::states::{StateWalkLimits, StatesOnDevice};
use super::walk::DeviceWalker;
use super::words::key_words;
use cudarc::driver::CudaSlice;
use gpu_attest_shared::backend::{BackendError, CancelToken};
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::memory::chain_pool::{ChainPool, MAX_WALK_STEPS};
use gpu_attest_shared::memory::locality::LocalityWalk;
use gpu_attest_shared::memory::pool::PoolBytes;
use gpu_attest_shared::memory::slice_walk::SliceWalk;
use gpu_attest_shared::memory::walk::{WalkSpec, walk_all};
use gpu_attest_shared::memory::{ENTRY_BYTES, MemoryParams, PoolSpec};
use std::time::Duration;

/// The walk on one device, as `miner bench` reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WalkBench {
    pub device: u32,
    pub name: String,
    /// The pool walked: the bytes asked for, or less when the device has less free.
    pub pool_bytes: u64,
    pub walkers: u32,
    /// Steps per walker in one timed launch.
    pub steps: u32,
    /// Seconds per launch.
    pub seconds: f64,
    /// `walkers * steps * 65536` bytes over `seconds`.
    pub walk_bytes_per_sec: f64,
    /// A device-to-device copy, counting the bytes read and those written.
    pub copy_bytes_per_sec: f64,
    pub walk_share_of_copy: f64,
    /// Whether a small walk on the device gave the CPU walk's checkpoints, every one.
    pub matches_cpu: bool,
    /// The pool's fill: its entries made as a challenge's are (chains of n = 256, hashed).
    pub fill_seconds: f64,
    pub fill_entries_per_sec: f64,
    /// The fill's int8 rate, `P * 2 * 256^3 * 64` operations over its seconds: the validator's
    /// fill budget (PROTOCOL.md 18.6, step 5) assumes it is at least the class's rate over the
    /// kernel's fill weight (a quarter on wgmma).
    pub fill_tops: f64,
    /// Version 4's walk (PROTOCOL.md 20.4) over the same bytes as states of 64 KiB, every state
    /// folded into its walker's tree on the device, timed to the walk root as an attested
    /// walk is (the kept traces come back after): what an attested version 4 walk on this
    /// device is compared with. The best of two walks, each sized to take the budget at
    /// version 3's rate. 0 where it did not run (`walk_v4_error`).
    pub walk_v4_bytes_per_sec: f64,
    pub walk_v4_steps: u32,
    /// Against version 3's walk above: what the trees cost.
    pub walk_v4_share_of_walk: f64,
    /// Whether version 4's walk and openings on the device gave the CPU's, every one
    /// (`DeviceRuntime::v4_walk_matches_cpu`).
    pub v4_matches_cpu: bool,
    /// Why version 4's walk did not run, where it did not; version 3's figures stand.
    pub walk_v4_error: Option<String>,
    /// Whether the locality walk and its openings on the device gave the CPU's
    /// (`DeviceRuntime::check_locality`).
    pub locality_matches_cpu: bool,
    /// The locality walk over the same bytes as states (PROTOCOL.md 20.10), timed as a
    /// validator times it, to the last generation's digest back on the host, over its `G * C`
    /// steps: with one walker (a memory latency and the step's instructions a step), with one
    /// walker an SM (the walk a validator asks of this device: its `gpu_step_ns` figure), and
    /// with [`LOCALITY_LOADED_WALKERS`] side by side (whether the latency holds under load). 0
    /// where it did not run (`locality_error`).
    pub locality_step_ns: f64,
    pub locality_per_sm_step_ns: f64,
    pub locality_loaded_step_ns: f64,
    /// One walker an SM again, in generations of [`LOCALITY_LONG_STEPS`]: with
    /// `locality_per_sm_step_ns` it splits a step's time into what every step costs and what each
    /// generation adds once (its slowest walker, its digest and push, the next starts, three
    /// launches; [`LocalitySplit`]).
    pub locality_long_generation_step_ns: f64,
    pub locality_error: Option<String>,
}

/// A time a step, `T(C) = step + generation / C`, split from two walks of `C` = `short` and
/// `long` steps a generation at `t_short` and `t_long` ns a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalitySplit {
    /// What every step costs, ns.
    pub step_ns: f64,
    /// What each generation adds once, us.
    pub generation_us: f64,
}

impl LocalitySplit {
    /// The split, where the longer generations are clearly cheaper a step: by more than
    /// [`SEPARABLE_SHARE`] of the shorter's time, which the best of two short walks resolves.
    /// `None` where they are not (the generation's cost is then within the walks' noise, and a
    /// split would print noise as a figure) or where `long` is not longer.
    pub fn of(short: u32, t_short: f64, long: u32, t_long: f64) -> Option<LocalitySplit> {
        // False for NaN timings too.
        let separable = t_short - t_long > SEPARABLE_SHARE * t_short;
        if long <= short || !separable {
            return None;
        }
        let generation_ns = (t_short - t_long) / (1.0 / f64::from(short) - 1.0 / f64::from(long));
        Some(LocalitySplit {
            step_ns: t_long - generation_ns / f64::from(long),
            generation_us: generation_ns / 1e3,
        })
    }
}

/// How much cheaper a step the longer generations must be for [`LocalitySplit::of`] to split
/// them: a few times the spread of the bench's best-of-two walks.
const SEPARABLE_SHARE: f64 = 0.03;

impl WalkBench {
    /// The locality walk's step split into what each step and each generation cost, where both
    /// timings ran and differ by more than their noise.
    pub fn locality_split(&self) -> Option<LocalitySplit> {
        if self.locality_per_sm_step_ns <= 0.0 || self.locality_long_generation_step_ns <= 0.0 {
            return None;
        }
        LocalitySplit::of(
            LOCALITY_BENCH_STEPS,
            self.locality_per_sm_step_ns,
            LOCALITY_LONG_STEPS,
            self.locality_long_generation_step_ns,
        )
    }
}

/// Walkers of the locality walk's loaded timing: a few warps an SM on the largest GPUs.
pub const LOCALITY_LOADED_WALKERS: u32 = 1024;
/// Steps a locality walker takes in one generation in the bench: the validator's default `C`.
pub const LOCALITY_BENCH_STEPS: u32 = 256;
/// The longer generation the bench also times, the most a walk may ask (PROTOCOL.md 20.10).
pub const LOCALITY_LONG_STEPS: u32 = 1024;

/// Most steps a timed launch takes: a launch stays well under a second on the largest GPUs
/// (8192 walkers x 4096 steps x 64 KiB is 2.2 TB, 0.7 s at 3.35 TB/s), short of a display
/// GPU's watchdog.
const MAX_STEPS_PER_LAUNCH: u32 = 4096;
/// Steps between checkpoints in the bench, as the validator's default `c_w`.
const BENCH_EVERY: u32 = 8;
/// The fill's batch buffers at n = 256: 4096 chains of three 64 KiB matrices and their hashing.
const FILL_BUFFER_BYTES: u64 = 1 << 30;
/// The smallest pool and copy buffers the bench uses, past any GPU's L2 (50 MB on an H100):
/// smaller ones would measure the cache.
const MIN_BENCH_BYTES: u64 = 1 << 30;

/// Measures the walk on `rt`'s device: a pool of `pool_bytes` (at least 1 GiB, at most what is
/// free beside the bench's own buffers), filled and timed as a challenge's, `walkers` walkers,
/// timed over about `budget`, and the exactness check.
pub fn bench_walk(
    rt: &DeviceRuntime,
    pool_bytes: u64,
    walkers: u32,
    budget: Duration,
) -> Result<WalkBench, BackendError> {
    let walker = rt.walker()?;
    let matches_cpu = matches_cpu(rt, &walker)?;
    // Beside the pool: the states and the largest checkpoint buffer a launch takes, a tenth of
    // what is free for the runtime, and the fill's reserve and batch buffers.
    let checkpoint_words = walkers as usize * (MAX_STEPS_PER_LAUNCH / BENCH_EVERY) as usize * 8;
    let own = (checkpoint_words + walkers as usize * 8) as u64 * 4;
    let entries = pool_entries(rt, pool_bytes, own)?;
    let mut states = rt.alloc_words(walkers as usize * 8)?;
    let mut checkpoints = rt.alloc_words(checkpoint_words)?;
    let (pool_spec, filled, fill_seconds) = filled_pool(rt, entries)?;
    let pool = filled.device_entries();
    let len = pool.len();
    let spec = bench_spec(rt.index, entries, walkers);
    let starts: Vec<u32> = (0..walkers).flat_map(|w| key_words(&spec.start_state(w).0)).collect();
    rt.stream.memcpy_htod(&starts, &mut states).map_err(|e| rt.err(e))?;
    // `time_launches` queues 16 launches between looks at the clock, so a launch is sized for
    // a sixteenth of the budget, from a short first run.
    let mut time = |steps: u32| {
        super::timing::time_launches(rt, budget, |launch| {
            walker.launch(
                &rt.stream,
                pool,
                entries,
                &mut states,
                launch * steps,
                steps,
                BENCH_EVERY,
                &mut checkpoints.as_view_mut(),
                walkers,
                3,
            )
        })
    };
    let first = time(64)?;
    let steps = ((budget.as_secs_f64() / 16.0 / first * 64.0) as u32).clamp(64, MAX_STEPS_PER_LAUNCH) / BENCH_EVERY
        * BENCH_EVERY;
    let seconds = time(steps)?;
    let walk_bytes_per_sec = f64::from(walkers) * f64::from(steps) * ENTRY_BYTES as f64 / seconds;

    // Version 4's walk over the same bytes, as states at n = 256 (one slice each), timed to its
    // root; an error leaves version 3's figures standing.
    let (v4_matches_cpu, walk_v4_steps, walk_v4_bytes_per_sec, walk_v4_error) =
        match bench_walk_v4(rt, &walker, pool, entries, walkers, walk_bytes_per_sec, budget) {
            Ok((matches, steps, rate)) => (matches, steps, rate, None),
            Err(e) => (false, 0, 0.0, Some(e.to_string())),
        };

    // The locality walk over the same bytes; an error leaves the other figures standing.
    let (
        locality_matches_cpu,
        [
            locality_step_ns,
            locality_per_sm_step_ns,
            locality_loaded_step_ns,
            locality_long_generation_step_ns,
        ],
        locality_error,
    ) = match bench_locality(rt, &walker, pool, entries) {
        Ok((matches, steps)) => (matches, steps, None),
        Err(e) => (false, [0.0; 4], Some(e.to_string())),
    };

    drop(filled);
    let copy_bytes_per_sec = copy_rate(rt, len, budget)?;
    Ok(WalkBench {
        device: rt.index,
        name: rt.gpu.name.clone(),
        pool_bytes: len as u64,
        walkers,
        steps,
        seconds,
        walk_bytes_per_sec,
        copy_bytes_per_sec,
        walk_share_of_copy: walk_bytes_per_sec / copy_bytes_per_sec,
        matches_cpu,
        fill_seconds,
        fill_entries_per_sec: entries as f64 / fill_seconds,
        fill_tops: pool_spec.fill_ops() as f64 / fill_seconds / 1e12,
        walk_v4_bytes_per_sec,
        walk_v4_steps,
        walk_v4_share_of_walk: walk_v4_bytes_per_sec / walk_bytes_per_sec,
        v4_matches_cpu,
        walk_v4_error,
        locality_matches_cpu,
        locality_step_ns,
        locality_per_sm_step_ns,
        locality_loaded_step_ns,
        locality_long_generation_step_ns,
        locality_error,
    })
}

/// `miner bench`'s locality walk on `rt`'s device over `pool`'s `entries` slices as states at
/// n = 256 (see [`WalkBench::locality_step_ns`]): whether it matches the CPU's, and the best of
/// two walks' time a step with one walker, one an SM and [`LOCALITY_LOADED_WALKERS`], and one an
/// SM in generations of [`LOCALITY_LONG_STEPS`].
fn bench_locality(
    rt: &DeviceRuntime,
    walker: &DeviceWalker,
    pool: &CudaSlice<i8>,
    entries: u64,
) -> Result<(bool, [f64; 4]), BackendError> {
    let matches_cpu = rt.check_locality().is_ok();
    let on_device = bench_states(rt, walker, pool, entries);
    let step_ns = |walkers: u32, generations: u32, steps: u32| -> Result<f64, BackendError> {
        let walk = LocalityWalk {
            nonce: [7; 32],
            seed: [8; 32],
            global: Digest::default(),
            walkers,
            generations,
            steps,
        };
        let mut best = f64::MAX;
        for _ in 0..2 {
            let started = std::time::Instant::now();
            on_device.walk_lines(&walk, &CancelToken::new())?;
            best = best.min(started.elapsed().as_secs_f64());
        }
        Ok(best * 1e9 / (f64::from(generations) * f64::from(steps)))
    };
    // About 0.1 s each at a microsecond a step.
    let per_sm = rt
        .gpu
        .sm_count
        .clamp(1, gpu_attest_shared::memory::locality::MAX_WALKERS);
    Ok((
        matches_cpu,
        [
            step_ns(1, 400, LOCALITY_BENCH_STEPS)?,
            step_ns(per_sm, 400, LOCALITY_BENCH_STEPS)?,
            step_ns(LOCALITY_LOADED_WALKERS, 400, LOCALITY_BENCH_STEPS)?,
            // The same steps as the walk at C = 256, in a quarter of the generations: only a
            // split of the figure above, so its failure (0, and no split shown) leaves the rest.
            step_ns(per_sm, 100, LOCALITY_LONG_STEPS).unwrap_or(0.0),
        ],
    ))
}

/// A real pool of `entries`, filled as a challenge's is (its fill is the memory phase's
/// compute), and the seconds the fill took.
fn filled_pool(rt: &DeviceRuntime, entries: u64) -> Result<(PoolSpec, CudaPool, f64), BackendError> {
    let work = gpu_attest_shared::params::Work::new(gpu_attest_shared::vectors::vector_params()).map_err(|e| {
        BackendError::Device {
            device: rt.index,
            detail: e.to_string(),
        }
    })?;
    let pool_spec = PoolSpec::with_entries(&work, rt.index, entries);
    let started = std::time::Instant::now();
    let filled = rt.fill_pool(&pool_spec, &|_| {}, &CancelToken::new())?;
    Ok((pool_spec, filled, started.elapsed().as_secs_f64()))
}

/// The pool's entries: `pool_bytes` (at least [`MIN_BENCH_BYTES`]) where it fits beside the
/// bench's `own` buffers, a tenth of what is free for the runtime, and the fill's reserve and
/// batch buffers.
fn pool_entries(rt: &DeviceRuntime, pool_bytes: u64, own: u64) -> Result<u64, BackendError> {
    let free = rt.free_memory()?;
    let room = (free / 10 * 9)
        .min(free.saturating_sub(super::plan::RESERVE_BYTES + FILL_BUFFER_BYTES))
        .saturating_sub(own);
    Ok((pool_bytes.max(MIN_BENCH_BYTES).min(room) / ENTRY_BYTES as u64).max(1))
}

/// The bench's walk: every walker from a start of its own (walkers that share a state share
/// every entry, and would be served by the cache), checkpoints as the validator's default.
fn bench_spec(device: u32, entries: u64, walkers: u32) -> WalkSpec {
    WalkSpec {
        nonce: [3; 32],
        walk_seed: [4; 32],
        device,
        pool_root: Digest::default(),
        entries,
        params: MemoryParams {
            pool_permille: 1000,
            walkers,
            walk_steps: BENCH_EVERY,
            walk_checkpoint_every: BENCH_EVERY,
        },
    }
}

/// Copy bandwidth, device to device: two buffers of 1 to 2 GiB in the pool's place (`len`
/// bytes, freed before this).
fn copy_rate(rt: &DeviceRuntime, len: usize, budget: Duration) -> Result<f64, BackendError> {
    let half = (len / 2).clamp(MIN_BENCH_BYTES as usize, 2 << 30);
    let (mut from, mut to) = (rt.alloc(half)?, rt.alloc(half)?);
    rt.stream.memset_zeros(&mut from).map_err(|e| rt.err(e))?;
    let copy_seconds = super::timing::time_launches(rt, budget, |_| {
        rt.stream.memcpy_dtod(&from, &mut to).map_err(|e| rt.err(e))
    })?;
    Ok(2.0 * half as f64 / copy_seconds)
}

/// `miner bench`'s version 4 walk on `rt`'s device over `pool`'s `entries` slices (see
/// [`WalkBench::walk_v4_bytes_per_sec`]): whether the device's version 4 walk matches the
/// CPU's, the steps a walker took, and the best rate of two walks.
fn bench_walk_v4(
    rt: &DeviceRuntime,
    walker: &DeviceWalker,
    pool: &CudaSlice<i8>,
    entries: u64,
    walkers: u32,
    v3_bytes_per_sec: f64,
    budget: Duration,
) -> Result<(bool, u32, f64), BackendError> {
    let v4_matches_cpu = rt.v4_walk_matches_cpu()?;
    let on_device = bench_states(rt, walker, pool, entries);
    let walk_v4_steps = (v3_bytes_per_sec * budget.as_secs_f64() / (f64::from(walkers) * ENTRY_BYTES as f64))
        .clamp(64.0, f64::from(MAX_WALK_STEPS)) as u32;
    let v4_walk = SliceWalk {
        nonce: [5; 32],
        walk_seed: [6; 32],
        global: Digest::default(),
        walkers,
        steps: walk_v4_steps,
    };
    let mut walk_v4_bytes_per_sec: f64 = 0.0;
    for _ in 0..2 {
        let started = std::time::Instant::now();
        let to_root = std::sync::Mutex::new(None);
        on_device.walk(&v4_walk, &CancelToken::new(), &|_| {
            *to_root.lock().unwrap_or_else(|p| p.into_inner()) = Some(started.elapsed())
        })?;
        let to_root = to_root.into_inner().unwrap_or_else(|p| p.into_inner());
        let seconds = to_root.unwrap_or_else(|| started.elapsed()).as_secs_f64();
        walk_v4_bytes_per_sec = walk_v4_bytes_per_sec.max(v4_walk_bytes(&v4_walk) / seconds);
    }
    Ok((v4_matches_cpu, walk_v4_steps, walk_v4_bytes_per_sec))
}

/// The bytes a version 4 walk reads: `W * L` slices.
fn v4_walk_bytes(walk: &SliceWalk) -> f64 {
    f64::from(walk.walkers) * f64::from(walk.steps) * ENTRY_BYTES as f64
}

/// A walk of 300 walkers over 37 entries, 16 steps in two launches of 8 with a checkpoint every
/// 4, on the device and on the CPU: every checkpoint must agree.
fn matches_cpu(rt: &DeviceRuntime, walker: &DeviceWalker) -> Result<bool, BackendError> {
    const ENTRIES: usize = 37;
    const WALKERS: u32 = 300;
    let params = MemoryParams {
        pool_permille: 1000,
        walkers: WALKERS,
        walk_steps: 16,
        walk_checkpoint_every: 4,
    };
    let host = PoolBytes::keystream(&[7; 32], ENTRIES).ok_or(BackendError::OutOfMemory {
        device: rt.index,
        detail: "no host memory for 37 entries".into(),
    })?;
    let spec = WalkSpec {
        nonce: [1; 32],
        walk_seed: [2; 32],
        device: rt.index,
        pool_root: Digest::default(),
        entries: ENTRIES as u64,
        params,
    };
    let cpu = walk_all(&host, &spec, &CancelToken::new())?;

    let mut pool = rt.alloc(ENTRIES * ENTRY_BYTES)?;
    rt.upload(bytemuck::cast_slice(host.as_bytes()), &mut pool)?;
    let starts: Vec<u32> = (0..WALKERS).flat_map(|w| key_words(&spec.start_state(w).0)).collect();
    let mut states = rt.alloc_words(starts.len())?;
    rt.stream.memcpy_htod(&starts, &mut states).map_err(|e| rt.err(e))?;
    let per_launch = 2; // 8 steps, a checkpoint every 4
    let mut device_checkpoints = Vec::new();
    for launch in 0..2 {
        let mut checkpoints = rt.alloc_words(WALKERS as usize * per_launch * 8)?;
        walker.launch(
            &rt.stream,
            &pool,
            ENTRIES as u64,
            &mut states,
            launch * 8,
            8,
            4,
            &mut checkpoints.as_view_mut(),
            WALKERS,
            3,
        )?;
        let mut host_words = vec![0u32; checkpoints.len()];
        rt.stream
            .memcpy_dtoh(&checkpoints, &mut host_words)
            .map_err(|e| rt.err(e))?;
        rt.synchronize()?;
        device_checkpoints.push(host_words);
    }
    Ok((0..WALKERS as usize).all(|w| {
        let trace = &cpu.traces[w].checkpoints;
        (0..4).all(|q| {
            let launch = &device_checkpoints[q / per_launch];
            let at = (w * per_launch + q % per_launch) * 8;
            launch[at..at + 8] == key_words(&trace[q + 1].0)
        })
    }))
}

/// The bench's filled pool as `entries` states of n = 256 (one slice each), for the walks of
/// version 4 that read it so.
fn bench_states<'a>(
    rt: &'a DeviceRuntime,
    walker: &'a DeviceWalker,
    pool: &'a CudaSlice<i8>,
    entries: u64,
) -> StatesOnDevice<'a> {
    StatesOnDevice {
        stream: &rt.stream,
        walker,
        states: pool,
        pool: ChainPool {
            device: rt.index,
            first_chain: 0,
            chains: entries,
            n: 256,
        },
        limits: StateWalkLimits::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::LocalitySplit;

    /// Two walks of the same steps in generations of 256 and 1024 give back the step's own time
    /// and the generation's (here 721 ns and 105 us, the H200's probe and its gap).
    #[test]
    fn a_step_splits_into_what_each_step_and_each_generation_cost() {
        let time = |c: f64| 721.0 + 105_000.0 / c;
        let split = LocalitySplit::of(256, time(256.0), 1024, time(1024.0)).unwrap();
        assert!((split.step_ns - 721.0).abs() < 1e-6, "{split:?}");
        assert!((split.generation_us - 105.0).abs() < 1e-9, "{split:?}");
        // Timings within their noise, the wrong way round, or generations no longer: no split.
        assert_eq!(LocalitySplit::of(256, 1000.0, 1024, 990.0), None);
        assert_eq!(LocalitySplit::of(256, 1000.0, 1024, 1010.0), None);
        assert_eq!(LocalitySplit::of(256, 1000.0, 256, 500.0), None);
        assert_eq!(LocalitySplit::of(256, f64::NAN, 1024, 500.0), None);
    }
}
