//! Deadlines from calibrated rates, with real miner servers on loopback and a real validator
//! store: a miner that claims more compute than it has misses the deadline, honest ones pass.
//!
//! This file holds one test, so that its binary runs alone (test binaries run one after
//! another): no other test competes for the CPU while it times the miners.

mod common;

use common::fleet::*;
use common::*;
use gpu_attest_validator::verdict::class::RateSource;
use gpu_attest_validator::verdict::reason::ReasonCode;

#[tokio::test(flavor = "multi_thread")]
async fn calibrated_deadlines_fail_an_under_provisioned_miner_and_pass_honest_ones() {
    let dir = TempDir::new("deadlines");
    let config = timing_config(&dir);
    let attestor = attestor(&config).await;
    let honest = honest_miners(1, CALIBRATING_MINERS).await;

    // First contact: the shipped rate, the wide slack. Two rounds teach the class.
    let learning = calibrate(&attestor, &honest, 2).await;
    let first = &learning[0].throughput;
    assert_eq!(first.rate_source, Some(RateSource::Shipped));
    assert_eq!(first.slack, config.deadline.first_contact_slack);
    let calibrated = &learning.last().unwrap().throughput;
    assert_eq!(calibrated.rate_miners, u32::from(CALIBRATING_MINERS));
    let slack = config.deadline.observed_slack("cpu");
    assert_eq!(calibrated.slack, slack);

    // Claims 8 devices of 2 cores and computes on one thread: a sixteenth of the claimed
    // compute at best. The challenge is sized for what it claims, so it cannot finish even by
    // the finish-by time (3 expected times at the calibrated slack), with room for the load on
    // a busy machine: with 4 devices a CI run saw it finish at 2.7 expected times, because the
    // honest miners' 2 threads had taught the class under load and its one thread then ran free.
    let cheat = under_provisioned_miner(40, 8, 1).await;
    let verdict = attestor.attest(&cheat.url(), &|_| {}).await.expect("attestation runs");
    assert_failed_with(&verdict, ReasonCode::CommitmentTimedOut);
    assert_eq!(verdict.throughput.rate_source, Some(RateSource::Calibrated));
    assert_eq!(
        verdict.throughput.proven_ops_per_sec, None,
        "a failed verdict proves no rate"
    );
    println!("under-provisioned miner: {:?}", verdict.reasons);

    // The honest miners pass every time under the same calibrated deadlines, and the deadline
    // is the tight (CPU) slack times the expected time.
    for verdict in calibrate(&attestor, &honest, 2).await {
        let t = &verdict.throughput;
        assert_eq!((t.rate_source, t.slack), (Some(RateSource::Calibrated), slack));
        assert_eq!(verdict.deadline_ms, (verdict.expected_ms as f64 * slack).ceil() as u64);
        println!(
            "honest: {} ms of {} ms allowed; {t}",
            verdict.measured_ms, verdict.deadline_ms
        );
    }
}
