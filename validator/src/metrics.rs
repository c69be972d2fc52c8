//! What the validator tells Prometheus: attestations by outcome and by fail reason, how long
//! each phase takes, the rate each miner proved, verification time, and the scheduler's state.
//! The handles are cheap clones over shared atomics; the registry is built once, for the
//! endpoint, from clones of them.

use crate::store::{MinerRecord, Store, StoreError, VerdictFilter};
use crate::verdict::Verdict;
use gpu_attest_daemon::metrics::prometheus_client::metrics::counter::Counter;
use gpu_attest_daemon::metrics::prometheus_client::metrics::family::Family;
use gpu_attest_daemon::metrics::prometheus_client::metrics::gauge::Gauge;
use gpu_attest_daemon::metrics::prometheus_client::metrics::histogram::Histogram;
use gpu_attest_daemon::metrics::prometheus_client::registry::Registry;
use gpu_attest_daemon::metrics::{
    DurationFamily, Labels, RealGauge, duration_family, duration_histogram, register_build_info,
};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The steps of one attestation, timed separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Connecting, reading the inventory and planning the challenge.
    Prepare,
    /// From sending the challenge to its commitment (the miner's compute).
    Challenge,
    /// Checking the commitment and re-executing the work, full or sampled.
    Verify,
    /// Writing the verdict.
    Store,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Prepare => "prepare",
            Phase::Challenge => "challenge",
            Phase::Verify => "verify",
            Phase::Store => "store",
        }
    }
}

#[derive(Clone)]
pub struct ValidatorMetrics {
    attestations: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    retests: Family<Labels, Counter>,
    phases: DurationFamily,
    verification: Histogram,
    proven_rate: Family<Labels, RealGauge>,
    proven_memory: Family<Labels, RealGauge>,
    proven_walk_rate: Family<Labels, RealGauge>,
    expected_rate: Family<Labels, RealGauge>,
    last_pass: Family<Labels, RealGauge>,
    registered_at: Family<Labels, RealGauge>,
    registered: Gauge,
    /// The miners the last listing held: a miner missing from the next one was removed, here
    /// or by another validator sharing the database, and its series go.
    listed: Arc<Mutex<BTreeSet<String>>>,
    queue_depth: Gauge,
    in_backoff: Gauge,
    running: Gauge,
}

impl Default for ValidatorMetrics {
    fn default() -> Self {
        let metrics = ValidatorMetrics {
            attestations: Family::default(),
            failures: Family::default(),
            errors: Family::default(),
            retests: Family::default(),
            phases: duration_family(),
            verification: duration_histogram(),
            proven_rate: Family::default(),
            proven_memory: Family::default(),
            proven_walk_rate: Family::default(),
            expected_rate: Family::default(),
            last_pass: Family::default(),
            registered_at: Family::default(),
            registered: Gauge::default(),
            listed: Arc::default(),
            queue_depth: Gauge::default(),
            in_backoff: Gauge::default(),
            running: Gauge::default(),
        };
        // Each outcome's series from the start, at 0: `increase()` over a counter's first
        // sample sees nothing, so an alert would miss the first failures after a restart.
        for outcome in ["pass", "fail", "error"] {
            drop(metrics.attestations.get_or_create(&vec![("outcome", outcome.into())]));
        }
        metrics
    }
}

