//! Miners whose version 4 walk fakes steps: at a faked step the miner reads nothing (the slice
//! is one it does not hold) and makes the next state up, then walks on from it, committing its
//! own trace and opening it consistently. With every state committed (PROTOCOL.md 20.4), each
//! faked step is a failed opening of its own (`walk-segment-mismatch`) and every other step
//! opens as an honest one, wherever the fakes are placed. Two cheaters:
//!
//! - [`StepFakes`] fakes the steps it is told to (placement);
//! - [`Grinding`] lacks part of its pool and walks as the best cheater of PROTOCOL.md 20.9's
//!   bound does: it serves misses while its clock leaves room, fakes the rest, and grinds each
//!   made-up state until the next steps read only slices it holds.
//!
//! The chains and the pool are the CPU backend's, honestly: the cheat is in the walk alone.

use super::pool_cheat::{PoolCheat, host_slices};
use gpu_attest_shared::backend::PoolStates;
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice_walk::{DeviceWalk, SliceSource, SliceWalk, StepOpening, StepStates, step};
use gpu_attest_shared::memory::step::entry_index;
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use gpu_attest_shared::{BackendError, CancelToken, Digest, Work};
use std::sync::{Arc, Mutex};

/// Which steps `(device, walker, step)` the miner fakes.
pub type Fakes = Arc<dyn Fn(u32, u32, u32) -> bool + Send + Sync>;

/// How a cheater walks a device's whole walk: every walker's trace, its start state first, from
/// the honest slices (which the cheater reads only where it says it holds them).
type Tracer = Arc<dyn Fn(&dyn SliceSource, &SliceWalk) -> Vec<Vec<Digest>> + Send + Sync>;

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
        let fakes = self.0.clone();
        let tracer: Tracer = Arc::new(move |source, walk| {
            let pool = source.pool();
            (0..walk.walkers)
                .map(|w| {
                    let mut state = walk.start_state(pool.device, w);
                    let mut trace = vec![state];
                    for t in 0..walk.steps {
                        state = if fakes(pool.device, w, t) {
                            made_up(&state, 0)
                        } else {
                            step(source.slice(entry_index(&state, pool.slices())), &state, t)
                        };
                        trace.push(state);
                    }
                    trace
                })
                .collect()
        });
        FakedWalk::boxed(states, tracer)
    }
}

/// A state the cheater makes up after `state` instead of reading the slice it lacks: the
/// `attempt`-th candidate.
fn made_up(state: &Digest, attempt: u64) -> Digest {
    Digest::hash(&[state.0.as_slice(), b"made up", &attempt.to_le_bytes()].concat())
}

/// A miner short of part of its pool, walking as the best cheater the bound counts (design 6.2,
/// PROTOCOL.md 20.9): it lacks the pool slices below `missing` (indices are hash outputs, so
/// which ones does not matter), serves a miss (makes the slice again, here: reads it) while it
/// has served fewer than `serve_share` of the walk's steps, the share its clock hides, and fakes
/// the rest. After each fake it grinds: it tries made-up states one after another, each until
/// its first missing index, and keeps the first whose next `run` steps read held slices only.
/// What it did, walk by walk, is in [`Grinding::tallies`].
#[derive(Clone)]
pub struct Grinding {
    pub missing: u64,
    pub serve_share: f64,
    pub run: u32,
    pub tallies: Arc<Mutex<Vec<GrindTally>>>,
}

/// One device walk of a [`Grinding`] cheater.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrindTally {
    /// Steps in the walk (`W * L`).
    pub steps: u64,
    /// Steps whose next state was made up: each a failed opening.
    pub faked: u64,
    /// Misses served within the clock's share.
    pub served: u64,
    /// Slices read: the trace's held steps, and the trials thrown away.
    pub reads: u64,
}

impl Grinding {
    fn trace_walk(&self, source: &dyn SliceSource, walk: &SliceWalk) -> (Vec<Vec<Digest>>, GrindTally) {
        let pool = source.pool();
        let slices = pool.slices();
        let mut tally = GrindTally {
            steps: u64::from(walk.walkers) * u64::from(walk.steps),
            ..GrindTally::default()
        };
        let serve_budget = (self.serve_share * tally.steps as f64).floor() as u64;
        let held = |state: &Digest| entry_index(state, slices) >= self.missing;
        let read = |state: &Digest, t: u32| step(source.slice(entry_index(state, slices)), state, t);
        let traces = (0..walk.walkers)
            .map(|w| {
                let mut trace = vec![walk.start_state(pool.device, w)];
                while trace.len() <= walk.steps as usize {
                    let t = (trace.len() - 1) as u32;
                    let state = *trace.last().expect("the start state");
                    if held(&state) {
                        tally.reads += 1;
                        trace.push(read(&state, t));
                    } else if tally.served < serve_budget {
                        tally.served += 1;
                        trace.push(read(&state, t));
                    } else {
                        // Step t is faked; steps t + 1 .. t + run come from the kept candidate.
                        tally.faked += 1;
                        let run = self.run.min(walk.steps - t - 1);
                        let kept = (0..)
                            .find_map(|attempt| {
                                let mut trial = vec![made_up(&state, attempt)];
                                for j in 0..run {
                                    let at = trial.last().expect("a candidate");
                                    if !held(at) {
                                        return None;
                                    }
                                    tally.reads += 1;
                                    trial.push(read(at, t + 1 + j));
                                }
                                Some(trial)
                            })
                            .expect("some candidate is kept");
                        trace.extend(kept);
                    }
                }
                trace
            })
            .collect();
        (traces, tally)
    }
}

impl PoolCheat for Grinding {
    fn cheat(
        &self,
        _: &Arc<CpuBackend>,
        _: u32,
        _: &Work,
        _: ChainPool,
        _: &mut [ChainResult],
        states: Box<dyn PoolStates>,
    ) -> Box<dyn PoolStates> {
        let me = self.clone();
        let tracer: Tracer = Arc::new(move |source, walk| {
            let (traces, tally) = me.trace_walk(source, walk);
            me.tallies.lock().unwrap().push(tally);
            traces
        });
        FakedWalk::boxed(states, tracer)
    }
}

/// Honest states, a cheater's walk over them, and every walker's whole trace kept to open from.
struct FakedWalk {
    states: Box<dyn PoolStates>,
    tracer: Tracer,
    traces: Mutex<Vec<Vec<Digest>>>,
}

impl FakedWalk {
    /// The pool a cheat hands its backend: the honest `states`, walked by `tracer`.
    fn boxed(states: Box<dyn PoolStates>, tracer: Tracer) -> Box<dyn PoolStates> {
        Box::new(FakedWalk {
            states,
            tracer,
            traces: Mutex::new(Vec::new()),
        })
    }
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
        let traces = (self.tracer)(host_slices(self.states.as_ref()), walk);
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
        walked.complete_opening(host_slices(self.states.as_ref()), walker, step, states, chain)
    }
}

/// A device's walk as a cheater that walks its own way commits it: each walker's tree over its
/// whole trace, and the device's tree over the walkers' roots (PROTOCOL.md 20.4).
pub fn committed_walk(traces: &[Vec<Digest>]) -> DeviceWalk {
    let walker_roots: Vec<Digest> = traces.iter().map(|t| MerkleTree::new(t).root()).collect();
    let root = MerkleTree::new(&walker_roots).root();
    DeviceWalk::new(walker_roots, root, Vec::new())
}
