//! The memory phase of a version 4 commitment on the miner (PROTOCOL.md 20): the pool chains'
//! final states, kept from the chain phase ([`gpu_attest_shared::engine::execute_with_pools`]);
//! the walk over them, each device's root handed over as soon as that device's walk ends, so
//! that the validator clocks every device on its own; and the step openings.
//!
//! A miner holds one commitment's pools at a time ([`HeldPools`], version 3's too until it is
//! retired): a later challenge releases them, and a walk or opening of a released commitment is
//! refused.

use crate::error::MinerError;
use gpu_attest_shared::backend::PoolStates;
use gpu_attest_shared::memory::chain_pool::{ChainPool, ChainPoolParams};
use gpu_attest_shared::memory::locality::{ChunkPaths, LineWalk, LocalityWalk, SegmentOpening};
use gpu_attest_shared::memory::slice_walk::{DeviceWalk, SliceWalk, StepOpening};
use gpu_attest_shared::merkle::MerkleProof;
use gpu_attest_shared::statement::DeviceInfo;
use gpu_attest_shared::statement::locality::SegmentSample;
use gpu_attest_shared::statement::memory_v4::StepSample;
use gpu_attest_shared::{BackendError, CancelToken, Digest};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `work` on every device's item side by side ([`gpu_attest_shared::failure::side_by_side`]);
/// a thread that panics counts as cancelled.
pub(crate) fn side_by_side<T: Sync, U: Send>(
    items: &[T],
    cancel: &CancelToken,
    work: impl Fn(&T) -> Result<U, BackendError> + Sync,
) -> Result<Vec<U>, BackendError> {
    gpu_attest_shared::failure::side_by_side(items, cancel, work, |_| BackendError::Cancelled)
}

/// What a commitment keeps on its devices for its memory phase (version 3's pools, version 4's
/// kept states) until it is released, and whether its one walk has been asked for.
pub struct HeldPools<T> {
    pools: Mutex<Option<T>>,
    walk_requested: AtomicBool,
}

impl<T> HeldPools<T> {
    pub fn new(pools: T) -> Self {
        HeldPools {
            pools: Mutex::new(Some(pools)),
            walk_requested: AtomicBool::new(false),
        }
    }

    /// The pools, or `None` once released.
    pub fn lock(&self) -> MutexGuard<'_, Option<T>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Frees the pools (another challenge needs the memory, or the opening round is over).
    /// Walks and openings of this commitment are refused from then on.
    pub fn release(&self) {
        self.lock().take();
    }

    /// Whether the pools are still held (not yet released).
    pub fn holds(&self) -> bool {
        self.lock().is_some()
    }

    /// Marks the commitment's one walk as asked for; `false` if it already was.
    pub fn claim_walk(&self) -> bool {
        !self.walk_requested.swap(true, Ordering::SeqCst)
    }
}

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

/// A finished locality walk, kept for its openings.
struct WalkedLines {
    walk: LocalityWalk,
    devices: Vec<LineWalk>,
    /// What each device's openings learnt of its states, kept for the round.
    paths: Vec<ChunkPaths>,
}

/// The memory side of a version 4 commitment: each device's kept states until they are
/// released, whether its one walk has been asked for, and the walk once done.
pub struct HeldChainPools {
    params: ChainPoolParams,
    /// G, the commitment's global root: every walk starts from it (PROTOCOL.md 20.4).
    global: Digest,
    pools: HeldPools<Vec<Box<dyn PoolStates>>>,
    walked: Mutex<Option<Walked>>,
    /// The locality walk (PROTOCOL.md 20.10): asked for at most once, opened at most once.
    lines_requested: AtomicBool,
    lines_opened: AtomicBool,
    lines: Mutex<Option<Box<WalkedLines>>>,
}

impl HeldChainPools {
    /// `pools` in device order, as the chain phase kept them.
    pub fn new(params: ChainPoolParams, global: Digest, pools: Vec<Box<dyn PoolStates>>) -> Self {
        HeldChainPools {
            params,
            global,
            pools: HeldPools::new(pools),
            walked: Mutex::new(None),
            lines_requested: AtomicBool::new(false),
            lines_opened: AtomicBool::new(false),
            lines: Mutex::new(None),
        }
    }

    /// G, the commitment's global root.
    pub fn global(&self) -> Digest {
        self.global
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

    /// Whether the version 4 walk has been done: the locality walk comes after it.
    pub fn has_walked(&self) -> bool {
        self.walked.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Marks the commitment's one locality walk as asked for; `false` if it already was.
    pub fn claim_lines(&self) -> bool {
        !self.lines_requested.swap(true, Ordering::SeqCst)
    }

    /// Marks the locality walk's one opening round as asked for; `false` if it already was.
    pub fn claim_lines_opening(&self) -> bool {
        !self.lines_opened.swap(true, Ordering::SeqCst)
    }

    /// The locality walk of every device (blocking), the devices side by side; `ended(j,
    /// locality_root_j, took)` is called on device `j`'s thread as soon as its walk ends.
    pub fn walk_lines(
        &self,
        walk: LocalityWalk,
        cancel: &CancelToken,
        ended: &(dyn Fn(u32, Digest, Duration) + Sync),
    ) -> Result<(), MinerError> {
        let devices = {
            let pools = self.pools.lock();
            let pools = pools.as_ref().ok_or(MinerError::PoolsReleased)?;
            side_by_side(pools, cancel, |pool| {
                let started = Instant::now();
                let walked = pool.walk_lines(&walk, cancel)?;
                ended(pool.pool().device, walked.root, started.elapsed());
                Ok(walked)
            })
            .map_err(MinerError::Walk)?
        };
        *self.lines.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(WalkedLines {
            paths: devices.iter().map(|_| ChunkPaths::default()).collect(),
            walk,
            devices,
        }));
        Ok(())
    }

    /// Checks locality samples before their round starts: the locality walk is done, the
    /// states still held, and every sample names a device, generation and walker of it.
    pub fn check_line_samples(&self, samples: &[SegmentSample]) -> Result<(), MinerError> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let lines = lines.as_ref().ok_or(MinerError::LinesNotWalked)?;
        if !self.holds_pools() {
            return Err(MinerError::PoolsReleased);
        }
        for &sample in samples {
            let in_range = (sample.device as usize) < lines.devices.len()
                && sample.generation < lines.walk.generations
                && sample.walker < lines.walk.walkers;
            if !in_range {
                return Err(MinerError::LocalitySampleOutOfRange(sample));
            }
        }
        Ok(())
    }

    /// Opens one locality segment (blocking: walks that walker's generation again).
    pub fn open_lines(
        &self,
        sample: SegmentSample,
        chain: &dyn Fn(u64) -> (Vec<gpu_attest_shared::Digest>, MerkleProof),
    ) -> Result<SegmentOpening, MinerError> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let lines = lines.as_ref().ok_or(MinerError::LinesNotWalked)?;
        let pools = self.pools.lock();
        let pools = pools.as_ref().ok_or(MinerError::PoolsReleased)?;
        let j = sample.device as usize;
        let (Some(pool), Some(walked), Some(paths)) = (pools.get(j), lines.devices.get(j), lines.paths.get(j)) else {
            return Err(MinerError::LocalitySampleOutOfRange(sample));
        };
        pool.open_lines(&lines.walk, walked, (sample.generation, sample.walker), chain, paths)
            .map_err(MinerError::Walk)?
            .ok_or(MinerError::LocalitySampleOutOfRange(sample))
    }
}