impl ValidatorMetrics {
    /// A registry over these metrics, for the endpoint.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("gpu_attest_validator");
        register_build_info(&mut r);
        self.register_attestations(&mut r);
        self.register_miners(&mut r);
        self.register_scheduler(&mut r);
        r
    }

    /// How attestations end, why they fail, and how long their phases take.
    fn register_attestations(&self, r: &mut Registry) {
        r.register(
            "attestations",
            "Attestations by outcome: pass and fail are stored verdicts, error is an attestation that could not run (no verdict)",
            self.attestations.clone(),
        );
        r.register(
            "attestation_failures",
            "Reasons failed verdicts gave, by reason code and miner (a verdict may give several)",
            self.failures.clone(),
        );
        r.register(
            "attestation_errors",
            "Attestations that could not run, by kind (unreachable, refused, ...)",
            self.errors.clone(),
        );
        r.register(
            "retests",
            "Misses just past the deadline retested with a fresh challenge, by the retest's outcome: pass or fail (the stored verdict is the retest's), or error (the retest could not run; the first run's verdict is stored)",
            self.retests.clone(),
        );
        r.register(
            "phase_seconds",
            "Time spent in each phase of an attestation",
            self.phases.clone(),
        );
        r.register(
            "verification_seconds",
            "Time this validator spent verifying a commitment (re-execution, full or sampled)",
            self.verification.clone(),
        );
    }

    /// What each miner's latest verdict proved and was timed by, and when it was registered and
    /// last passed.
    fn register_miners(&self, r: &mut Registry) {
        r.register(
            "proven_ops_per_second",
            "The rate each miner proved in its latest verdict (0 when it failed, except a graded miss: the rate its late work proved)",
            self.proven_rate.clone(),
        );
        r.register(
            "proven_memory_bytes",
            "The memory each miner's latest verdict proved, all devices (0 when it failed, except a graded miss; no series for a miner attested without the memory phase)",
            self.proven_memory.clone(),
        );
        r.register(
            "proven_walk_bytes_per_second",
            "The walk bandwidth per device each miner's latest verdict proved (0 when it failed, except a graded miss)",
            self.proven_walk_rate.clone(),
        );
        r.register(
            "expected_ops_per_second",
            "The rate each miner's latest verdict was timed by: its hardware class's rate for the devices it claimed (proven over expected is the share of the class rate it proved)",
            self.expected_rate.clone(),
        );
        r.register(
            "last_pass_timestamp_seconds",
            "When each registered miner last passed (Unix time of the verdict); no series for one that never passed",
            self.last_pass.clone(),
        );
        r.register(
            "miner_registered_timestamp_seconds",
            "When each registered miner was registered (Unix time): with last_pass_timestamp_seconds, a miner that never passed",
            self.registered_at.clone(),
        );
        r.register(
            "registered_miners",
            "Miners registered with this validator (its database's, shared with any validator on the same PostgreSQL database)",
            self.registered.clone(),
        );
    }

    /// The scheduler's queue, back-offs and running attestations.
    fn register_scheduler(&self, r: &mut Registry) {
        r.register(
            "scheduler_queue_depth",
            "Miners due for attestation and waiting for a free slot",
            self.queue_depth.clone(),
        );
        r.register(
            "scheduler_miners_in_backoff",
            "Miners whose latest scheduled attempt could not attest them, waiting longer before the next",
            self.in_backoff.clone(),
        );
        r.register(
            "scheduler_running",
            "Scheduled attestations running now",
            self.running.clone(),
        );
    }

    pub fn phase(&self, phase: Phase, took: Duration) {
        self.phases
            .get_or_create(&vec![("phase", phase.name().to_string())])
            .observe(took.as_secs_f64());
        if phase == Phase::Verify {
            self.verification.observe(took.as_secs_f64());
        }
    }

    /// A retest ran (PROTOCOL.md 14.7): `pass` or `fail`, its verdict's; `error` when it could
    /// not run and the first run's verdict was stored.
    pub fn retested(&self, outcome: &'static str) {
        self.retests.get_or_create(&vec![("outcome", outcome.into())]).inc();
    }

    /// Counts what one attestation came to: its verdict, or the kind of error that kept it from
    /// one (`AttestError::kind`); `registered`: whether its miner is registered (only those have
    /// a proven-rate series).
    pub fn attested(&self, result: Result<&Verdict, &'static str>, registered: bool) {
        match result {
            Ok(verdict) => {
                let outcome = if verdict.passed { "pass" } else { "fail" };
                self.attestations
                    .get_or_create(&vec![("outcome", outcome.into())])
                    .inc();
                for reason in &verdict.reasons {
                    self.failures
                        .get_or_create(&vec![
                            ("reason", reason.code.as_str().to_string()),
                            ("miner", verdict.miner_url.clone()),
                        ])
                        .inc();
                }
                if registered {
                    self.latest_verdict(verdict);
                }
            }
            Err(kind) => {
                self.attestations
                    .get_or_create(&vec![("outcome", "error".into())])
                    .inc();
                self.errors.get_or_create(&vec![("kind", kind.to_string())]).inc();
            }
        }
    }

    /// The per-miner series of a registered miner's latest verdict: on each new one, and at
    /// start from the store ([`restore`]), so that a restart does not empty them.
    pub fn latest_verdict(&self, verdict: &Verdict) {
        let miner = vec![("miner", verdict.miner_url.clone())];
        self.proven_rate
            .get_or_create(&miner)
            .set(verdict.throughput.proven_ops_per_sec.unwrap_or(0.0));
        self.expected_rate
            .get_or_create(&miner)
            .set(verdict.throughput.expected_ops_per_sec);
        if verdict.passed {
            self.passed_at(&verdict.miner_url, verdict.created_at_ms);
        }
        match &verdict.memory {
            Some(memory) => {
                self.proven_memory
                    .get_or_create(&miner)
                    .set(memory.proven_bytes() as f64);
                self.proven_walk_rate
                    .get_or_create(&miner)
                    .set(memory.proven_walk_bytes_per_sec.unwrap_or(0.0));
            }
            None => {
                self.proven_memory.remove(&miner);
                self.proven_walk_rate.remove(&miner);
            }
        }
    }

    fn passed_at(&self, url: &str, at_ms: u64) {
        self.last_pass
            .get_or_create(&vec![("miner", url.to_string())])
            .set(at_ms as f64 / 1000.0);
    }

    /// The registered miners, as the store lists them now: their count, and when each was
    /// registered (a series that is there before the miner's first pass). A miner the last
    /// listing held and this one does not was removed, maybe by another validator on the same
    /// PostgreSQL database: its series go, or its registration time, with no pass beside it,
    /// would fire `GpuAttestMinerNeverPassed` for a miner nobody attests any more.
    pub fn registered_miners(&self, miners: &[MinerRecord]) {
        self.registered.set(i64::try_from(miners.len()).unwrap_or(i64::MAX));
        for miner in miners {
            self.registered_at
                .get_or_create(&vec![("miner", miner.url.clone())])
                .set(miner.registered_at_ms as f64 / 1000.0);
        }
        let now: BTreeSet<String> = miners.iter().map(|m| m.url.clone()).collect();
        let before = std::mem::replace(&mut *self.listed.lock().unwrap_or_else(|p| p.into_inner()), now.clone());
        for gone in before.difference(&now) {
            self.forget_miner(gone);
        }
    }

    /// Drops a removed miner's series.
    pub fn forget_miner(&self, url: &str) {
        let miner = vec![("miner", url.to_string())];
        self.proven_rate.remove(&miner);
        self.expected_rate.remove(&miner);
        self.last_pass.remove(&miner);
        self.registered_at.remove(&miner);
        self.proven_memory.remove(&miner);
        self.proven_walk_rate.remove(&miner);
    }

    /// The scheduler's state after each change.
    pub fn scheduler(&self, queued: usize, in_backoff: usize, running: usize) {
        let as_gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.queue_depth.set(as_gauge(queued));
        self.in_backoff.set(as_gauge(in_backoff));
        self.running.set(as_gauge(running));
    }
}

