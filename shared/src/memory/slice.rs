//! A 64 KiB slice of a chain state, proven against the state's BLAKE3 hash (protocol version 4,
//! docs/design/protocol-v4.md 2.3).
//!
//! Version 4 walks over slices of the pool chains' final states, and every such state is already
//! committed: its hash `blake3(X_{i,K})` is the chain's last checkpoint, inside the chain's leaf
//! and so the device root. BLAKE3 hashes a message as a binary tree of 1 KiB chunks whose left
//! subtree is always the largest power of two of chunks smaller than the whole; for a state that is
//! a whole number of 64 KiB slices, every aligned slice is then a complete subtree. A slice is
//! proven by the chaining values of the sibling subtrees on its path to the root (6 of them, 192
//! bytes, at n = 2048), so no second tree is built and the miner hashes nothing new until a slice
//! is opened.

use crate::digest::Digest;
use blake3::hazmat::{ChainingValue, HasherExt, Mode, left_subtree_len, merge_subtrees_non_root, merge_subtrees_root};
use thiserror::Error;

/// Bytes in one slice: one walk step's read.
pub const SLICE_BYTES: usize = 1 << 16;
/// Largest state a slice is proven in: n = 8192, 64 MiB, 1024 slices.
pub const MAX_STATE_BYTES: u64 = 1 << 26;
/// Bytes in one BLAKE3 chunk: the unit a locality walk's line is proven in (a line is a quarter
/// of a chunk), with the same construction one level further down.
pub const CHUNK_BYTES: usize = 1024;
/// Chunks in a slice.
pub const CHUNKS_PER_SLICE: u64 = (SLICE_BYTES / CHUNK_BYTES) as u64;

/// The sibling chaining values on a slice's path to its state's hash, bottom first.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SlicePath {
    pub siblings: Vec<ChainingValue>,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SliceError {
    #[error("a state of {0} bytes is not a whole number of 64 KiB slices in 1..=1024")]
    NotWholeSlices(u64),
    #[error("slice or chunk {slice} is outside a state of {count}")]
    OutOfRange { slice: u64, count: u64 },
    #[error("a slice is 65536 bytes and a chunk 1024, got {0}")]
    WrongLength(usize),
    #[error("slice {slice}'s path has {got} siblings, its place in the state needs {want}")]
    PathLength { slice: u64, got: usize, want: usize },
    #[error("slice or chunk {slice} and its path do not hash to the committed state")]
    Mismatch { slice: u64 },
    #[error("{got} slice chaining values for a state that has {want}")]
    WrongCount { got: u64, want: u64 },
}

/// One level of a slice's path: where the sibling subtree lies and on which side.
#[derive(Clone, Copy, Debug)]
struct Level {
    slice_is_left: bool,
    sibling_start: u64,
    sibling_len: u64,
}

/// The levels from the state's root down to unit `index` (a slice, or a chunk: `unit_bytes` a
/// power of two from 1 KiB to 64 KiB), root first. The shape depends on the state's length and
/// the unit's index alone, so a verifier rebuilds it and takes nothing but chaining values from
/// the prover.
fn levels(state_bytes: u64, unit_bytes: u64, index: u64) -> Result<Vec<Level>, SliceError> {
    if state_bytes == 0 || !state_bytes.is_multiple_of(SLICE_BYTES as u64) || state_bytes > MAX_STATE_BYTES {
        return Err(SliceError::NotWholeSlices(state_bytes));
    }
    let count = state_bytes / unit_bytes;
    if index >= count {
        return Err(SliceError::OutOfRange { slice: index, count });
    }
    let target = index * unit_bytes;
    let (mut start, mut len) = (0, state_bytes);
    let mut levels = Vec::new();
    while len > unit_bytes {
        // A power of two of bytes at least half of `len`, so at least one unit: the subtree
        // boundaries below stay on unit boundaries.
        let left = left_subtree_len(len);
        if target < start + left {
            levels.push(Level {
                slice_is_left: true,
                sibling_start: start + left,
                sibling_len: len - left,
            });
            len = left;
        } else {
            levels.push(Level {
                slice_is_left: false,
                sibling_start: start,
                sibling_len: left,
            });
            start += left;
            len -= left;
        }
    }
    Ok(levels)
}

