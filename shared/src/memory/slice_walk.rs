//! Protocol version 4's walk and its openings (docs/design/protocol-v4.md 2.4 and 2.5): `W`
//! walkers per device, each `L` steps over 64 KiB slices of the pool chains' final states, every
//! state committed (`c_w = 1`), so that each faked step is a failed opening of its own.
//!
//! A walker's states are the leaves of its own Merkle tree, folded as it walks in blocks of
//! [`KEPT_EVERY`] states, of which it keeps each block's first state and node
//! ([`KeptTrace`]); the device's walk root is the tree over the walker roots.
//! An opening of step `t` proves `s_t` and `s_{t+1}` in the walker's tree, the walker's start
//! (which the validator computes itself, so that no walker may choose where it begins), the
//! slice `s_t` names against its chain's committed state, and the step between them.

use super::chain_pool::{ChainPool, StateRows};
use super::slice::{SLICE_BYTES, SliceError, SlicePath, StateSlices, verify_slice};
use super::step::{entry_index, step_under};
use crate::chain::leaf_hash;
use crate::digest::Digest;
use crate::failure::{BackendError, CancelToken};
use crate::matrix::Matrix;
use crate::merkle::{MerkleProof, MerkleTree, verify_proof};
use crate::params::Work;
use rayon::prelude::*;
use std::sync::OnceLock;
use thiserror::Error;

const START_CONTEXT: &[u8] = b"gpu-attest v4 walk start";
const STEP_CONTEXT: &[u8] = b"gpu-attest v4 walk step";

/// What every device's walk of one challenge is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceWalk {
    pub nonce: [u8; 32],
    /// Drawn by the validator after the commitment arrived.
    pub walk_seed: [u8; 32],
    /// G, the commitment's global root: the walk starts from what was committed.
    pub global: Digest,
    /// W, walkers per device.
    pub walkers: u32,
    /// L, steps per walker.
    pub steps: u32,
}

impl SliceWalk {
    /// `s_{w,0} = blake3("gpu-attest v4 walk start" || nonce || walk_seed || G || le32(j) ||
    /// le32(w))`.
    pub fn start_state(&self, device: u32, walker: u32) -> Digest {
        let mut h = blake3::Hasher::new();
        h.update(START_CONTEXT);
        h.update(&self.nonce);
        h.update(&self.walk_seed);
        h.update(self.global.as_bytes());
        h.update(&device.to_le_bytes());
        h.update(&walker.to_le_bytes());
        h.finalize().into()
    }
}

/// Step `t` over `slice` (65536 bytes read as a 256 x 256 int8 matrix): version 3's step
/// under version 4's domain.
pub fn step(slice: &[u8], state: &Digest, t: u32) -> Digest {
    step_under(STEP_CONTEXT, bytemuck::cast_slice(slice), state, t)
}

/// Where a walk reads its slices: a device's resident pool.
pub trait SliceSource: Sync {
    fn pool(&self) -> &ChainPool;
    /// Pool slice `e` (65536 bytes).
    fn slice(&self, e: u64) -> &[u8];
}

/// A pool's states in host memory, in chain order (the CPU backend's pool).
pub struct HeldStates {
    pool: ChainPool,
    states: Vec<Matrix>,
}

impl HeldStates {
    /// `states[k]` is the final state of chain `pool.first_chain + k`.
    pub fn new(pool: ChainPool, states: Vec<Matrix>) -> Option<Self> {
        let fits = states.len() as u64 == pool.chains && states.iter().all(|s| s.n() == pool.n);
        fits.then_some(HeldStates { pool, states })
    }

    pub fn state(&self, chain: u64) -> &Matrix {
        &self.states[(chain - self.pool.first_chain) as usize]
    }
}

impl SliceSource for HeldStates {
    fn pool(&self) -> &ChainPool {
        &self.pool
    }

    fn slice(&self, e: u64) -> &[u8] {
        let (chain, q) = self.pool.locate(e);
        &self.state(chain).as_bytes()[q as usize * SLICE_BYTES..][..SLICE_BYTES]
    }
}

