//! Sizes a challenge from one miner inventory (PROTOCOL.md section 15): expected throughput
//! from the rate book (calibrated, shared or shipped rates per hardware class), chain count from
//! the target duration, deadline from the expected time and the slack that the rates' source
//! earns, samples from the policy. Every limit the miner advertises is honoured: the
//! plan adapts where it can (fewer chains, fewer samples) and is refused where it cannot, so an
//! honest miner is never sent a challenge it must refuse or fail.

use crate::config::{ChallengeConfig, ValidatorConfig};
use crate::memory::MemoryPlan;
use crate::memory::plan::{MemoryPlanError, plan_memory};
use crate::memory::plan_v4::{ChainPoolPlan, ExpectedWalk, PlanV4Error, V4Settings, plan_chain_pools};
use crate::rates::class::units;
use crate::rates::class::{walk_class, walk_v4_class};
use crate::rates::{RateBook, RateClass, RateSource};
use crate::throughput::Expectation;
use gpu_attest_shared::inventory::{HardwareClaim, Inventory, InventoryError};
use gpu_attest_shared::params::{
    ChallengeParams, MAX_CHAINS, MAX_SEGMENTS, MAX_TOTAL_CHECKPOINTS, NEWEST_PROTOCOL_VERSION,
};

/// Kept off a miner's `max_duration_ms`: the miner measures the deadline window on its own
/// clock, after the challenge has travelled, so a deadline planned right at the limit would be
/// refused by a miner whose clock runs a little behind.
pub const MINER_CLOCK_ALLOWANCE_MS: u64 = 2_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub params: ChallengeParams,
    /// The hardware the challenge was sized for; the signed challenge carries its digest.
    pub claim: HardwareClaim,
    /// Operations per second the miner's devices should sustain together, and on what evidence.
    pub expectation: Expectation,
    pub expected_ms: u64,
    /// Time allowed from sending the challenge to receiving the commitment.
    pub deadline_ms: u64,
    /// Time from sending the challenge by which a late commitment still proves its rate, on a
    /// failing verdict (PROTOCOL.md 15, step 11; from sending, not from the deadline). 0: the
    /// challenge has no finish-by time.
    pub finish_by_ms: u64,
    /// Openings to ask for under the sampled policy (0 under full re-execution).
    pub samples: u32,
    /// The memory phase (protocol version 3); `None` when the challenge has none.
    pub memory: Option<MemoryPlan>,
    /// Version 4's memory phase (PROTOCOL.md 20), for a miner whose inventory says 4; never
    /// beside `memory`.
    pub chain_pool: Option<ChainPoolPlan>,
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
        "at most {max_chains} chains fit this miner's limits and the protocol's, but {needed} are needed for a deadline of at least {min_ms} ms (deadline.min_ms); a shorter challenge would time the network rather than the hardware: raise the miner's max_chains"
    )]
    TooLittleWork { max_chains: u64, needed: u64, min_ms: u64 },
    #[error(
        "miner accepts deadlines up to {max_duration_ms} ms, but the smallest challenge this validator sends it (at least one chain per device, and enough chains to reach deadline.min_ms) has a deadline of {needed_ms} ms (plus {MINER_CLOCK_ALLOWANCE_MS} ms for clock differences); raise the miner's max_duration_secs or lower the validator's deadline.min_ms or challenge size"
    )]
    DurationOverLimit { max_duration_ms: u64, needed_ms: u64 },
    #[error(
        "miner answers at most {max_samples} openings per request, below this validator's floor of {floor} (min_samples); raise the miner's max_samples"
    )]
    TooFewSamples { max_samples: u32, floor: u32 },
    #[error("the planned challenge is invalid: {0}")]
    Params(#[from] gpu_attest_shared::params::ParamsError),
    #[error(transparent)]
    Memory(#[from] MemoryPlanError),
    #[error("cannot plan version 4's memory phase: {0}")]
    ChainPool(#[from] PlanV4Error),
    #[error(
        "version 4's pools need {needed} chains (each device's pool is its first chains' states), but at most {max_chains} fit this miner's limits and the protocol's: raise the miner's max_chains"
    )]
    PoolChainsOverLimit { needed: u64, max_chains: u64 },
}

/// Version 4's memory phase for a miner whose inventory says 4, when this validator asks for a
/// memory phase (PROTOCOL.md 20). Each device's walk is expected at its own `walk-v4` class's
/// rate: learned from version 4 passes only, and until then the shipped first-contact rate with
/// the first-contact slack. Never at a version 3 walk rate: that one was measured with the host
/// inside the clock, and timing version 4 by it would let the clock hide more of each pool than
/// the verdict states.
fn plan_chain_pool(
    inventory: &Inventory,
    config: &ValidatorConfig,
    rates: &RateBook,
    n: u32,
) -> Result<Option<ChainPoolPlan>, PlanV4Error> {
    if !config.memory.enabled || inventory.protocol_version < NEWEST_PROTOCOL_VERSION {
        return Ok(None);
    }
    let claim = &inventory.claim;
    let expected: Vec<ExpectedWalk> = claim
        .devices
        .iter()
        .map(|device| {
            let class = rates.expected(&walk_v4_class(claim, device, n));
            ExpectedWalk {
                bytes_per_sec: class.ops_per_unit * units(&claim.backend, device),
                source: class.source,
            }
        })
        .collect();
    let memory = &config.memory;
    let settings = V4Settings {
        calibrated_slack: memory.slack,
        first_contact_slack: memory.first_contact_slack,
        walkers_per_gpu: memory.walkers_per_gpu,
        walkers_per_core: memory.walkers_per_core,
        walk_target_ms: memory.walk_target_ms,
        ..V4Settings::default()
    };
    plan_chain_pools(
        &claim.backend,
        &claim.devices,
        &expected,
        n,
        config.challenge.checkpoint_every,
        &settings,
    )
    .map(Some)
}

