//! The locality walk (docs/design/locality.md): a latency-bound walk over a device's version 4
//! pool, one 256-byte line a step, run in generations whose order a few openings can check.
//!
//! - [`step`]: one step. Why a cheap mix and not a hash: the step must cost one memory latency, so
//!   that a line served from elsewhere (a peer device, host memory, another process or host)
//!   costs a hop the clock sees. Every word of the line goes through the bijection [`mix64`]
//!   keyed by the state, so the next line is known only once the whole line has been read.
//! - [`LocalityWalk`], [`walk_lines`]: `W` walkers a generation, each `C` steps. The generations'
//!   digests are the leaves of the locality tree (20.3's Merkle tree), and generation `g` starts
//!   from the nodes left of its leaf's path: the roots of the subtrees that hold every generation
//!   before it. This is Cohen and Pietrzak's depth-robust tree (proofs of sequential work): to
//!   begin generation `g` before an earlier one has ended, a miner must commit ends it did not
//!   walk for every generation it has not finished (a node itself cannot be made up and still
//!   reach the root), and each of those fails its opening, so a walk cut short by `k`
//!   generations fails at least `k` of them. (Starting each generation from the one before
//!   alone, as a first build
//!   did, let one made-up generation split the walk in two at a cost of 1 in `G`.)
//! - [`open_segment`], [`check_segment`]: one walker of one generation opened, its `C` lines each
//!   proven against the pool as a 1 KiB BLAKE3 chunk (20.2's construction one level down), and
//!   replayed from the start the generation before it gives to the end the miner committed.

use super::chain_pool::ChainPool;
use super::slice::{CHUNK_BYTES, CHUNKS_PER_SLICE, SliceError, SlicePath, StateSlices, verify_chunk};
use super::slice_walk::SliceSource;
use crate::chain::leaf_hash;
use crate::digest::Digest;
use crate::failure::{BackendError, CancelToken};
use crate::merkle::{MerkleFold, MerkleProof, MerkleTree, verify_proof};
use crate::params::Work;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// The bytes a step reads: one line.
pub const LINE_BYTES: usize = 256;
/// Lines in a 64 KiB slice of the pool (PROTOCOL.md 20.1).
pub const LINES_PER_SLICE: u64 = 65536 / LINE_BYTES as u64;

const START_CONTEXT: &[u8] = b"gpu-attest v4 locality start";
const TREE_START_CONTEXT: &[u8] = b"gpu-attest v4 locality tree start";
const LEAF_CONTEXT: &[u8] = b"gpu-attest v4 locality leaf";

/// Most walkers a generation: a generation's ends are hashed into its leaf and sent whole in
/// every opening (32 bytes each).
pub const MAX_WALKERS: u32 = 4096;
/// Most steps a walker takes in one generation: an opened segment carries one line proof a step.
pub const MAX_SEGMENT_STEPS: u32 = 1024;
/// Most end states a miner keeps for one device's walk (`W * G`): 128 MiB of them.
pub const MAX_KEPT_ENDS: u64 = 1 << 22;

/// The share of a locality walk's (generation, walker) pairs that `segments` uniform openings,
/// all passing, show walked in order at 99%: `0.01^(1 / segments)`, since a walk with a smaller
/// share passes each opening with probability below it (0.75 at 16 openings). The hop bound
/// (PROTOCOL.md 20.10) spreads the measured time over this share of the steps; 0 for no openings.
pub fn ordered_share_at_least(segments: u32) -> f64 {
    if segments == 0 {
        return 0.0;
    }
    0.01f64.powf(1.0 / f64::from(segments))
}

/// A walker's state: four 64-bit words (32 bytes, little-endian words when written as bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State(pub [u64; 4]);