/// What opening a step reads of a device's pool, wherever the device holds it: host memory
/// (any [`SliceSource`]), or a GPU, which walks the blocks again and cuts the slice's path there.
pub trait OpenSource {
    fn pool(&self) -> &ChainPool;

    /// `count` states of a walker whose state at step `first` is `start`: `s_first`,
    /// `s_{first + 1}`, .. (at most up to `s_L`).
    fn rewalk(&self, walk: &SliceWalk, start: Digest, first: u32, count: u32) -> Result<Vec<Digest>, BackendError>;

    /// Pool slice `e` (65536 bytes) and its path to its state's hash (PROTOCOL.md 20.2).
    fn slice_and_path(&self, e: u64) -> Result<(Vec<u8>, SlicePath), BackendError>;
}

impl<S: SliceSource + ?Sized> OpenSource for S {
    fn pool(&self) -> &ChainPool {
        SliceSource::pool(self)
    }

    fn rewalk(&self, walk: &SliceWalk, start: Digest, first: u32, count: u32) -> Result<Vec<Digest>, BackendError> {
        Ok(trace_from(walk, self, start, first).take(count as usize).collect())
    }

    fn slice_and_path(&self, e: u64) -> Result<(Vec<u8>, SlicePath), BackendError> {
        let pool = SliceSource::pool(self);
        let q = pool.locate(e).1;
        // The path is made from the state's slices where the source holds them, each hashed
        // once, in parallel: no copy of the whole state.
        let first = e - q;
        let path = StateSlices::new(pool.slices_per_state(), |r| self.slice(first + r))
            .and_then(|state| state.slice_path(q))
            .map_err(|e| BackendError::Device {
                device: pool.device,
                detail: format!("a pool state that is not whole slices: {e}"),
            })?;
        Ok((self.slice(e).to_vec(), path))
    }
}

/// Walker `walker`'s states on `source`'s device, `s_0 ..= s_L`, each made as it is taken.
fn trace<'a>(walk: &'a SliceWalk, source: &'a dyn SliceSource, walker: u32) -> impl Iterator<Item = Digest> + 'a {
    let start = walk.start_state(source.pool().device, walker);
    trace_from(walk, source, start, 0)
}

/// The states `s_first ..= s_L` of a walker whose state `first` is `state`.
fn trace_from<'a, S: SliceSource + ?Sized>(
    walk: &'a SliceWalk,
    source: &'a S,
    state: Digest,
    first: u32,
) -> impl Iterator<Item = Digest> + 'a {
    let slices = source.pool().slices();
    std::iter::once(state).chain((first..walk.steps).scan(state, move |s, t| {
        *s = step(source.slice(entry_index(s, slices)), s, t);
        Some(*s)
    }))
}

/// States per block of a walker's kept trace (docs/design/protocol-v4.md 2.5).
pub const KEPT_EVERY: u32 = 64;

/// What a walker keeps of its walk so that any step can be opened by walking at most three
/// blocks of [`KEPT_EVERY`] states again, rather than the whole walker: the first state of
/// each block, and each block's node in the walker's tree (the root of its states, which is
/// that tree's node at level 6: [`MerkleTree::over_nodes`]). 64 bytes per 64 states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptTrace {
    pub block_starts: Vec<Digest>,
    pub block_nodes: Vec<Digest>,
}

impl KeptTrace {
    /// The walker's root: the tree above its blocks.
    fn root(&self) -> Digest {
        MerkleTree::over_nodes(self.block_nodes.clone()).root()
    }
}

/// Folds a walker's states into its kept trace as they arrive.
#[derive(Default)]
struct TraceKeeper {
    kept: Vec<Digest>,
    nodes: Vec<Digest>,
    block: Vec<Digest>,
}

impl TraceKeeper {
    fn push(&mut self, state: Digest) {
        if self.block.is_empty() {
            self.kept.push(state);
        }
        self.block.push(state);
        if self.block.len() == KEPT_EVERY as usize {
            self.close_block();
        }
    }

    fn close_block(&mut self) {
        if !self.block.is_empty() {
            self.nodes.push(MerkleTree::new(&self.block).root());
            self.block.clear();
        }
    }

