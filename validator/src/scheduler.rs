//! Attests every registered miner on an interval until shutdown, at scale:
//!
//! - **Bounded concurrency**: at most `concurrency` attestations run at once.
//! - **Jitter**: a miner's first attestation falls at a random point of the first interval, and
//!   each later one `interval` ± `jitter` after the last, so miners registered together are not
//!   challenged together, and do not drift back into step.
//! - **Backoff**: a miner that could not be attested (unreachable, refusing, not a miner) is
//!   tried again after `backoff_initial`, doubling on each failure in a row up to
//!   `backoff_max`. A verdict, passing or failing, is not a failure of the schedule: a miner that
//!   fails its attestation is attested again on the normal interval (unreachable is not the
//!   same as cheating).
//!
//! The runner is generic over the attestation and the list of miners, so its timing is tested
//! on tokio's paused clock.

use crate::attest::{AttestEvent, Attestor};
use crate::config::ScheduleConfig;
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{info, warn};

/// How the scheduler paces attestations.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub interval: Duration,
    pub concurrency: usize,
    /// Fraction of the interval (and of a backoff delay) each wait is randomly moved by, 0..1.
    pub jitter: f64,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long a lease on a miner lasts without renewal.
    pub lease: Duration,
}

impl Schedule {
    pub fn from_config(config: &ScheduleConfig) -> Self {
        Schedule {
            interval: Duration::from_secs(config.interval_secs.max(1)),
            concurrency: config.concurrency.max(1),
            jitter: config.jitter.clamp(0.0, 0.99),
            backoff_initial: Duration::from_secs(config.backoff_initial_secs.max(1)),
            backoff_max: Duration::from_secs(config.backoff_max_secs.max(config.backoff_initial_secs).max(1)),
            lease: Duration::from_secs(config.lease_secs.max(3)),
        }
    }

    /// When a newly seen miner is first attested: at `unit` (0..1) of the first interval.
    pub fn first_delay(&self, unit: f64) -> Duration {
        self.interval.mul_f64(unit.clamp(0.0, 1.0))
    }

    /// How long after an attempt the next one is due, `errors` being the failures in a row so
    /// far (0 after a verdict), `unit` (0..1) the random draw for the jitter.
    pub fn next_delay(&self, errors: u32, unit: f64) -> Duration {
        let base = if errors == 0 {
            self.interval
        } else {
            let doubled = self
                .backoff_initial
                .saturating_mul(1u32.checked_shl(errors - 1).unwrap_or(u32::MAX));
            doubled.min(self.backoff_max)
        };
        base.mul_f64(1.0 - self.jitter + 2.0 * self.jitter * unit.clamp(0.0, 1.0))
    }
}

/// What one scheduled attestation came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// A verdict was stored, passing or failing.
    Verdict,
    /// No verdict: the miner could not be attested this time.
    Error,
    /// Another validator holds the miner, or attested it recently: look again after this.
    Held(Duration),
}

/// One miner's place in the schedule.
struct Slot {
    due: Instant,
    /// Failures in a row.
    errors: u32,
}

/// The scheduler's state, reported after every change (for metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerState {
    /// Miners due and waiting for a free slot.
    pub queued: usize,
    /// Miners whose latest attempt could not attest them.
    pub in_backoff: usize,
    /// Attestations running now.
    pub running: usize,
}

/// How often the list of registered miners is read again (or every interval, if shorter), so a
/// new registration is picked up soon.
const REFRESH: Duration = Duration::from_secs(5);

/// How long attestations in flight at shutdown may go on to their verdicts before they are
/// dropped: inside the validator unit's `TimeoutStopSec=60`, with room for giving back the
/// leases and closing the store (a PostgreSQL connection may take up to 10 s).
/// A CPU host's attestation takes seconds; one that needs longer is cut short (its lease given
/// back, the miner due again at once) rather than killed with the process.
pub const STOP_DRAIN: Duration = Duration::from_secs(40);

