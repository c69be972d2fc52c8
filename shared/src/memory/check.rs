//! Opening a walk segment (miner) and checking it (validator), PROTOCOL.md 18.5.
//!
//! An opening of segment `q` of walker `w` on device `j` carries the walker's checkpoints, the
//! proof of its leaf in the walk tree, and, for each of the segment's `c_w` steps, the entry the
//! step read with its proof in the pool tree. The validator checks every link: the leaf is
//! committed, the first checkpoint is the walk's start, each entry is the one its state names,
//! committed in the pool and made by the work function, and the steps lead to the next
//! checkpoint.

use super::params::{ENTRY_BYTES, ENTRY_N, PoolSpec};
pub use super::pool::CommittedEntries;
use super::pool::entry_leaf;
use super::walk::{DeviceWalk, WalkSpec, entry_index, step, walk_leaf};
use crate::digest::Digest;
use crate::failure::BackendError;
use crate::merkle::{MerkleProof, ProofError, verify_proof};
use thiserror::Error;

/// One entry as an opening carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenedEntry {
    /// The entry's 65536 bytes.
    pub bytes: Vec<u8>,
    /// Its proof in the device's pool tree, at the index the step's state names.
    pub proof: MerkleProof,
}

/// A walk segment, opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkOpening {
    pub device: u32,
    pub walker: u32,
    pub segment: u32,
    /// `s_{w, q*c_w}` for q in 0..=L/c_w.
    pub checkpoints: Vec<Digest>,
    /// The walker's leaf in the device's walk tree.
    pub proof: MerkleProof,
    /// The entries of steps `segment*c_w .. (segment+1)*c_w`, in step order.
    pub entries: Vec<OpenedEntry>,
}

/// Why an opened walk segment fails; each a reason of its own in a verdict.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WalkCheckError {
    #[error("the opening answers device {got:?}, walker and segment, not the {want:?} asked for")]
    WrongRequest {
        got: (u32, u32, u32),
        want: (u32, u32, u32),
    },
    #[error("walker {walker} has {got} checkpoints; the challenge makes {want}")]
    CheckpointCount { walker: u32, got: usize, want: usize },
    #[error("walker {walker}'s leaf is not in device {device}'s committed walk: {source}")]
    LeafNotCommitted {
        device: u32,
        walker: u32,
        source: ProofError,
    },
    #[error("walker {walker}'s first checkpoint is not the walk's start state for this walk request")]
    WrongStart { walker: u32 },
    #[error("segment {segment} carries {got} entries; it has {want} steps")]
    EntryCount { segment: u32, got: usize, want: usize },
    #[error("step {step} carries an entry of {got} bytes, not {ENTRY_BYTES}")]
    EntrySize { step: u32, got: usize },
    #[error("step {step}'s entry {entry} is not in device {device}'s committed pool: {source}")]
    EntryNotCommitted {
        device: u32,
        step: u32,
        entry: u64,
        source: ProofError,
    },
    #[error("step {step}'s entry {entry} is not the work function's entry {entry} in the rows drawn (a fake pool)")]
    EntryNotMade { step: u32, entry: u64 },
    #[error("walker {walker}'s steps {first}..{end} do not lead to its checkpoint {next}")]
    SegmentMismatch {
        walker: u32,
        first: u32,
        end: u32,
        next: u32,
    },
}

impl WalkCheckError {
    /// The stable code a verdict stores (PROTOCOL.md section 16).
    pub fn code(&self) -> &'static str {
        match self {
            WalkCheckError::WrongRequest { .. } => "walk-opening-for-wrong-request",
            WalkCheckError::CheckpointCount { .. } => "walk-checkpoint-count",
            WalkCheckError::LeafNotCommitted { .. } => "walk-leaf-not-committed",
            WalkCheckError::WrongStart { .. } => "walk-start-mismatch",
            WalkCheckError::EntryCount { .. } | WalkCheckError::EntrySize { .. } => "malformed-walk-opening",
            WalkCheckError::EntryNotCommitted { .. } => "pool-entry-not-committed",
            WalkCheckError::EntryNotMade { .. } => "pool-entry-mismatch",
            WalkCheckError::SegmentMismatch { .. } => "walk-segment-mismatch",
        }
    }
}

/// The miner's side: opens segment `segment` of `walker` from its walk and its pool. `Ok(None)`
/// if there is no such walker or segment; an error if an entry cannot be read.
pub fn open_segment(
    pool: &dyn CommittedEntries,
    walk: &DeviceWalk,
    spec: &WalkSpec,
    walker: u32,
    segment: u32,
) -> Result<Option<WalkOpening>, BackendError> {
    let (Some(trace), Ok(proof)) = (
        walk.traces.get(walker as usize),
        walk.tree.proof(u64::from(walker)).ok_or(()),
    ) else {
        return Ok(None);
    };
    if segment >= spec.params.walk_segments() {
        return Ok(None);
    }
    let every = spec.params.walk_checkpoint_every;
    let mut state = trace.checkpoints[segment as usize];
    let mut entries = Vec::with_capacity(every as usize);
    for t in segment * every..(segment + 1) * every {
        let e = entry_index(&state, spec.entries);
        let (bytes, proof) = pool.entry(e)?;
        if bytes.len() != ENTRY_BYTES {
            return Err(BackendError::Device {
                device: spec.device,
                detail: format!("entry {e} came back as {} bytes, not {ENTRY_BYTES}", bytes.len()),
            });
        }
        state = step(bytemuck::cast_slice(&bytes), &state, t);
        entries.push(OpenedEntry {
            bytes: bytes.into_owned(),
            proof,
        });
    }
    Ok(Some(WalkOpening {
        device: spec.device,
        walker,
        segment,
        checkpoints: trace.checkpoints.clone(),
        proof,
        entries,
    }))
}