    fn finish(mut self) -> KeptTrace {
        self.close_block();
        KeptTrace {
            block_starts: self.kept,
            block_nodes: self.nodes,
        }
    }
}

/// Every state of walker `walker` on `source`'s device: `s_0 ..= s_L`.
pub fn walker_states(walk: &SliceWalk, source: &dyn SliceSource, walker: u32) -> Vec<Digest> {
    trace(walk, source, walker).collect()
}

/// One device's walk: each walker's root and the device's walk root over them, and what each
/// walker kept to open its steps ([`open_kept_step`]).
#[derive(Clone, Debug)]
pub struct DeviceWalk {
    pub walker_roots: Vec<Digest>,
    pub root: Digest,
    pub kept: Vec<KeptTrace>,
    /// The tree over `walker_roots`, built at the first opening and kept for the others: every
    /// opening needs its walker's path in it, and a GPU's walk has thousands of walkers (8192
    /// by default) and hundreds of openings, each of which rebuilt it.
    walker_tree: OnceLock<MerkleTree>,
}

impl DeviceWalk {
    pub fn new(walker_roots: Vec<Digest>, root: Digest, kept: Vec<KeptTrace>) -> Self {
        DeviceWalk {
            walker_roots,
            root,
            kept,
            walker_tree: OnceLock::new(),
        }
    }

    /// The tree over the walkers' roots, built once.
    fn walker_tree(&self) -> &MerkleTree {
        self.walker_tree.get_or_init(|| MerkleTree::new(&self.walker_roots))
    }

    /// [`complete_opening`] of step `step` of walker `walker` of this walk, from its `states`.
    pub fn complete_opening<S: OpenSource + ?Sized>(
        &self,
        source: &S,
        walker: u32,
        step: u32,
        states: StepStates,
        chain: impl Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Result<Option<StepOpening>, BackendError> {
        complete_opening(
            source,
            &self.walker_roots,
            self.walker_tree(),
            walker,
            step,
            states,
            chain,
        )
    }
}

/// Equal walks: the same roots and kept traces, whether or not either has built its tree yet.
impl PartialEq for DeviceWalk {
    fn eq(&self, other: &Self) -> bool {
        (&self.walker_roots, &self.root, &self.kept) == (&other.walker_roots, &other.root, &other.kept)
    }
}

impl Eq for DeviceWalk {}

/// Steps a walker takes between looks at the cancel flag.
const STEPS_PER_CANCEL_CHECK: u32 = 1024;

/// Walks every walker of `source`'s device, folding each walker's states into its tree as it
/// goes (nothing of the trace is kept).
pub fn walk_device(walk: &SliceWalk, source: &dyn SliceSource) -> DeviceWalk {
    walk_device_until(walk, source, &CancelToken::new()).expect("a fresh token is never cancelled")
}

/// [`walk_device`], stopping with [`BackendError::Cancelled`] soon after `cancel` is: a walk
/// is as long as the validator asks (`W * L` steps), and a miner stops one whose validator has
/// gone or whose deadline is long past.
pub fn walk_device_until(
    walk: &SliceWalk,
    source: &dyn SliceSource,
    cancel: &CancelToken,
) -> Result<DeviceWalk, BackendError> {
    let kept: Vec<KeptTrace> = (0..walk.walkers)
        .into_par_iter()
        .map(|w| {
            let mut keeper = TraceKeeper::default();
            for (t, s) in trace(walk, source, w).enumerate() {
                if (t as u32).is_multiple_of(STEPS_PER_CANCEL_CHECK) {
                    cancel.check()?;
                }
                keeper.push(s);
            }
            Ok(keeper.finish())
        })
        .collect::<Result<_, BackendError>>()?;
    let walker_roots: Vec<Digest> = kept.iter().map(KeptTrace::root).collect();
    let walker_tree = MerkleTree::new(&walker_roots);
    Ok(DeviceWalk {
        root: walker_tree.root(),
        walker_roots,
        kept,
        walker_tree: OnceLock::from(walker_tree),
    })
}

/// The opening of step `step` of walker `walker` (design 2.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepOpening {
    pub walker: u32,
    pub step: u32,
    /// The walker's root and its place among the device's `W` walker roots.
    pub walker_root: Digest,
    pub walker_proof: MerkleProof,
    /// `s_0`'s place in the walker's tree (the validator computes `s_0` itself).
    pub start_proof: MerkleProof,
    pub before: Digest,
    pub before_proof: MerkleProof,
    pub after: Digest,
    pub after_proof: MerkleProof,
    /// The slice `before` names, and its path to its state's hash.
    pub slice: Vec<u8>,
    pub slice_path: SlicePath,
    /// The checkpoint hashes of the slice's chain (the last is its state's hash), and the chain
    /// leaf's place in the device root.
    pub checkpoints: Vec<Digest>,
    pub chain_proof: MerkleProof,
}