impl State {
    /// `blake3("gpu-attest v4 locality start" || nonce || seed || G || le32(j) || le32(w))`,
    /// read as four little-endian words: a walker's start outside the locality tree (the
    /// latency example and the GPU probe time walks from it).
    pub fn start(nonce: &[u8; 32], seed: &[u8; 32], global: &Digest, device: u32, walker: u32) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(START_CONTEXT);
        h.update(nonce);
        h.update(seed);
        h.update(global.as_bytes());
        h.update(&device.to_le_bytes());
        h.update(&walker.to_le_bytes());
        State::from_bytes(h.finalize().as_bytes())
    }

    pub fn from_bytes(bytes: &[u8; 32]) -> Self {
        let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        State([word(0), word(1), word(2), word(3)])
    }

    pub fn to_bytes(self) -> [u8; 32] {
        let mut out = [0; 32];
        for (chunk, word) in out.chunks_exact_mut(8).zip(self.0) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The line this state names in a pool of `pool_slices` slices: slice `s_0 mod P`, line
    /// `s_1 mod 256` within it.
    pub fn names(&self, pool_slices: u64) -> Line {
        Line {
            slice: self.0[0] % pool_slices.max(1),
            line: (self.0[1] % LINES_PER_SLICE) as u32,
        }
    }
}

/// A line of the pool: bytes `256 line .. 256 line + 256` of slice `slice`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    pub slice: u64,
    pub line: u32,
}

impl Line {
    /// The line's bytes within its slice's 65536.
    pub fn of<'a>(&self, slice: &'a [u8]) -> &'a [u8; LINE_BYTES] {
        slice[self.line as usize * LINE_BYTES..][..LINE_BYTES]
            .try_into()
            .expect("a slice is 65536 bytes")
    }
}

/// `m(x)`: a bijection of 64-bit words (xorshift, odd multiply, xorshift), wrapping.
pub fn mix64(x: u64) -> u64 {
    let x = (x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

/// One step: the line's 32 words `v_l`, each keyed by state word `l mod 4` and its lane, mixed
/// and folded into four (`n_r`), then chained into the next state so that its first word, and
/// through it every word (the next line's address included), takes in the whole line.
pub fn step(state: &State, line: &[u8; LINE_BYTES]) -> State {
    let s = state.0;
    let mut n = [0u64; 4];
    for (l, word) in line.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        n[l % 4] ^= mix64(v ^ s[l % 4] ^ ((l as u64) << 56));
    }
    let s0 = mix64(n[0] ^ n[1] ^ n[2] ^ n[3] ^ s[1]);
    let s1 = n[1].wrapping_add(s[2]).wrapping_add(s0);
    let s2 = n[2] ^ s[3] ^ s0;
    let s3 = n[3].wrapping_add(s[0]).wrapping_add(s0);
    State([s0, s1, s2, s3])
}

/// A walker's walk of `steps` steps from `start` over a pool of `pool_slices` slices, reading
/// each line from `slices` (slice `e`'s 65536 bytes): its checkpoints, the start and every
/// `every`-th state after it, the last state included however `steps` divides.
pub fn walk<'a>(
    start: State,
    steps: u64,
    every: u64,
    pool_slices: u64,
    slices: impl Fn(u64) -> &'a [u8],
) -> Vec<State> {
    let every = every.max(1);
    let mut checkpoints = Vec::with_capacity((steps / every) as usize + 2);
    checkpoints.push(start);
    let mut state = start;
    for t in 1..=steps {
        let line = state.names(pool_slices);
        state = step(&state, line.of(slices(line.slice)));
        if t % every == 0 || t == steps {
            checkpoints.push(state);
        }
    }
    checkpoints
}

/// Why a segment does not replay to its end.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SegmentError {
    #[error("step {step} of the segment read line {got:?}, but its state names {named:?}")]
    WrongLine { step: usize, named: Line, got: Line },
    #[error("the segment's {steps} lines replay to another state than its end checkpoint")]
    WrongEnd { steps: usize },
}

