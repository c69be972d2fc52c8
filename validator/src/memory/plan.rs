//! Sizing and timing the memory phase (PROTOCOL.md 18.6): each device's pool from its claimed
//! memory, the walk's length from the slowest device's expected bandwidth, and the walk's
//! deadline from the bandwidth's source.
//!
//! A device's bandwidth is the rate of its **walk class**: its backend and model with the kernel
//! `walk` (and n = 256, the entry's size), rated in bytes per second per unit. Walk classes
//! live in the same rate book as the compute classes, so they are learned from passing verdicts,
//! imported and capped by the same rules; the shipped table has one row per GPU model, from its
//! datasheet (`rates::shipped`).

use super::plan_v4::{TooShort, walkers_reaching};
use crate::config::memory::MemoryConfig;
use crate::rates::RateBook;
use crate::verdict::class::RateSource;
use crate::verdict::class::{units, walk_class};
use crate::verdict::memory::{DeviceMemory, MemoryProof};
use gpu_attest_shared::inventory::{HardwareClaim, Inventory};
use gpu_attest_shared::memory::params::{ENTRY_BYTES, MAX_POOL_ENTRIES, MAX_WALK_SEGMENTS, MAX_WALKERS, pool_entries};
use gpu_attest_shared::memory::{ENTRY_OPS, MemoryParams};
use gpu_attest_shared::params::NEWEST_PROTOCOL_VERSION;

/// Steps between a walker's checkpoints: the most the protocol allows, so that an opening
/// checks 8 steps for one walk proof.
pub const WALK_CHECKPOINT_EVERY: u32 = 8;

/// One device's pool as planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedPool {
    /// What the inventory claims, and the challenge's inventory digest binds.
    pub memory_bytes: u64,
    /// P_j.
    pub entries: u64,
}

impl PlannedPool {
    /// The int8 operations that make this pool.
    pub fn fill_ops(&self) -> f64 {
        self.entries as f64 * ENTRY_OPS as f64
    }
}

/// The memory phase of one challenge.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    pub params: MemoryParams,
    /// One per device, in index order.
    pub pools: Vec<PlannedPool>,
    /// Each device's expected walk bandwidth, bytes per second (its class's rate times its
    /// units).
    pub bytes_per_sec: Vec<f64>,
    /// The weakest source among the devices' walk classes.
    pub source: RateSource,
    /// The fewest miners behind an observed bandwidth among them; 0 if any is shipped.
    pub miners: u32,
    /// Walk deadline over expected walk time.
    pub slack: f64,
    pub walk_expected_ms: u64,
    pub walk_deadline_ms: u64,
    /// Walk segments to open.
    pub samples: u32,
    /// Chain operations at the class's rate one fill operation is timed as
    /// ([`super::fill::fill_weight`]).
    pub fill_weight: f64,
}

impl MemoryPlan {
    /// The proof as planned, before the walk: nothing measured, nothing proven yet.
    pub fn planned_proof(&self) -> MemoryProof {
        MemoryProof {
            pool_permille: self.params.pool_permille,
            walkers: self.params.walkers,
            walk_steps: self.params.walk_steps,
            walk_checkpoint_every: self.params.walk_checkpoint_every,
            walk_samples: self.samples,
            devices: self
                .pools
                .iter()
                .map(|p| DeviceMemory {
                    locality: None,
                    claimed_bytes: p.memory_bytes,
                    pool_entries: p.entries,
                    proven_bytes: 0,
                    walk: None,
                })
                .collect(),
            walk_bytes: self.walk_bytes(),
            walk_measured_ms: 0,
            walk_expected_ms: self.walk_expected_ms,
            walk_deadline_ms: self.walk_deadline_ms,
            expected_walk_bytes_per_sec: self.slowest_bytes_per_sec(),
            proven_walk_bytes_per_sec: None,
            bandwidth_source: self.source.as_str().into(),
            bandwidth_miners: self.miners,
            slack: self.slack,
            fill_weight: self.fill_weight,
            host_held_at_least: None,
            proves: String::new(),
        }
    }

    /// Bytes one device's walk reads: `W * L * 65536`.
    pub fn walk_bytes(&self) -> u64 {
        self.params.walk_bytes()
    }

    /// The slowest device's expected bandwidth: what the walk is timed by.
    pub fn slowest_bytes_per_sec(&self) -> f64 {
        slowest(&self.bytes_per_sec)
    }
}

fn slowest(bytes_per_sec: &[f64]) -> f64 {
    bytes_per_sec.iter().copied().fold(f64::INFINITY, f64::min)
}

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum MemoryPlanError {
    #[error(
        "miner speaks protocol version {0}, which cannot prove memory (version {NEWEST_PROTOCOL_VERSION} can; a miner speaks 2 when it is older or its GPUs are too old for the walk kernel, before compute capability 6.1): upgrade it, or set [memory] required = false to attest it without the memory phase (its verdicts then prove no memory)"
    )]
    NotSpoken(u32),
    #[error(
        "miner speaks protocol version 3, whose memory proof bounds no share of the claim and which this validator refuses ([memory] refuse_version_3, on by default): upgrade the miner to a release that speaks version 4 (and leave its [limits] protocol_4 on; a GPU miner says 4 once its version 4 walk passed the self-check it runs at start, which its log reports), or set [memory] required = false to attest its compute only (its verdicts then say memory: null)"
    )]
    Version3Refused,
    #[error(
        "device {device} claims {memory_bytes} bytes: at pool_permille {permille} that is a pool of {entries} entries of 64 KiB, and a pool holds 1..={MAX_POOL_ENTRIES}"
    )]
    PoolSize {
        device: u32,
        memory_bytes: u64,
        permille: u32,
        entries: u64,
    },
    #[error(
        "even the longest walk ({MAX_WALK_SEGMENTS} segments of {WALK_CHECKPOINT_EVERY} steps for {walkers} walkers, the most a challenge may have) takes only {reach_ms:.0} ms at the expected bandwidth, under half of [memory] walk_target_ms = {target_ms}: lower walk_target_ms"
    )]
    WalkTooShort {
        walkers: u32,
        reach_ms: f64,
        target_ms: u64,
    },
}

