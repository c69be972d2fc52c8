//! How tight can a calibrated deadline be on this machine, and what does the retest band cost?
//! Real miner servers on loopback and a real validator store: three honest miners calibrate
//! their class, then
//! - HONEST honest attestations (200 by default) measure the spread of honest times over the
//!   expected time (the slack must exceed it, or honest miners fail) and count the FAILs stored
//!   (the retest band is there so that this is 0);
//! - two under-provisioned miners are timed with a deadline they cannot miss, to measure their
//!   time over the expected time (the slack must stay below it, or they pass), then attested
//!   with the default slack and band: one claims 2 devices of 2 cores and computes on 2
//!   threads (exactly half the compute it claims), CHEATS times (100 by default); one states 2
//!   cores and computes on 1 thread (half the threads; on a 2-vCPU guest, more than half the
//!   compute), 5 times;
//! - from the honest spread, the chance that a miner holding a given share of the class rate
//!   passes, without and with the retest (SECURITY.md "Graded misses").
//!
//! `cargo bench -p gpu-attest-integration-tests --bench deadline_slack [-- HONEST [CHEATS]]`

#[path = "../tests/common/mod.rs"]
mod common;

use common::fleet::*;
use common::*;
use gpu_attest_validator::config::DeadlineConfig;
use gpu_attest_validator::verdict::Verdict;

const DEFAULT_HONEST: usize = 200;
const DEFAULT_CHEATS: usize = 100;

fn time_ratio(v: &Verdict) -> f64 {
    v.measured_ms as f64 / v.expected_ms.max(1) as f64
}

/// Every run a verdict holds, as time over expected: its own, and the first run its retest
/// replaced.
fn run_ratios(v: &Verdict) -> Vec<f64> {
    let mut ratios = vec![time_ratio(v)];
    if let Some(first) = &v.first_run {
        ratios.push(first.measured_ms as f64 / first.expected_ms.max(1) as f64);
    }
    ratios
}

fn summary(label: &str, mut ratios: Vec<f64>) {
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    println!(
        "{label:<44} n={:<3} min {:.3}  median {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
        ratios.len(),
        at(0.0),
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
}

/// The share of honest runs at most `x` times the expected time.
fn cdf(sorted: &[f64], x: f64) -> f64 {
    sorted.partition_point(|&r| r <= x) as f64 / sorted.len() as f64
}

/// A miner that holds `held` of its class's rate takes `X / held` of the expected time, `X`
/// drawn from the honest spread. One run passes with `p = F(S * held)`; with the band `B`, a run
/// that misses by at most `B` deadlines is retested once, so the attestation passes with
/// `p + (F(B * S * held) - p) * p`, never more than `1 - (1 - p)^2`.
fn pass_table(honest: &[f64], slack: f64, band: f64) {
    let mut sorted = honest.to_vec();
    sorted.sort_by(f64::total_cmp);
    println!(
        "pass probability by the share of the class rate held (honest spread of {} runs, slack {slack}, band {band}):",
        sorted.len()
    );
    println!("  held   one run   with the retest");
    for held in [0.45, 0.50, 0.55, 1.0 / slack, 0.60, 0.65, 0.70, 0.80, 1.0] {
        let p = cdf(&sorted, slack * held);
        let in_band = cdf(&sorted, band * slack * held) - p;
        println!("  {held:.3}  {p:>7.3}   {:>7.3}", p + in_band * p);
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut counts = std::env::args().skip(1).filter_map(|a| a.parse::<usize>().ok());
    let honest_runs = counts.next().unwrap_or(DEFAULT_HONEST);
    let cheat_runs = counts.next().unwrap_or(DEFAULT_CHEATS);
    let dir = TempDir::new("slack");
    let config = timing_config(&dir);
    let attestor = attestor(&config).await;
    let honest = honest_miners(1, CALIBRATING_MINERS).await;
    let slack = config.deadline.observed_slack("cpu");
    println!(
        "deadline slack study: n = {}, target {} s, default slack {slack} (first contact {}), finish-by {} deadlines, retest band {}",
        config.challenge.cpu_n,
        config.challenge.target_seconds,
        config.deadline.first_contact_slack,
        config.deadline.finish_by,
        config.deadline.retest_band
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
    let (mut stored_fails, mut retested) = (0, 0);
    for i in 0..honest_runs {
        let miner = &honest[i % honest.len()];
        let v = attestor.attest(&miner.url(), &|_| {}).await.expect("attestation runs");
        if let Some(first) = &v.first_run {
            retested += 1;
            println!(
                "  honest retest: first run {} ms of a {} ms deadline; the retest {}",
                first.measured_ms,
                first.deadline_ms,
                if v.passed { "passed" } else { "failed" }
            );
        }
        if !v.passed {
            stored_fails += 1;
            println!("  honest FAIL stored: {:?}", v.reasons);
        }
        honest_ratios.extend(run_ratios(&v));
        if (i + 1) % 50 == 0 {
            println!("  {} of {honest_runs} honest attestations", i + 1);
        }
    }
    summary("calibrated: honest time / expected", honest_ratios.clone());
    println!("calibrated: {stored_fails} FAILs stored of {honest_runs} honest attestations ({retested} retested)");

    // The cheats, timed without a deadline they could miss. They go last: they pass there, and
    // their slow rates then count as more (outvoted) miners.
    let mut loose_config = config.clone();
    loose_config.deadline = DeadlineConfig {
        slack: 10.0,
        cpu_slack: 10.0,
        retest_band: 1.0,
        ..config.deadline.clone()
    };
    let loose = common::attestor(&loose_config).await;
    let cheats = [
        (
            "half the claimed compute (4 cores on 2)",
            under_provisioned_miner(40, 2, 2).await,
            cheat_runs,
        ),
        (
            "half the claimed threads (2 cores on 1)",
            under_provisioned_miner(41, 1, 1).await,
            5,
        ),
    ];
    for (label, cheat, runs) in &cheats {
        let mut ratios = Vec::new();
        for _ in 0..5 {
            let v = loose.attest(&cheat.url(), &|_| {}).await.expect("attestation runs");
            ratios.push(time_ratio(&v));
        }
        summary(&format!("{label}: time / expected"), ratios);
        let (mut caught, mut retested, mut graded) = (0, 0, 0);
        for _ in 0..*runs {
            let v = attestor.attest(&cheat.url(), &|_| {}).await.expect("attestation runs");
            if !v.passed {
                caught += 1;
                if v.throughput.proven_ops_per_sec.is_some() {
                    graded += 1;
                }
            }
            if v.first_run.is_some() {
                retested += 1;
            }
        }
        println!(
            "{label} at the default slack: caught {caught} of {runs} ({graded} graded misses; {retested} retested)"
        );
    }
    pass_table(&honest_ratios, slack, config.deadline.retest_band);
}
