//! The `Backend` trait: what a compute backend (CPU, CUDA, ...) provides to the engine.
//!
//! A backend runs whole chains, not single GEMMs, so that a GPU backend can keep A, B and X on
//! the device, fuse `mix` into its epilogue and hash on the device. The engine decides which
//! chains each device runs (the canonical partition) and assembles the commitment; a backend
//! only has to produce the right checkpoint hashes.

use crate::chain::ChainResult;
use crate::device::DeviceInfo;
use crate::digest::Digest;
use crate::matrix::Matrix;
use crate::memory::PoolSpec;
use crate::memory::chain_pool::{ChainPool, ChainPoolParams};
use crate::memory::check::{CommittedEntries, WalkOpening, open_segment};
use crate::memory::locality::{
    ChunkPaths, LineWalk, LocalityWalk, SegmentOpening, open_segment as open_locality_segment, walk_lines,
};
use crate::memory::slice_walk::{
    DeviceWalk as StateWalk, HeldStates, SliceSource, SliceWalk, StepOpening, open_kept_step, walk_device_until,
};
use crate::memory::walk::{DeviceWalk, WalkSpec};
use crate::merkle::MerkleProof;
use crate::params::Work;
use std::ops::Range;

pub use crate::failure::{BackendError, CancelToken};

/// A device's pool (PROTOCOL.md 18.2), filled and held where the device keeps it, for the walk
/// and its openings.
pub trait ResidentPool: Send + Sync {
    fn spec(&self) -> &PoolSpec;

    /// The pool root.
    fn root(&self) -> Digest;

    /// The whole walk of `walk` over this pool (PROTOCOL.md 18.3).
    fn walk(&self, walk: &WalkSpec, cancel: &CancelToken) -> Result<DeviceWalk, BackendError>;

    /// The pool's entries and their proofs, as an opening reads them.
    fn committed(&self) -> &dyn CommittedEntries;

    /// Segment `segment` of walker `walker`, opened from this pool and `done`, the walk it ran;
    /// `Ok(None)` if there is no such walker or segment, an error if the pool cannot be read.
    fn open(
        &self,
        done: &DeviceWalk,
        walk: &WalkSpec,
        walker: u32,
        segment: u32,
    ) -> Result<Option<WalkOpening>, BackendError> {
        open_segment(self.committed(), done, walk, walker, segment)
    }
}

/// A device's version 4 pool (PROTOCOL.md 20.1): the final states of its pool chains, kept
/// where the device keeps them from the chain phase to the end of the opening round. The walk
/// and its openings read it as 64 KiB slices.
pub trait PoolStates: Send + Sync {
    /// Which chains' states these are, on which device.
    fn pool(&self) -> &ChainPool;

    /// The states slice by slice, where they are in host memory (the CPU backend's); `None`
    /// where they stay on a device, whose pool walks and opens itself.
    fn host_states(&self) -> Option<&dyn SliceSource> {
        None
    }

    /// The walk of `walk` over these states (PROTOCOL.md 20.4): each walker's root and the
    /// device's walk root, `ended` told the root as soon as it is known (before anything kept
    /// for the openings is gathered, so that a miner can sign and send it at once). Stops soon
    /// after `cancel` is cancelled.
    fn walk(
        &self,
        walk: &SliceWalk,
        cancel: &CancelToken,
        ended: &(dyn Fn(Digest) + Sync),
    ) -> Result<StateWalk, BackendError> {
        let source = self.host_states().ok_or(BackendError::Unsupported {
            what: "walk a pool held on a device without a walk of its own",
        })?;
        let walked = walk_device_until(walk, source, cancel)?;
        ended(walked.root);
        Ok(walked)
    }

