//! The memory phase on the miner (PROTOCOL.md 18): the pools a version 3 challenge asks for,
//! filled after the chains and held for the walk; the walk with the validator's fresh seed; and
//! the walk openings.
//!
//! A pool fills most of its device's memory, so a miner holds one set of pools at a time: a
//! later challenge releases the pools of every earlier commitment
//! ([`HeldMemory::release`]), and a walk or walk opening of a released commitment is refused
//! rather than answered from memory that is no longer there.

use crate::error::MinerError;
use crate::memory_v4::{HeldPools, side_by_side};
use gpu_attest_shared::backend::ResidentPool;
use gpu_attest_shared::memory::check::WalkOpening;
use gpu_attest_shared::memory::walk::{DeviceWalk, WalkSpec};
use gpu_attest_shared::memory::{MemoryParams, PoolSpec};
use gpu_attest_shared::statement::DeviceInfo;
use gpu_attest_shared::statement::memory_v3::{PoolCommitment, WalkSample};
use gpu_attest_shared::{Backend, BackendError, CancelToken, Digest, Work};
use std::sync::Mutex;

/// The pools one version 3 challenge asks for, one per device, checked against PROTOCOL.md
/// 18.1 before the challenge is accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolPlan {
    pub params: MemoryParams,
    pub specs: Vec<PoolSpec>,
}

impl PoolPlan {
    /// The pools of `devices` (the miner's claim, which the challenge's inventory digest bound)
    /// at the challenge's `params`.
    pub fn new(params: MemoryParams, work: &Work, devices: &[DeviceInfo]) -> Result<Self, MinerError> {
        params.validate().map_err(MinerError::Memory)?;
        let specs = devices
            .iter()
            .enumerate()
            .map(|(j, d)| PoolSpec::new(work, j as u32, d.memory_bytes, params.pool_permille))
            .collect::<Result<Vec<_>, _>>()
            .map_err(MinerError::Memory)?;
        Ok(PoolPlan { params, specs })
    }

    /// Refuses pools a device cannot hold, before the challenge is accepted.
    pub fn check_capacity(&self, backend: &dyn Backend) -> Result<(), BackendError> {
        self.specs.iter().try_for_each(|spec| backend.check_pool_capacity(spec))
    }

    /// Fills every device's pool, the devices side by side (blocking). `progress` hears
    /// `(device, entries made)` now and then.
    pub fn fill(
        &self,
        backend: &dyn Backend,
        progress: &(dyn Fn(u32, u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<Vec<Box<dyn ResidentPool>>, BackendError> {
        side_by_side(&self.specs, cancel, |spec| {
            let device = spec.device();
            backend.fill_pool(spec, &|made| progress(device, made), cancel)
        })
    }
}

/// What a commitment names of its pools.
pub fn pool_commitments(pools: &[Box<dyn ResidentPool>]) -> Vec<PoolCommitment> {
    pools
        .iter()
        .map(|p| PoolCommitment {
            device: p.spec().device(),
            entries: p.spec().entries(),
            root: p.root(),
        })
        .collect()
}

/// A finished walk: what the walk statement's roots came from, kept for the openings.
struct Walked {
    specs: Vec<WalkSpec>,
    walks: Vec<DeviceWalk>,
}

/// The memory side of a version 3 commitment: its pools until they are released, whether its
/// one walk has been asked for, and the walk once done.
pub struct HeldMemory {
    params: MemoryParams,
    pools: HeldPools<Vec<Box<dyn ResidentPool>>>,
    walked: Mutex<Option<Walked>>,
}

impl HeldMemory {
    pub fn new(params: MemoryParams, pools: Vec<Box<dyn ResidentPool>>) -> Self {
        HeldMemory {
            params,
            pools: HeldPools::new(pools),
            walked: Mutex::new(None),
        }
    }

    pub fn params(&self) -> &MemoryParams {
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

    /// Walks every device's pool with `walk_seed` (blocking), the devices side by side, and
    /// keeps the walk for the openings. Returns `(j, walk_root_j)` per device in index order.
    pub fn walk(
        &self,
        nonce: [u8; 32],
        walk_seed: [u8; 32],
        cancel: &CancelToken,
    ) -> Result<Vec<(u32, Digest)>, MinerError> {
        // The pools' lock is let go before the walk's is taken: `open` takes them the other way
        // round.
        let (specs, walks) = {
            let pools = self.pools.lock();
            let pools = pools.as_ref().ok_or(MinerError::PoolsReleased)?;
            Self::walk_pools(pools, &self.params, nonce, walk_seed, cancel)?
        };
        let roots = walks.iter().zip(&specs).map(|(w, s)| (s.device, w.root())).collect();
        *self.walked.lock().unwrap_or_else(|p| p.into_inner()) = Some(Walked { specs, walks });
        Ok(roots)
    }

    /// Every pool's walk, the devices side by side (blocking).
    fn walk_pools(
        pools: &[Box<dyn ResidentPool>],
        params: &MemoryParams,
        nonce: [u8; 32],
        walk_seed: [u8; 32],
        cancel: &CancelToken,
    ) -> Result<(Vec<WalkSpec>, Vec<DeviceWalk>), MinerError> {
        let specs: Vec<WalkSpec> = pools
            .iter()
            .map(|p| WalkSpec {
                nonce,
                walk_seed,
                device: p.spec().device(),
                pool_root: p.root(),
                entries: p.spec().entries(),
                params: *params,
            })
            .collect();
        let indexed: Vec<_> = pools.iter().zip(&specs).collect();
        let walks = side_by_side(&indexed, cancel, |(pool, spec)| pool.walk(spec, cancel)).map_err(MinerError::Walk)?;
        Ok((specs, walks))
    }

    /// Checks walk samples before an opening round starts: the walk is done, the pools are
    /// still held, and every sample names a device, walker and segment of it.
    pub fn check_samples(&self, samples: &[WalkSample]) -> Result<(), MinerError> {
        if samples.is_empty() {
            return Ok(());
        }
        let walked = self.walked.lock().unwrap_or_else(|p| p.into_inner());
        let walked = walked.as_ref().ok_or(MinerError::NotWalked)?;
        if !self.pools.holds() {
            return Err(MinerError::PoolsReleased);
        }
        for &sample in samples {
            let in_range = (sample.device as usize) < walked.specs.len()
                && sample.walker < self.params.walkers
                && sample.segment < self.params.walk_segments();
            if !in_range {
                return Err(MinerError::WalkSampleOutOfRange(sample));
            }
        }
        Ok(())
    }

    /// Opens one walk sample from the pools and the walk (blocking: copies c_w entries).
    pub fn open(&self, sample: WalkSample) -> Result<WalkOpening, MinerError> {
        let walked = self.walked.lock().unwrap_or_else(|p| p.into_inner());
        let walked = walked.as_ref().ok_or(MinerError::NotWalked)?;
        let pools = self.pools.lock();
        let pools = pools.as_ref().ok_or(MinerError::PoolsReleased)?;
        let j = sample.device as usize;
        let (Some(pool), Some(walk), Some(spec)) = (pools.get(j), walked.walks.get(j), walked.specs.get(j)) else {
            return Err(MinerError::WalkSampleOutOfRange(sample));
        };
        pool.open(walk, spec, sample.walker, sample.segment)
            .map_err(MinerError::Fill)?
            .ok_or(MinerError::WalkSampleOutOfRange(sample))
    }
}