/// Replays a segment: from checkpoint `from`, each `(line, bytes)` read in order, each the line
/// the state before it names, must end at `to`. The validator's check of an opened segment,
/// once each line's bytes are proven against the pool (20.2's path, a level down).
pub fn replay_segment(
    from: State,
    to: State,
    lines: &[(Line, [u8; LINE_BYTES])],
    pool_slices: u64,
) -> Result<(), SegmentError> {
    let mut state = from;
    for (i, (line, bytes)) in lines.iter().enumerate() {
        let named = state.names(pool_slices);
        if named != *line {
            return Err(SegmentError::WrongLine {
                step: i,
                named,
                got: *line,
            });
        }
        state = step(&state, bytes);
    }
    if state != to {
        return Err(SegmentError::WrongEnd { steps: lines.len() });
    }
    Ok(())
}

/// What every device's locality walk of one challenge is bound to, and its shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalityWalk {
    pub nonce: [u8; 32],
    /// Drawn by the validator after every root of the version 4 walk arrived.
    pub seed: [u8; 32],
    /// G, the commitment's global root.
    pub global: Digest,
    /// `W`, walkers a generation.
    pub walkers: u32,
    /// `G`, generations.
    pub generations: u32,
    /// `C`, steps a walker takes in one generation.
    pub steps: u32,
}

/// Why a locality walk's shape is refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ShapeError {
    #[error(
        "a locality walk needs at least one walker, generation and step, got W = {walkers}, G = {generations}, C = {steps}"
    )]
    Empty { walkers: u32, generations: u32, steps: u32 },
    #[error("{walkers} walkers a generation is above the limit of {MAX_WALKERS}")]
    TooManyWalkers { walkers: u32 },
    #[error("{steps} steps a segment is above the limit of {MAX_SEGMENT_STEPS}")]
    SegmentTooLong { steps: u32 },
    #[error("{walkers} walkers x {generations} generations is {ends} end states, above the limit of {MAX_KEPT_ENDS}")]
    TooManyEnds { walkers: u32, generations: u32, ends: u64 },
}

impl LocalityWalk {
    /// Checks the shape against this release's limits: what a miner refuses before it walks.
    pub fn check_shape(&self) -> Result<(), ShapeError> {
        let (walkers, generations, steps) = (self.walkers, self.generations, self.steps);
        if walkers == 0 || generations == 0 || steps == 0 {
            return Err(ShapeError::Empty {
                walkers,
                generations,
                steps,
            });
        }
        if walkers > MAX_WALKERS {
            return Err(ShapeError::TooManyWalkers { walkers });
        }
        if steps > MAX_SEGMENT_STEPS {
            return Err(ShapeError::SegmentTooLong { steps });
        }
        let ends = u64::from(walkers) * u64::from(generations);
        if ends > MAX_KEPT_ENDS {
            return Err(ShapeError::TooManyEnds {
                walkers,
                generations,
                ends,
            });
        }
        Ok(())
    }

    /// Steps each walker takes over the whole walk: `G * C`.
    pub fn walker_steps(&self) -> u64 {
        u64::from(self.generations) * u64::from(self.steps)
    }

    /// Walker `w`'s first state in generation `g` of device `j`: `blake3("gpu-attest v4
    /// locality tree start" || nonce || seed || G || le32(j) || le32(g) || le32(w) || p_1 || ..
    /// || p_k)` as four words, where `p_1 .. p_k` are the nodes left of leaf `g`'s path in the
    /// locality tree, lowest first ([`MerkleProof::left_siblings`]; none for `g = 0`). They
    /// hold every generation before `g`, so none of `g`'s walkers can start before all of those
    /// have ended, unless their ends are made up.
    pub fn start(&self, device: u32, generation: u32, walker: u32, parents: &[Digest]) -> State {
        let mut h = blake3::Hasher::new();
        h.update(TREE_START_CONTEXT);
        h.update(&self.nonce);
        h.update(&self.seed);
        h.update(self.global.as_bytes());
        h.update(&device.to_le_bytes());
        h.update(&generation.to_le_bytes());
        h.update(&walker.to_le_bytes());
        for parent in parents {
            h.update(parent.as_bytes());
        }
        State::from_bytes(h.finalize().as_bytes())
    }