    /// Opens step `step` of walker `walker` of `walked`, the walk [`PoolStates::walk`] made
    /// (PROTOCOL.md 20.5); `chain(i)` gives chain `i`'s checkpoint hashes and its leaf's proof.
    /// `Ok(None)` for a walker or step outside the walk; an error if the states cannot be read.
    fn open(
        &self,
        walk: &SliceWalk,
        walked: &StateWalk,
        walker: u32,
        step: u32,
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Result<Option<StepOpening>, BackendError> {
        let source = self.host_states().ok_or(BackendError::Unsupported {
            what: "open a pool held on a device without openings of its own",
        })?;
        open_kept_step(walk, source, walked, walker, step, chain)
    }

    /// The locality walk of `walk` over these states (PROTOCOL.md 20.10): every generation's
    /// end states, their digests and the locality root. Stops soon after `cancel` is cancelled.
    /// A pool held on a device that has no line walk of its own says so ([`BackendError::Unsupported`]).
    fn walk_lines(&self, walk: &LocalityWalk, cancel: &CancelToken) -> Result<LineWalk, BackendError> {
        let source = self.host_states().ok_or(BackendError::Unsupported {
            what: "walk lines of a pool held on a device without a line walk of its own",
        })?;
        walk_lines(walk, source, cancel)
    }

    /// Opens walker `walker` of generation `generation` of `walked`, the walk
    /// [`PoolStates::walk_lines`] made; `paths` is kept across the round's openings of this
    /// device. `Ok(None)` for a segment outside the walk.
    fn open_lines(
        &self,
        walk: &LocalityWalk,
        walked: &LineWalk,
        segment: (u32, u32),
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
        paths: &ChunkPaths,
    ) -> Result<Option<SegmentOpening>, BackendError> {
        let source = self.host_states().ok_or(BackendError::Unsupported {
            what: "open lines of a pool held on a device without a line walk of its own",
        })?;
        open_locality_segment(walk, source, walked, segment, chain, paths)
    }
}

/// The CPU backend's pool: the states in host memory.
impl PoolStates for HeldStates {
    fn pool(&self) -> &ChainPool {
        SliceSource::pool(self)
    }

    fn host_states(&self) -> Option<&dyn SliceSource> {
        Some(self)
    }
}

/// How a backend reports per-chain progress: called from the device's thread after each chain.
pub type ChainProgress<'a> = &'a (dyn Fn(u64) + Sync);

/// One way of computing the work function. Implementations must be bit-identical to the naive
/// definition in PROTOCOL.md; the engine never looks inside.
pub trait Backend: Send + Sync {
    /// Human-readable name with the kernel, e.g. `cpu (avx512-vnni, 2 threads)`.
    fn describe(&self) -> String;

    /// How many devices the engine splits chains over (GPUs; the CPU backend presents one by default).
    fn device_count(&self) -> u32;

    /// What each device states in an inventory (PROTOCOL.md 13), in partition order: the
    /// facts (model, units, memory) a validator sizes the work and the memory phase by, and a
    /// commitment binds. Text is already fitted to the protocol's rules.
    fn devices(&self) -> Vec<DeviceInfo>;

    /// Checkpoint hashes of the chains `chains` (global indices), computed on `device`, in index
    /// order. `progress` is told the number of chains finished so far.
    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError>;

    /// Runs `chains` as [`Backend::run_chains`] does, and keeps the final states `X_{i,K}` of
    /// `pool`'s chains (the first of `chains`) as device `device`'s version 4 pool
    /// (PROTOCOL.md 20.1). Backends that cannot keep them yet say so.
    fn run_pool_chains(
        &self,
        _device: u32,
        _work: &Work,
        _chains: Range<u64>,
        _pool: ChainPool,
        _progress: ChainProgress<'_>,
        _cancel: &CancelToken,
    ) -> Result<(Vec<ChainResult>, Box<dyn PoolStates>), BackendError> {
        Err(BackendError::Unsupported {
            what: "keep its chains' final states as a pool (protocol version 4)",
        })
    }

    /// Whether [`Backend::run_pool_chains`] works here: a miner answers a version 4 challenge
    /// only on a backend that keeps its chains' final states as pools.
    fn keeps_chain_pools(&self) -> bool {
        false
    }

    /// Refuses a version 4 pool its device cannot hold beside the chains' batches and the
    /// buffers of the walk `params` asks for, before a challenge is accepted (a GPU checks its
    /// free memory). Backends without such a limit accept every pool.
    fn check_chain_pool_capacity(
        &self,
        _work: &Work,
        _pool: &ChainPool,
        _params: &ChainPoolParams,
    ) -> Result<(), BackendError> {
        Ok(())
    }

    /// Devices that can no longer run work (a GPU that faulted and could not be reset), each
    /// with the reason, in device order. Work is refused while any is listed: the partition
    /// gives every device a share.
    fn out_of_service(&self) -> Vec<(u32, String)> {
        Vec::new()
    }

    /// Refuses work the devices cannot hold, before a challenge is accepted (a GPU checks its
    /// free memory). Backends without such a limit accept everything.
    fn check_capacity(&self, _work: &Work) -> Result<(), BackendError> {
        Ok(())
    }