/// The two states of an opened step, with their proofs and the start's in the walker's tree:
/// what a walker's trace gives, however it is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepStates {
    pub before: Digest,
    pub after: Digest,
    pub start_proof: MerkleProof,
    pub before_proof: MerkleProof,
    pub after_proof: MerkleProof,
}

impl StepStates {
    /// Step `step`'s states from the walker's whole trace `s_0 ..= s_L`.
    pub fn from_trace(states: &[Digest], step: u32) -> Option<Self> {
        let tree = MerkleTree::new(states);
        let t = step as usize;
        Some(StepStates {
            before: *states.get(t)?,
            after: *states.get(t + 1)?,
            start_proof: tree.proof(0)?,
            before_proof: tree.proof(t as u64)?,
            after_proof: tree.proof(t as u64 + 1)?,
        })
    }
}

/// The opening of step `step` of walker `walker` from its `states`: the walker's root and its
/// proof among `walker_roots` (whose tree is `walker_tree`), the slice `before` names with its path to its state's hash, and
/// (from `chain`) that chain's checkpoint hashes and its leaf's proof in the device root.
/// `Ok(None)` for a walker outside `walker_roots`; an error if the pool cannot be read.
pub fn complete_opening<S: OpenSource + ?Sized>(
    source: &S,
    walker_roots: &[Digest],
    walker_tree: &MerkleTree,
    walker: u32,
    step: u32,
    states: StepStates,
    chain: impl Fn(u64) -> (Vec<Digest>, MerkleProof),
) -> Result<Option<StepOpening>, BackendError> {
    let (Some(&walker_root), Some(walker_proof)) =
        (walker_roots.get(walker as usize), walker_tree.proof(u64::from(walker)))
    else {
        return Ok(None);
    };
    let pool = source.pool();
    let e = entry_index(&states.before, pool.slices());
    let (chain_index, _) = pool.locate(e);
    let (checkpoints, chain_proof) = chain(chain_index);
    let (slice, slice_path) = source.slice_and_path(e)?;
    Ok(Some(StepOpening {
        walker,
        step,
        walker_root,
        walker_proof,
        start_proof: states.start_proof,
        before: states.before,
        before_proof: states.before_proof,
        after: states.after,
        after_proof: states.after_proof,
        slice,
        slice_path,
        checkpoints,
        chain_proof,
    }))
}

/// Opens step `step` of walker `walker` by walking it again; `chain` gives a chain's checkpoint
/// hashes and its leaf's proof in the device root, as the miner kept them from the chains.
pub fn open_step(
    walk: &SliceWalk,
    source: &dyn SliceSource,
    walker_roots: &[Digest],
    walker: u32,
    step: u32,
    chain: impl Fn(u64) -> (Vec<Digest>, MerkleProof),
) -> Option<StepOpening> {
    if walker >= walk.walkers || step >= walk.steps || walker_roots.len() != walk.walkers as usize {
        return None;
    }
    let states = StepStates::from_trace(&walker_states(walk, source, walker), step)?;
    // A host source reads nothing that can fail.
    let walker_tree = MerkleTree::new(walker_roots);
    complete_opening(source, walker_roots, &walker_tree, walker, step, states, chain)
        .ok()
        .flatten()
}