/// Rows of each opened entry that a validator makes again and compares (check 7).
pub const ROWS_CHECKED_PER_ENTRY: usize = 8;

/// `ROWS_CHECKED_PER_ENTRY` distinct rows of an entry, drawn from `rng`: the validator's own
/// CSPRNG, after the opening arrived.
pub fn draw_rows(rng: &mut impl rand_chacha::rand_core::Rng) -> Vec<u32> {
    let mut rows: Vec<u32> = Vec::with_capacity(ROWS_CHECKED_PER_ENTRY);
    while rows.len() < ROWS_CHECKED_PER_ENTRY {
        let row = rng.next_u32() % ENTRY_N as u32;
        if !rows.contains(&row) {
            rows.push(row);
        }
    }
    rows
}

/// The opened walker's checkpoints: one per segment boundary, committed under the walk root,
/// and starting where the walker starts.
fn check_walker_checkpoints(
    spec: &WalkSpec,
    walk_root: &Digest,
    walker: u32,
    opening: &WalkOpening,
) -> Result<(), WalkCheckError> {
    let want_checkpoints = spec.params.walk_segments() as usize + 1;
    if opening.checkpoints.len() != want_checkpoints {
        return Err(WalkCheckError::CheckpointCount {
            walker,
            got: opening.checkpoints.len(),
            want: want_checkpoints,
        });
    }
    let leaf = walk_leaf(walker, &opening.checkpoints);
    verify_proof(
        walk_root,
        &leaf,
        u64::from(walker),
        u64::from(spec.params.walkers),
        &opening.proof,
    )
    .map_err(|source| WalkCheckError::LeafNotCommitted {
        device: spec.device,
        walker,
        source,
    })?;
    if opening.checkpoints[0] != spec.start_state(walker) {
        return Err(WalkCheckError::WrongStart { walker });
    }
    Ok(())
}

/// The validator's side: checks `opening` against the request `(walker, segment)` of device
/// `spec.device`, the committed walk root, and the work function's entries of the pool `pool`:
/// `is_made(e, bytes)` says whether `bytes` are entry `e` (a validator compares drawn rows,
/// [`super::pool::entry_rows_match`] and [`draw_rows`]; a test may compare whole entries).
/// Reports the first check that fails.
pub fn check_segment(
    spec: &WalkSpec,
    pool: &PoolSpec,
    walk_root: &Digest,
    request: (u32, u32),
    opening: &WalkOpening,
    is_made: &dyn Fn(u64, &[u8]) -> bool,
) -> Result<(), WalkCheckError> {
    let (walker, segment) = request;
    let got = (opening.device, opening.walker, opening.segment);
    let want = (spec.device, walker, segment);
    if got != want || walker >= spec.params.walkers || segment >= spec.params.walk_segments() {
        return Err(WalkCheckError::WrongRequest { got, want });
    }
    check_walker_checkpoints(spec, walk_root, walker, opening)?;
    let every = spec.params.walk_checkpoint_every;
    if opening.entries.len() != every as usize {
        return Err(WalkCheckError::EntryCount {
            segment,
            got: opening.entries.len(),
            want: every as usize,
        });
    }
    let first = segment * every;
    let mut state = opening.checkpoints[segment as usize];
    for (t, opened) in (first..).zip(&opening.entries) {
        if opened.bytes.len() != ENTRY_BYTES {
            return Err(WalkCheckError::EntrySize {
                step: t,
                got: opened.bytes.len(),
            });
        }
        let e = entry_index(&state, spec.entries);
        verify_proof(
            &spec.pool_root,
            &entry_leaf(&opened.bytes),
            e,
            pool.entries(),
            &opened.proof,
        )
        .map_err(|source| WalkCheckError::EntryNotCommitted {
            device: spec.device,
            step: t,
            entry: e,
            source,
        })?;
        if !is_made(e, &opened.bytes) {
            return Err(WalkCheckError::EntryNotMade { step: t, entry: e });
        }
        state = step(bytemuck::cast_slice(&opened.bytes), &state, t);
    }
    if state != opening.checkpoints[segment as usize + 1] {
        return Err(WalkCheckError::SegmentMismatch {
            walker,
            first,
            end: first + every,
            next: segment + 1,
        });
    }
    Ok(())
}