/// The chaining value of the subtree `bytes` that starts `offset` bytes into the message.
fn subtree(bytes: &[u8], offset: u64) -> ChainingValue {
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset(offset);
    hasher.update(bytes);
    hasher.finalize_non_root()
}

/// The path of slice `slice` of `state`, cut from the whole state: the plain construction, which
/// [`StateSlices`] (what the miner uses) is tested against.
pub fn slice_path(state: &[u8], slice: u64) -> Result<SlicePath, SliceError> {
    unit_path(state, SLICE_BYTES as u64, slice)
}

/// The path of chunk `chunk` (1 KiB, the chunk index within the whole state) of `state`: a
/// locality line's proof (docs/design/locality.md 2), cut from the whole state, the plain
/// construction [`StateSlices`] is tested against.
pub fn chunk_path(state: &[u8], chunk: u64) -> Result<SlicePath, SliceError> {
    unit_path(state, CHUNK_BYTES as u64, chunk)
}

fn unit_path(state: &[u8], unit_bytes: u64, index: u64) -> Result<SlicePath, SliceError> {
    path_of(state.len() as u64, unit_bytes, index, |start, len| {
        subtree(&state[start as usize..(start + len) as usize], start)
    })
}

/// The path of unit `index` (of `unit_bytes`) in a state of `state_bytes`, bottom first, each
/// sibling subtree's chaining value from `sibling(start, len)`.
fn path_of(
    state_bytes: u64,
    unit_bytes: u64,
    index: u64,
    mut sibling: impl FnMut(u64, u64) -> ChainingValue,
) -> Result<SlicePath, SliceError> {
    let mut siblings: Vec<ChainingValue> = levels(state_bytes, unit_bytes, index)?
        .iter()
        .map(|level| sibling(level.sibling_start, level.sibling_len))
        .collect();
    siblings.reverse();
    Ok(SlicePath { siblings })
}

/// A state's slices by their chaining values: every sibling above a slice is a run of whole
/// slices (each slice is a complete subtree, above), so once these are known a slice's path
/// costs a few merges and a chunk's the hashing within its own slice, not the whole state. The
/// miner keeps one per state a locality opening round touches, and makes one, from the slices
/// where they lie, for each version 4 step it opens.
#[derive(Clone, Debug)]
pub struct StateSlices {
    /// Each slice's chaining value, in order; empty for a state of one slice, whose slice is the
    /// whole message.
    cvs: Vec<ChainingValue>,
    state_bytes: u64,
}

