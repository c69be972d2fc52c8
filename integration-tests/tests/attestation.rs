//! End to end over real sockets: a real miner server and the validator's attestation flow, CPU
//! backend, small challenges. The honest miner passes under both policies; each cheating miner
//! fails with the reason that names its cheat.

mod common;

use common::cheats::{Cheat, spawn_cheater};
use common::*;
use gpu_attest_validator::attest::AttestEvent;
use gpu_attest_validator::config::Policy;
use gpu_attest_validator::rates::RateSource;
use gpu_attest_validator::reason::ReasonCode;

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

#[tokio::test(flavor = "multi_thread")]
async fn answering_after_the_deadline_fails() {
    let miner = spawn_cheater(miner_core(9, &[validator_key()], 1), Cheat::Slow).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert_failed_with(&verdict, ReasonCode::LateCommitment);
    assert!(verdict.measured_ms > verdict.deadline_ms);
}

/// Full re-execution costs the validator as much as the work; a miner that has already failed
/// does not get to make it spend that. (The cheat is late but honest, so the skipped
/// re-execution is seen in the events: no progress after the commitment.)
#[tokio::test(flavor = "multi_thread")]
async fn a_late_commitment_is_not_reexecuted_under_the_full_policy() {
    let miner = spawn_cheater(miner_core(63, &[validator_key()], 1), Cheat::Slow).await;
    let dir = TempDir::new("late-full");
    let attestor = attestor(&validator_config(&dir, Policy::Full)).await;
    let events = std::sync::Mutex::new(Vec::new());
    let verdict = attestor
        .attest(&miner.url(), &|e| events.lock().unwrap().push(e))
        .await
        .unwrap();
    assert_failed_with(&verdict, ReasonCode::LateCommitment);
    let events = events.into_inner().unwrap();
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
    let after: Vec<_> = events[committed..].iter().collect();
    assert!(
        after.iter().any(
            |e| matches!(e, AttestEvent::Phase { name: "verifying", detail } if detail.contains("not re-executed"))
        ),
        "{after:?}"
    );
    assert!(
        !after.iter().any(|e| matches!(e, AttestEvent::Progress(_))),
        "re-executed: {after:?}"
    );
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
    let key = attestor.inventory(&miner.url()).await.unwrap().miner_key;
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