/// The walkers per device: per GPU, or per core of the CPU with the fewest cores.
fn walkers(claim: &HardwareClaim, config: &MemoryConfig) -> u32 {
    let per_device = if claim.backend == "cpu" {
        let cores = claim
            .devices
            .iter()
            .map(|d| units(&claim.backend, d))
            .fold(f64::INFINITY, f64::min);
        (f64::from(config.walkers_per_core) * cores).min(f64::from(MAX_WALKERS)) as u32
    } else {
        config.walkers_per_gpu
    };
    per_device.clamp(1, MAX_WALKERS)
}

/// Each device's pool: `permille` of its memory in whole entries, within the protocol's limit.
pub(crate) fn planned_pools(claim: &HardwareClaim, permille: u32) -> Result<Vec<PlannedPool>, MemoryPlanError> {
    claim
        .devices
        .iter()
        .enumerate()
        .map(|(j, d)| {
            let entries = pool_entries(d.memory_bytes, permille);
            if !(1..=MAX_POOL_ENTRIES).contains(&entries) {
                return Err(MemoryPlanError::PoolSize {
                    device: j as u32,
                    memory_bytes: d.memory_bytes,
                    permille,
                    entries,
                });
            }
            Ok(PlannedPool {
                memory_bytes: d.memory_bytes,
                entries,
            })
        })
        .collect()
}

/// Plans the memory phase for `inventory`, or `None` when this validator does not ask for it.
pub fn plan_memory(
    inventory: &Inventory,
    config: &MemoryConfig,
    rates: &RateBook,
) -> Result<Option<MemoryPlan>, MemoryPlanError> {
    if !config.enabled {
        return Ok(None);
    }
    if inventory.protocol_version < 3 {
        return match config.required {
            true => Err(MemoryPlanError::NotSpoken(inventory.protocol_version)),
            false => Ok(None),
        };
    }
    if config.refuse_version_3 {
        // Planned only for a miner that does not speak 4 (the planner tries version 4 first).
        return match config.required {
            true => Err(MemoryPlanError::Version3Refused),
            false => Ok(None),
        };
    }
    let claim = &inventory.claim;
    let permille = config.pool_permille;
    let pools = planned_pools(claim, permille)?;

    let mut bytes_per_sec = Vec::with_capacity(claim.devices.len());
    let mut source = RateSource::Calibrated;
    let mut miners = u32::MAX;
    for device in &claim.devices {
        let expected = rates.expected(&walk_class(claim, device));
        bytes_per_sec.push(expected.ops_per_unit * units(&claim.backend, device));
        source = source.weaker(expected.source);
        miners = miners.min(expected.miners);
    }
    let slowest = slowest(&bytes_per_sec);
    // Version 3's walk keeps the looser of the observed slacks on every backend: its timed
    // window holds the host's copy, gather and hashing, and an honest H200 walk took 1.37x its
    // expected time, past the 1.25 that version 4's device-timed walks earned.
    let slack = if source.is_observed() {
        config.loosest_observed_slack()
    } else {
        config.first_contact_slack
    };

    let every = WALK_CHECKPOINT_EVERY;
    let longest_bytes = ENTRY_BYTES as f64 * f64::from(MAX_WALK_SEGMENTS * every);
    let target_ms = config.walk_target_ms;
    let walkers = walkers_reaching(walkers(claim, config), longest_bytes, slowest, target_ms).map_err(
        |TooShort { walkers, reach_ms }| MemoryPlanError::WalkTooShort {
            walkers,
            reach_ms,
            target_ms,
        },
    )?;
    let step_bytes = f64::from(walkers) * ENTRY_BYTES as f64;
    let walk_ms = |steps: u32| f64::from(steps) * step_bytes / slowest * 1000.0;
    let wanted = (config.walk_target_ms as f64 / 1000.0 * slowest / step_bytes / f64::from(every)).ceil();
    let walk_steps = (wanted.clamp(1.0, f64::from(MAX_WALK_SEGMENTS)) as u32) * every;
    let params = MemoryParams {
        pool_permille: permille,
        walkers,
        walk_steps,
        walk_checkpoint_every: every,
    };
    let walk_expected_ms = walk_ms(walk_steps).ceil() as u64;
    Ok(Some(MemoryPlan {
        params,
        pools,
        bytes_per_sec,
        source,
        miners: if source.is_observed() { miners } else { 0 },
        slack,
        walk_expected_ms,
        walk_deadline_ms: (walk_expected_ms as f64 * slack).ceil() as u64,
        samples: config.walk_samples,
        fill_weight: super::fill::fill_weight(&inventory.claim.backend, &inventory.claim.kernel),
    }))
}
