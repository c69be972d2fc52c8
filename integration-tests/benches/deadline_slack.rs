//! How tight can a calibrated deadline be on this machine? Real miner servers on loopback and a
//! real validator store: three honest miners calibrate their class, then
//! - HONEST honest attestations measure the spread of honest times over the expected time (the
//!   slack must exceed it, or honest miners fail);
//! - two under-provisioned miners are timed with a deadline they cannot miss, to measure their
//!   time over the expected time (the slack must stay below it, or they pass), then attested
//!   with the default slack, to show the verdict: one claims 2 devices of 2 cores and computes
//!   on 2 threads (exactly half the compute it claims), one states 2 cores and computes on 1
//!   thread (half the threads; on a 2-vCPU guest, more than half the compute).
//!
//! `cargo bench -p gpu-attest-integration-tests --bench deadline_slack [-- HONEST]`

#[path = "../tests/common/mod.rs"]
mod common;

use common::fleet::*;
use common::*;
use gpu_attest_validator::config::DeadlineConfig;
use gpu_attest_validator::store::Verdict;

const DEFAULT_HONEST: usize = 20;

fn time_ratio(v: &Verdict) -> f64 {
    v.measured_ms as f64 / v.expected_ms.max(1) as f64
}

fn summary(label: &str, mut ratios: Vec<f64>) {
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    println!(
        "{label:<44} n={:<3} min {:.3}  median {:.3}  p90 {:.3}  max {:.3}",
        ratios.len(),
        at(0.0),
        at(0.5),
        at(0.9),
        at(1.0)
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let honest_runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(DEFAULT_HONEST);
    let dir = TempDir::new("slack");
    let config = timing_config(&dir);
    let attestor = attestor(&config).await;
    let honest = honest_miners(1, CALIBRATING_MINERS).await;
    println!(
        "deadline slack study: n = {}, target {} s, default slack {} (first contact {})",
        config.challenge.cpu_n,
        config.challenge.target_seconds,
        config.deadline.observed_slack("cpu"),
        config.deadline.first_contact_slack
    );

    let learning = calibrate(&attestor, &honest, 4).await;
    let (first_contact, calibrated): (Vec<&Verdict>, Vec<&Verdict>) = learning
        .iter()
        .partition(|v| v.throughput.rate_source == learning[0].throughput.rate_source);
    summary(
        "first contact: honest time / expected",
        first_contact.iter().map(|v| time_ratio(v)).collect(),
    );
    summary(
        "calibrating: honest time / expected",
        calibrated.iter().map(|v| time_ratio(v)).collect(),
    );

    let mut honest_ratios = Vec::new();
    let mut honest_failures = 0;
    for i in 0..honest_runs {
        let miner = &honest[i % honest.len()];
        let v = attestor.attest(&miner.url(), &|_| {}).await.expect("attestation runs");
        if !v.passed {
            honest_failures += 1;
            println!("  honest FAIL: {:?}", v.reasons);
        }
        honest_ratios.push(time_ratio(&v));
    }
    summary("calibrated: honest time / expected", honest_ratios);
    println!("calibrated: honest failures {honest_failures} of {honest_runs}");

    // The cheats, timed without a deadline they could miss. They go last: they pass there, and
    // their slow rates then count as more (outvoted) miners.
    let mut loose_config = config.clone();
    loose_config.deadline = DeadlineConfig {
        slack: 10.0,
        cpu_slack: 10.0,
        ..config.deadline.clone()
    };
    let loose = common::attestor(&loose_config).await;
    let cheats = [
        (
            "half the claimed compute (4 cores on 2)",
            under_provisioned_miner(40, 2, 2).await,
        ),
        (
            "half the claimed threads (2 cores on 1)",
            under_provisioned_miner(41, 1, 1).await,
        ),
    ];
    for (label, cheat) in &cheats {
        let mut ratios = Vec::new();
        for _ in 0..5 {
            let v = loose.attest(&cheat.url(), &|_| {}).await.expect("attestation runs");
            ratios.push(time_ratio(&v));
        }
        summary(&format!("{label}: time / expected"), ratios);
        let mut caught = 0;
        for _ in 0..5 {
            let v = attestor.attest(&cheat.url(), &|_| {}).await.expect("attestation runs");
            if !v.passed {
                caught += 1;
            }
        }
        println!("{label} at the default slack: caught {caught} of 5");
    }
}