    /// `D_g = blake3("gpu-attest v4 locality leaf" || nonce || seed || le32(j) || le32(g) ||
    /// e_{g,0} || .. || e_{g,W-1})`: every end state of generation `g`, in walker order, bound
    /// to this walk. It is leaf `g` of the device's locality tree.
    pub fn generation_digest(&self, device: u32, generation: u32, ends: &[State]) -> Digest {
        let mut h = blake3::Hasher::new();
        h.update(LEAF_CONTEXT);
        h.update(&self.nonce);
        h.update(&self.seed);
        h.update(&device.to_le_bytes());
        h.update(&generation.to_le_bytes());
        for end in ends {
            h.update(&end.to_bytes());
        }
        h.finalize().into()
    }
}

/// `steps` steps from `state` over a pool of `pool_slices` slices read from `slices`.
fn walk_segment<'a>(mut state: State, steps: u32, pool_slices: u64, slices: impl Fn(u64) -> &'a [u8]) -> State {
    for _ in 0..steps {
        let line = state.names(pool_slices);
        state = step(&state, line.of(slices(line.slice)));
    }
    state
}

/// One device's locality walk as the miner keeps it for the openings: every end state,
/// generation by generation (`W` each), each generation's digest, and the locality tree's root
/// over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineWalk {
    pub walkers: u32,
    pub ends: Vec<State>,
    pub digests: Vec<Digest>,
    pub root: Digest,
}

impl LineWalk {
    /// The end states of generation `g`, in walker order.
    pub fn generation(&self, g: u32) -> Option<&[State]> {
        let w = self.walkers as usize;
        self.ends.get(g as usize * w..(g as usize + 1) * w)
    }
}

/// Walks every generation of `walk` over `source`'s device, each generation's walkers side by
/// side (a thread each, as many as the host lends), stopping soon after `cancel` is cancelled.
pub fn walk_lines(
    walk: &LocalityWalk,
    source: &dyn SliceSource,
    cancel: &CancelToken,
) -> Result<LineWalk, BackendError> {
    let pool = source.pool();
    let (device, slices) = (pool.device, pool.slices());
    let mut ends = Vec::with_capacity(walk.walkers as usize * walk.generations as usize);
    let mut digests = Vec::with_capacity(walk.generations as usize);
    // The tree as it grows: its finished subtrees are the next generation's parents.
    let mut tree = MerkleFold::new();
    for g in 0..walk.generations {
        cancel.check()?;
        let parents = tree.left_siblings();
        let walked: Vec<State> = (0..walk.walkers)
            .into_par_iter()
            .map(|w| {
                let start = walk.start(device, g, w, &parents);
                walk_segment(start, walk.steps, slices, |e| source.slice(e))
            })
            .collect();
        let digest = walk.generation_digest(device, g, &walked);
        tree.push(&digest);
        digests.push(digest);
        ends.extend(walked);
    }
    let root = tree.root();
    Ok(LineWalk {
        walkers: walk.walkers,
        ends,
        digests,
        root,
    })
}

/// One step's line, proven against the pool: the 1 KiB chunk that holds it with the chunk's path
/// to its state's hash, and that state's chain (its checkpoint hashes, the last the state's hash,
/// and its leaf's proof in the device root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineProof {
    pub chunk: Vec<u8>,
    pub chunk_path: SlicePath,
    pub checkpoints: Vec<Digest>,
    pub chain_proof: MerkleProof,
}

/// The slice chaining values of every state a device's locality openings have touched, kept for
/// the whole opening round: a line's chunk path then costs its own slice's hashing, not its
/// whole state's (a state is 4 MiB at n = 2048, and a round opens thousands of lines).
#[derive(Debug, Default)]
pub struct ChunkPaths {
    by_chain: Mutex<HashMap<u64, Arc<StateSlices>>>,
}