/// Fills the per-miner series and the registered count from `store`: each registered miner's
/// latest verdict, and its latest pass where that is older. A validator that restarts shows what
/// its miners proved at once instead of after their next attestation.
pub async fn restore(metrics: &ValidatorMetrics, store: &Store) -> Result<(), StoreError> {
    let miners = store.miners().await?;
    metrics.registered_miners(&miners);
    for miner in miners {
        let newest = |passed: Option<bool>| VerdictFilter {
            miner_url: Some(miner.url.clone()),
            passed,
            limit: 1,
            ..VerdictFilter::default()
        };
        let Some(latest) = store.verdicts(&newest(None)).await?.pop() else {
            continue;
        };
        metrics.latest_verdict(&latest);
        if !latest.passed
            && let Some(pass) = store.verdicts(&newest(Some(true))).await?.pop()
        {
            metrics.passed_at(&pass.miner_url, pass.created_at_ms);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_support::{passing_verdict, test_stores};
    use gpu_attest_daemon::metrics::prometheus_client::encoding::text::encode;
    use gpu_attest_shared::keys::PublicKey;

    /// The value of the sample `series` (name and labels, as the exposition writes them).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// A miner another validator removed from a shared database disappears from the next
    /// listing: its series go with it, so no alert fires for a miner nobody attests any more.
    #[test]
    fn a_miner_gone_from_the_listing_loses_its_series() {
        let metrics = ValidatorMetrics::default();
        let record = |url: &str| MinerRecord {
            url: url.into(),
            name: String::new(),
            miner_key: PublicKey([1; 32]),
            registered_at_ms: 7_000,
        };
        metrics.registered_miners(&[record("http://stays"), record("http://goes")]);
        metrics.passed_at("http://goes", 9_000);
        let text = || {
            let mut text = String::new();
            encode(&mut text, &metrics.registry()).unwrap();
            text
        };
        let registered = |text: &str, miner: &str| {
            sample(
                text,
                &format!("gpu_attest_validator_miner_registered_timestamp_seconds{{miner=\"{miner}\"}}"),
            )
        };
        let before = text();
        assert_eq!(registered(&before, "http://goes"), Some(7.0), "{before}");
        metrics.registered_miners(&[record("http://stays")]);
        let after = text();
        assert_eq!(registered(&after, "http://stays"), Some(7.0), "{after}");
        assert!(!after.contains("http://goes"), "{after}");
        assert_eq!(sample(&after, "gpu_attest_validator_registered_miners"), Some(1.0));
    }

    /// A restarted validator's per-miner series come back from the store: the latest verdict's
    /// rates, the latest pass even behind a later fail, and the registered count; a miner never
    /// attested has no series.
    #[tokio::test]
    async fn restore_refills_the_per_miner_series_from_the_store() {
        for (store, _scratch) in test_stores("metrics-restore").await {
            let now = 5_000_000;
            for (url, key) in [("http://a", 1u8), ("http://b", 2), ("http://never", 3)] {
                store
                    .register_miner(url, None, PublicKey([key; 32]), false, now)
                    .await
                    .unwrap();
            }
            // Each verdict's nonce issued first, as an attestation does.
            for (nonce, url) in [([1; 32], "http://a"), ([2; 32], "http://a"), ([3; 32], "http://b")] {
                assert!(store.claim_nonce(&nonce, url, now).await.unwrap());
            }
            let mut passed = passing_verdict([1; 32]);
            passed.miner_url = "http://a".into();
            passed.created_at_ms = 2_000_000;
            store.insert_verdict(&passed).await.unwrap();
            let mut failed = passing_verdict([2; 32]);
            failed.miner_url = "http://a".into();
            failed.created_at_ms = 3_000_000;
            failed.passed = false;
            failed.throughput.proven_ops_per_sec = None;
            store.insert_verdict(&failed).await.unwrap();
            let mut b = passing_verdict([3; 32]);
            b.miner_url = "http://b".into();
            b.created_at_ms = 4_000_000;
            store.insert_verdict(&b).await.unwrap();

            let metrics = ValidatorMetrics::default();
            restore(&metrics, &store).await.unwrap();
            let mut text = String::new();
            encode(&mut text, &metrics.registry()).unwrap();
            let series =
                |name: &str, miner: &str| sample(&text, &format!("gpu_attest_validator_{name}{{miner=\"{miner}\"}}"));
            assert_eq!(
                sample(&text, "gpu_attest_validator_registered_miners"),
                Some(3.0),
                "{text}"
            );
            assert_eq!(
                series("proven_ops_per_second", "http://a"),
                Some(0.0),
                "the latest, failed verdict"
            );
            assert_eq!(
                series("last_pass_timestamp_seconds", "http://a"),
                Some(2_000.0),
                "{text}"
            );
            let proven_b = b.throughput.proven_ops_per_sec.unwrap();
            assert_eq!(series("proven_ops_per_second", "http://b"), Some(proven_b), "{text}");
            assert_eq!(series("last_pass_timestamp_seconds", "http://b"), Some(4_000.0));
            // A miner never attested: registered, so an alert can see that it never passed,
            // and nothing else.
            assert_eq!(
                series("miner_registered_timestamp_seconds", "http://never"),
                Some(5_000.0)
            );
            assert_eq!(text.matches("http://never").count(), 1, "{text}");
        }
    }

    /// What an alert needs from the first scrape: every outcome counted from 0, the release, and
    /// failures by miner.
    #[test]
    fn a_fresh_validator_exports_its_build_and_zero_counters() {
        let metrics = ValidatorMetrics::default();
        let mut text = String::new();
        encode(&mut text, &metrics.registry()).unwrap();
        for outcome in ["pass", "fail", "error"] {
            let series = format!("gpu_attest_validator_attestations_total{{outcome=\"{outcome}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{text}");
        }
        let build = text
            .lines()
            .find(|l| l.starts_with("gpu_attest_validator_build_info{"))
            .unwrap_or_else(|| panic!("no build info in {text}"));
        assert!(
            build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
            "{build}"
        );
        assert!(build.ends_with(" 1"), "{build}");

        let mut failed = crate::store::test_support::passing_verdict([9; 32]);
        failed.passed = false;
        failed.miner_url = "http://c".into();
        failed.reasons = vec![crate::verdict::reason::Reason::new(
            crate::verdict::reason::ReasonCode::ReexecutionMismatch,
            "x",
        )];
        metrics.attested(Ok(&failed), false);
        text.clear();
        encode(&mut text, &metrics.registry()).unwrap();
        let series =
            "gpu_attest_validator_attestation_failures_total{reason=\"reexecution-mismatch\",miner=\"http://c\"}";
        assert_eq!(sample(&text, series), Some(1.0), "{text}");
    }
}
