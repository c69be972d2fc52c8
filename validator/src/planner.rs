//! Sizes a challenge from one miner inventory (PROTOCOL.md section 15): expected throughput
//! from the rate table, chain count from the target duration, deadline from the expected time
//! and the slack, samples from the policy. Every limit the miner advertises is honoured: the
//! plan adapts where it can (fewer chains, fewer samples) and is refused where it cannot, so an
//! honest miner is never sent a challenge it must refuse or fail.

use crate::config::{ChallengeConfig, RateEntry, ValidatorConfig};
use gpu_attest_shared::inventory::{HardwareClaim, Inventory, InventoryError};
use gpu_attest_shared::params::{ChallengeParams, MAX_CHAINS, MAX_SEGMENTS, MAX_TOTAL_CHECKPOINTS};

/// Rate assumed for a device no table entry matches.
pub const FALLBACK_OPS_PER_SEC: f64 = 1.0e9;

/// Kept off a miner's `max_duration_ms`: the miner measures the deadline window on its own
/// clock, after the challenge has travelled, so a deadline planned right at the limit would be
/// refused by a miner whose clock runs a little behind.
pub const MINER_CLOCK_ALLOWANCE_MS: u64 = 2_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub params: ChallengeParams,
    /// The hardware the challenge was sized for; the signed challenge carries its digest.
    pub claim: HardwareClaim,
    /// Operations per second the miner's devices should sustain together.
    pub expected_ops_per_sec: f64,
    pub expected_ms: u64,
    /// Time allowed from sending the challenge to receiving the commitment.
    pub deadline_ms: u64,
    /// Openings to ask for under the sampled policy (0 under full re-execution).
    pub samples: u32,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error("miner's limits (max n {max_n}) are below the configured size {n}")]
    SizeOverLimit { n: u32, max_n: u32 },
    #[error("miner's limits (max iterations {max}) are below the configured {iterations}")]
    IterationsOverLimit { iterations: u32, max: u32 },
    #[error(
        "at most {max_chains} chains fit this miner's limits and the protocol's, fewer than its {devices} devices: a device without a chain would be named in the verdict without being tested"
    )]
    ChainsBelowDevices { max_chains: u64, devices: u64 },
    #[error(
        "miner accepts deadlines up to {max_duration_ms} ms, but even one chain per device needs a deadline of {needed_ms} ms (plus {MINER_CLOCK_ALLOWANCE_MS} ms for clock differences); raise the miner's max_duration_secs or lower the validator's deadline.min_ms or challenge size"
    )]
    DurationOverLimit { max_duration_ms: u64, needed_ms: u64 },
    #[error(
        "miner answers at most {max_samples} openings per request, below this validator's floor of {floor} (min_samples); raise the miner's max_samples"
    )]
    TooFewSamples { max_samples: u32, floor: u32 },
    #[error("the planned challenge is invalid: {0}")]
    Params(#[from] gpu_attest_shared::params::ParamsError),
}

/// Rate of one device: the first table entry whose pattern occurs in "backend kernel name"
/// (compared in lower case), else [`FALLBACK_OPS_PER_SEC`].
pub fn device_rate(rates: &[RateEntry], backend: &str, kernel: &str, device_name: &str) -> f64 {
    let subject = format!("{backend} {kernel} {device_name}").to_lowercase();
    rates
        .iter()
        .find(|r| subject.contains(&r.pattern.to_lowercase()))
        .map(|r| r.ops_per_sec)
        .unwrap_or(FALLBACK_OPS_PER_SEC)
}

/// The matrix size for a claim: CPU miners get the smaller one, so that a CPU validator can
/// check their samples quickly.
pub fn matrix_size(config: &ChallengeConfig, claim: &HardwareClaim) -> u32 {
    if claim.backend == "cpu" {
        config.cpu_n
    } else {
        config.gpu_n
    }
}

/// Times for `chains` chains at `rate`: (expected, deadline), both in milliseconds.
struct Timing {
    ops_per_chain: f64,
    rate: f64,
    slack: f64,
    min_ms: u64,
}

impl Timing {
    fn expected_ms(&self, chains: u64) -> u64 {
        (self.ops_per_chain * chains as f64 / self.rate * 1000.0).ceil() as u64
    }