impl ChunkPaths {
    /// Chunk `chunk` of slice `e` of `source`'s pool, with its path to its state's hash.
    fn chunk_and_path(
        &self,
        source: &dyn SliceSource,
        e: u64,
        chunk_in_slice: u64,
    ) -> Result<(Vec<u8>, SlicePath), BackendError> {
        let pool = source.pool();
        let (chain, q) = pool.locate(e);
        let broken = |e: SliceError| BackendError::Device {
            device: pool.device,
            detail: format!("a pool state that is not whole slices: {e}"),
        };
        let first = e - q;
        let state = self.state(chain, || {
            StateSlices::new(pool.slices_per_state(), |r| source.slice(first + r)).map_err(broken)
        })?;
        let slice = source.slice(e);
        let path = state
            .chunk_path(slice, q * CHUNKS_PER_SLICE + chunk_in_slice)
            .map_err(broken)?;
        Ok((
            slice[chunk_in_slice as usize * CHUNK_BYTES..][..CHUNK_BYTES].to_vec(),
            path,
        ))
    }

    /// Makes state `chain`'s slices known from `slices` where they are not yet: for a pool
    /// whose states stay on a device, which hashes a state's slices there and hands over their
    /// chaining values rather than the state (`StateSlices::from_cvs`). An opening of such a
    /// pool then reads from its source only the slices its lines lie in.
    pub fn keep_state(
        &self,
        chain: u64,
        slices: impl FnOnce() -> Result<StateSlices, BackendError>,
    ) -> Result<(), BackendError> {
        self.state(chain, slices).map(|_| ())
    }

    /// State `chain`'s slices as kept, made by `slices` and kept the first time they are asked.
    fn state(
        &self,
        chain: u64,
        slices: impl FnOnce() -> Result<StateSlices, BackendError>,
    ) -> Result<Arc<StateSlices>, BackendError> {
        let known = self
            .by_chain
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&chain)
            .cloned();
        if let Some(state) = known {
            return Ok(state);
        }
        let state = Arc::new(slices()?);
        self.by_chain
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(chain, state.clone());
        Ok(state)
    }
}

/// Where walker `walker` of generation `generation` of `walked` starts: from the nodes its
/// generation's proof in the locality tree has on its left, as an opening walks it again.
/// `None` for a segment outside the walk.
pub fn segment_start(
    walk: &LocalityWalk,
    walked: &LineWalk,
    device: u32,
    (generation, walker): (u32, u32),
) -> Option<State> {
    let (_, proof) = generation_proof(walk, walked, (generation, walker))?;
    let parents = proof.left_siblings(u64::from(generation), u64::from(walk.generations));
    Some(walk.start(device, generation, walker, &parents))
}

/// The ends of generation `generation` of `walked` and its proof in the locality tree, where
/// walker `walker` of it is in the walk.
fn generation_proof<'a>(
    walk: &LocalityWalk,
    walked: &'a LineWalk,
    (generation, walker): (u32, u32),
) -> Option<(&'a [State], MerkleProof)> {
    if walker >= walk.walkers || generation >= walk.generations || walked.walkers != walk.walkers {
        return None;
    }
    let proof = MerkleTree::new(&walked.digests).proof(u64::from(generation))?;
    Some((walked.generation(generation)?, proof))
}

/// Walker `walker` of generation `generation` opened: the ends of its generation (among them its
/// own end), the generation's proof in the locality tree (whose left siblings give its start),
/// and the line of every step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentOpening {
    pub generation: u32,
    pub walker: u32,
    pub ends: Vec<State>,
    pub ends_proof: MerkleProof,
    pub lines: Vec<LineProof>,
}

/// Opens walker `walker` of generation `generation` of `walked` by walking it again from its
/// start. `chain(i)` gives chain `i`'s checkpoint hashes and its leaf's proof in the device
/// root, as the miner kept them from the chains; `paths` keeps what the round's openings learnt
/// of the device's states. `Ok(None)` for a segment outside the walk.
pub fn open_segment(
    walk: &LocalityWalk,
    source: &dyn SliceSource,
    walked: &LineWalk,
    (generation, walker): (u32, u32),
    chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    paths: &ChunkPaths,
) -> Result<Option<SegmentOpening>, BackendError> {
    let Some((ends, ends_proof)) = generation_proof(walk, walked, (generation, walker)) else {
        return Ok(None);
    };
    open_walker(
        walk,
        source,
        (generation, walker),
        (ends.to_vec(), ends_proof),
        chain,
        paths,
    )
    .map(Some)
}

