//! The walk (PROTOCOL.md 18.3): W walkers per device, each L steps; step t reads the one entry
//! that the state before it names, so no step can be known, or its entry fetched, before the
//! step before it is done.

use super::params::MemoryParams;
use super::pool::EntrySource;
pub use super::step::entry_index;
use super::step::step_under;
use crate::digest::Digest;
use crate::failure::{BackendError, CancelToken};
use crate::merkle::MerkleTree;
use rayon::prelude::*;

const START_CONTEXT: &[u8] = b"gpu-attest v3 walk start";
const STEP_CONTEXT: &[u8] = b"gpu-attest v3 walk step";
const LEAF_CONTEXT: &[u8] = b"gpu-attest v3 walk leaf";

/// Steps a walker takes between looks at the cancel flag.
const CANCEL_EVERY: u32 = 64;

/// What one device's walk is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkSpec {
    pub nonce: [u8; 32],
    /// 32 random bytes from the validator's walk request, sent after the pool roots were
    /// committed.
    pub walk_seed: [u8; 32],
    pub device: u32,
    pub pool_root: Digest,
    /// P: the device's pool entries.
    pub entries: u64,
    pub params: MemoryParams,
}

impl WalkSpec {
    /// `s_{w,0} = blake3("gpu-attest v3 walk start" || nonce || walk_seed || le32(j) ||
    /// pool_root_j || le32(w))`.
    pub fn start_state(&self, walker: u32) -> Digest {
        let mut h = blake3::Hasher::new();
        h.update(START_CONTEXT);
        h.update(&self.nonce);
        h.update(&self.walk_seed);
        h.update(&self.device.to_le_bytes());
        h.update(self.pool_root.as_bytes());
        h.update(&walker.to_le_bytes());
        h.finalize().into()
    }
}

/// One walk step, step number `t` of its walker: `y = E * v` (int32, exact),
/// `z[r] = mix(y[r], t, r, 0)`, `s' = blake3("gpu-attest v3 walk step" || s || z)`.
pub fn step(entry: &[i8], state: &Digest, t: u32) -> Digest {
    step_under(STEP_CONTEXT, entry, state, t)
}

/// One walker's checkpoints: `s_{w, q*c_w}` for q in 0..=L/c_w.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkerTrace {
    pub walker: u32,
    pub checkpoints: Vec<Digest>,
}

impl WalkerTrace {
    pub fn leaf(&self) -> Digest {
        walk_leaf(self.walker, &self.checkpoints)
    }
}

/// `blake3("gpu-attest v3 walk leaf" || le32(w) || s_{w,0} || s_{w,c_w} || ... || s_{w,L})`.
pub fn walk_leaf(walker: u32, checkpoints: &[Digest]) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(LEAF_CONTEXT);
    h.update(&walker.to_le_bytes());
    for c in checkpoints {
        h.update(c.as_bytes());
    }
    h.finalize().into()
}

/// Runs walker `walker` over `pool`.
pub fn walk_one(
    pool: &dyn EntrySource,
    spec: &WalkSpec,
    walker: u32,
    cancel: &CancelToken,
) -> Result<WalkerTrace, BackendError> {
    Ok(walk_group(pool, spec, walker..walker + 1, cancel)?.remove(0))
}

/// Walkers a thread steps in turn. Once a walker's step is done its next entry is known, and
/// the memory system fetches it while the thread steps the group's other walker: one walker
/// alone waits for each entry and then computes on it, about 60% of the machine's read
/// bandwidth on two Zen 3 cores; two in turn overlap the two.
const WALKERS_PER_THREAD_TASK: u32 = 2;

/// Walkers `walkers` stepped in turn, with their traces in walker order.
fn walk_group(
    pool: &dyn EntrySource,
    spec: &WalkSpec,
    walkers: std::ops::Range<u32>,
    cancel: &CancelToken,
) -> Result<Vec<WalkerTrace>, BackendError> {
    let every = spec.params.walk_checkpoint_every;
    let mut states: Vec<Digest> = walkers.clone().map(|w| spec.start_state(w)).collect();
    let mut traces: Vec<WalkerTrace> = walkers
        .zip(&states)
        .map(|(walker, start)| {
            let mut checkpoints = Vec::with_capacity(spec.params.walk_segments() as usize + 1);
            checkpoints.push(*start);
            WalkerTrace { walker, checkpoints }
        })
        .collect();
    for t in 0..spec.params.walk_steps {
        if t.is_multiple_of(CANCEL_EVERY) {
            cancel.check()?;
        }
        for (state, trace) in states.iter_mut().zip(&mut traces) {
            *state = step(&pool.entry(entry_index(state, spec.entries)), state, t);
            pool.prefetch(entry_index(state, spec.entries));
            if (t + 1).is_multiple_of(every) {
                trace.checkpoints.push(*state);
            }
        }
    }
    Ok(traces)
}

/// One device's whole walk: every walker's trace, in walker order, on the threads of the
/// rayon pool this is called in.
pub fn walk_all(pool: &dyn EntrySource, spec: &WalkSpec, cancel: &CancelToken) -> Result<DeviceWalk, BackendError> {
    let walkers = spec.params.walkers;
    let groups = walkers.div_ceil(WALKERS_PER_THREAD_TASK);
    let traces = (0..groups)
        .into_par_iter()
        .map(|g| {
            let first = g * WALKERS_PER_THREAD_TASK;
            let group = walk_group(
                pool,
                spec,
                first..(first + WALKERS_PER_THREAD_TASK).min(walkers),
                cancel,
            );
            if group.is_err() {
                cancel.cancel();
            }
            group
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(DeviceWalk::new(traces.into_iter().flatten().collect()))
}

/// A device's walker traces and the tree over their leaves: what a miner keeps to open them.
#[derive(Clone, Debug)]
pub struct DeviceWalk {
    pub traces: Vec<WalkerTrace>,
    pub tree: MerkleTree,
}

impl DeviceWalk {
    pub fn new(traces: Vec<WalkerTrace>) -> Self {
        // In parallel: a GPU's default walk has 300 MB of checkpoints to hash, a tenth of a
        // second on one core, inside the walk's timed window.
        let leaves: Vec<Digest> = traces.par_iter().map(WalkerTrace::leaf).collect();
        DeviceWalk {
            tree: MerkleTree::new(&leaves),
            traces,
        }
    }

    /// The walk root (PROTOCOL.md 18.3): the Merkle root over the walkers' leaves.
    pub fn root(&self) -> Digest {
        self.tree.root()
    }
}
