//! A miner whose version 4 walk fakes the steps it chooses: at a faked step it reads nothing
//! (the slice is one it does not hold) and makes the next state up, then walks on from it,
//! committing its own trace and opening it consistently. With every state committed
//! (PROTOCOL.md 20.4), each faked step is a failed opening of its own (`walk-segment-mismatch`)
//! and every other step opens as an honest one, wherever the fakes are placed.
//!
//! The chains and the pool are the CPU backend's, honestly: the cheat is in the walk alone.

use gpu_attest_shared::backend::{ChainProgress, PoolStates};
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice_walk::{
    DeviceWalk, SliceSource, SliceWalk, StepOpening, StepStates, complete_opening, step,
};
use gpu_attest_shared::memory::walk::entry_index;
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use gpu_attest_shared::{Backend, BackendError, CancelToken, Digest, Work};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Which steps `(device, walker, step)` the miner fakes.
pub type Fakes = Arc<dyn Fn(u32, u32, u32) -> bool + Send + Sync>;

/// The CPU backend, with a walk that fakes `fakes`.
pub struct StepFaker {
    pub cpu: CpuBackend,
    pub fakes: Fakes,
}

impl Backend for StepFaker {
    fn describe(&self) -> String {
        self.cpu.describe()
    }
    fn device_count(&self) -> u32 {
        self.cpu.device_count()
    }
    fn devices(&self) -> Vec<gpu_attest_shared::statement::DeviceInfo> {
        self.cpu.devices()
    }
    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        self.cpu.run_chains(device, work, chains, progress, cancel)
    }
    fn run_pool_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        pool: ChainPool,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<(Vec<ChainResult>, Box<dyn PoolStates>), BackendError> {
        let (results, states) = self.cpu.run_pool_chains(device, work, chains, pool, progress, cancel)?;
        let faked = FakedWalk {
            states,
            fakes: self.fakes.clone(),
            traces: Mutex::new(Vec::new()),
        };
        Ok((results, Box::new(faked)))
    }
    fn keeps_chain_pools(&self) -> bool {
        true
    }
    fn advance(
        &self,
        work: &Work,
        chain: u64,
        start: Matrix,
        first: u32,
        steps: u32,
        cancel: &CancelToken,
    ) -> Result<Matrix, BackendError> {
        self.cpu.advance(work, chain, start, first, steps, cancel)
    }
}

/// Honest states, a faked walk over them, and every walker's whole trace kept to open from.
struct FakedWalk {
    states: Box<dyn PoolStates>,
    fakes: Fakes,
    traces: Mutex<Vec<Vec<Digest>>>,
}

impl PoolStates for FakedWalk {
    fn source(&self) -> &dyn SliceSource {
        self.states.source()
    }

    fn walk(&self, walk: &SliceWalk, _: &CancelToken) -> Result<DeviceWalk, BackendError> {
        let source = self.source();
        let pool = source.pool();
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
        let walker_roots: Vec<Digest> = traces.iter().map(|t| MerkleTree::new(t).root()).collect();
        let root = MerkleTree::new(&walker_roots).root();
        *self.traces.lock().unwrap() = traces;
        Ok(DeviceWalk {
            walker_roots,
            root,
            kept: Vec::new(),
        })
    }

    fn open(
        &self,
        _: &SliceWalk,
        walked: &DeviceWalk,
        walker: u32,
        step: u32,
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Option<StepOpening> {
        let traces = self.traces.lock().unwrap();
        let states = StepStates::from_trace(traces.get(walker as usize)?, step)?;
        complete_opening(self.source(), &walked.walker_roots, walker, step, states, chain)
    }
}
