//! Devices out of service: how both daemons notice one and stop.
//!
//! A CUDA fault is sticky for the whole process: on an H100 (driver 580) an illegal-address
//! fault left every later context of the process on that device failing with the same error, a
//! reset primary context and a fresh non-primary one alike, as the CUDA documentation warns. A
//! daemon whose device went out of service therefore stops serving and exits with
//! [`EXIT_DEVICE_FAULT`], and its supervisor (the systemd units' `Restart=on-failure`) starts a
//! fresh process, which gets the device back.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The exit status of a daemon stopped by a device fault (EX_TEMPFAIL): a restart is expected
/// to fix it.
pub const EXIT_DEVICE_FAULT: u8 = 75;

/// How often a serving daemon asks its backend for devices out of service.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// Rung by whatever finds a device out of service while the daemon serves (a challenge refused
/// for it), so that the watcher asks the backend at once instead of at its next tick. A ring
/// before the watcher waits is kept for it.
#[derive(Clone, Debug, Default)]
pub struct DeviceAlarm(Arc<Notify>);

impl DeviceAlarm {
    pub fn ring(&self) {
        self.0.notify_one();
    }
}

/// Resolves, with each device and its reason, once `probe` (the backend's `out_of_service`)
/// reports any; asks every `interval`, the first time at once, and whenever `alarm` rings.
pub async fn out_of_service(
    probe: impl Fn() -> Vec<(u32, String)>,
    interval: Duration,
    alarm: &DeviceAlarm,
) -> Vec<(u32, String)> {
    let mut ticks = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = alarm.0.notified() => {}
        }
        let devices = probe();
        if !devices.is_empty() {
            return devices;
        }
    }
}

/// Completes when `shutdown` does or, first, when `probe` (the backend's `out_of_service`),
/// asked every `interval` and whenever `alarm` rings, reports a device: then it logs each
/// device, sets service `S` NOT_SERVING and completes, so that, given to the server as its
/// shutdown, it stops the server. `daemon` names the daemon in the log line. The caller tells
/// the two endings apart by asking the backend again.
pub async fn shutdown_or_device_lost<S: tonic::server::NamedService>(
    shutdown: impl Future<Output = ()>,
    probe: impl Fn() -> Vec<(u32, String)>,
    (interval, alarm): (Duration, DeviceAlarm),
    health: tonic_health::server::HealthReporter,
    daemon: &'static str,
) {
    tokio::select! {
        () = shutdown => {}
        lost = out_of_service(probe, interval, &alarm) => {
            for (device, reason) in lost {
                tracing::error!(device, %reason, "device out of service: the {daemon} stops so that a fresh process can use it");
            }
            health.set_not_serving::<S>().await;
            // And the server as a whole (service ""), which a probe asks unless told a service
            // name (a Kubernetes gRPC probe, by default).
            health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
        }
    }
}

/// "device 0 is out of service (reason); device 2 is ...", for errors and logs.
pub fn describe(devices: &[(u32, String)]) -> String {
    devices
        .iter()
        .map(|(device, reason)| format!("device {device} is out of service ({reason})"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn resolves_once_the_backend_reports_a_device() {
        let asked = AtomicU32::new(0);
        let probe = || {
            if asked.fetch_add(1, Ordering::SeqCst) < 3 {
                Vec::new()
            } else {
                vec![(1, "CUDA_ERROR_ILLEGAL_ADDRESS".to_string())]
            }
        };
        let devices = out_of_service(probe, Duration::from_millis(1), &DeviceAlarm::default()).await;
        assert_eq!(devices, [(1, "CUDA_ERROR_ILLEGAL_ADDRESS".to_string())]);
        assert_eq!(asked.load(Ordering::SeqCst), 4);
        assert_eq!(
            describe(&devices),
            "device 1 is out of service (CUDA_ERROR_ILLEGAL_ADDRESS)"
        );
    }

    #[tokio::test]
    async fn waits_while_every_device_serves() {
        let waited = tokio::time::timeout(
            Duration::from_millis(50),
            out_of_service(Vec::new, Duration::from_millis(1), &DeviceAlarm::default()),
        )
        .await;
        assert!(waited.is_err(), "resolved with no device out of service");
    }

    /// A ring makes the watcher ask at once, long before its next tick; one rung before the
    /// watcher waits is not lost.
    #[tokio::test]
    async fn an_alarm_makes_the_watcher_ask_at_once() {
        let broken = std::sync::atomic::AtomicBool::new(false);
        let probe = || {
            if broken.load(Ordering::SeqCst) {
                vec![(0, "CUDA_ERROR_ILLEGAL_ADDRESS".to_string())]
            } else {
                Vec::new()
            }
        };
        let alarm = DeviceAlarm::default();
        let hour = Duration::from_secs(3600);
        let watcher = out_of_service(probe, hour, &alarm);
        tokio::pin!(watcher);
        // The first tick asks at once and finds every device serving.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut watcher)
                .await
                .is_err()
        );
        broken.store(true, Ordering::SeqCst);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut watcher)
                .await
                .is_err(),
            "asked before its tick without being rung"
        );
        alarm.ring();
        let devices = tokio::time::timeout(Duration::from_secs(5), &mut watcher)
            .await
            .expect("the ring is heard before the hour's tick");
        assert_eq!(devices.len(), 1);
    }
}
