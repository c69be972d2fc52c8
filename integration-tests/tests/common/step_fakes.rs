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
use gpu_attest_shared::memory::slice::slice_path;
use gpu_attest_shared::memory::slice_walk::{DeviceWalk, SliceSource, SliceWalk, StepOpening, step};
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

impl FakedWalk {
    /// The whole state of `chain`, from its slices.
    fn whole_state(&self, chain: u64) -> Vec<u8> {
        let source = self.states.source();
        let pool = source.pool();
        let first = (chain - pool.first_chain) * pool.slices_per_state();
        (first..first + pool.slices_per_state())
            .flat_map(|e| source.slice(e).iter().copied())
            .collect()
    }
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
        let states = traces.get(walker as usize)?;
        let tree = MerkleTree::new(states);
        let (t, w) = (step as usize, walker as usize);
        let (before, after) = (*states.get(t)?, *states.get(t + 1)?);
        let pool = self.source().pool();
        let e = entry_index(&before, pool.slices());
        let (chain_index, q) = pool.locate(e);
        let (checkpoints, chain_proof) = chain(chain_index);
        Some(StepOpening {
            walker,
            step,
            walker_root: walked.walker_roots[w],
            walker_proof: MerkleTree::new(&walked.walker_roots).proof(u64::from(walker))?,
            start_proof: tree.proof(0)?,
            before,
            before_proof: tree.proof(t as u64)?,
            after,
            after_proof: tree.proof(t as u64 + 1)?,
            slice: self.source().slice(e).to_vec(),
            slice_path: slice_path(&self.whole_state(chain_index), q).ok()?,
            checkpoints,
            chain_proof,
        })
    }
}
