//! A validator timed by calibrated rates: honest miners teach it their class, then it times
//! everyone by what they proved. Shared by the deadline tests and the slack benchmark.

use super::*;
use gpu_attest_validator::config::calibration::CalibrationConfig;
use gpu_attest_validator::verdict::class::RateSource;

/// Distinct honest miners that calibrate the class: the default `min_miners`.
pub const CALIBRATING_MINERS: u8 = 3;

/// Challenges that take real time on a CPU, timed by the validator's own defaults: the shipped
/// rate table alone (so first contact is sized about right, and calibration starts from runs of the
/// same size as later ones), its challenge shape, slacks, floor and calibration, with 3 s of
/// target work instead of 30. The CPU size n = 256 is one where a second thread adds compute
/// (at smaller n one thread does nearly as much as two, and a "core" would prove nothing).
/// Shorter challenges time worse on a shared VM: at 1.5 s with 4 steps per chain, honest runs
/// spread over 1.5x, against 1.25x at this size (BENCHMARKS.md, "Deadline slack").
pub fn timing_config(dir: &TempDir) -> ValidatorConfig {
    let mut config = validator_config(dir, Policy::Sampled);
    config.challenge = ChallengeConfig {
        target_seconds: 3.0,
        ..ChallengeConfig::default()
    };
    config.deadline = DeadlineConfig::default();
    config.calibration = CalibrationConfig::default();
    config.rates = Vec::new();
    config
}

/// Honest miners on the test CPU backend, with seeds from `first_seed` on.
pub async fn honest_miners(first_seed: u8, count: u8) -> Vec<Running> {
    let mut miners = Vec::new();
    for seed in first_seed..first_seed + count {
        miners.push(spawn_miner(miner_core(seed, &[validator_key()], 1)).await);
    }
    miners
}

/// Attests each miner `rounds` times, round by round; every verdict must pass (these miners are
/// honest). Returns the verdicts in order.
pub async fn calibrate(attestor: &Attestor, miners: &[Running], rounds: u32) -> Vec<Verdict> {
    // Registered first: only the operator's registered miners teach the validator their class.
    for miner in miners {
        let key = attestor.inventory(&miner.url()).await.expect("inventory").0.miner_key;
        let url = gpu_attest_validator::attest::normalise_url(&miner.url());
        attestor
            .store()
            .register_miner(&url, Some("honest"), key, false, 0)
            .await
            .expect("register");
    }
    let mut verdicts = Vec::new();
    for _ in 0..rounds {
        for miner in miners {
            let verdict = attestor.attest(&miner.url(), &|_| {}).await.expect("attestation runs");
            assert!(
                verdict.passed,
                "an honest miner failed while calibrating ({}): {:?}",
                verdict.throughput, verdict.reasons
            );
            verdicts.push(verdict);
        }
    }
    let last = &verdicts.last().expect("at least one round").throughput;
    assert_eq!(
        last.rate_source,
        Some(RateSource::Calibrated),
        "the class is calibrated after every miner passed"
    );
    verdicts
}

/// A miner that claims `devices` devices of [`TEST_CORES`] cores each but computes on
/// `threads` threads.
pub async fn under_provisioned_miner(seed: u8, devices: u32, threads: usize) -> Running {
    let backend = cpu_backend_on(threads, devices);
    spawn_miner(miner_on(
        seed,
        &[validator_key()],
        backend,
        Limits::default(),
        NonceLog::in_memory(),
    ))
    .await
}