/// Opens step `step` of walker `walker` as [`open_step`] does, from the walker's kept trace:
/// the blocks of `s_0`, `s_t` and `s_{t+1}` are walked again (at most `3 * 64` steps), and the
/// proofs are each block's own path joined to the path of its node among the walker's blocks.
/// `Ok(None)` for a walker or step outside the walk, or a kept trace that is not the walk's.
pub fn open_kept_step<S: OpenSource + ?Sized>(
    walk: &SliceWalk,
    source: &S,
    walked: &DeviceWalk,
    walker: u32,
    step: u32,
    chain: impl Fn(u64) -> (Vec<Digest>, MerkleProof),
) -> Result<Option<StepOpening>, BackendError> {
    let n_walkers = walked.walker_roots.len();
    if walker >= walk.walkers
        || step >= walk.steps
        || n_walkers != walk.walkers as usize
        || walked.kept.len() != n_walkers
    {
        return Ok(None);
    }
    let kept = &walked.kept[walker as usize];
    let upper = MerkleTree::over_nodes(kept.block_nodes.clone());
    // The states of block `b` (64, or what is left of the walk's L + 1), walked again.
    let block = |b: u32| -> Result<Option<Vec<Digest>>, BackendError> {
        let Some(&start) = kept.block_starts.get(b as usize) else {
            return Ok(None);
        };
        let first = b * KEPT_EVERY;
        let count = KEPT_EVERY.min(walk.steps - first + 1);
        source.rewalk(walk, start, first, count).map(Some)
    };
    // The proof of the state at `t` in the walker's tree, from its block's states.
    let proof_in = |states: &[Digest], t: u32| -> Option<MerkleProof> {
        let mut siblings = MerkleTree::new(states).proof(u64::from(t % KEPT_EVERY))?.siblings;
        siblings.extend(upper.proof(u64::from(t / KEPT_EVERY))?.siblings);
        Some(MerkleProof { siblings })
    };
    let (b, next) = (step / KEPT_EVERY, (step + 1) / KEPT_EVERY);
    let Some(here) = block(b)? else {
        return Ok(None);
    };
    let there = if next == b { Some(here.clone()) } else { block(next)? };
    let first = if b == 0 { Some(here.clone()) } else { block(0)? };
    let (Some(there), Some(first)) = (there, first) else {
        return Ok(None);
    };
    let states = (|| {
        Some(StepStates {
            before: *here.get((step % KEPT_EVERY) as usize)?,
            after: *there.get(((step + 1) % KEPT_EVERY) as usize)?,
            start_proof: proof_in(&first, 0)?,
            before_proof: proof_in(&here, step)?,
            after_proof: proof_in(&there, step + 1)?,
        })
    })();
    match states {
        Some(states) => walked.complete_opening(source, walker, step, states, chain),
        None => Ok(None),
    }
}

/// What the validator holds of one device when it checks an opening.
#[derive(Clone, Copy, Debug)]
pub struct DeviceCommitments {
    /// `root_j` of the commitment, over the device's `chains` chain leaves.
    pub device_root: Digest,
    pub device_chains: u64,
    /// The device's signed walk root.
    pub walk_root: Digest,
}

/// Why an opened step fails, each its own reason (design 2.5).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StepRejection {
    #[error("step {step} of walker {walker} is outside the walk")]
    OutOfRange { walker: u32, step: u32 },
    #[error("walker {0}'s root is not in the device's walk root")]
    WalkerNotCommitted(u32),
    #[error("walker {0}'s tree does not begin at the start state the challenge gives it")]
    StartNotCommitted(u32),
    #[error("the states of step {step} of walker {walker} are not in the walker's tree")]
    StateNotCommitted { walker: u32, step: u32 },
    #[error("chain {0}'s checkpoints are not the ones its leaf committed")]
    ChainNotCommitted(u64),
    #[error("the slice is not part of chain {chain}'s committed state: {error}")]
    SliceNotCommitted { chain: u64, error: SliceError },
    #[error("step {step} of walker {walker} over its slice does not give the next committed state")]
    StepMismatch { walker: u32, step: u32 },
    #[error("row {row} of chain {chain}'s final state is not the work function's")]
    PoolStateMismatch { chain: u64, row: u32 },
}

