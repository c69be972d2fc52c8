//! The memory phase of a version 4 commitment on the miner (PROTOCOL.md 20): the pool chains'
//! final states, kept from the chain phase ([`gpu_attest_shared::engine::execute_with_pools`]);
//! the walk over them, each device's root handed over as soon as that device's walk ends, so
//! that the validator clocks every device on its own; and the step openings.
//!
//! As in version 3 ([`crate::memory`]), a miner holds one commitment's pools at a time: a later
//! challenge releases them, and a walk or opening of a released commitment is refused.

use crate::error::MinerError;
use crate::memory::{HeldPools, side_by_side};
use gpu_attest_shared::backend::PoolStates;
use gpu_attest_shared::memory::chain_pool::{ChainPool, ChainPoolParams};
use gpu_attest_shared::memory::slice_walk::{DeviceWalk, SliceWalk, StepOpening};
use gpu_attest_shared::merkle::MerkleProof;
use gpu_attest_shared::statement::DeviceInfo;
use gpu_attest_shared::statement::memory_v4::StepSample;
use gpu_attest_shared::{CancelToken, Digest};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refuses, before a challenge is accepted, a pool that is more than its device claims to
/// hold: the engine keeps whatever it is asked to, and a validator that sized a pool past the
/// claim has made a mistake the operator should hear about, not a miner that swaps.
pub fn check_pools_fit(pools: &[ChainPool], devices: &[DeviceInfo]) -> Result<(), MinerError> {
    for pool in pools {
        let claimed = devices.get(pool.device as usize).map_or(0, |d| d.memory_bytes);
        let bytes = pool.chains.saturating_mul(pool.state_bytes());
        if bytes > claimed {
            return Err(MinerError::PoolOverClaim {
                device: pool.device,
                bytes,
                claimed,
            });
        }
    }
    Ok(())
}

/// A finished walk: what the roots came from, kept for the openings.
struct Walked {
    walk: SliceWalk,
    devices: Vec<DeviceWalk>,
}

/// The memory side of a version 4 commitment: each device's kept states until they are
/// released, whether its one walk has been asked for, and the walk once done.
pub struct HeldChainPools {
    params: ChainPoolParams,
    /// G, the commitment's global root: every walk starts from it (PROTOCOL.md 20.4).
    global: Digest,
    pools: HeldPools<Vec<Box<dyn PoolStates>>>,
    walked: Mutex<Option<Walked>>,
}

impl HeldChainPools {
    /// `pools` in device order, as the chain phase kept them.
    pub fn new(params: ChainPoolParams, global: Digest, pools: Vec<Box<dyn PoolStates>>) -> Self {
        HeldChainPools {
            params,
            global,
            pools: HeldPools::new(pools),
            walked: Mutex::new(None),
        }
    }

    pub fn params(&self) -> &ChainPoolParams {
        &self.params
    }

    pub fn release(&self) {
        self.pools.release();
    }

    pub fn holds_pools(&self) -> bool {
        self.pools.holds()
    }

    pub fn claim_walk(&self) -> bool {
        self.pools.claim_walk()
    }

    /// Walks every device's pool with `walk_seed` (blocking), the devices side by side.
    /// `ended(j, walk_root_j, took)` is called on device `j`'s thread as soon as its walk root
    /// is known, without waiting for the others or for what the device keeps for the openings;
    /// `took` is the walk alone, as that device timed it.
    pub fn walk(
        &self,
        nonce: [u8; 32],
        walk_seed: [u8; 32],
        cancel: &CancelToken,
        ended: &(dyn Fn(u32, Digest, Duration) + Sync),
    ) -> Result<(), MinerError> {
        let walk = SliceWalk {
            nonce,
            walk_seed,
            global: self.global,
            walkers: self.params.walkers,
            steps: self.params.walk_steps,
        };
        let devices = {
            let pools = self.pools.lock();
            let pools = pools.as_ref().ok_or(MinerError::PoolsReleased)?;
            side_by_side(pools, cancel, |pool| {
                let started = Instant::now();
                let device = pool.pool().device;
                pool.walk(&walk, cancel, &|root| ended(device, root, started.elapsed()))
            })
            .map_err(MinerError::Walk)?
        };
        *self.walked.lock().unwrap_or_else(|p| p.into_inner()) = Some(Walked { walk, devices });
        Ok(())
    }

    /// Checks step samples before an opening round starts: the walk is done, the states are
    /// still held, and every sample names a device, walker and step of it.
    pub fn check_steps(&self, steps: &[StepSample]) -> Result<(), MinerError> {
        if steps.is_empty() {
            return Ok(());
        }
        let walked = self.walked.lock().unwrap_or_else(|p| p.into_inner());
        let walked = walked.as_ref().ok_or(MinerError::NotWalked)?;
        if !self.holds_pools() {
            return Err(MinerError::PoolsReleased);
        }
        for &step in steps {
            let in_range = (step.device as usize) < walked.devices.len()
                && step.walker < walked.walk.walkers
                && step.step < walked.walk.steps;
            if !in_range {
                return Err(MinerError::StepSampleOutOfRange(step));
            }
        }
        Ok(())
    }

    /// Opens one walk step (blocking: walks at most three blocks of 64 states again, from the
    /// walk's kept trace). `chain(i)` gives chain `i`'s checkpoint hashes and its leaf's proof
    /// in its device's root.
    pub fn open(
        &self,
        sample: StepSample,
        chain: impl Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Result<StepOpening, MinerError> {
        let walked = self.walked.lock().unwrap_or_else(|p| p.into_inner());
        let walked = walked.as_ref().ok_or(MinerError::NotWalked)?;
        let pools = self.pools.lock();
        let pools = pools.as_ref().ok_or(MinerError::PoolsReleased)?;
        let j = sample.device as usize;
        let (Some(pool), Some(device)) = (pools.get(j), walked.devices.get(j)) else {
            return Err(MinerError::StepSampleOutOfRange(sample));
        };
        pool.open(&walked.walk, device, sample.walker, sample.step, &chain)
            .map_err(MinerError::Walk)?
            .ok_or(MinerError::StepSampleOutOfRange(sample))
    }
}