/// Walker `walker` of generation `generation` opened under `ends_proof`, its generation's proof
/// in the locality tree: walked again from the start the proof's left siblings give, each line
/// with its proofs. [`open_segment`] brings the miner's own tree; a test's cheater brings a
/// proof through a node it made up.
pub fn open_walker(
    walk: &LocalityWalk,
    source: &dyn SliceSource,
    (generation, walker): (u32, u32),
    (ends, ends_proof): (Vec<State>, MerkleProof),
    chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    paths: &ChunkPaths,
) -> Result<SegmentOpening, BackendError> {
    let pool = source.pool();
    let slices = pool.slices();
    let parents = ends_proof.left_siblings(u64::from(generation), u64::from(walk.generations));
    let mut state = walk.start(pool.device, generation, walker, &parents);
    let mut lines = Vec::with_capacity(walk.steps as usize);
    for _ in 0..walk.steps {
        let line = state.names(slices);
        let (chunk, chunk_path) = paths.chunk_and_path(source, line.slice, u64::from(line.line) / LINES_PER_CHUNK)?;
        let (checkpoints, chain_proof) = chain(pool.locate(line.slice).0);
        lines.push(LineProof {
            chunk,
            chunk_path,
            checkpoints,
            chain_proof,
        });
        state = step(&state, line.of(source.slice(line.slice)));
    }
    Ok(SegmentOpening {
        generation,
        walker,
        ends,
        ends_proof,
        lines,
    })
}

/// Lines in a 1 KiB chunk.
const LINES_PER_CHUNK: u64 = (CHUNK_BYTES / LINE_BYTES) as u64;

/// What the validator holds of one device when it checks a locality opening.
#[derive(Clone, Copy, Debug)]
pub struct LocalityCommitments {
    /// `root_j` of the commitment, over the device's `device_chains` chain leaves.
    pub device_root: Digest,
    pub device_chains: u64,
    /// The device's signed locality root.
    pub locality_root: Digest,
}

/// Why an opened locality segment fails, each with its own code.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LocalityRejection {
    #[error("walker {walker} of generation {generation} is outside the walk")]
    OutOfRange { generation: u32, walker: u32 },
    #[error("generation {generation}'s end states are {got}, the walk has {want} walkers")]
    WrongWalkerCount { generation: u32, got: usize, want: u32 },
    #[error("generation {generation}'s end states are not the ones the locality root committed")]
    GenerationNotCommitted { generation: u32 },
    #[error("the segment carries {got} lines for a segment of {want} steps")]
    WrongLineCount { got: usize, want: u32 },
    #[error("step {step}: chain {chain}'s checkpoints are not the ones its leaf committed")]
    ChainNotCommitted { step: usize, chain: u64 },
    #[error("step {step}: the line is not part of chain {chain}'s committed state: {error}")]
    LineNotCommitted { step: usize, chain: u64, error: SliceError },
    #[error("walker {walker} of generation {generation} over its lines does not end at its committed end state")]
    SegmentMismatch { generation: u32, walker: u32 },
}

impl LocalityRejection {
    /// The stable code a verdict stores (PROTOCOL.md section 16).
    pub fn code(&self) -> &'static str {
        match self {
            LocalityRejection::OutOfRange { .. } | LocalityRejection::WrongWalkerCount { .. } => {
                "locality-opening-for-wrong-request"
            }
            LocalityRejection::GenerationNotCommitted { .. } => "locality-generation-not-committed",
            LocalityRejection::WrongLineCount { .. } | LocalityRejection::SegmentMismatch { .. } => {
                "locality-segment-mismatch"
            }
            LocalityRejection::ChainNotCommitted { .. } => "leaf-not-committed",
            LocalityRejection::LineNotCommitted { .. } => "locality-line-not-committed",
        }
    }
}

