//! Sizes a challenge from a miner's inventory: expected throughput from the rate table, chain
//! count from the target duration, deadline from the expected time and the slack.

use crate::config::{ChallengeConfig, DeadlineConfig, RateEntry};
use gpu_attest_proto::v1;
use gpu_attest_shared::params::{ChallengeParams, MAX_CHAINS, MAX_SEGMENTS, MAX_TOTAL_CHECKPOINTS};

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub params: ChallengeParams,
    /// Operations per second the miner's devices should sustain together.
    pub expected_ops_per_sec: f64,
    pub expected_ms: u64,
    /// Time allowed from sending the challenge to receiving the commitment.
    pub deadline_ms: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("miner reports no devices")]
    NoDevices,
    #[error("miner's limits (max n {max_n}) are below the configured size {n}")]
    SizeOverLimit { n: u32, max_n: u32 },
    #[error("miner's limits (max iterations {max}) are below the configured {iterations}")]
    IterationsOverLimit { iterations: u32, max: u32 },
    #[error("the planned challenge is invalid: {0}")]
    Params(#[from] gpu_attest_shared::params::ParamsError),
}

/// Rate of one device: the first table entry whose pattern occurs in "backend kernel name".
pub fn device_rate(rates: &[RateEntry], backend: &str, kernel: &str, device_name: &str) -> f64 {
    let subject = format!("{backend} {kernel} {device_name}").to_lowercase();
    rates
        .iter()
        .find(|r| subject.contains(&r.pattern.to_lowercase()))
        .map(|r| r.ops_per_sec)
        .unwrap_or(1.0e9)
}

pub fn plan(
    inventory: &v1::Inventory,
    config: &ChallengeConfig,
    deadline: &DeadlineConfig,
    rates: &[RateEntry],
    nonce: [u8; 32],
    seed: [u8; 32],
    miner_key: [u8; 32],
) -> Result<Plan, PlanError> {
    let devices = inventory.devices.len() as u64;
    if devices == 0 {
        return Err(PlanError::NoDevices);
    }
    let limits = inventory.limits.unwrap_or_default();
    let n = if inventory.backend == "cpu" {
        config.cpu_n
    } else {
        config.gpu_n
    };
    if limits.max_n != 0 && n > limits.max_n {
        return Err(PlanError::SizeOverLimit { n, max_n: limits.max_n });
    }
    let iterations = config.iterations;
    if limits.max_iterations != 0 && iterations > limits.max_iterations {
        return Err(PlanError::IterationsOverLimit {
            iterations,
            max: limits.max_iterations,
        });
    }
    let rate: f64 = inventory
        .devices
        .iter()
        .map(|d| device_rate(rates, &inventory.backend, &inventory.kernel, &d.name))
        .sum();
    let ops_per_chain = 2.0 * f64::from(n).powi(3) * f64::from(iterations);
    let wanted = (rate * config.target_seconds / ops_per_chain).ceil() as u64;
    let segments = u64::from(iterations / config.checkpoint_every.max(1)).clamp(1, u64::from(MAX_SEGMENTS));
    let mut max_chains = MAX_CHAINS.min(MAX_TOTAL_CHECKPOINTS / (segments + 1));
    if limits.max_chains != 0 {
        max_chains = max_chains.min(limits.max_chains);
    }
    // At least one chain per device, so every device the miner claims has to work.
    let num_chains = wanted.clamp(devices.min(max_chains), max_chains);
    let expected_ms = (ops_per_chain * num_chains as f64 / rate * 1000.0).ceil() as u64;
    let deadline_ms = ((expected_ms as f64 * deadline.slack) as u64).max(deadline.min_ms);
    let params = ChallengeParams {
        nonce,
        seed,
        miner_key,
        n,
        num_chains,
        iterations,
        checkpoint_every: config.checkpoint_every,
    };
    params.validate()?;
    Ok(Plan {
        params,
        expected_ops_per_sec: rate,
        expected_ms,
        deadline_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::default_rates;

    fn inventory(backend: &str, kernel: &str, names: &[&str]) -> v1::Inventory {
        v1::Inventory {
            backend: backend.into(),
            kernel: kernel.into(),
            devices: names
                .iter()
                .map(|n| v1::DeviceInfo {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            limits: Some(v1::MinerLimits {
                max_n: 8192,
                max_chains: 1 << 16,
                max_iterations: 1 << 16,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A plan with the default deadline policy and rates, and zero nonce, seed and key.
    fn plan_for(inv: &v1::Inventory, cfg: &ChallengeConfig) -> Result<Plan, PlanError> {
        plan(
            inv,
            cfg,
            &DeadlineConfig::default(),
            &default_rates(),
            [0; 32],
            [0; 32],
            [0; 32],
        )
    }

    #[test]
    fn rates_match_first_pattern_case_insensitively() {
        let rates = default_rates();
        assert_eq!(device_rate(&rates, "cuda", "tensor", "NVIDIA H100 80GB HBM3"), 5.0e14);
        assert_eq!(device_rate(&rates, "cpu", "avx512-vnni", "cpu: Xeon"), 1.0e11);
        assert_eq!(device_rate(&rates, "cpu", "portable", "cpu: Ryzen"), 2.0e9);
    }

    #[test]
    fn chain_count_follows_target_and_device_count() {
        let mut inv = inventory("cuda", "tensor", &["NVIDIA H100", "NVIDIA H100"]);
        inv.limits.as_mut().unwrap().max_chains = 1 << 20;
        let cfg = ChallengeConfig::default();
        let seconds = |p: &Plan| 2.0 * f64::from(p.params.n).powi(3) * 16.0 * p.params.num_chains as f64 / 1.0e15;
        // Two H100s at 5e14 each: 30 s of work is about 109 000 chains of n = 2048, K = 16.
        let p = plan_for(&inv, &cfg).unwrap();
        assert!((seconds(&p) - 30.0).abs() < 0.1, "{}", seconds(&p));
        assert_eq!(p.deadline_ms, p.expected_ms * 2);
        // The miner's own limit caps the chain count (and so the work) below the target.
        inv.limits.as_mut().unwrap().max_chains = 1 << 16;
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
        inv.limits.as_mut().unwrap().max_n = 128;
        let err = plan_for(&inv, &ChallengeConfig::default());
        assert_eq!(err.unwrap_err(), PlanError::SizeOverLimit { n: 256, max_n: 128 });
        inv.devices.clear();
        let err = plan_for(&inv, &ChallengeConfig::default());
        assert_eq!(err.unwrap_err(), PlanError::NoDevices);
    }
}