impl StepRejection {
    /// The stable code a verdict stores (PROTOCOL.md section 16): version 3's code where the
    /// check means the same, so that what already watches for a fake pool or faked steps
    /// watches version 4 too.
    pub fn code(&self) -> &'static str {
        match self {
            StepRejection::OutOfRange { .. } => "walk-opening-for-wrong-request",
            StepRejection::WalkerNotCommitted(_) => "walk-leaf-not-committed",
            StepRejection::StartNotCommitted(_) => "walk-start-mismatch",
            StepRejection::StateNotCommitted { .. } => "walk-state-not-committed",
            StepRejection::ChainNotCommitted(_) => "leaf-not-committed",
            StepRejection::SliceNotCommitted { .. } => "pool-entry-not-committed",
            StepRejection::StepMismatch { .. } => "walk-segment-mismatch",
            StepRejection::PoolStateMismatch { .. } => "pool-entry-mismatch",
        }
    }
}

/// Checks one opened step of `pool`'s device, with the rows `rows` made again from the work
/// function: each `r` names the row `first + r mod count` of the slice's rows
/// ([`ChainPool::slice_rows`]), drawn by the validator after the opening arrived, and the bytes
/// that row shares with the slice are compared (all of it where `n` divides 65536).
pub fn check_step(
    work: &Work,
    walk: &SliceWalk,
    pool: &ChainPool,
    committed: &DeviceCommitments,
    opening: &StepOpening,
    rows: &[u32],
) -> Result<(), StepRejection> {
    let (w, t) = (opening.walker, opening.step);
    if w >= walk.walkers || t >= walk.steps {
        return Err(StepRejection::OutOfRange { walker: w, step: t });
    }
    let walkers = u64::from(walk.walkers);
    verify_proof(
        &committed.walk_root,
        &opening.walker_root,
        u64::from(w),
        walkers,
        &opening.walker_proof,
    )
    .map_err(|_| StepRejection::WalkerNotCommitted(w))?;
    let states = u64::from(walk.steps) + 1;
    let start = walk.start_state(pool.device, w);
    verify_proof(&opening.walker_root, &start, 0, states, &opening.start_proof)
        .map_err(|_| StepRejection::StartNotCommitted(w))?;
    let in_tree =
        |state: &Digest, at: u64, proof: &MerkleProof| verify_proof(&opening.walker_root, state, at, states, proof);
    in_tree(&opening.before, u64::from(t), &opening.before_proof)
        .and(in_tree(&opening.after, u64::from(t) + 1, &opening.after_proof))
        .map_err(|_| StepRejection::StateNotCommitted { walker: w, step: t })?;

    let (chain, q) = pool.locate(entry_index(&opening.before, pool.slices()));
    let position = chain - pool.first_chain;
    let whole_chain = opening.checkpoints.len() == work.checkpoints_per_chain();
    if !whole_chain
        || verify_proof(
            &committed.device_root,
            &leaf_hash(chain, &opening.checkpoints),
            position,
            committed.device_chains,
            &opening.chain_proof,
        )
        .is_err()
    {
        return Err(StepRejection::ChainNotCommitted(chain));
    }
    let state_hash = opening.checkpoints.last().expect("a chain has checkpoints");
    verify_slice(state_hash, pool.state_bytes(), q, &opening.slice, &opening.slice_path)
        .map_err(|error| StepRejection::SliceNotCommitted { chain, error })?;
    if step(&opening.slice, &opening.before, t) != opening.after {
        return Err(StepRejection::StepMismatch { walker: w, step: t });
    }
    if rows.is_empty() {
        return Ok(());
    }
    let (first, count) = pool.slice_rows(q);
    let made = StateRows::new(work, chain);
    for &r in rows {
        let row = first + r % count;
        let (of_row, of_slice) = pool.row_in_slice(row, q);
        if bytemuck::cast_slice::<i8, u8>(&made.row(row))[of_row] != opening.slice[of_slice] {
            return Err(StepRejection::PoolStateMismatch { chain, row });
        }
    }
    Ok(())
}