/// Runs `attest` for every miner `miners()` lists, paced by `schedule`, until `shutdown` turns
/// true. Then no attestation starts; those running have [`STOP_DRAIN`] to reach and store
/// their verdicts (a second interrupt stops them at once), and what is left is dropped (its
/// challenge cancelled).
pub async fn run_with<M, MF, A, F, R>(
    schedule: Schedule,
    miners: M,
    attest: A,
    report: R,
    rng: ChaCha8Rng,
    mut shutdown: watch::Receiver<bool>,
) where
    M: Fn() -> MF,
    MF: Future<Output = Result<Vec<String>, String>>,
    A: Fn(String, u32) -> F,
    R: Fn(SchedulerState),
    F: Future<Output = Attempt> + Send + 'static,
{
    let mut timetable = Timetable {
        schedule,
        slots: HashMap::new(),
        running: HashSet::new(),
        rng,
    };
    let mut tasks: JoinSet<Attempt> = JoinSet::new();
    // Which miner each task attests: a task that panics returns nothing, and its miner must
    // still leave `running`, or it would hold a slot (and never be attested again) for good.
    let mut task_urls: HashMap<tokio::task::Id, String> = HashMap::new();
    let mut next_refresh = Instant::now();
    loop {
        if *shutdown.borrow() {
            break;
        }
        let now = Instant::now();
        if now >= next_refresh {
            match miners().await {
                Ok(urls) => timetable.relist(&urls, now),
                Err(e) => warn!(error = %e, "scheduler cannot read registered miners"),
            }
            next_refresh = now + REFRESH.min(timetable.schedule.interval);
        }
        let (starting, queued) = timetable.start_due(now);
        for (url, errors) in starting {
            let attempt = attest(url.clone(), errors);
            task_urls.insert(tasks.spawn(attempt).id(), url);
        }
        report(SchedulerState {
            queued,
            in_backoff: timetable.in_backoff(),
            running: timetable.running.len(),
        });
        // Sleep until the next miner is due (or the list is read again), a task ends, or shutdown.
        let wake = timetable
            .next_due(now)
            .map_or(next_refresh, |due| due.min(next_refresh));
        tokio::select! {
            Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let (id, attempt) = match joined {
                    Ok((id, attempt)) => (id, attempt),
                    Err(failed) => {
                        warn!(url = task_urls.get(&failed.id()).map_or("?", String::as_str), error = %failed, "attestation task failed; backing off as from an error");
                        (failed.id(), Attempt::Error)
                    }
                };
                if let Some(url) = task_urls.remove(&id) {
                    timetable.settle(&url, attempt);
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.changed() => {}
        }
    }
    drain(&mut tasks, &task_urls).await;
    info!("scheduler stopped");
}

/// Lets the attestations in `tasks` finish, for up to [`STOP_DRAIN`] or until a second
/// interrupt, then drops what is left.
/// No attempt is settled: the timetable ends with the scheduler, and a backoff logged now
/// would announce a retry that never comes.
async fn drain(tasks: &mut JoinSet<Attempt>, task_urls: &HashMap<tokio::task::Id, String>) {
    if tasks.is_empty() {
        return;
    }
    info!(
        running = tasks.len(),
        seconds = STOP_DRAIN.as_secs(),
        "stopping: attestations in flight have up to the drain limit to reach their verdicts; interrupt again to stop now"
    );
    let finished = async {
        while let Some(joined) = tasks.join_next_with_id().await {
            if let Err(failed) = joined {
                warn!(url = task_urls.get(&failed.id()).map_or("?", String::as_str), error = %failed, "attestation task failed while the scheduler stopped");
            }
        }
    };
    tokio::select! {
        () = finished => info!("attestations in flight finished"),
        () = tokio::time::sleep(STOP_DRAIN) => warn!(
            seconds = STOP_DRAIN.as_secs(),
            "attestations still running after the drain limit; stopping without them"
        ),
        () = gpu_attest_daemon::signals::interrupted() => warn!("interrupted again: stopping the attestations in flight"),
    }
    tasks.abort_all();
}

/// Every listed miner's place in the schedule, and which are being attested now.
struct Timetable {
    schedule: Schedule,
    slots: HashMap<String, Slot>,
    running: HashSet<String>,
    rng: ChaCha8Rng,
}

impl Timetable {
    /// A uniform draw in 0..1, for the jitter.
    fn unit(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The registered miners are `urls` now: a new one is first due at a random point of the
    /// first interval; one no longer listed is forgotten once it is not running.
    fn relist(&mut self, urls: &[String], now: Instant) {
        let listed: HashSet<&String> = urls.iter().collect();
        let running = &self.running;
        self.slots
            .retain(|url, _| listed.contains(url) || running.contains(url));
        for url in urls {
            if !self.slots.contains_key(url) {
                let unit = self.unit();
                let due = now + self.schedule.first_delay(unit);
                self.slots.insert(url.clone(), Slot { due, errors: 0 });
            }
        }
    }

    /// The miners to start now, earliest due first, up to the concurrency bound (each with its
    /// failures in a row, now marked running), and how many more are due and wait for a slot.
    fn start_due(&mut self, now: Instant) -> (Vec<(String, u32)>, usize) {
        let mut due: Vec<(&String, &Slot)> = self
            .slots
            .iter()
            .filter(|(url, slot)| slot.due <= now && !self.running.contains(*url))
            .collect();
        due.sort_by_key(|&(_, slot)| slot.due);
        let free = self.schedule.concurrency.saturating_sub(self.running.len());
        let starting: Vec<(String, u32)> = due
            .iter()
            .take(free)
            .map(|&(url, slot)| (url.clone(), slot.errors))
            .collect();
        let queued = due.len() - starting.len();
        self.running.extend(starting.iter().map(|(url, _)| url.clone()));
        (starting, queued)
    }

    /// When the next miner not yet due becomes due. Miners already due are waiting for a free
    /// slot: only a task ending wakes them.
    fn next_due(&self, now: Instant) -> Option<Instant> {
        self.slots
            .iter()
            .filter(|(url, slot)| !self.running.contains(*url) && slot.due > now)
            .map(|(_, slot)| slot.due)
            .min()
    }

    fn in_backoff(&self) -> usize {
        self.slots.values().filter(|s| s.errors > 0).count()
    }

    /// `url`'s attempt ended as `attempt`: it is due again after the interval, or its backoff,
    /// or when the validator that holds it says.
    fn settle(&mut self, url: &str, attempt: Attempt) {
        self.running.remove(url);
        let unit = self.unit();
        let (jitter, schedule) = (self.schedule.jitter, self.schedule.clone());
        let Some(slot) = self.slots.get_mut(url) else { return };
        if let Attempt::Held(retry_in) = attempt {
            // Not ours this time; the holder keeps its own backoff.
            slot.due = Instant::now() + retry_in.mul_f64(1.0 + jitter * unit);
            return;
        }
        slot.errors = match attempt {
            Attempt::Verdict | Attempt::Held(_) => 0,
            Attempt::Error => slot.errors.saturating_add(1),
        };
        let (errors, delay) = (slot.errors, schedule.next_delay(slot.errors, unit));
        slot.due = Instant::now() + delay;
        if errors > 0 {
            warn!(
                %url,
                failures_in_a_row = errors,
                retry_in_secs = delay.as_secs(),
                miners_in_backoff = self.in_backoff(),
                "miner could not be attested; backing off"
            );
        }
    }
}

fn quiet(_: AttestEvent) {}

/// The scheduler over `attestor`'s registered miners, each attestation under a lease in the
/// store (see `store::leases`), so that validators sharing a database split the miners.
pub async fn run(attestor: Arc<Attestor>, schedule: Schedule, shutdown: watch::Receiver<bool>) {
    // The draw only spreads attestations in time; nothing depends on it being secret, so a fixed
    // seed is an acceptable fallback (nonces, which must be unpredictable, fail loudly instead).
    let seed: [u8; 32] = crate::attest::random32().unwrap_or([0x5c; 32]);
    let holder = format!(
        "{}-{}",
        &attestor.public_key().to_string()[..16],
        hex::encode(&crate::attest::random32().unwrap_or(seed)[..4])
    );
    info!(%holder, lease_secs = schedule.lease.as_secs(), "scheduler started");
    let metrics = attestor.metrics().clone();
    let store = attestor.clone();
    let miners = move || {
        let store = store.clone();
        async move {
            let miners = store.store().miners().await.map_err(|e| e.to_string())?;
            // Counted from each round's list, so that miners registered through another
            // validator on a shared database count too.
            store.metrics().registered_miners(&miners);
            Ok(miners.into_iter().map(|m| m.url).collect())
        }
    };
    let leased = schedule.clone();
    let (releaser, ours) = (attestor.clone(), holder.clone());
    let attest = move |url: String, errors: u32| {
        let (attestor, holder, schedule) = (attestor.clone(), holder.clone(), leased.clone());
        async move { attest_leased(&attestor, &url, &holder, &schedule, errors).await }
    };
    let report = move |state: SchedulerState| metrics.scheduler(state.queued, state.in_backoff, state.running);
    run_with(schedule, miners, attest, report, ChaCha8Rng::from_seed(seed), shutdown).await;
    // Attestations cut short by the shutdown left their leases held: give them back, due now.
    match releaser.store().release_leases_of(&ours, crate::attest::now_ms()).await {
        Ok(0) => {}
        Ok(released) => info!(released, "leases of unfinished attestations given back"),
        Err(e) => warn!(error = %e, "cannot give back this validator's leases; they run out by themselves"),
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One scheduled attestation: take the miner's lease (or learn when to look again), attest it
/// while renewing the lease, then give the lease back with the earliest time any validator may
/// attest the miner again (this one's next wait without its jitter).
async fn attest_leased(attestor: &Attestor, url: &str, holder: &str, schedule: &Schedule, errors: u32) -> Attempt {
    let store = attestor.store();
    let now = crate::attest::now_ms();
    let ttl_ms = schedule.lease.as_millis() as u64;
    let lease = match store.take_lease(url, holder, now, ttl_ms).await {
        Ok(Ok(lease)) => lease,
        Ok(Err(held)) => {
            // Never longer than a full wait of our own: a time far ahead (another validator's
            // clock running fast) must not make this one forget the miner.
            let longest = (schedule.interval + schedule.backoff_max).as_millis() as u64;
            let wait = held.retry_at_ms.saturating_sub(now).clamp(100, longest);
            return Attempt::Held(Duration::from_millis(wait));
        }
        Err(e) => {
            warn!(%url, error = %e, "cannot take the miner's lease");
            return Attempt::Error;
        }
    };
    // Aborted when dropped: also if this attestation is dropped (the scheduler stopping) or
    // panics, so that a lease is never renewed for work nobody is doing.
    let (lost_tx, lost) = tokio::sync::oneshot::channel::<()>();
    let renewing = AbortOnDrop({
        let (store, lease) = (store.clone(), lease.clone());
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis((ttl_ms / 3).max(1)));
            ticks.tick().await; // the first tick is immediate
            loop {
                ticks.tick().await;
                match store.renew_lease(&lease, crate::attest::now_ms(), ttl_ms).await {
                    Ok(true) => {}
                    Ok(false) => {
                        let _ = lost_tx.send(());
                        return;
                    }
                    Err(e) => warn!(url = %lease.miner_url, error = %e, "cannot renew the miner's lease"),
                }
            }
        })
    });
    // A lease that ran out (the database out of reach for longer than the lease) may already be
    // another validator's: this attestation stops rather than run beside that one.
    let attested = tokio::select! {
        attested = attestor.attest(url, &quiet) => attested,
        Ok(()) = lost => {
            warn!(%url, "lease lost while attesting (it ran out); attestation abandoned to the validator that holds it now");
            return Attempt::Held(schedule.interval);
        }
    };
    let attempt = match attested {
        Ok(v) if v.passed => {
            info!(%url, verdict = v.id, "scheduled attestation passed");
            Attempt::Verdict
        }
        Ok(v) => {
            let reasons = v.reasons.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            warn!(%url, verdict = v.id, %reasons, "scheduled attestation failed");
            Attempt::Verdict
        }
        Err(e) => {
            warn!(%url, error = %e, "scheduled attestation could not run");
            attestor.backoffs().failed(url, errors.saturating_add(1), e.to_string());
            Attempt::Error
        }
    };
    drop(renewing); // before the release, so that no renewal follows it
    let errors_after = match attempt {
        Attempt::Error => errors.saturating_add(1),
        _ => {
            attestor.backoffs().clear(url);
            0
        }
    };
    let next_due = crate::attest::now_ms() + schedule.next_delay(errors_after, 0.0).as_millis() as u64;
    if let Err(e) = store.release_lease(&lease, next_due).await {
        // It runs out by itself within the lease time.
        warn!(%url, error = %e, "cannot release the miner's lease");
    }
    attempt
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn schedule() -> Schedule {
        Schedule {
            interval: Duration::from_secs(600),
            concurrency: 2,
            jitter: 0.1,
            backoff_initial: Duration::from_secs(30),
            backoff_max: Duration::from_secs(3600),
            lease: Duration::from_secs(60),
        }
    }

    #[test]
    fn verdicts_keep_the_interval_and_errors_back_off_doubling_to_the_cap() {
        let s = schedule();
        assert_eq!(s.next_delay(0, 0.5), Duration::from_secs(600));
        assert_eq!(
            s.next_delay(0, 0.0),
            Duration::from_secs(540),
            "jitter moves it down 10%"
        );
        assert_eq!(s.next_delay(0, 1.0), Duration::from_secs(660), "and up 10%");
        let backoff: Vec<u64> = (1..=9).map(|e| s.next_delay(e, 0.5).as_secs()).collect();
        assert_eq!(backoff, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(s.next_delay(200, 0.5), Duration::from_secs(3600), "no overflow");
        assert!(s.first_delay(0.999) < s.interval);
    }

    /// Four miners, one of them unreachable, concurrency 2, on tokio's paused clock: never more
    /// than two at once; every miner attested within the first interval; the reachable ones
    /// every interval ± jitter; the unreachable one after 30, 60, 120 ... seconds.
    #[tokio::test(start_paused = true)]
    async fn attestations_are_bounded_spread_and_back_off() {
        let s = schedule();
        let started = Instant::now();
        let calls: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
        let now_running = Arc::new(AtomicUsize::new(0));
        let most_running = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = watch::channel(false);
        let miners = || async { Ok(["a", "b", "c", "down"].map(String::from).to_vec()) };
        let attest = {
            let (calls, now_running, most_running) = (calls.clone(), now_running.clone(), most_running.clone());
            move |url: String, _errors: u32| {
                let (calls, now_running, most_running) = (calls.clone(), now_running.clone(), most_running.clone());
                async move {
                    calls.lock().unwrap().push((url.clone(), started.elapsed()));
                    let n = now_running.fetch_add(1, Ordering::SeqCst) + 1;
                    most_running.fetch_max(n, Ordering::SeqCst);
                    // An attestation takes 100 s here: long enough for the bound to matter.
                    tokio::time::sleep(Duration::from_secs(100)).await;
                    now_running.fetch_sub(1, Ordering::SeqCst);
                    if url == "down" {
                        Attempt::Error
                    } else {
                        Attempt::Verdict
                    }
                }
            }
        };
        let states: Arc<Mutex<Vec<SchedulerState>>> = Arc::default();
        let report = {
            let states = states.clone();
            move |state| states.lock().unwrap().push(state)
        };
        let runner = tokio::spawn(run_with(
            s.clone(),
            miners,
            attest,
            report,
            ChaCha8Rng::from_seed([3; 32]),
            stopped,
        ));
        tokio::time::sleep(Duration::from_secs(3000)).await;
        stop.send(true).unwrap();
        runner.await.unwrap();

        assert_eq!(
            most_running.load(Ordering::SeqCst),
            2,
            "at most `concurrency` at once, and it was reached"
        );
        let states = states.lock().unwrap();
        assert!(states.iter().all(|s| s.running <= 2 && s.in_backoff <= 1), "{states:?}");
        assert!(
            states.iter().any(|s| s.in_backoff == 1),
            "the unreachable miner is reported in backoff"
        );
        assert!(
            states.iter().any(|s| s.running == 2),
            "running attestations are reported"
        );
        let calls = calls.lock().unwrap();
        let times = |url: &str| -> Vec<u64> {
            calls
                .iter()
                .filter(|(u, _)| u == url)
                .map(|(_, t)| t.as_secs())
                .collect()
        };
        for url in ["a", "b", "c"] {
            let t = times(url);
            assert!(
                t[0] < 600 + 200,
                "{url} first attested at {t:?}: within the first interval (plus the queue)"
            );
            for pair in t.windows(2) {
                let gap = pair[1] - pair[0];
                // From end to next start: interval ± 10%, plus the 100 s the attestation took.
                assert!((640..=760 + 200).contains(&gap), "{url}: gap {gap} in {t:?}");
            }
            assert!(t.len() >= 4, "{url}: {t:?}");
        }
        let down = times("down");
        let gaps: Vec<u64> = down.windows(2).map(|p| p[1] - p[0] - 100).collect();
        assert!(gaps.len() >= 4, "{down:?}");
        for (i, gap) in gaps.iter().take(5).enumerate() {
            let want = 30u64 << i;
            // ± 10% jitter, and up to 100 s waiting for a free slot.
            assert!(
                *gap as f64 >= want as f64 * 0.9 - 1.0 && (*gap as f64) <= want as f64 * 1.1 + 101.0,
                "backoff {i}: {gap} s, want about {want} s ({down:?})"
            );
        }
    }

    /// An attestation that panics (a library's `expect` on a hostile peer's bytes, say) gives
    /// its slot back and backs its miner off, as an error does: with one slot, a miner whose
    /// every attempt panics must not stop the others being attested.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_attestation_gives_its_slot_back_and_backs_off() {
        let s = Schedule {
            concurrency: 1,
            ..schedule()
        };
        let started = Instant::now();
        let calls: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let (stop, stopped) = watch::channel(false);
        let miners = || async { Ok(["boom", "fine"].map(String::from).to_vec()) };
        let attest = {
            let calls = calls.clone();
            move |url: String, _errors: u32| {
                let calls = calls.clone();
                async move {
                    calls.lock().unwrap().push((url.clone(), started.elapsed().as_secs()));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    assert!(url != "boom", "the attestation of {url} panicked");
                    Attempt::Verdict
                }
            }
        };
        let runner = tokio::spawn(run_with(
            s,
            miners,
            attest,
            |_| {},
            ChaCha8Rng::from_seed([5; 32]),
            stopped,
        ));
        tokio::time::sleep(Duration::from_secs(2000)).await;
        stop.send(true).unwrap();
        runner.await.unwrap();
        let calls = calls.lock().unwrap();
        let times = |url: &str| {
            calls
                .iter()
                .filter(|(u, _)| u == url)
                .map(|&(_, t)| t)
                .collect::<Vec<_>>()
        };
        let (boom, fine) = (times("boom"), times("fine"));
        assert!(
            fine.len() >= 3,
            "the other miner goes on being attested: {fine:?} (boom {boom:?})"
        );
        // Backed off as an error: 30, 60, 120 ... s apart, not once every interval.
        assert!(
            boom.len() >= 4,
            "the panicking miner is retried with a backoff: {boom:?}"
        );
        assert!(boom[1] - boom[0] < 100, "{boom:?}");
    }

    /// At shutdown nothing new starts, an attestation in flight that ends within the drain
    /// limit reaches its end (its verdict stored, in the daemon), and one that would take
    /// longer is dropped at the limit.
    #[tokio::test(start_paused = true)]
    async fn a_stop_lets_attestations_in_flight_finish_within_the_drain_limit() {
        let s = schedule();
        let (stop, stopped) = watch::channel(false);
        let miners = || async { Ok(["quick", "slow"].map(String::from).to_vec()) };
        let started: Arc<Mutex<Vec<String>>> = Arc::default();
        let finished: Arc<Mutex<Vec<String>>> = Arc::default();
        let attest = {
            let (started, finished, stop_seen) = (started.clone(), finished.clone(), stopped.clone());
            move |url: String, _errors: u32| {
                let (started, finished, mut stop_seen) = (started.clone(), finished.clone(), stop_seen.clone());
                async move {
                    started.lock().unwrap().push(url.clone());
                    if url == "quick" {
                        // Still running at the stop, and done 20 s after it.
                        let _ = stop_seen.wait_for(|stop| *stop).await;
                        tokio::time::sleep(Duration::from_secs(20)).await;
                    } else {
                        tokio::time::sleep(Duration::from_secs(100_000)).await;
                    }
                    finished.lock().unwrap().push(url);
                    Attempt::Verdict
                }
            }
        };
        let runner = tokio::spawn(run_with(
            s,
            miners,
            attest,
            |_| {},
            ChaCha8Rng::from_seed([7; 32]),
            stopped,
        ));
        // Both start within the first interval; wait until both run, then stop.
        while started.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let stopping = Instant::now();
        stop.send(true).unwrap();
        runner.await.unwrap();
        let took = stopping.elapsed();
        assert_eq!(
            *finished.lock().unwrap(),
            ["quick"],
            "the quick one finished, the slow one was dropped"
        );
        assert_eq!(started.lock().unwrap().len(), 2, "nothing started after the stop");
        assert!(
            took >= STOP_DRAIN && took < STOP_DRAIN + Duration::from_secs(1),
            "stopped after {took:?}: the drain limit, not the slow attestation's end"
        );
    }
}