/// The hardware classes of a claim's devices, at the size the planner gives it, and their walk
/// classes of both versions when the memory phase is asked for: every rate a plan looks up.
pub fn classes(claim: &HardwareClaim, config: &ValidatorConfig) -> Vec<RateClass> {
    let n = matrix_size(&config.challenge, claim);
    let compute = claim.devices.iter().map(|d| RateClass::of(claim, d, n));
    let walk = claim
        .devices
        .iter()
        .filter(|_| config.memory.enabled)
        .flat_map(|d| [walk_class(claim, d), walk_v4_class(claim, d, n)]);
    compute.chain(walk).collect()
}

/// Seconds the pools take to fill: each device's pool at its compute rate, each fill operation
/// counted as the fill's weight in chain operations (PROTOCOL.md 18.6 step 5: GEMMs at n = 256
/// run several times below the class's rate at its own n on GPUs; [`crate::memory::fill`]).
fn fill_seconds(claim: &HardwareClaim, n: u32, rates: &RateBook, memory: &MemoryPlan) -> f64 {
    claim
        .devices
        .iter()
        .zip(&memory.pools)
        .map(|(device, pool)| {
            let rate = rates.expected(&RateClass::of(claim, device, n)).ops_per_unit * units(&claim.backend, device);
            memory.fill_weight * pool.fill_ops() / rate
        })
        .fold(0.0, f64::max)
}

