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
use crate::rates::RateBook;
use crate::verdict::class::units;
use crate::verdict::class::{RateClass, RateSource};
use crate::verdict::class::{walk_class, walk_v4_class};
use crate::verdict::throughput::Expectation;
use gpu_attest_shared::inventory::{HardwareClaim, Inventory, InventoryError, MinerLimits};
use gpu_attest_shared::params::{
    ChallengeParams, MAX_CHAINS, MAX_SEGMENTS, MAX_TOTAL_CHECKPOINTS, NEWEST_PROTOCOL_VERSION,
};
use gpu_attest_shared::statement::MemoryPhase;

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
    /// The memory phase, which fixes the protocol version the attestation runs under.
    pub memory: MemoryPhasePlan,
}

/// A challenge's memory phase, decided once, by the planner: it is the protocol version the
/// attestation runs under, the opening requests it signs and the verdict it states
/// (PROTOCOL.md 16.1), so nothing downstream works the version out again.
#[derive(Clone, Debug, PartialEq)]
pub enum MemoryPhasePlan {
    /// No memory phase (turned off, or not required of a miner that cannot walk): judged under
    /// version 2, and proving no memory.
    Off,
    /// Version 3's fill and walk (PROTOCOL.md 18).
    V3(MemoryPlan),
    /// Version 4's chain pools and walk (PROTOCOL.md 20), for a miner whose inventory says 4.
    V4(ChainPoolPlan),
}

impl MemoryPhasePlan {
    /// The protocol version whose rules judge the attestation.
    pub fn protocol_version(&self) -> u32 {
        match self {
            MemoryPhasePlan::Off => 2,
            MemoryPhasePlan::V3(_) => 3,
            MemoryPhasePlan::V4(_) => 4,
        }
    }

    /// Version 3's plan, if the phase is version 3's.
    pub fn v3(&self) -> Option<&MemoryPlan> {
        match self {
            MemoryPhasePlan::V3(plan) => Some(plan),
            _ => None,
        }
    }

    /// Version 4's plan, if the phase is version 4's.
    pub fn v4(&self) -> Option<&ChainPoolPlan> {
        match self {
            MemoryPhasePlan::V4(plan) => Some(plan),
            _ => None,
        }
    }

    /// What the signed challenge carries of it.
    pub fn challenge_phase(&self) -> Option<MemoryPhase> {
        match self {
            MemoryPhasePlan::Off => None,
            MemoryPhasePlan::V3(plan) => Some(MemoryPhase::V3(plan.params)),
            MemoryPhasePlan::V4(pool) => Some(MemoryPhase::V4(pool.params.clone())),
        }
    }
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
    let settings = v4_settings(config, &claim.backend);
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

/// What version 4's planner sizes a `backend` claim's memory phase with, from `config`.
pub fn v4_settings(config: &ValidatorConfig, backend: &str) -> V4Settings {
    let memory = &config.memory;
    V4Settings {
        calibrated_slack: memory.observed_slack(backend),
        first_contact_slack: memory.first_contact_slack,
        walkers_per_gpu: memory.walkers_per_gpu,
        walkers_per_core: memory.walkers_per_core,
        walk_target_ms: memory.walk_target_ms,
        ..V4Settings::default()
    }
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
        Some(pool) => MemoryPhasePlan::V4(pool),
        None => plan_memory(inventory, &config.memory, rates)?.map_or(MemoryPhasePlan::Off, MemoryPhasePlan::V3),
    };
    let timing = Timing {
        ops_per_chain: 2.0 * f64::from(n).powi(3) * f64::from(iterations),
        rate,
        slack: expectation.slack,
        fixed_s: memory.v3().map_or(0.0, |m| fill_seconds(claim, n, rates, m)),
    };

    let pool_chains = memory.v4().map_or(0, |p| p.min_chains);
    let num_chains = chain_count(&timing, config, limits, iterations, devices, pool_chains)?;
    let samples = sample_count(config, limits, sampled)?;

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
    })
}

/// How many chains a challenge gets: enough work for the configured duration at the expected
/// rate, at least one a device, every device's pool chains, and enough that the deadline reaches
/// the floor; within the protocol's caps and the miner's limits (its chains and its duration).
fn chain_count(
    timing: &Timing,
    config: &ValidatorConfig,
    limits: &MinerLimits,
    iterations: u32,
    devices: u64,
    pool_chains: u64,
) -> Result<u64, PlanError> {
    let challenge = &config.challenge;
    let segments = u64::from(iterations / challenge.checkpoint_every.max(1)).clamp(1, u64::from(MAX_SEGMENTS));
    let mut max_chains = MAX_CHAINS.min(MAX_TOTAL_CHECKPOINTS / (segments + 1));
    if limits.max_chains != 0 {
        max_chains = max_chains.min(limits.max_chains);
    }
    if max_chains < devices {
        return Err(PlanError::ChainsBelowDevices { max_chains, devices });
    }
    // Searched within the cap: the search walks chain by chain across rounding plateaus, so an
    // absurd claimed rate must not make it walk far. A refusal states the closed-form count.
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
    let wanted = (timing.rate * challenge.target_seconds / timing.ops_per_chain).ceil() as u64;
    let num_chains = wanted.clamp(fewest, max_chains);
    if limits.max_duration_ms == 0 {
        return Ok(num_chains);
    }
    let window = limits.max_duration_ms.saturating_sub(MINER_CLOCK_ALLOWANCE_MS);
    timing
        .chains_within(window, num_chains)
        .filter(|&c| c >= fewest)
        .ok_or(PlanError::DurationOverLimit {
            max_duration_ms: limits.max_duration_ms,
            needed_ms: timing.deadline_ms(fewest),
        })
}

/// Chains opened after the commitment: none unless the sampled policy is in force; else the
/// configured count within the miner's limit, refused where that limit is under the floor.
fn sample_count(config: &ValidatorConfig, limits: &MinerLimits, sampled: bool) -> Result<u32, PlanError> {
    if !sampled {
        return Ok(0);
    }
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
    Ok(allowed)
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
mod tests;
