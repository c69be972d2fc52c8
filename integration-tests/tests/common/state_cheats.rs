//! Version 4 miners that cheat on their pool states, or are honest but slow where the clock must
//! (or must not) see it: design 9's cheaters, each met by one defence.
//!
//! The chains are the CPU backend's, honestly; what changes is the pool the walk reads, the
//! commitment of its states where a cheat needs it, or when the walk and the openings happen.

use super::pool_cheat::{PoolCheat, host_slices};
use gpu_attest_shared::backend::PoolStates;
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice_walk::{HeldStates, SliceSource, SliceWalk, StepOpening};
use gpu_attest_shared::merkle::MerkleProof;
use gpu_attest_shared::{BackendError, CancelToken, Digest, Work};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

type StateWalk = gpu_attest_shared::memory::slice_walk::DeviceWalk;

/// What the miner does to its pool (the CPU backend wears it as `CheatingCpu<StateCheat>`).
#[derive(Clone, Copy, Debug)]
pub enum StateCheat {
    /// Commits random bytes as every pool chain's final state, their true hash as the chain's
    /// last checkpoint, and walks them honestly: every slice is on its committed state's path
    /// and every step follows, so only a row made again from the work function sees it.
    CheapStates,
    /// Holds only its pool's first state and serves that state's slices for every state,
    /// walking consistently: only a slice's path to its own chain's state hash sees it.
    OneStateForAll,
    /// Honest, but sleeps this long before its first opening: the work after the root (a
    /// GPU's download of what it walked) that the walk clock must leave out.
    SlowAfterWalk(Duration),
    /// Honest, but device `device`'s walk takes `extra` longer.
    SlowWalk { device: u32, extra: Duration },
}

impl PoolCheat for StateCheat {
    fn cheat(
        &self,
        _: &Arc<CpuBackend>,
        device: u32,
        _: &Work,
        pool: ChainPool,
        results: &mut [ChainResult],
        states: Box<dyn PoolStates>,
    ) -> Box<dyn PoolStates> {
        match *self {
            StateCheat::CheapStates => {
                let mut rng = ChaCha20Rng::from_seed([device as u8 + 1; 32]);
                let cheap: Vec<Matrix> = (0..pool.chains)
                    .map(|_| {
                        let mut bytes = vec![0u8; pool.n * pool.n];
                        rng.fill_bytes(&mut bytes);
                        Matrix::from_bytes(pool.n, &bytes).expect("n x n bytes")
                    })
                    .collect();
                // The pool chains come first in the device's range: each one's last
                // checkpoint becomes its cheap state's hash, so the commitment holds them.
                for (result, state) in results.iter_mut().zip(&cheap) {
                    *result.checkpoints.last_mut().expect("a chain has checkpoints") = state.digest();
                }
                Box::new(HeldStates::new(pool, cheap).expect("one state per pool chain"))
            }
            StateCheat::OneStateForAll => Box::new(OneStateForAll { states }),
            StateCheat::SlowAfterWalk(sleep) => Box::new(Timed {
                states,
                walk_extra: Duration::ZERO,
                before_first_opening: sleep,
                opened: AtomicBool::new(false),
            }),
            StateCheat::SlowWalk { device: slow, extra } => Box::new(Timed {
                states,
                walk_extra: if slow == device { extra } else { Duration::ZERO },
                before_first_opening: Duration::ZERO,
                opened: AtomicBool::new(false),
            }),
        }
    }
}

/// Every state served as the pool's first.
struct OneStateForAll {
    states: Box<dyn PoolStates>,
}

impl SliceSource for OneStateForAll {
    fn pool(&self) -> &ChainPool {
        self.states.pool()
    }

    fn slice(&self, e: u64) -> &[u8] {
        // Slice q of whichever state: slice q of the first one.
        let (_, q) = self.states.pool().locate(e);
        host_slices(self.states.as_ref()).slice(q)
    }
}

impl PoolStates for OneStateForAll {
    fn pool(&self) -> &ChainPool {
        self.states.pool()
    }

    fn host_states(&self) -> Option<&dyn SliceSource> {
        Some(self)
    }
}

/// Honest states, with time added to the walk or before the openings.
struct Timed {
    states: Box<dyn PoolStates>,
    walk_extra: Duration,
    before_first_opening: Duration,
    opened: AtomicBool,
}

impl PoolStates for Timed {
    fn pool(&self) -> &ChainPool {
        self.states.pool()
    }

    fn walk(
        &self,
        walk: &SliceWalk,
        cancel: &CancelToken,
        ended: &(dyn Fn(Digest) + Sync),
    ) -> Result<StateWalk, BackendError> {
        std::thread::sleep(self.walk_extra);
        self.states.walk(walk, cancel, ended)
    }

    fn open(
        &self,
        walk: &SliceWalk,
        walked: &StateWalk,
        walker: u32,
        step: u32,
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Result<Option<StepOpening>, BackendError> {
        if !self.opened.swap(true, Ordering::SeqCst) {
            std::thread::sleep(self.before_first_opening);
        }
        self.states.open(walk, walked, walker, step, chain)
    }
}
