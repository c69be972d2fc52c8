//! A miner whose version 4 walk fakes the steps it chooses: at a faked step it reads nothing
//! (the slice is one it does not hold) and makes the next state up, then walks on from it,
//! committing its own trace and opening it consistently. With every state committed
//! (PROTOCOL.md 20.4), each faked step is a failed opening of its own (`walk-segment-mismatch`)
//! and every other step opens as an honest one, wherever the fakes are placed.
//!
//! The chains and the pool are the CPU backend's, honestly: the cheat is in the walk alone.

use super::pool_cheat::{PoolCheat, host_slices};
use gpu_attest_shared::backend::PoolStates;
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice_walk::{DeviceWalk, SliceWalk, StepOpening, StepStates, complete_opening, step};
use gpu_attest_shared::memory::walk::entry_index;
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use gpu_attest_shared::{BackendError, CancelToken, Digest, Work};
use std::sync::{Arc, Mutex};

/// Which steps `(device, walker, step)` the miner fakes.
pub type Fakes = Arc<dyn Fn(u32, u32, u32) -> bool + Send + Sync>;

/// The cheat: a walk that fakes the steps `.0` names (the CPU backend wears it as
/// `CheatingCpu<StepFakes>`).
pub struct StepFakes(pub Fakes);

impl PoolCheat for StepFakes {
    fn cheat(
        &self,
        _: &Arc<CpuBackend>,
        _: u32,
        _: &Work,
        _: ChainPool,
        _: &mut [ChainResult],
        states: Box<dyn PoolStates>,
    ) -> Box<dyn PoolStates> {
        Box::new(FakedWalk {
            states,
            fakes: self.0.clone(),
            traces: Mutex::new(Vec::new()),
        })
    }
}

/// Honest states, a faked walk over them, and every walker's whole trace kept to open from.
struct FakedWalk {
    states: Box<dyn PoolStates>,
    fakes: Fakes,
    traces: Mutex<Vec<Vec<Digest>>>,
}

impl PoolStates for FakedWalk {
    fn pool(&self) -> &ChainPool {
        self.states.pool()
    }

    fn walk(
        &self,
        walk: &SliceWalk,
        _: &CancelToken,
        ended: &(dyn Fn(Digest) + Sync),
    ) -> Result<DeviceWalk, BackendError> {
        let source = host_slices(self.states.as_ref());
        let pool = self.states.pool();
        let traces: Vec<Vec<Digest>> = (0..walk.walkers)
            .map(|w| {
                let mut state = walk.start_state(pool.device, w);
                let mut trace = vec![state];
                for t in 0..walk.steps {
                    state = if (self.fakes)(pool.device, w, t) {
                        Digest::hash(&[state.0.as_slice(), b"made up"].concat())
                    } else {
                        step(source.slice(entry_index(&state, pool.slices())), &state, t)
                    };
                    trace.push(state);
                }
                trace
            })
            .collect();
        let walked = committed_walk(&traces);
        *self.traces.lock().unwrap() = traces;
        ended(walked.root);
        Ok(walked)
    }

    fn open(
        &self,
        _: &SliceWalk,
        walked: &DeviceWalk,
        walker: u32,
        step: u32,
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Result<Option<StepOpening>, BackendError> {
        let traces = self.traces.lock().unwrap();
        let Some(states) = traces
            .get(walker as usize)
            .and_then(|trace| StepStates::from_trace(trace, step))
        else {
            return Ok(None);
        };
        complete_opening(
            host_slices(self.states.as_ref()),
            &walked.walker_roots,
            walker,
            step,
            states,
            chain,
        )
    }
}

/// A device's walk as a cheater that walks its own way commits it: each walker's tree over its
/// whole trace, and the device's tree over the walkers' roots (PROTOCOL.md 20.4).
pub fn committed_walk(traces: &[Vec<Digest>]) -> DeviceWalk {
    let walker_roots: Vec<Digest> = traces.iter().map(|t| MerkleTree::new(t).root()).collect();
    DeviceWalk {
        root: MerkleTree::new(&walker_roots).root(),
        walker_roots,
        kept: Vec::new(),
    }
}