    /// Whether [`Backend::fill_pool`] works here: a miner speaks protocol version 3 (the memory
    /// phase) only on a backend that can hold pools.
    fn holds_pools(&self) -> bool {
        false
    }
    /// Refuses a pool its device cannot hold, before a challenge is accepted (a GPU checks its
    /// free memory). Backends without such a limit accept every pool.
    fn check_pool_capacity(&self, _spec: &PoolSpec) -> Result<(), BackendError> {
        Ok(())
    }

    /// Fills `spec`'s pool on its device (`spec.device()`) and keeps it there (PROTOCOL.md
    /// 18.2). `progress` hears the entries made so far, now and then. Backends that cannot hold
    /// a pool yet say so.
    fn fill_pool(
        &self,
        _spec: &PoolSpec,
        _progress: &(dyn Fn(u64) + Sync),
        _cancel: &CancelToken,
    ) -> Result<Box<dyn ResidentPool>, BackendError> {
        Err(BackendError::Unsupported {
            what: "hold a memory pool (protocol version 3)",
        })
    }

    /// `X_{first + steps}` of chain `chain`, given `start = X_first`. Used to open a chain for
    /// the validator and to check an opened segment.
    fn advance(
        &self,
        work: &Work,
        chain: u64,
        start: Matrix,
        first: u32,
        steps: u32,
        cancel: &CancelToken,
    ) -> Result<Matrix, BackendError>;
}

/// Checks `advance`'s arguments against the challenge; every backend calls it first.
pub fn check_advance(work: &Work, start: &Matrix, first: u32, steps: u32) -> Result<(), BackendError> {
    if start.n() != work.n() {
        return Err(BackendError::WrongMatrixSize {
            got: start.n(),
            want: work.n(),
        });
    }
    let end = u64::from(first) + u64::from(steps);
    if end > u64::from(work.iterations()) {
        return Err(BackendError::StepsOutOfRange {
            first,
            end,
            iterations: work.iterations(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend with nothing but the required methods.
    struct Bare;

    impl Backend for Bare {
        fn describe(&self) -> String {
            "bare".into()
        }

        fn device_count(&self) -> u32 {
            1
        }

        fn devices(&self) -> Vec<DeviceInfo> {
            vec![DeviceInfo::default()]
        }

        fn run_chains(
            &self,
            _: u32,
            _: &Work,
            _: Range<u64>,
            _: ChainProgress<'_>,
            _: &CancelToken,
        ) -> Result<Vec<ChainResult>, BackendError> {
            Err(BackendError::Cancelled)
        }

        fn advance(
            &self,
            _: &Work,
            _: u64,
            _: Matrix,
            _: u32,
            _: u32,
            _: &CancelToken,
        ) -> Result<Matrix, BackendError> {
            Err(BackendError::Cancelled)
        }
    }

    /// A backend that cannot hold a pool says so in words, rather than filling nothing.
    #[test]
    fn a_backend_without_pools_refuses_to_fill_one() {
        let work = Work::new(crate::vectors::vector_params()).unwrap();
        let spec = PoolSpec::with_entries(&work, 0, 4);
        let refused = Bare.fill_pool(&spec, &|_| {}, &CancelToken::new()).err().unwrap();
        assert_eq!(
            refused.to_string(),
            "this backend cannot hold a memory pool (protocol version 3) yet"
        );
    }

    /// Nor does one that cannot keep its chains' states pretend to (the engine passes the
    /// refusal on, naming version 4).
    #[test]
    fn a_backend_without_pool_states_refuses_to_keep_them() {
        let params = crate::ChallengeParams {
            n: 256,
            ..crate::vectors::vector_params()
        };
        let work = Work::new(params).unwrap();
        let pool = ChainPool::new(0, 0, 1, 256).unwrap();
        let refused = Bare
            .run_pool_chains(0, &work, 0..1, pool, &|_| {}, &CancelToken::new())
            .err()
            .unwrap();
        assert_eq!(
            refused.to_string(),
            "this backend cannot keep its chains' final states as a pool (protocol version 4) yet"
        );
        let by_the_engine = crate::engine::execute_with_pools(&Bare, &work, &[1], &|_| {}, &CancelToken::new());
        assert!(matches!(
            by_the_engine.err(),
            Some(crate::engine::EngineError::Backend(BackendError::Unsupported { .. }))
        ));
    }
}