/// What the claimed devices should sustain together: the sum of their classes' rates times
/// their units. The source reported is the weakest among the classes. The slack is each
/// device's own (tight for an observed rate, wide at first contact), combined so that the
/// deadline demands the sum of the devices' least acceptable rates, `r_j / S_j`: one odd device
/// at first contact loosens the deadline by its own share, not the whole claim's.
pub fn expectation(claim: &HardwareClaim, n: u32, rates: &RateBook, config: &ValidatorConfig) -> Expectation {
    let slack_of = |source: RateSource| {
        if source.is_observed() {
            config.deadline.observed_slack(&claim.backend)
        } else {
            config.deadline.first_contact_slack
        }
    };
    let mut ops_per_sec = 0.0;
    let mut peak_ops_per_sec = 0.0;
    let mut least_ops_per_sec = 0.0;
    let mut miners = u32::MAX;
    let mut weakest = RateSource::Calibrated;
    let mut strongest = RateSource::Shipped;
    for device in &claim.devices {
        let class = RateClass::of(claim, device, n);
        let e = rates.expected(&class);
        let rate = e.ops_per_unit * units(&claim.backend, device);
        ops_per_sec += rate;
        peak_ops_per_sec += rates.ceiling(&class) * units(&claim.backend, device);
        least_ops_per_sec += rate / slack_of(e.source);
        miners = miners.min(e.miners);
        weakest = weakest.weaker(e.source);
        strongest = strongest.stronger(e.source);
    }
    // Devices that all share one slack get it as it is, free of rounding.
    let slack = if slack_of(weakest) == slack_of(strongest) || least_ops_per_sec <= 0.0 {
        slack_of(weakest)
    } else {
        ops_per_sec / least_ops_per_sec
    };
    Expectation {
        ops_per_sec,
        source: Some(weakest),
        miners: if weakest.is_observed() { miners } else { 0 },
        slack,
        peak_ops_per_sec,
    }
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

/// Times for a number of chains at `rate`, plus a fixed part (the pools' fill), in
/// milliseconds. The deadline is always the expected time times the slack: the planner meets
/// `min_ms` with more work, never with a looser deadline.
struct Timing {
    ops_per_chain: f64,
    rate: f64,
    slack: f64,
    /// Seconds of work besides the chains.
    fixed_s: f64,
}

impl Timing {
    fn expected_ms(&self, chains: u64) -> u64 {
        ((self.ops_per_chain * chains as f64 / self.rate + self.fixed_s) * 1000.0).ceil() as u64
    }

    fn deadline_ms(&self, chains: u64) -> u64 {
        (self.expected_ms(chains) as f64 * self.slack).ceil() as u64
    }

    /// The chains whose deadline is `deadline_ms`, in closed form before rounding.
    fn chains_for_deadline(&self, deadline_ms: u64) -> f64 {
        (deadline_ms as f64 / self.slack / 1000.0 - self.fixed_s) * self.rate / self.ops_per_chain
    }

    /// The chain count (at least 1, at most `upper`) nearest `estimate` from below for which
    /// `fits` holds, if any, given that `fits` holds for all counts up to some bound.
    fn largest(&self, estimate: f64, upper: u64, fits: impl Fn(u64) -> bool) -> Option<u64> {
        if upper == 0 || !fits(1) {
            return None;
        }
        // The closed form lands within a chain or two of the answer; the loops settle rounding.
        let mut chains = (estimate.max(1.0) as u64).clamp(1, upper);
        while chains < upper && fits(chains + 1) {
            chains += 1;
        }
        while chains > 1 && !fits(chains) {
            chains -= 1;
        }
        Some(chains)
    }

    /// The most chains (at most `upper`) whose deadline fits `window_ms`, if any.
    fn chains_within(&self, window_ms: u64, upper: u64) -> Option<u64> {
        let estimate = self.chains_for_deadline(window_ms).floor();
        self.largest(estimate, upper, |c| self.deadline_ms(c) <= window_ms)
    }

    /// The fewest chains whose deadline reaches `min_ms` (1 if any does); `upper + 1` if even
    /// `upper` chains fall short.
    fn fewest_reaching(&self, min_ms: u64, upper: u64) -> u64 {
        if self.deadline_ms(1) >= min_ms {
            return 1;
        }
        // The largest count that still falls short, plus one.
        let estimate = self.chains_for_deadline(min_ms).floor();
        self.largest(estimate, upper, |c| self.deadline_ms(c) < min_ms)
            .map_or(1, |short| short + 1)
    }
}

/// Plans a challenge for `inventory` under `config` with the rates in `rates`; `sampled` is the
/// policy in force.
pub fn plan(
    inventory: &Inventory,
    config: &ValidatorConfig,
    rates: &RateBook,
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
    let chain_pool = plan_chain_pool(inventory, config, rates, n)?;
    // A version 4 pool state costs kappa operations a byte to make again only if its chain ran
    // long enough (PROTOCOL.md 20, docs/design/protocol-v4.md 2.2).
    let iterations = match &chain_pool {
        Some(pool) => challenge.iterations.max(pool.min_iterations),
        None => challenge.iterations,
    };
    if limits.max_iterations != 0 && iterations > limits.max_iterations {
        return Err(PlanError::IterationsOverLimit {
            iterations,
            max: limits.max_iterations,
        });
    }

    let expectation = expectation(claim, n, rates, config);
    let rate = expectation.ops_per_sec;
    let memory = match chain_pool {
        Some(_) => None,
        None => plan_memory(inventory, &config.memory, rates)?,
    };
    let timing = Timing {
        ops_per_chain: 2.0 * f64::from(n).powi(3) * f64::from(iterations),
        rate,
        slack: expectation.slack,
        fixed_s: memory.as_ref().map_or(0.0, |m| fill_seconds(claim, n, rates, m)),
    };

    let segments = u64::from(iterations / challenge.checkpoint_every.max(1)).clamp(1, u64::from(MAX_SEGMENTS));
    let mut max_chains = MAX_CHAINS.min(MAX_TOTAL_CHECKPOINTS / (segments + 1));
    if limits.max_chains != 0 {
        max_chains = max_chains.min(limits.max_chains);
    }
    if max_chains < devices {
        return Err(PlanError::ChainsBelowDevices { max_chains, devices });
    }
    // At least one chain per device, so every device the miner claims has to work, and enough
    // work that the deadline reaches the floor.
    // Searched within the cap: the search walks chain by chain across rounding plateaus, so an
    // absurd claimed rate must not make it walk far. A refusal states the closed-form count.
    let pool_chains = chain_pool.as_ref().map_or(0, |p| p.min_chains);
    if pool_chains > max_chains {
        return Err(PlanError::PoolChainsOverLimit {
            needed: pool_chains,
            max_chains,
        });
    }
    let fewest = timing
        .fewest_reaching(config.deadline.min_ms, max_chains)
        .max(devices)
        .max(pool_chains);
    if fewest > max_chains {
        let needed = timing.chains_for_deadline(config.deadline.min_ms).ceil();
        return Err(PlanError::TooLittleWork {
            max_chains,
            needed: (needed as u64).max(max_chains + 1),
            min_ms: config.deadline.min_ms,
        });
    }
    let wanted = (rate * challenge.target_seconds / timing.ops_per_chain).ceil() as u64;
    let mut num_chains = wanted.clamp(fewest, max_chains);
    if limits.max_duration_ms != 0 {
        let window = limits.max_duration_ms.saturating_sub(MINER_CLOCK_ALLOWANCE_MS);
        let fitting = timing.chains_within(window, num_chains).filter(|&c| c >= fewest);
        num_chains = fitting.ok_or(PlanError::DurationOverLimit {
            max_duration_ms: limits.max_duration_ms,
            needed_ms: timing.deadline_ms(fewest),
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
    let deadline_ms = timing.deadline_ms(num_chains);
    Ok(Plan {
        params,
        claim: claim.clone(),
        expectation,
        expected_ms: timing.expected_ms(num_chains),
        deadline_ms,
        finish_by_ms: finish_by_ms(deadline_ms, config.deadline.finish_by, inventory),
        samples,
        memory,
        chain_pool,
    })
}

/// PROTOCOL.md 15, step 11: `factor` deadlines, within the miner's `max_duration_ms` less the
/// clock allowance; none for a miner that does not take one, or when that leaves no time past
/// the deadline. The limit shortens the late window, never the deadline's work: a miner with a
/// tight limit gets the challenge it would have got, and less time to be late in.
fn finish_by_ms(deadline_ms: u64, factor: f64, inventory: &Inventory) -> u64 {
    if !inventory.takes_finish_by {
        return 0;
    }
    let wanted = (deadline_ms as f64 * factor).ceil() as u64;
    let finish_by = match inventory.limits.max_duration_ms {
        0 => wanted,
        max => wanted.min(max.saturating_sub(MINER_CLOCK_ALLOWANCE_MS)),
    };
    if finish_by > deadline_ms { finish_by } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryConfig;
    use crate::rates::calibration::{CalibrationConfig, Observation};
    use crate::rates::shipped::shipped_rates;
    use gpu_attest_shared::inventory::MinerLimits;
    use gpu_attest_shared::keys::KeyPair;
    use gpu_attest_shared::params::PROTOCOL_VERSION;
    use gpu_attest_shared::statement::DeviceInfo;

    const H100: &str = "NVIDIA H100 80GB HBM3";
    /// The shipped expected rate of one H100: half its dense int8 figure.
    const H100_RATE: f64 = 1.979e15 / 2.0;
    const OPS_PER_CHAIN: f64 = 2.0 * 2048.0 * 2048.0 * 2048.0 * 16.0;

    fn inventory(backend: &str, kernel: &str, names: &[&str]) -> Inventory {
        Inventory {
            miner_key: KeyPair::from_seed([7; 32]).public_key(),
            claim: HardwareClaim {
                backend: backend.into(),
                kernel: kernel.into(),
                devices: names
                    .iter()
                    .enumerate()
                    .map(|(j, n)| DeviceInfo {
                        index: j as u32,
                        name: n.to_string(),
                        sm_count: 4,
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
            takes_finish_by: true,
        }
    }

    /// The chains alone: the memory phase's planning has tests of its own below.
    fn config(challenge: ChallengeConfig) -> ValidatorConfig {
        ValidatorConfig {
            challenge,
            memory: MemoryConfig {
                enabled: false,
                ..MemoryConfig::default()
            },
            ..ValidatorConfig::default()
        }
    }

    fn shipped_book() -> RateBook {
        RateBook::shipped(shipped_rates(), CalibrationConfig::default())
    }

    /// One CUDA device `name` claiming `memory_bytes`, saying version 4, with room for the
    /// chains its pool needs.
    fn v4_inventory(name: &str, memory_bytes: u64) -> Inventory {
        let mut inv = inventory("cuda", "tensor", &[name]);
        inv.protocol_version = 4;
        inv.claim.devices[0].memory_bytes = memory_bytes;
        inv.limits.max_chains = 1 << 20;
        inv
    }

    /// A sampled plan with the default deadline policy and shipped rates, and zero nonce and seed.
    fn plan_for(inv: &Inventory, cfg: &ChallengeConfig) -> Result<Plan, PlanError> {
        plan(inv, &config(cfg.clone()), &shipped_book(), true, [0; 32], [0; 32])
    }

    fn seconds(p: &Plan) -> f64 {
        OPS_PER_CHAIN * p.params.num_chains as f64 / p.expectation.ops_per_sec
    }

    #[test]
    fn expected_rate_is_per_device_on_gpus_and_per_core_on_cpus() {
        let cfg = ValidatorConfig::default();
        let book = shipped_book();
        let gpus = inventory("cuda", "tensor", &[H100, H100]);
        let e = expectation(&gpus.claim, 2048, &book, &cfg);
        assert_eq!(e.ops_per_sec, 2.0 * H100_RATE);
        assert_eq!((e.source, e.miners, e.slack), (Some(RateSource::Shipped), 0, 3.0));
        // Four cores of avx512-vnni at the shipped 1.4e11 per core.
        let cpu = inventory("cpu", "avx512-vnni", &["cpu: Xeon"]);
        let e = expectation(&cpu.claim, 256, &book, &cfg);
        assert_eq!(e.ops_per_sec, 4.0 * 1.4e11);
        // The peaks a verdict states its share of: two H100s' datasheet figures; four cores of
        // 256 int8 operations a cycle at 5 GHz.
        assert_eq!(
            expectation(&gpus.claim, 2048, &book, &cfg).peak_ops_per_sec,
            2.0 * 1.979e15
        );
        assert_eq!(e.peak_ops_per_sec, 4.0 * 256.0 * 5.0e9);
    }

    #[test]
    fn observed_rates_earn_the_tight_slack_only_for_every_device() {
        let cfg = ValidatorConfig::default();
        let mut book = shipped_book();
        let votes: Vec<Observation> = (1..=3)
            .map(|m| Observation {
                miner_key: [m; 32],
                ops_per_unit: 7.0e14,
            })
            .collect();
        let claim = inventory("cuda", "tensor", &[H100]).claim;
        book.learn(RateClass::of(&claim, &claim.devices[0], 2048), &votes);
        let e = expectation(&claim, 2048, &book, &cfg);
        assert_eq!(
            (e.ops_per_sec, e.source, e.miners),
            (7.0e14, Some(RateSource::Calibrated), 3)
        );
        assert_eq!(e.slack, cfg.deadline.slack);
        // One device of an unobserved class is at first contact, and the verdict says so; but
        // it loosens the deadline only by its own share: 8 calibrated H100s and one odd device
        // must still show 8 H100s' worth within the tight slack.
        let mixed = inventory("cuda", "tensor", &[H100, "NVIDIA A100"]).claim;
        let e = expectation(&mixed, 2048, &book, &cfg);
        assert_eq!((e.source, e.miners), (Some(RateSource::Shipped), 0));
        assert_eq!(e.ops_per_sec, 7.0e14 + 6.24e14 / 2.0);
        let least = 7.0e14 / cfg.deadline.slack + 6.24e14 / 2.0 / cfg.deadline.first_contact_slack;
        assert!((e.slack - e.ops_per_sec / least).abs() < 1e-12);
        let mut names = vec![H100; 8];
        names.push("Odd GPU");
        let padded = expectation(&inventory("cuda", "tensor", &names).claim, 2048, &book, &cfg);
        assert!(padded.slack < 1.06 * cfg.deadline.slack, "{}", padded.slack);
    }

    #[test]
    fn chain_count_follows_target_and_device_count() {
        let mut inv = inventory("cuda", "tensor", &[H100, H100]);
        inv.limits.max_chains = 1 << 20;
        let cfg = ChallengeConfig::default();
        let p = plan_for(&inv, &cfg).unwrap();
        assert!((seconds(&p) - 30.0).abs() < 0.1, "{}", seconds(&p));
        assert_eq!(p.deadline_ms, (p.expected_ms as f64 * 3.0).ceil() as u64);
        assert_eq!(p.claim, inv.claim);
        assert_eq!(p.params.miner_key, inv.miner_key.0);
        // The miner's own limit caps the chain count (and so the work) below the target.
        inv.limits.max_chains = 1 << 16;
        let capped = plan_for(&inv, &cfg).unwrap();
        assert_eq!(capped.params.num_chains, 1 << 16);
        assert!(seconds(&capped) < 30.0);
    }

    #[test]
    fn the_deadline_floor_is_met_with_work_never_with_slack() {
        let inv = inventory("cuda", "tensor", &[H100, H100]);
        let tiny = ChallengeConfig {
            target_seconds: 0.0,
            ..ChallengeConfig::default()
        };
        let p = plan_for(&inv, &tiny).unwrap();
        assert_eq!(p.deadline_ms, (p.expected_ms as f64 * 3.0).ceil() as u64);
        assert!(p.deadline_ms >= 2_000, "{}", p.deadline_ms);
        let one_less = Timing {
            ops_per_chain: OPS_PER_CHAIN,
            rate: p.expectation.ops_per_sec,
            slack: 3.0,
            fixed_s: 0.0,
        };
        assert!(one_less.deadline_ms(p.params.num_chains - 1) < 2_000);
        // A miner whose limits allow less work than the floor needs is refused, not timed loosely.
        let mut small = inv.clone();
        small.limits.max_chains = 100;
        match plan_for(&small, &tiny) {
            Err(PlanError::TooLittleWork {
                max_chains: 100,
                needed,
                min_ms: 2_000,
                // The refusal states the closed form, within rounding of the exact count.
            }) => assert!(
                needed.abs_diff(p.params.num_chains) <= p.params.num_chains / 100,
                "{needed}"
            ),
            other => panic!("{other:?}"),
        }
        // An absurd claim (64 CPUs of 4 billion cores each) is refused at once, not searched.
        let mut absurd = inventory("cpu", "portable", &["cpu"; 64]);
        for d in &mut absurd.claim.devices {
            d.sm_count = u32::MAX;
        }
        assert!(matches!(
            plan_for(&absurd, &ChallengeConfig::default()),
            Err(PlanError::TooLittleWork { .. })
        ));
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
        newer.protocol_version = 5;
        assert_eq!(
            plan_for(&newer, &ChallengeConfig::default()).unwrap_err(),
            PlanError::Inventory(InventoryError::ProtocolVersion {
                theirs: 5,
                oldest: 2,
                ours: 4
            })
        );
    }

    #[test]
    fn samples_adapt_to_the_miner_down_to_the_floor() {
        let mut inv = inventory("cpu", "portable", &["cpu"]);
        let cfg = ValidatorConfig {
            samples: 32,
            min_samples: 8,
            ..config(ChallengeConfig::default())
        };
        let book = shipped_book();
        let samples = |inv: &Inventory| plan(inv, &cfg, &book, true, [0; 32], [0; 32]).map(|p| p.samples);
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
        assert_eq!(plan(&inv, &cfg, &book, false, [0; 32], [0; 32]).unwrap().samples, 0);
    }

    /// The memory phase as PROTOCOL.md 18.6 sizes it, on a GPU at first contact.
    #[test]
    fn memory_phase_is_sized_from_claimed_memory_and_datasheet_bandwidth() {
        let mut inv = inventory("cuda", "tensor", &[H100]);
        inv.claim.devices[0].memory_bytes = 80 << 30;
        inv.limits.max_chains = 1 << 20;
        let with_memory = ValidatorConfig::default();
        let p = plan(&inv, &with_memory, &shipped_book(), true, [0; 32], [0; 32]).unwrap();
        let m = p.memory.as_ref().expect("a version 3 miner gets the memory phase");
        assert_eq!(m.pools[0].entries, (80u64 << 30) * 950 / 1000 / 65536);
        assert_eq!(m.params.pool_permille, 950);
        assert_eq!((m.params.walkers, m.params.walk_checkpoint_every), (8192, 8));
        // 0.75 of the H100's 3.35 TB/s, a walk of about 2 s, first-contact slack 2.
        assert_eq!(m.bytes_per_sec, vec![0.75 * 3.35e12]);
        assert_eq!((m.source, m.slack), (RateSource::Shipped, 2.0));
        let seconds = m.walk_bytes() as f64 / (0.75 * 3.35e12);
        assert!((2.0..2.01).contains(&seconds), "{seconds}");
        assert_eq!(m.walk_expected_ms, (seconds * 1000.0).ceil() as u64);
        assert_eq!(m.walk_deadline_ms, m.walk_expected_ms * 2);
        // The fill is added to the chains' time: its operations at the compute rate, each
        // counted as the tensor kernel's fill weight, 3 (PROTOCOL.md 18.6).
        assert_eq!(m.fill_weight, 3.0);
        let fill_ms = 3.0 * m.pools[0].fill_ops() / H100_RATE * 1000.0;
        let without = plan(
            &inv,
            &config(ChallengeConfig::default()),
            &shipped_book(),
            true,
            [0; 32],
            [0; 32],
        )
        .unwrap();
        assert_eq!(p.params.num_chains, without.params.num_chains);
        assert!(
            (p.expected_ms as f64 - without.expected_ms as f64 - fill_ms).abs() <= 1.0,
            "{} vs {} + {fill_ms}",
            p.expected_ms,
            without.expected_ms
        );
    }

    /// A miner that says 4 gets version 4's memory phase and no fill: chains at least
    /// `2^16 / n` steps long, enough of them for every device's pool, and openings from the
    /// bound for its model.
    #[test]
    fn a_version_4_miner_is_planned_with_its_pool_in_its_chains() {
        let mut inv = v4_inventory(H100, 80_000_000_000);
        let p = plan(
            &inv,
            &ValidatorConfig::default(),
            &shipped_book(),
            true,
            [0; 32],
            [0; 32],
        )
        .unwrap();
        assert!(p.memory.is_none(), "no version 3 phase beside version 4's");
        let pool = p.chain_pool.as_ref().expect("version 4's phase");
        assert_eq!(pool.params.pool_chains, vec![18310], "design table 2.6");
        assert_eq!(p.params.n, 2048);
        assert_eq!(p.params.iterations, 32, "16 configured, raised to 2^16 / 2048");
        assert!(p.params.num_chains >= 18310, "{}", p.params.num_chains);
        assert_eq!(pool.devices[0].sized_as, Some("H100 SXM"));
        // At first contact (the shipped 0.75 of the datasheet, slack 2) the 90% holder is not
        // claimed caught, even with the worst row's openings (497 and 185 at the design clock, raised
        // as far as the cap).
        assert_eq!(
            (pool.devices[0].steps_opened, pool.devices[0].rows_checked),
            (1649, 474)
        );
        assert_eq!(pool.slack(), 2.0);
        assert!(!pool.devices[0].catches_ninety_percent());

        // A miner whose limits cannot take its pool's chains is refused, saying so.
        inv.limits.max_chains = 1000;
        assert_eq!(
            plan(
                &inv,
                &ValidatorConfig::default(),
                &shipped_book(),
                true,
                [0; 32],
                [0; 32]
            )
            .unwrap_err(),
            PlanError::PoolChainsOverLimit {
                needed: 18310,
                max_chains: 1000
            }
        );
    }

    /// What a first-contact verdict states per model (SECURITY.md quotes these): each device at
    /// the shipped walk row's rate (0.75 of the slowest variant's datasheet bandwidth) and slack
    /// 2, its openings raised as far as the worst row's.
    #[test]
    fn first_contact_bounds_per_model() {
        let cases = [
            ("NVIDIA H100 80GB HBM3", 80_000_000_000, 0.8854),
            ("NVIDIA H200", 141_000_000_000, 0.9001),
            // Its shipped rate is 0.75 of the 40GB PCIe part's 1,555 GB/s: 0.572 of this one's.
            ("NVIDIA A100-SXM4-80GB", 80_000_000_000, 0.8841),
            ("NVIDIA GeForce RTX 4090", 24_000_000_000, 0.8512),
            // Its Grace memory over C2C counted: the clock hides 31% of the pool at first
            // contact (0.75 of its own 4 TB/s; it was once matched as an H200, whose name it
            // contains, and expected at 0.9 of its own).
            ("NVIDIA GH200 480GB", 96_000_000_000, 0.6435),
        ];
        for (name, memory_bytes, held) in cases {
            let inv = v4_inventory(name, memory_bytes);
            let pool = plan(
                &inv,
                &ValidatorConfig::default(),
                &shipped_book(),
                true,
                [0; 32],
                [0; 32],
            )
            .unwrap()
            .chain_pool
            .unwrap();
            let stated = pool.devices[0].held_at_least.unwrap();
            assert!((stated - held).abs() < 0.0001, "{name}: {stated}");
        }
    }

    /// A rate book that learned only version 3 walks leaves a version 4 miner at first contact:
    /// a version 3 rate has the host inside its clock. Its own `walk-v4` class, once learned,
    /// times it with the calibrated slack.
    #[test]
    fn version_3_walk_rates_do_not_time_version_4() {
        let mut inv = v4_inventory(H100, 80_000_000_000);
        let config = ValidatorConfig::default();
        let learned = |rate: f64| crate::rates::SharedRate {
            ops_per_unit: rate,
            miners: 3,
            observations: 3,
        };
        let device = &inv.claim.devices[0];
        let mut book = shipped_book();
        book.share(walk_class(&inv.claim, device), learned(2.2e12));
        let pool = plan(&inv, &config, &book, true, [0; 32], [0; 32])
            .unwrap()
            .chain_pool
            .unwrap();
        assert!(!pool.observed(), "a version 3 rate does not make version 4 calibrated");
        assert_eq!(pool.slack(), 2.0);
        assert_eq!(
            pool.devices[0].bytes_per_sec,
            0.75 * 3.35e12,
            "the shipped first-contact rate"
        );

        book.share(walk_v4_class(&inv.claim, device, 2048), learned(3.1e12));
        let pool = plan(&inv, &config, &book, true, [0; 32], [0; 32])
            .unwrap()
            .chain_pool
            .unwrap();
        assert!(pool.observed());
        assert_eq!(
            pool.slack(),
            1.5,
            "[memory] slack, until a device-timed spread allows 1.25"
        );
        assert_eq!(pool.devices[0].bytes_per_sec, 3.1e12);
        assert!(pool.devices[0].catches_ninety_percent(), "near 0.9 of the datasheet");
        // Its version 3 walk class is still what a version 3 miner is timed by.
        inv.protocol_version = 3;
        let v3 = plan(&inv, &config, &book, true, [0; 32], [0; 32]).unwrap();
        assert_eq!(v3.memory.unwrap().bytes_per_sec, vec![2.2e12]);
    }

    /// Design 7: where this validator refuses version 3's memory phase, a miner that speaks 3
    /// is refused before any challenge, the error naming the upgrade and the compute-only way;
    /// with `required = false` it is challenged under version 2 (no memory phase). A miner that
    /// says 4 is not touched by it.
    #[test]
    fn a_version_3_miner_is_refused_naming_the_upgrade() {
        let mut inv = v4_inventory(H100, 80_000_000_000);
        inv.protocol_version = 3;
        let mut config = ValidatorConfig::default();
        config.memory.refuse_version_3 = true;
        let book = shipped_book();
        let refused = plan(&inv, &config, &book, true, [0; 32], [0; 32]).unwrap_err();
        assert_eq!(refused, PlanError::Memory(MemoryPlanError::Version3Refused));
        let message = refused.to_string();
        for names in ["version 4", "upgrade", "required = false", "refuse_version_3"] {
            assert!(message.contains(names), "{message}");
        }
        config.memory.required = false;
        let compute_only = plan(&inv, &config, &book, true, [0; 32], [0; 32]).unwrap();
        assert!(compute_only.memory.is_none() && compute_only.chain_pool.is_none());
        inv.protocol_version = 4;
        let v4 = plan(&inv, &config, &book, true, [0; 32], [0; 32]).unwrap();
        assert!(v4.chain_pool.is_some());
        // Off (this release's default), version 3 is planned as before.
        inv.protocol_version = 3;
        let kept = plan(&inv, &ValidatorConfig::default(), &book, true, [0; 32], [0; 32]).unwrap();
        assert!(kept.memory.is_some());
    }

    #[test]
    fn memory_phase_refusals_name_their_cause() {
        let with_memory = ValidatorConfig::default();
        let book = shipped_book();
        let mut old = inventory("cuda", "tensor", &[H100]);
        old.claim.devices[0].memory_bytes = 80 << 30;
        old.protocol_version = 2;
        let refused = plan(&old, &with_memory, &book, true, [0; 32], [0; 32]).unwrap_err();
        assert_eq!(refused, PlanError::Memory(MemoryPlanError::NotSpoken(2)));
        assert!(refused.to_string().contains("required = false"), "{refused}");
        // Without the memory phase, or where it is not required, a version 2 miner is
        // challenged as before.
        let without = plan(&old, &config(ChallengeConfig::default()), &book, true, [0; 32], [0; 32]);
        assert!(without.unwrap().memory.is_none());
        let optional = ValidatorConfig {
            memory: MemoryConfig {
                required: false,
                ..MemoryConfig::default()
            },
            ..ValidatorConfig::default()
        };
        assert!(
            plan(&old, &optional, &book, true, [0; 32], [0; 32])
                .unwrap()
                .memory
                .is_none()
        );
        // A claim too small for one entry cannot be challenged.
        let tiny = inventory("cuda", "tensor", &[H100]);
        assert!(matches!(
            plan(&tiny, &with_memory, &book, true, [0; 32], [0; 32]),
            Err(PlanError::Memory(MemoryPlanError::PoolSize { entries: 0, .. }))
        ));
        // CPU walkers are per core: 4 cores at the default 4 per core.
        let mut cpu = inventory("cpu", "avx2", &["cpu: test"]);
        cpu.claim.devices[0].memory_bytes = 1 << 20;
        let p = plan(&cpu, &with_memory, &book, true, [0; 32], [0; 32]).unwrap();
        assert_eq!(p.memory.unwrap().params.walkers, 16);
    }

    /// A CPU's small pool sits in its cache: once its bandwidth is learned, even the longest
    /// walk of the configured walkers is short of the target, and the walkers are raised until
    /// it is not (the soak found one-core CPU miners unattestable before).
    #[test]
    fn walkers_grow_until_a_fast_cpu_walks_for_the_target() {
        let with_memory = ValidatorConfig::default();
        let mut cpu = inventory("cpu", "avx2", &["cpu: test"]);
        cpu.claim.devices[0].sm_count = 1;
        cpu.claim.devices[0].memory_bytes = 16 << 20;
        let mut book = shipped_book();
        let class = crate::rates::class::walk_class(&cpu.claim, &cpu.claim.devices[0]);
        let learned = 21e9;
        book.share(
            class,
            crate::rates::SharedRate {
                ops_per_unit: learned,
                miners: 3,
                observations: 3,
            },
        );
        let m = plan(&cpu, &with_memory, &book, true, [0; 32], [0; 32])
            .expect("a fast CPU is still attested")
            .memory
            .unwrap();
        assert_eq!(m.bytes_per_sec, vec![learned], "the learned bandwidth times one core");
        // 4 walkers walk at most 4096 * 8 steps of 64 KiB: 409 ms at 21 GB/s. 20 walkers reach
        // the 2 s target, and the walk is then sized to it as usual.
        assert_eq!(m.params.walkers, 20);
        assert_eq!(m.params.walk_steps, 4006 * 8);
        assert!((2_000..2_010).contains(&m.walk_expected_ms), "{}", m.walk_expected_ms);
        // Walkers that already reach it are left as configured.
        let slow = ValidatorConfig {
            memory: MemoryConfig {
                walkers_per_core: 64,
                ..MemoryConfig::default()
            },
            ..ValidatorConfig::default()
        };
        let m = plan(&cpu, &slow, &book, true, [0; 32], [0; 32])
            .unwrap()
            .memory
            .unwrap();
        assert_eq!(m.params.walkers, 64);
        assert!((2_000..2_100).contains(&m.walk_expected_ms), "{}", m.walk_expected_ms);
    }

    #[test]
    fn the_fitted_chain_counts_are_exact() {
        for (rate, slack) in [(1.0e8, 2.0), (3.3e9, 1.3), (7.0e6, 1.0), (1.0e12, 3.0)] {
            let timing = Timing {
                ops_per_chain: 2.0 * 64f64.powi(3) * 4.0,
                rate,
                slack,
                fixed_s: 0.0,
            };
            for window in (0..200).map(|i| i * 137 + 11) {
                match timing.chains_within(window, 1 << 20) {
                    None => assert!(timing.deadline_ms(1) > window),
                    Some(m) => {
                        assert!(timing.deadline_ms(m) <= window, "{m} chains overrun {window} ms");
                        assert!(
                            m == 1 << 20 || timing.deadline_ms(m + 1) > window,
                            "{} chains also fit {window} ms",
                            m + 1
                        );
                    }
                }
                let fewest = timing.fewest_reaching(window, 1 << 20);
                if fewest > 1 << 20 {
                    assert!(timing.deadline_ms(1 << 20) < window);
                    continue;
                }
                assert!(
                    timing.deadline_ms(fewest) >= window,
                    "{fewest} chains fall short of {window} ms"
                );
                assert!(
                    fewest == 1 || timing.deadline_ms(fewest - 1) < window,
                    "{} chains also reach {window} ms",
                    fewest - 1
                );
            }
        }
    }

    #[test]
    fn deadlines_fit_the_miners_max_duration() {
        let mut inv = inventory("cuda", "tensor", &[H100]);
        inv.limits.max_chains = 1 << 20;
        let cfg = ChallengeConfig::default(); // 30 s of work, first-contact slack 3: a 90 s deadline
        let unlimited = plan_for(&inv, &cfg).unwrap();
        assert!(unlimited.deadline_ms > 80_000, "{}", unlimited.deadline_ms);
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
            ops_per_chain: OPS_PER_CHAIN,
            rate: fitted.expectation.ops_per_sec,
            slack: 3.0,
            fixed_s: 0.0,
        }
        .deadline_ms(fitted.params.num_chains + 1);
        assert!(one_more > 20_000 - MINER_CLOCK_ALLOWANCE_MS, "{one_more}");
        // Below the deadline floor nothing fits: refused, never sent to be refused or failed.
        inv.limits.max_duration_ms = 3_500;
        match plan_for(&inv, &cfg) {
            Err(PlanError::DurationOverLimit {
                max_duration_ms: 3_500,
                needed_ms,
            }) => assert!((2_000..2_010).contains(&needed_ms), "{needed_ms}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_finish_by_time_is_deadlines_within_the_miners_limit() {
        let mut inv = inventory("cuda", "tensor", &[H100]);
        inv.limits.max_chains = 1 << 20;
        let cfg = ChallengeConfig::default();
        // The default, two deadlines.
        let p = plan_for(&inv, &cfg).unwrap();
        assert_eq!(p.finish_by_ms, p.deadline_ms * 2);
        // A miner that does not take one gets none, and the same challenge otherwise.
        inv.takes_finish_by = false;
        let none = plan_for(&inv, &cfg).unwrap();
        assert_eq!(none.finish_by_ms, 0);
        assert_eq!(none.params.num_chains, p.params.num_chains);
        inv.takes_finish_by = true;
        // The miner's limit shortens the late window, not the work.
        inv.limits.max_duration_ms = p.deadline_ms + MINER_CLOCK_ALLOWANCE_MS + 5_000;
        let tight = plan_for(&inv, &cfg).unwrap();
        assert_eq!(tight.params.num_chains, p.params.num_chains);
        assert_eq!(tight.finish_by_ms, p.deadline_ms + 5_000);
        // A limit the deadline already fills leaves no late window.
        inv.limits.max_duration_ms = p.deadline_ms + MINER_CLOCK_ALLOWANCE_MS;
        assert_eq!(plan_for(&inv, &cfg).unwrap().finish_by_ms, 0);
        // A factor of 1 sends none; other factors round up.
        for (factor, want) in [(1.0, 0), (1.25, (p.deadline_ms as f64 * 1.25).ceil() as u64)] {
            inv.limits.max_duration_ms = 0;
            let mut config = config(cfg.clone());
            config.deadline.finish_by = factor;
            let got = plan(&inv, &config, &shipped_book(), true, [0; 32], [0; 32]).unwrap();
            assert_eq!(got.finish_by_ms, want, "factor {factor}");
        }
    }
}