    fn deadline_ms(&self, chains: u64) -> u64 {
        ((self.expected_ms(chains) as f64 * self.slack) as u64).max(self.min_ms)
    }

    /// The most chains (at most `upper`) whose deadline fits `window_ms`, if any.
    fn chains_within(&self, window_ms: u64, upper: u64) -> Option<u64> {
        if self.deadline_ms(1) > window_ms {
            return None;
        }
        // The closed form lands within a chain or two of the answer; the loops settle rounding.
        let estimate = (window_ms as f64 / self.slack / 1000.0 * self.rate / self.ops_per_chain).floor();
        let mut chains = (estimate.max(1.0) as u64).min(upper);
        while chains < upper && self.deadline_ms(chains + 1) <= window_ms {
            chains += 1;
        }
        while chains > 1 && self.deadline_ms(chains) > window_ms {
            chains -= 1;
        }
        Some(chains)
    }
}

/// Plans a challenge for `inventory` under `config`; `sampled` is the policy in force.
pub fn plan(
    inventory: &Inventory,
    config: &ValidatorConfig,
    sampled: bool,
    nonce: [u8; 32],
    seed: [u8; 32],
) -> Result<Plan, PlanError> {
    inventory.check()?;
    let claim = &inventory.claim;
    let limits = &inventory.limits;
    let challenge = &config.challenge;
    let devices = claim.devices.len() as u64;

    let n = matrix_size(challenge, claim);
    if limits.max_n != 0 && n > limits.max_n {
        return Err(PlanError::SizeOverLimit { n, max_n: limits.max_n });
    }
    let iterations = challenge.iterations;
    if limits.max_iterations != 0 && iterations > limits.max_iterations {
        return Err(PlanError::IterationsOverLimit {
            iterations,
            max: limits.max_iterations,
        });
    }

    let rate: f64 = claim
        .devices
        .iter()
        .map(|d| device_rate(&config.rates, &claim.backend, &claim.kernel, &d.name))
        .sum();
    let timing = Timing {
        ops_per_chain: 2.0 * f64::from(n).powi(3) * f64::from(iterations),
        rate,
        slack: config.deadline.slack,
        min_ms: config.deadline.min_ms,
    };

    let segments = u64::from(iterations / challenge.checkpoint_every.max(1)).clamp(1, u64::from(MAX_SEGMENTS));
    let mut max_chains = MAX_CHAINS.min(MAX_TOTAL_CHECKPOINTS / (segments + 1));
    if limits.max_chains != 0 {
        max_chains = max_chains.min(limits.max_chains);
    }
    if max_chains < devices {
        return Err(PlanError::ChainsBelowDevices { max_chains, devices });
    }
    // At least one chain per device, so every device the miner claims has to work.
    let wanted = (rate * challenge.target_seconds / timing.ops_per_chain).ceil() as u64;
    let mut num_chains = wanted.clamp(devices, max_chains);
    if limits.max_duration_ms != 0 {
        let window = limits.max_duration_ms.saturating_sub(MINER_CLOCK_ALLOWANCE_MS);
        let fitting = timing.chains_within(window, num_chains).filter(|&c| c >= devices);
        num_chains = fitting.ok_or(PlanError::DurationOverLimit {
            max_duration_ms: limits.max_duration_ms,
            needed_ms: timing.deadline_ms(devices),
        })?;
    }

    let samples = if sampled {
        let floor = config.min_samples.min(config.samples);
        let allowed = match limits.max_samples {
            0 => config.samples,
            max => config.samples.min(max),
        };
        if allowed < floor {
            return Err(PlanError::TooFewSamples {
                max_samples: limits.max_samples,
                floor,
            });
        }
        allowed
    } else {
        0
    };

    let params = ChallengeParams {
        nonce,
        seed,
        miner_key: inventory.miner_key.0,
        n,
        num_chains,
        iterations,
        checkpoint_every: challenge.checkpoint_every,
    };
    params.validate()?;
    Ok(Plan {
        params,
        claim: claim.clone(),
        expected_ops_per_sec: rate,
        expected_ms: timing.expected_ms(num_chains),
        deadline_ms: timing.deadline_ms(num_chains),
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::default_rates;
    use gpu_attest_shared::identity::PublicKey;
    use gpu_attest_shared::inventory::MinerLimits;
    use gpu_attest_shared::params::PROTOCOL_VERSION;
    use gpu_attest_shared::statement::DeviceInfo;

    fn inventory(backend: &str, kernel: &str, names: &[&str]) -> Inventory {
        Inventory {
            miner_key: PublicKey([7; 32]),
            claim: HardwareClaim {
                backend: backend.into(),
                kernel: kernel.into(),
                devices: names
                    .iter()
                    .enumerate()
                    .map(|(j, n)| DeviceInfo {
                        index: j as u32,
                        name: n.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            },
            protocol_version: PROTOCOL_VERSION,
            software_version: "test".into(),
            limits: MinerLimits {
                max_n: 8192,
                max_chains: 1 << 16,
                max_iterations: 1 << 16,
                max_duration_ms: 3_600_000,
                max_samples: 64,
            },
        }
    }

    fn config(challenge: ChallengeConfig) -> ValidatorConfig {
        ValidatorConfig {
            challenge,
            ..ValidatorConfig::default()
        }
    }

    /// A sampled plan with the default deadline policy and rates, and zero nonce and seed.
    fn plan_for(inv: &Inventory, cfg: &ChallengeConfig) -> Result<Plan, PlanError> {
        plan(inv, &config(cfg.clone()), true, [0; 32], [0; 32])
    }

    #[test]
    fn rates_match_first_pattern_case_insensitively() {
        let rates = default_rates();
        assert_eq!(device_rate(&rates, "cuda", "tensor", "NVIDIA H100 80GB HBM3"), 5.0e14);
        assert_eq!(device_rate(&rates, "cpu", "avx512-vnni", "cpu: Xeon"), 1.0e11);
        assert_eq!(device_rate(&rates, "cpu", "portable", "cpu: Ryzen"), 2.0e9);
        assert_eq!(device_rate(&[], "cpu", "portable", "cpu"), FALLBACK_OPS_PER_SEC);
    }

    #[test]
    fn chain_count_follows_target_and_device_count() {
        let mut inv = inventory("cuda", "tensor", &["NVIDIA H100", "NVIDIA H100"]);
        inv.limits.max_chains = 1 << 20;
        let cfg = ChallengeConfig::default();
        let seconds = |p: &Plan| 2.0 * f64::from(p.params.n).powi(3) * 16.0 * p.params.num_chains as f64 / 1.0e15;
        // Two H100s at 5e14 each: 30 s of work is about 109 000 chains of n = 2048, K = 16.
        let p = plan_for(&inv, &cfg).unwrap();
        assert!((seconds(&p) - 30.0).abs() < 0.1, "{}", seconds(&p));
        assert_eq!(p.deadline_ms, p.expected_ms * 2);
        assert_eq!(p.claim, inv.claim);
        assert_eq!(p.params.miner_key, [7; 32]);
        // The miner's own limit caps the chain count (and so the work) below the target.
        inv.limits.max_chains = 1 << 16;
        let capped = plan_for(&inv, &cfg).unwrap();
        assert_eq!(capped.params.num_chains, 1 << 16);
        assert!(seconds(&capped) < 30.0);
        // Tiny targets still give every device a chain, and the deadline floor applies.
        let tiny = ChallengeConfig {
            target_seconds: 0.0,
            ..cfg
        };
        let p = plan_for(&inv, &tiny).unwrap();
        assert_eq!(p.params.num_chains, 2);
        assert_eq!(p.deadline_ms, 5_000);
    }

    #[test]
    fn refuses_what_the_miner_cannot_take() {
        let mut inv = inventory("cpu", "portable", &["cpu"]);
        inv.limits.max_n = 128;
        let err = plan_for(&inv, &ChallengeConfig::default());
        assert_eq!(err.unwrap_err(), PlanError::SizeOverLimit { n: 256, max_n: 128 });
        inv.claim.devices.clear();
        let err = plan_for(&inv, &ChallengeConfig::default());
        assert_eq!(err.unwrap_err(), PlanError::Inventory(InventoryError::NoDevices));
        let mut many = inventory("cpu", "portable", &["cpu"; 65]);
        assert_eq!(
            plan_for(&many, &ChallengeConfig::default()).unwrap_err(),
            PlanError::Inventory(InventoryError::TooManyDevices(65))
        );
        many.claim.devices.truncate(64);
        many.limits.max_chains = 63;
        assert_eq!(
            plan_for(&many, &ChallengeConfig::default()).unwrap_err(),
            PlanError::ChainsBelowDevices {
                max_chains: 63,
                devices: 64
            }
        );
        let mut newer = inventory("cpu", "portable", &["cpu"]);
        newer.protocol_version = 2;
        assert_eq!(
            plan_for(&newer, &ChallengeConfig::default()).unwrap_err(),
            PlanError::Inventory(InventoryError::ProtocolVersion { theirs: 2, ours: 1 })
        );
    }

    #[test]
    fn samples_adapt_to_the_miner_down_to_the_floor() {
        let mut inv = inventory("cpu", "portable", &["cpu"]);
        let cfg = ValidatorConfig {
            samples: 32,
            min_samples: 8,
            ..ValidatorConfig::default()
        };
        let samples = |inv: &Inventory| plan(inv, &cfg, true, [0; 32], [0; 32]).map(|p| p.samples);
        assert_eq!(samples(&inv), Ok(32));
        inv.limits.max_samples = 12;
        assert_eq!(samples(&inv), Ok(12));
        inv.limits.max_samples = 0; // not stated
        assert_eq!(samples(&inv), Ok(32));
        inv.limits.max_samples = 7;
        assert_eq!(
            samples(&inv),
            Err(PlanError::TooFewSamples {
                max_samples: 7,
                floor: 8
            })
        );
        // Full re-execution opens nothing, so the miner's sample limit does not matter.
        assert_eq!(plan(&inv, &cfg, false, [0; 32], [0; 32]).unwrap().samples, 0);
    }

    #[test]
    fn the_fitted_chain_count_is_the_largest_that_fits() {
        for (rate, slack, min_ms) in [(1.0e8, 2.0, 1_500), (3.3e9, 1.3, 0), (7.0e6, 1.0, 250)] {
            let timing = Timing {
                ops_per_chain: 2.0 * 64f64.powi(3) * 4.0,
                rate,
                slack,
                min_ms,
            };
            for window in (0..200).map(|i| i * 137 + 11) {
                match timing.chains_within(window, 1 << 20) {
                    None => assert!(timing.deadline_ms(1) > window),
                    Some(m) => {
                        assert!(timing.deadline_ms(m) <= window, "{m} chains overrun {window} ms");
                        assert!(
                            timing.deadline_ms(m + 1) > window,
                            "{} chains also fit {window} ms",
                            m + 1
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn deadlines_fit_the_miners_max_duration() {
        let mut inv = inventory("cuda", "tensor", &["NVIDIA H100"]);
        inv.limits.max_chains = 1 << 20;
        let cfg = ChallengeConfig::default(); // 30 s of work, slack 2: a 60 s deadline
        let unlimited = plan_for(&inv, &cfg).unwrap();
        assert!(unlimited.deadline_ms > 50_000, "{}", unlimited.deadline_ms);
        // A 20 s limit: fewer chains, and the deadline plus the clock allowance fits.
        inv.limits.max_duration_ms = 20_000;
        let fitted = plan_for(&inv, &cfg).unwrap();
        assert!(
            fitted.deadline_ms <= 20_000 - MINER_CLOCK_ALLOWANCE_MS,
            "{}",
            fitted.deadline_ms
        );
        assert!(fitted.params.num_chains < unlimited.params.num_chains);
        // One more chain would not have fitted.
        let one_more = Timing {
            ops_per_chain: 2.0 * 2048f64.powi(3) * 16.0,
            rate: fitted.expected_ops_per_sec,
            slack: 2.0,
            min_ms: 5_000,
        }
        .deadline_ms(fitted.params.num_chains + 1);
        assert!(one_more > 20_000 - MINER_CLOCK_ALLOWANCE_MS, "{one_more}");
        // Below the deadline floor nothing fits: refused, never sent to be refused or failed.
        inv.limits.max_duration_ms = 6_000;
        assert_eq!(
            plan_for(&inv, &cfg).unwrap_err(),
            PlanError::DurationOverLimit {
                max_duration_ms: 6_000,
                needed_ms: 5_000
            }
        );
    }
}
