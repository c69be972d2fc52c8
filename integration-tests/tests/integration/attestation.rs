//! End to end over real sockets: a real miner server and the validator's attestation flow, CPU
//! backend, small challenges. The honest miner passes under both policies; each cheating miner
//! fails with the reason that names its cheat.

use crate::common;

use common::cheats::{Cheat, spawn_cheater};
use common::*;
use gpu_attest_validator::attest::AttestEvent;
use gpu_attest_validator::config::Policy;
use gpu_attest_validator::verdict::Verdict;
use gpu_attest_validator::verdict::class::RateSource;
use gpu_attest_validator::verdict::memory::MemoryProof;
use gpu_attest_validator::verdict::reason::ReasonCode;
use gpu_attest_validator::verdict::throughput::operations;

#[tokio::test(flavor = "multi_thread")]
async fn honest_miner_passes_sampled_verification() {
    let miner = spawn_miner(miner_core(1, &[validator_key()], 1)).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert_eq!(verdict.policy, "sampled");
    assert_eq!(verdict.samples, 8);
    assert_eq!(verdict.params.n, 64);
    assert!(verdict.measured_ms <= verdict.deadline_ms);
    assert_eq!(verdict.inventory.len(), 1);
    // Finishing within the measured time proves at least the required work over that time,
    // and so at least that over the deadline.
    let t = verdict.throughput;
    let p = &verdict.params;
    assert_eq!(t.operations, 2.0 * 64f64.powi(3) * p.num_chains as f64 * 4.0);
    assert!(t.proven_ops_per_sec.unwrap() >= t.operations / (verdict.deadline_ms as f64 / 1000.0));
    // The test rate table's CPU row, per core, times the 2 cores the miner states; at first
    // contact, with the first-contact slack.
    assert_eq!(t.expected_ops_per_sec, 2.0 * TEST_CPU_RATE_PER_CORE);
    assert_eq!(t.rate_source, Some(RateSource::Shipped));
    assert_eq!((t.rate_miners, t.slack), (0, 2.0));
    assert_eq!(verdict.deadline_ms, (verdict.expected_ms as f64 * 2.0).ceil() as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn honest_multi_device_miner_passes_full_reexecution() {
    // Three devices on the miner, one on the validator: G must still match.
    let miner = spawn_miner(miner_core(2, &[validator_key()], 3)).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Full).await;
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert_eq!(verdict.policy, "full");
    assert_eq!(verdict.inventory.len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_global_checksum_fails() {
    let miner = spawn_cheater(miner_core(3, &[validator_key()], 1), Cheat::WrongGlobalChecksum).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert_failed_with(&verdict, ReasonCode::GlobalChecksumMismatch);
    assert_eq!(
        verdict.throughput.proven_ops_per_sec, None,
        "a failed verdict proves nothing"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn skipped_chains_are_caught_by_sampling() {
    let miner = spawn_cheater(miner_core(4, &[validator_key()], 1), Cheat::SkipChains).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert!(!verdict.passed);
    // Every garbage chain is opened (8 samples cover all ~5 chains); each fails on a segment:
    // its recomputation misses the next checkpoint, or its opened matrix misses its own.
    assert!(
        verdict
            .reasons
            .iter()
            .all(|r| matches!(r.code, ReasonCode::SegmentMismatch | ReasonCode::OpenedMatrixMismatch)),
        "{:?}",
        verdict.reasons
    );
    // Exactly the skipped chains (the second half) fail, each of them.
    let m = verdict.params.num_chains;
    let mut failing: Vec<u64> = verdict
        .reasons
        .iter()
        .map(|r| {
            r.message
                .strip_prefix("chain ")
                .and_then(|r| r.split(':').next())
                .and_then(|c| c.parse().ok())
                .expect(&r.message)
        })
        .collect();
    failing.sort();
    failing.dedup();
    assert_eq!(failing, (m / 2..m).collect::<Vec<_>>(), "{:?}", verdict.reasons);
}

#[tokio::test(flavor = "multi_thread")]
async fn skipped_chains_are_caught_by_full_reexecution() {
    let miner = spawn_cheater(miner_core(5, &[validator_key()], 1), Cheat::SkipChains).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Full).await;
    assert_failed_with(&verdict, ReasonCode::ReexecutionMismatch);
}

#[tokio::test(flavor = "multi_thread")]
async fn leaf_changed_after_commitment_fails() {
    let miner = spawn_cheater(miner_core(6, &[validator_key()], 1), Cheat::LeafChangedAfterCommit).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert_failed_with(&verdict, ReasonCode::LeafNotCommitted);
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_partition_fails() {
    let miner = spawn_cheater(miner_core(7, &[validator_key()], 2), Cheat::WrongPartition).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert_failed_with(&verdict, ReasonCode::PartitionNotCanonical);
}

#[tokio::test(flavor = "multi_thread")]
async fn replayed_commitment_from_earlier_nonce_fails() {
    let miner = spawn_cheater(miner_core(8, &[validator_key()], 1), Cheat::ReplayFirstCommitment).await;
    let dir = TempDir::new("replay");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let first = attestor.attest(&miner.url(), &|_| {}).await.unwrap();
    assert!(first.passed, "{:?}", first.reasons);
    let second = attestor.attest(&miner.url(), &|_| {}).await.unwrap();
    assert_ne!(first.nonce, second.nonce, "a nonce was reused");
    assert_failed_with(&second, ReasonCode::NonceMismatch);
}

/// A late commitment by the finish-by time is still a FAIL, but its work is verified and the
/// verdict states the rate it proved: a marketplace can grade the host. It teaches the class
/// nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_commitment_after_the_deadline_fails_and_states_the_rate_it_proved() {
    let miner = spawn_cheater(miner_core(9, &[validator_key()], 1), Cheat::Slow).await;
    let dir = TempDir::new("graded");
    let mut config = validator_config(&dir, Policy::Sampled);
    config.calibration.registered_only = false;
    let attestor = attestor(&config).await;
    let verdict = attest_with(&attestor, &miner.url()).await;
    assert_failed_with(&verdict, ReasonCode::LateCommitment);
    assert_eq!(verdict.reasons.len(), 1, "only late: {:?}", verdict.reasons);
    assert!(verdict.measured_ms > verdict.deadline_ms);
    assert_eq!(verdict.finish_by_ms, verdict.deadline_ms * 2);
    assert!(verdict.measured_ms <= verdict.finish_by_ms);
    let t = &verdict.throughput;
    let proven = t.proven_ops_per_sec.expect("a graded miss states the rate it proved");
    assert_eq!(proven, t.operations / (verdict.measured_ms as f64 / 1000.0));
    // The share of the class's rate counts the work as the deadline did: the pools' fill (if
    // the challenge had them) at its weight.
    let fill = MemoryProof::fill_work_of(verdict.memory.as_ref());
    let timed = operations(&verdict.params) + fill.weighted_ops();
    let share = timed / (verdict.measured_ms as f64 / 1000.0) / t.expected_ops_per_sec;
    assert_eq!(t.proven_to_expected, Some(share));
    // Later than the deadline: less than the deadline's share of the class rate.
    assert!(t.proven_to_expected.unwrap() < 1.0 / t.slack, "{t}");
    let classes = attestor.store().rate_classes().await.unwrap();
    assert!(classes.is_empty(), "a miss taught {classes:?}");
}

/// A graded miss within the retest band gets one fresh challenge, and the verdict is the
/// retest's: a host that stalled once is stored as its retest found it, with the first run on
/// record inside the verdict, and never as a second verdict.
#[tokio::test(flavor = "multi_thread")]
async fn a_miss_within_the_retest_band_is_retested_once_and_the_retest_decides() {
    let dir = TempDir::new("retest");
    let mut config = validator_config(&dir, Policy::Sampled);
    // The cheats are 300 ms late on a deadline of about 1.6 s: inside a band of 2 deadlines.
    config.deadline.retest_band = 2.0;
    let attestor = attestor(&config).await;

    let stalled_once = spawn_cheater(miner_core(66, &[validator_key()], 1), Cheat::SlowOnce).await;
    let events = std::sync::Mutex::new(Vec::new());
    let verdict = attestor
        .attest(&stalled_once.url(), &|e| events.lock().unwrap().push(e))
        .await
        .unwrap();
    assert!(verdict.passed, "the retest was on time: {:?}", verdict.reasons);
    let first = verdict.first_run.as_ref().expect("the first run is on record");
    assert_ne!(first.nonce, verdict.nonce, "the retest had a fresh challenge");
    assert!(first.measured_ms > first.deadline_ms);
    assert_eq!(first.reasons.len(), 1);
    assert_eq!(first.reasons[0].code, ReasonCode::LateCommitment);
    assert!(first.proven_ops_per_sec.is_some());
    let retests = events
        .into_inner()
        .unwrap()
        .into_iter()
        .filter(|e| matches!(e, AttestEvent::Phase { name: "retest", .. }))
        .count();
    assert_eq!(retests, 1);

    // Late every time: retested once, not twice, and the verdict is the retest's graded miss.
    let always_late = spawn_cheater(miner_core(67, &[validator_key()], 1), Cheat::Slow).await;
    let verdict = attestor.attest(&always_late.url(), &|_| {}).await.unwrap();
    assert_failed_with(&verdict, ReasonCode::LateCommitment);
    assert!(verdict.throughput.proven_ops_per_sec.is_some());
    assert!(verdict.first_run.is_some());

    let stored = stored_verdicts(&attestor).await;
    assert_eq!(stored.len(), 2, "one verdict per attestation");
    assert!(stored.iter().all(|v| v.first_run.is_some()));

    // A retest is of the same key and hardware, or none: the first run's graded miss stands.
    let changed = spawn_cheater(miner_core(69, &[validator_key()], 1), Cheat::SlowThenOtherHardware).await;
    let verdict = attestor.attest(&changed.url(), &|_| {}).await.unwrap();
    assert_failed_with(&verdict, ReasonCode::LateCommitment);
    assert!(
        verdict.throughput.proven_ops_per_sec.is_some(),
        "the first run's grade stands"
    );
    assert!(verdict.first_run.is_none());
    assert!(!verdict.inventory[0].name.contains("bigger"));
}

/// Late work is verified as strictly as on-time work: a late commitment whose work does not
/// verify is no graded miss and states no rate, under either policy.
#[tokio::test(flavor = "multi_thread")]
async fn late_work_that_does_not_verify_proves_nothing() {
    let miner = spawn_cheater(miner_core(68, &[validator_key()], 1), Cheat::LateSkipChains).await;
    for policy in [Policy::Sampled, Policy::Full] {
        let (verdict, _dir) = attest(&miner.url(), policy).await;
        assert_failed_with(&verdict, ReasonCode::LateCommitment);
        assert!(
            verdict.measured_ms <= verdict.finish_by_ms,
            "late, but by the finish-by time"
        );
        assert!(
            verdict.reasons.iter().any(|r| r.code != ReasonCode::LateCommitment),
            "{policy:?}: the skipped chains were not caught: {:?}",
            verdict.reasons
        );
        assert_eq!(verdict.throughput.proven_ops_per_sec, None, "{policy:?}");
        assert!(verdict.first_run.is_none(), "no retest for work that did not verify");
    }
}

/// Without a finish-by time (the validator turned it off), a late commitment proves nothing.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_finish_by_time_a_late_commitment_proves_nothing() {
    let miner = spawn_cheater(miner_core(64, &[validator_key()], 1), Cheat::Slow).await;
    let dir = TempDir::new("late-no-finish-by");
    let mut config = validator_config(&dir, Policy::Sampled);
    config.deadline.finish_by = 1.0;
    let verdict = attest_with(&*attestor(&config).await, &miner.url()).await;
    assert_failed_with(&verdict, ReasonCode::LateCommitment);
    assert_eq!(verdict.finish_by_ms, 0);
    assert_eq!(verdict.throughput.proven_ops_per_sec, None);
}

/// The events of one attestation by a full-policy validator, from the commitment on.
async fn full_policy_events_after_the_commitment(miner: &Running, tag: &str) -> (Verdict, Vec<AttestEvent>) {
    let dir = TempDir::new(tag);
    let attestor = attestor(&validator_config(&dir, Policy::Full)).await;
    let events = std::sync::Mutex::new(Vec::new());
    let verdict = attestor
        .attest(&miner.url(), &|e| events.lock().unwrap().push(e))
        .await
        .unwrap();
    let mut events = events.into_inner().unwrap();
    let committed = events
        .iter()
        .position(|e| {
            matches!(
                e,
                AttestEvent::Phase {
                    name: "commitment-received",
                    ..
                }
            )
        })
        .expect("a commitment arrived");
    (verdict, events.split_off(committed))
}

/// Full re-execution costs the validator as much as the work. A commitment past the finish-by
/// time proves nothing, so it does not get to make the validator spend that; one by the
/// finish-by time is re-executed, since the rate its verdict states rests on it. (The cheats
/// are late but honest, so re-execution shows as progress after the commitment.)
#[tokio::test(flavor = "multi_thread")]
async fn under_the_full_policy_only_a_late_commitment_that_can_prove_a_rate_is_reexecuted() {
    let reexecuted = |after: &[AttestEvent]| after.iter().any(|e| matches!(e, AttestEvent::Progress(_)));

    let past = spawn_cheater(miner_core(63, &[validator_key()], 1), Cheat::PastFinishBy).await;
    let (verdict, after) = full_policy_events_after_the_commitment(&past, "past-finish-by-full").await;
    let late = failed_with(&verdict, ReasonCode::LateCommitment);
    assert!(late.message.contains("past the finish-by time"), "{late:?}");
    assert!(verdict.measured_ms > verdict.finish_by_ms);
    assert_eq!(verdict.throughput.proven_ops_per_sec, None);
    assert!(
        after.iter().any(
            |e| matches!(e, AttestEvent::Phase { name: "verifying", detail } if detail.contains("not re-executed"))
        ),
        "{after:?}"
    );
    assert!(!reexecuted(&after), "re-executed: {after:?}");

    let graded = spawn_cheater(miner_core(65, &[validator_key()], 1), Cheat::Slow).await;
    let (verdict, after) = full_policy_events_after_the_commitment(&graded, "graded-full").await;
    assert_failed_with(&verdict, ReasonCode::LateCommitment);
    assert_eq!(verdict.reasons.len(), 1, "{:?}", verdict.reasons);
    assert!(verdict.throughput.proven_ops_per_sec.is_some());
    assert!(reexecuted(&after), "not re-executed: {after:?}");
}

/// A miner that could compute first and refuse only the runs it would fail would show nothing
/// but passes. Past the accept window a refusal no longer withdraws the challenge: the outcome
/// is a stored failure, like silence.
#[tokio::test(flavor = "multi_thread")]
async fn a_challenge_not_accepted_within_the_window_is_a_stored_failure() {
    for (seed, cheat) in [(60, Cheat::RefusesAfterComputing), (61, Cheat::NeverAccepts)] {
        let miner = spawn_cheater(miner_core(seed, &[validator_key()], 1), cheat).await;
        let dir = TempDir::new("accept-window");
        let mut config = validator_config(&dir, Policy::Sampled);
        config.deadline.accept_ms = 300;
        assert!(common::cheats::PAST_THE_ACCEPT_WINDOW.as_millis() > 300);
        let attestor = attestor(&config).await;
        let verdict = attestor.attest(&miner.url(), &|_| {}).await.unwrap();
        let reason = common::failed_with(&verdict, ReasonCode::NotAccepted);
        assert!(reason.message.contains("within 300 ms"), "{cheat:?}: {reason:?}");
        let stored = attestor.store().verdicts(&every_verdict()).await.unwrap();
        assert_eq!(stored.len(), 1, "{cheat:?}: the failure is on record");
    }
    // A refusal within the window stores nothing: `unreachable_and_refusing_miners_store_no_verdict`.
}

fn every_verdict() -> gpu_attest_validator::store::VerdictFilter {
    gpu_attest_validator::store::VerdictFilter {
        limit: 100,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn only_registered_unrevoked_miners_teach_their_class_rate() {
    let miner = spawn_miner(miner_core(12, &[validator_key()], 1)).await;
    let dir = TempDir::new("teach");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let store = attestor.store();
    // A one-shot attestation of an unregistered URL passes, and teaches nothing.
    let verdict = attestor.attest(&miner.url(), &|_| {}).await.unwrap();
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert!(store.rate_classes().await.unwrap().is_empty());
    // Registered, its pass records the rate it proved for its class, per core.
    let key = attestor.inventory(&miner.url()).await.unwrap().0.miner_key;
    let url = gpu_attest_validator::attest::normalise_url(&miner.url());
    store.register_miner(&url, Some("rig"), key, false, 0).await.unwrap();
    let verdict = attestor.attest(&miner.url(), &|_| {}).await.unwrap();
    assert!(verdict.passed, "{:?}", verdict.reasons);
    let classes = store.rate_classes().await.unwrap();
    assert_eq!(classes.len(), 1);
    let seen = store.observations(&classes[0], 0).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].miner_key, key.0);
    let proven = verdict.throughput.proven_ops_per_sec.unwrap();
    assert_eq!(seen[0].ops_per_unit, proven / f64::from(TEST_CORES));
    // Revoked, its observations no longer count.
    store.revoke_key(&key, "test", 1).await.unwrap();
    assert!(store.observations(&classes[0], 0).await.unwrap().is_empty());
}