/// Checks one opened segment of `pool`'s device: its generation's ends against the locality
/// root, each line against its chain's committed state, and the replay from the start the
/// proof's left siblings give to the walker's committed end.
pub fn check_segment(
    work: &Work,
    walk: &LocalityWalk,
    pool: &ChainPool,
    committed: &LocalityCommitments,
    opening: &SegmentOpening,
) -> Result<(), LocalityRejection> {
    let (g, w) = (opening.generation, opening.walker);
    if g >= walk.generations || w >= walk.walkers {
        return Err(LocalityRejection::OutOfRange {
            generation: g,
            walker: w,
        });
    }
    let generations = u64::from(walk.generations);
    if opening.ends.len() != walk.walkers as usize {
        return Err(LocalityRejection::WrongWalkerCount {
            generation: g,
            got: opening.ends.len(),
            want: walk.walkers,
        });
    }
    let digest = walk.generation_digest(pool.device, g, &opening.ends);
    verify_proof(
        &committed.locality_root,
        &digest,
        u64::from(g),
        generations,
        &opening.ends_proof,
    )
    .map_err(|_| LocalityRejection::GenerationNotCommitted { generation: g })?;
    if opening.lines.len() != walk.steps as usize {
        return Err(LocalityRejection::WrongLineCount {
            got: opening.lines.len(),
            want: walk.steps,
        });
    }
    let slices = pool.slices();
    let parents = opening.ends_proof.left_siblings(u64::from(g), generations);
    let mut state = walk.start(pool.device, g, w, &parents);
    for (i, proof) in opening.lines.iter().enumerate() {
        let line = state.names(slices);
        let (chain, q) = pool.locate(line.slice);
        let whole_chain = proof.checkpoints.len() == work.checkpoints_per_chain();
        if !whole_chain
            || verify_proof(
                &committed.device_root,
                &leaf_hash(chain, &proof.checkpoints),
                chain - pool.first_chain,
                committed.device_chains,
                &proof.chain_proof,
            )
            .is_err()
        {
            return Err(LocalityRejection::ChainNotCommitted { step: i, chain });
        }
        let state_hash = proof.checkpoints.last().expect("a chain has checkpoints");
        let chunk = q * CHUNKS_PER_SLICE + u64::from(line.line) / LINES_PER_CHUNK;
        verify_chunk(state_hash, pool.state_bytes(), chunk, &proof.chunk, &proof.chunk_path)
            .map_err(|error| LocalityRejection::LineNotCommitted { step: i, chain, error })?;
        let within = (u64::from(line.line) % LINES_PER_CHUNK) as usize * LINE_BYTES;
        let bytes: &[u8; LINE_BYTES] = proof.chunk[within..within + LINE_BYTES]
            .try_into()
            .expect("a verified chunk is 1024 bytes");
        state = step(&state, bytes);
    }
    if state != opening.ends[w as usize] {
        return Err(LocalityRejection::SegmentMismatch {
            generation: g,
            walker: w,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `slices` slices of bytes from a counter, 64 KiB each.
    fn pool(slices: u64) -> Vec<Vec<u8>> {
        (0..slices)
            .map(|e| {
                (0..65536u32)
                    .map(|i| (mix64(e << 20 | u64::from(i)) >> 13) as u8)
                    .collect()
            })
            .collect()
    }

    fn start() -> State {
        State::start(&[1; 32], &[2; 32], &Digest([3; 32]), 0, 1)
    }

    /// Every segment between two checkpoints replays, from the lines its states named, to the
    /// next checkpoint; the walk's last state is a checkpoint however the steps divide.
    #[test]
    fn every_segment_of_a_walk_replays_from_its_lines() {
        let pool = pool(8);
        let (steps, every) = (1000, 64);
        let checkpoints = walk(start(), steps, every, 8, |e| &pool[e as usize]);
        assert_eq!(checkpoints.len(), 1 + (steps / every) as usize + 1);
        let mut state = start();
        for (c, pair) in checkpoints.windows(2).enumerate() {
            let count = if c as u64 == steps / every {
                steps % every
            } else {
                every
            };
            let mut lines = Vec::new();
            for _ in 0..count {
                let line = state.names(8);
                let bytes = *line.of(&pool[line.slice as usize]);
                lines.push((line, bytes));
                state = step(&state, &bytes);
            }
            assert_eq!(replay_segment(pair[0], pair[1], &lines, 8), Ok(()), "segment {c}");
        }
        assert_eq!(state, *checkpoints.last().unwrap());
    }

    /// A changed bit anywhere in any line of a segment, or a line other than the one named,
    /// fails the replay: no byte of a line can be skipped or made up.
    #[test]
    fn a_changed_bit_or_another_line_fails_the_segment() {
        let pool = pool(4);
        let mut state = start();
        let mut lines = Vec::new();
        for _ in 0..16 {
            let line = state.names(4);
            let bytes = *line.of(&pool[line.slice as usize]);
            lines.push((line, bytes));
            state = step(&state, &bytes);
        }
        let end = state;
        for i in [0, 7, 15] {
            for bit in [0, 63, 511, 2047] {
                let mut changed = lines.clone();
                changed[i].1[bit / 8] ^= 1 << (bit % 8);
                let replayed = replay_segment(start(), end, &changed, 4);
                assert!(replayed.is_err(), "line {i} bit {bit}: {replayed:?}");
            }
            let mut moved = lines.clone();
            moved[i].0.line ^= 1;
            assert!(matches!(
                replay_segment(start(), end, &moved, 4),
                Err(SegmentError::WrongLine { step, .. }) if step == i
            ));
        }
    }

    /// Each of the 32 words of a line reaches every word of the next state (so that a cheater
    /// holding part of a line cannot compute the next address), and so does each state word.
    #[test]
    fn every_word_of_the_line_and_the_state_reaches_every_word_of_the_next_state() {
        let line: [u8; LINE_BYTES] = std::array::from_fn(|i| (i * 7 + 3) as u8);
        let base = step(&start(), &line);
        for lane in 0..LINE_BYTES / 8 {
            let mut changed = line;
            changed[lane * 8] ^= 1;
            let next = step(&start(), &changed);
            for word in 0..4 {
                assert_ne!(next.0[word], base.0[word], "lane {lane} reaches word {word}");
            }
        }
        for changed_word in 0..4 {
            let mut s = start();
            s.0[changed_word] ^= 1 << 40;
            let next = step(&s, &line);
            for word in 0..4 {
                assert_ne!(next.0[word], base.0[word], "state word {changed_word} reaches {word}");
            }
        }
    }

    /// The step as design section 2 writes it, spelled out again: a mutant of either (another
    /// fold, another lane key) would have to change both.
    #[test]
    fn the_step_is_the_designs() {
        let s = State([1, 2, 3, 4]);
        let line: [u8; LINE_BYTES] = std::array::from_fn(|i| i as u8);
        let v = |l: usize| u64::from_le_bytes(line[8 * l..8 * l + 8].try_into().unwrap());
        let n = |r: usize| {
            (0..32)
                .filter(|l| l % 4 == r)
                .fold(0u64, |acc, l| acc ^ mix64(v(l) ^ s.0[r] ^ ((l as u64) << 56)))
        };
        let s0 = mix64(n(0) ^ n(1) ^ n(2) ^ n(3) ^ 2);
        let want = State([
            s0,
            n(1).wrapping_add(3).wrapping_add(s0),
            n(2) ^ 4 ^ s0,
            n(3).wrapping_add(1).wrapping_add(s0),
        ]);
        assert_eq!(step(&s, &line), want);
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x9E37_79B9_7F4A_7C15 ^ (0x9E37_79B9_7F4A_7C15 >> 29));
    }

    #[test]
    fn a_state_reads_back_from_its_bytes_and_names_a_line_in_the_pool() {
        let s = start();
        assert_eq!(State::from_bytes(&s.to_bytes()), s);
        for pool_slices in [1, 7, 1 << 20] {
            let line = s.names(pool_slices);
            assert!(line.slice < pool_slices && u64::from(line.line) < LINES_PER_SLICE);
        }
    }
}
