//! The walk (PROTOCOL.md 18.3): W walkers per device, each L steps; step t reads the one entry
//! that the state before it names, so no step can be known, or its entry fetched, before the
//! step before it is done.

use super::params::{ENTRY_BYTES, ENTRY_N, MemoryParams};
use super::pool::EntrySource;
use crate::backend::{BackendError, CancelToken};
use crate::digest::Digest;
use crate::merkle::MerkleTree;
use crate::mix::mix;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
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

/// The entry a state names: `le64(s[0..8]) mod P`.
pub fn entry_index(state: &Digest, entries: u64) -> u64 {
    let mut low = [0u8; 8];
    low.copy_from_slice(&state.0[..8]);
    u64::from_le_bytes(low) % entries
}

/// The step's vector: the first 256 bytes of ChaCha8 keyed by the state (stream 0), each with
/// its lowest bit set, so that every element is odd and no column of the entry can be skipped.
pub fn walk_vector(state: &Digest) -> [i8; ENTRY_N] {
    let mut bytes = [0u8; ENTRY_N];
    ChaCha8Rng::from_seed(state.0).fill_bytes(&mut bytes);
    bytes.map(|b| (b | 1) as i8)
}

/// One walk step, step number `t` of its walker: `y = E * v` (int32, exact),
/// `z[r] = mix(y[r], t, r, 0)`, `s' = blake3("gpu-attest v3 walk step" || s || z)`.
pub fn step(entry: &[i8], state: &Digest, t: u32) -> Digest {
    assert_eq!(entry.len(), ENTRY_BYTES, "a pool entry is 256 x 256 bytes");
    let v = walk_vector(state);
    let mut z = [0u8; ENTRY_N];
    for (r, (row, out)) in entry.chunks_exact(ENTRY_N).zip(z.iter_mut()).enumerate() {
        *out = mix(dot(row, &v), t, r as u32, 0) as u8;
    }
    let mut h = blake3::Hasher::new();
    h.update(STEP_CONTEXT);
    h.update(state.as_bytes());
    h.update(&z);
    h.finalize().into()
}

/// A row times the vector. |sum| <= 256 * 128 * 127 < 2^23. The products are widened to i16
/// (at most 2^14) and summed in i32, the shape that compilers turn into `pmaddwd`.
#[inline]
fn dot(row: &[i8], v: &[i8; ENTRY_N]) -> i32 {
    row.iter()
        .zip(v)
        .map(|(&a, &b)| i32::from(i16::from(a) * i16::from(b)))
        .sum()
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
    let every = spec.params.walk_checkpoint_every;
    let mut state = spec.start_state(walker);
    let mut checkpoints = Vec::with_capacity(spec.params.walk_segments() as usize + 1);
    checkpoints.push(state);
    for t in 0..spec.params.walk_steps {
        if t.is_multiple_of(CANCEL_EVERY) {
            cancel.check()?;
        }
        state = step(&pool.entry(entry_index(&state, spec.entries)), &state, t);
        if (t + 1).is_multiple_of(every) {
            checkpoints.push(state);
        }
    }
    Ok(WalkerTrace { walker, checkpoints })
}

/// One device's whole walk: every walker's trace, in walker order, on the threads of the
/// rayon pool this is called in.
pub fn walk_all(pool: &dyn EntrySource, spec: &WalkSpec, cancel: &CancelToken) -> Result<DeviceWalk, BackendError> {
    let traces = (0..spec.params.walkers)
        .into_par_iter()
        .map(|w| {
            let trace = walk_one(pool, spec, w, cancel);
            if trace.is_err() {
                cancel.cancel();
            }
            trace
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(DeviceWalk::new(traces))
}

/// A device's walker traces and the tree over their leaves: what a miner keeps to open them.
#[derive(Clone, Debug)]
pub struct DeviceWalk {
    pub traces: Vec<WalkerTrace>,
    pub tree: MerkleTree,
}

impl DeviceWalk {
    pub fn new(traces: Vec<WalkerTrace>) -> Self {
        let leaves: Vec<Digest> = traces.iter().map(WalkerTrace::leaf).collect();
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
