//! What runs on the miner right now: the devices' lock, the count of challenges and opening
//! rounds in flight, and whether the miner is stopping.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;
use tokio::sync::OwnedMutexGuard;

#[derive(Default)]
pub struct Running {
    devices: Arc<tokio::sync::Mutex<()>>,
    /// Challenges and opening rounds running, whether or not they hold the devices right now.
    working: Arc<AtomicUsize>,
    /// Set once the miner is stopping: new challenges are refused while the one in flight
    /// finishes and is opened ([`super::MinerCore::settle`]).
    stopping: AtomicBool,
}

impl Running {
    /// Counts a challenge or an opening round as running until the guard drops: what stopping
    /// waits for.
    pub fn started(&self) -> WorkRunning {
        self.working.fetch_add(1, Ordering::SeqCst);
        WorkRunning(self.working.clone())
    }

    /// Ends work counted by `running` and, once no other challenge or round runs, hands the
    /// memory it freed back to the system ([`gpu_attest_daemon::allocator::release_free_memory`]).
    /// Only for work an allowed validator asked for: a refused request just drops its guard, so
    /// a stranger's requests cannot make the miner walk its arenas again and again.
    ///
    /// Why: a round frees its matrices and messages below blocks that outlive it (the kept
    /// commitment, the next connection's buffers), where the allocator cannot give them back,
    /// and the hour-long soak (BENCHMARKS.md) saw honest miners' resident memory creep up by
    /// such blocks for the whole hour.
    pub fn ended(&self, running: WorkRunning) {
        drop(running);
        if self.is_idle() {
            let started = Instant::now();
            let released = gpu_attest_daemon::allocator::release_free_memory();
            tracing::debug!(
                released,
                micros = started.elapsed().as_micros() as u64,
                "idle: free memory handed back to the system"
            );
        }
    }

    /// Whether no challenge or opening round runs.
    pub fn is_idle(&self) -> bool {
        self.working.load(Ordering::SeqCst) == 0
    }

    /// Waits for the devices (openings queue behind a running challenge instead of failing).
    pub async fn lock_devices(&self) -> OwnedMutexGuard<()> {
        self.devices.clone().lock_owned().await
    }

    /// The devices, if nothing holds them now.
    pub(super) fn try_lock_devices(&self) -> Option<OwnedMutexGuard<()>> {
        self.devices.clone().try_lock_owned().ok()
    }

    pub(super) fn stop_taking_challenges(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub(super) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// A challenge or opening round running on a miner ([`Running::started`]).
pub struct WorkRunning(Arc<AtomicUsize>);

impl Drop for WorkRunning {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