impl StateSlices {
    /// From a state's `count` slices, `slice(q)` giving slice `q`'s 65536 bytes; each hashed on
    /// the calling thread's rayon pool.
    pub fn new<'a>(count: u64, slice: impl Fn(u64) -> &'a [u8] + Sync) -> Result<Self, SliceError> {
        use rayon::prelude::*;
        let state_bytes = count * SLICE_BYTES as u64;
        levels(state_bytes, SLICE_BYTES as u64, 0)?;
        let cvs = if count == 1 {
            Vec::new()
        } else {
            (0..count)
                .into_par_iter()
                .map(|q| {
                    let bytes = slice(q);
                    (bytes.len() == SLICE_BYTES)
                        .then(|| subtree(bytes, q * SLICE_BYTES as u64))
                        .ok_or(SliceError::WrongLength(bytes.len()))
                })
                .collect::<Result<_, _>>()?
        };
        Ok(StateSlices { cvs, state_bytes })
    }

    /// From the chaining values of a state's `count` slices, in order, where they were hashed
    /// elsewhere (on the device that holds the state); none for a state of one slice. Refused
    /// where their number is not the state's.
    pub fn from_cvs(count: u64, cvs: Vec<ChainingValue>) -> Result<Self, SliceError> {
        let state_bytes = count * SLICE_BYTES as u64;
        levels(state_bytes, SLICE_BYTES as u64, 0)?;
        let want = if count == 1 { 0 } else { count };
        if cvs.len() as u64 != want {
            return Err(SliceError::WrongCount {
                got: cvs.len() as u64,
                want,
            });
        }
        Ok(StateSlices { cvs, state_bytes })
    }

    /// The path of chunk `chunk` (the chunk index within the whole state), `slice` being the
    /// bytes of the slice that holds it: what [`chunk_path`] cuts from the whole state.
    pub fn chunk_path(&self, slice: &[u8], chunk: u64) -> Result<SlicePath, SliceError> {
        if slice.len() != SLICE_BYTES {
            return Err(SliceError::WrongLength(slice.len()));
        }
        let slice_start = chunk / CHUNKS_PER_SLICE * SLICE_BYTES as u64;
        path_of(self.state_bytes, CHUNK_BYTES as u64, chunk, |start, len| {
            if len >= SLICE_BYTES as u64 {
                self.slices(start, len)
            } else {
                // Below the slice's own node, so within the slice.
                let within = (start - slice_start) as usize;
                subtree(&slice[within..within + len as usize], start)
            }
        })
    }

    /// The path of slice `slice`: what [`slice_path`] cuts from the whole state, made of the
    /// other slices' chaining values alone.
    pub fn slice_path(&self, slice: u64) -> Result<SlicePath, SliceError> {
        path_of(self.state_bytes, SLICE_BYTES as u64, slice, |start, len| {
            self.slices(start, len)
        })
    }

    /// The chaining value of the subtree of whole slices `len` bytes long from byte `start`.
    fn slices(&self, start: u64, len: u64) -> ChainingValue {
        self.run(start / SLICE_BYTES as u64, len / SLICE_BYTES as u64)
    }

    /// The chaining value of the subtree over `count` slices from `first`: split as BLAKE3
    /// splits, the left part the largest power of two of slices below `count`.
    fn run(&self, first: u64, count: u64) -> ChainingValue {
        if count == 1 {
            return self.cvs[first as usize];
        }
        let left = left_subtree_len(count * SLICE_BYTES as u64) / SLICE_BYTES as u64;
        merge_subtrees_non_root(
            &self.run(first, left),
            &self.run(first + left, count - left),
            Mode::Hash,
        )
    }
}

/// Checks that `bytes` are slice `slice` of a state of `state_bytes` bytes whose BLAKE3 hash is
/// `state_hash` (the validator's side).
pub fn verify_slice(
    state_hash: &Digest,
    state_bytes: u64,
    slice: u64,
    bytes: &[u8],
    path: &SlicePath,
) -> Result<(), SliceError> {
    verify_unit(state_hash, state_bytes, SLICE_BYTES as u64, slice, bytes, path)
}

/// Checks that `bytes` are chunk `chunk` (1 KiB) of a state of `state_bytes` bytes whose BLAKE3
/// hash is `state_hash`.
pub fn verify_chunk(
    state_hash: &Digest,
    state_bytes: u64,
    chunk: u64,
    bytes: &[u8],
    path: &SlicePath,
) -> Result<(), SliceError> {
    verify_unit(state_hash, state_bytes, CHUNK_BYTES as u64, chunk, bytes, path)
}

fn verify_unit(
    state_hash: &Digest,
    state_bytes: u64,
    unit_bytes: u64,
    index: u64,
    bytes: &[u8],
    path: &SlicePath,
) -> Result<(), SliceError> {
    let levels = levels(state_bytes, unit_bytes, index)?;
    if bytes.len() as u64 != unit_bytes {
        return Err(SliceError::WrongLength(bytes.len()));
    }
    if path.siblings.len() != levels.len() {
        return Err(SliceError::PathLength {
            slice: index,
            got: path.siblings.len(),
            want: levels.len(),
        });
    }
    let root: Digest = match levels.split_first() {
        // A state of one unit: the unit is the whole message.
        None => blake3::hash(bytes).into(),
        Some((top, below)) => {
            let mut node = subtree(bytes, index * unit_bytes);
            let join = |node: &ChainingValue, sibling: &ChainingValue, level: &Level| {
                if level.slice_is_left {
                    (*node, *sibling)
                } else {
                    (*sibling, *node)
                }
            };
            // Bottom up: `path` is bottom first, `levels` root first.
            for (level, sibling) in below.iter().rev().zip(&path.siblings) {
                let (left, right) = join(&node, sibling, level);
                node = merge_subtrees_non_root(&left, &right, Mode::Hash);
            }
            let (left, right) = join(&node, path.siblings.last().expect("length checked"), top);
            merge_subtrees_root(&left, &right, Mode::Hash).into()
        }
    };
    if &root == state_hash {
        Ok(())
    } else {
        Err(SliceError::Mismatch { slice: index })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::{Rng, SeedableRng};

    fn random_state(n: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; n * n];
        ChaCha8Rng::seed_from_u64(n as u64).fill_bytes(&mut bytes);
        bytes
    }

    fn slice_of(state: &[u8], slice: u64) -> &[u8] {
        &state[slice as usize * SLICE_BYTES..][..SLICE_BYTES]
    }

    #[test]
    fn every_slice_proves_against_the_states_own_blake3_hash() {
        // Powers of two and not (n = 768 is 9 slices: 8 on the left, 1 on the right).
        for n in [256, 512, 768, 1024, 2048] {
            let state = random_state(n);
            let hash: Digest = blake3::hash(&state).into();
            let count = (n * n / SLICE_BYTES) as u64;
            for slice in 0..count {
                let path = slice_path(&state, slice).unwrap();
                verify_slice(&hash, state.len() as u64, slice, slice_of(&state, slice), &path)
                    .unwrap_or_else(|e| panic!("n = {n}, slice {slice}: {e}"));
            }
        }
    }

    /// A chunk's path from its slice and the state's slice chaining values is the path cut from
    /// the whole state, at every size a state takes (9 slices at n = 768) and at chunks on every
    /// edge, and so is every slice's; a slice of the wrong length is refused.
    #[test]
    fn chunk_paths_from_slice_chaining_values_are_the_whole_states() {
        for n in [256, 512, 768, 1024, 2048] {
            let state = random_state(n);
            let slices = (state.len() / SLICE_BYTES) as u64;
            let kept = StateSlices::new(slices, |q| slice_of(&state, q)).unwrap();
            let count = state.len() as u64 / CHUNK_BYTES as u64;
            for chunk in [
                0,
                1,
                62,
                63,
                64,
                65,
                count / 2 - 1,
                count / 2,
                count / 2 + 5,
                count - 64,
                count - 1,
            ]
            .into_iter()
            .filter(|&c| c < count)
            {
                let slice = slice_of(&state, chunk / CHUNKS_PER_SLICE);
                assert_eq!(
                    kept.chunk_path(slice, chunk).unwrap(),
                    chunk_path(&state, chunk).unwrap(),
                    "n = {n}, chunk {chunk}"
                );
            }
            for slice in 0..slices {
                assert_eq!(
                    kept.slice_path(slice).unwrap(),
                    slice_path(&state, slice).unwrap(),
                    "n = {n}, slice {slice}"
                );
            }
            assert!(kept.slice_path(slices).is_err());
            assert_eq!(kept.chunk_path(&state[..100], 0), Err(SliceError::WrongLength(100)));
            assert!(kept.chunk_path(slice_of(&state, 0), count).is_err());
        }
        assert!(StateSlices::new(2, |_| &[0u8; 100][..]).is_err());
        assert!(StateSlices::new(0, |_| &[][..]).is_err());
    }

    /// Every chunk proves against the state's hash, a path six levels longer than its slice's;
    /// a changed byte, sibling or index fails.
    #[test]
    fn every_chunk_proves_against_the_states_own_blake3_hash() {
        for n in [256, 768, 1024] {
            let state = random_state(n);
            let hash: Digest = blake3::hash(&state).into();
            let len = state.len() as u64;
            let count = len / CHUNK_BYTES as u64;
            for chunk in [0, 1, 63, 64, count / 2 + 5, count - 1]
                .into_iter()
                .filter(|&c| c < count)
            {
                let path = chunk_path(&state, chunk).unwrap();
                let bytes = &state[chunk as usize * CHUNK_BYTES..][..CHUNK_BYTES];
                verify_chunk(&hash, len, chunk, bytes, &path).unwrap_or_else(|e| panic!("n = {n}, chunk {chunk}: {e}"));
                let slice_levels = slice_path(&state, chunk / CHUNKS_PER_SLICE).unwrap().siblings.len();
                assert_eq!(path.siblings.len(), slice_levels + 6, "n = {n}, chunk {chunk}");
                let mut changed = bytes.to_vec();
                changed[1000] ^= 4;
                assert!(verify_chunk(&hash, len, chunk, &changed, &path).is_err());
                let mut bad = path.clone();
                bad.siblings[0][3] ^= 1;
                assert!(verify_chunk(&hash, len, chunk, bytes, &bad).is_err());
                let other = (chunk + 1) % count;
                assert!(verify_chunk(&hash, len, other, bytes, &path).is_err());
            }
            assert!(verify_chunk(&hash, len, count, &state[..CHUNK_BYTES], &SlicePath::default()).is_err());
            assert_eq!(
                verify_chunk(&hash, len, 0, &state[..100], &chunk_path(&state, 0).unwrap()),
                Err(SliceError::WrongLength(100))
            );
        }
    }

    #[test]
    fn a_path_has_one_sibling_per_level() {
        let state = random_state(2048);
        assert_eq!(slice_path(&state, 17).unwrap().siblings.len(), 6);
        let state = random_state(768);
        assert_eq!(slice_path(&state, 0).unwrap().siblings.len(), 4);
        assert_eq!(slice_path(&state, 8).unwrap().siblings.len(), 1);
        assert!(slice_path(&random_state(256), 0).unwrap().siblings.is_empty());
    }

    #[test]
    fn a_changed_byte_sibling_or_index_fails() {
        let state = random_state(1024);
        let (hash, len): (Digest, u64) = (blake3::hash(&state).into(), state.len() as u64);
        let path = slice_path(&state, 5).unwrap();
        let mut bytes = slice_of(&state, 5).to_vec();
        bytes[40_000] ^= 1;
        assert_eq!(
            verify_slice(&hash, len, 5, &bytes, &path),
            Err(SliceError::Mismatch { slice: 5 })
        );
        let mut bad = path.clone();
        bad.siblings[2][0] ^= 1;
        assert!(verify_slice(&hash, len, 5, slice_of(&state, 5), &bad).is_err());
        // Slice 4's bytes under slice 5's path, and the right bytes at the wrong index.
        assert!(verify_slice(&hash, len, 5, slice_of(&state, 4), &path).is_err());
        assert!(verify_slice(&hash, len, 4, slice_of(&state, 5), &path).is_err());
        // A single-slice state's hash is not any slice's of a larger one.
        assert!(verify_slice(&hash, 65536, 0, slice_of(&state, 0), &SlicePath::default()).is_err());
    }

    #[test]
    fn malformed_inputs_are_errors_not_panics() {
        let state = random_state(512);
        let (hash, len): (Digest, u64) = (blake3::hash(&state).into(), state.len() as u64);
        let path = slice_path(&state, 1).unwrap();
        assert_eq!(
            verify_slice(&hash, len, 4, slice_of(&state, 1), &path),
            Err(SliceError::OutOfRange { slice: 4, count: 4 })
        );
        assert_eq!(
            verify_slice(&hash, len, 1, &[0; 100], &path),
            Err(SliceError::WrongLength(100))
        );
        let short = SlicePath {
            siblings: path.siblings[..1].to_vec(),
        };
        assert_eq!(
            verify_slice(&hash, len, 1, slice_of(&state, 1), &short),
            Err(SliceError::PathLength {
                slice: 1,
                got: 1,
                want: 2
            })
        );
        for bad_len in [0, 1000, 65537, MAX_STATE_BYTES + 65536] {
            assert_eq!(
                verify_slice(&hash, bad_len, 0, slice_of(&state, 0), &path),
                Err(SliceError::NotWholeSlices(bad_len))
            );
        }
        assert!(slice_path(&state[..1000], 0).is_err());
    }
}
