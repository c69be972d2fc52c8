//! The walk (PROTOCOL.md 18.3): W walkers per device, each L steps; step t reads the one entry
//! that the state before it names, so no step can be known, or its entry fetched, before the
//! step before it is done.

use super::params::{ENTRY_BYTES, ENTRY_N, MemoryParams};
use super::pool::EntrySource;
use crate::digest::Digest;
use crate::failure::{BackendError, CancelToken};
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
    step_under(STEP_CONTEXT, entry, state, t)
}

/// [`step`] under the domain `context`: version 4 takes the same step over a 64 KiB slice of a
/// chain state, under its own domain.
pub fn step_under(context: &[u8], entry: &[i8], state: &Digest, t: u32) -> Digest {
    assert_eq!(entry.len(), ENTRY_BYTES, "a pool entry is 256 x 256 bytes");
    let y = matvec(entry, &walk_vector(state));
    let mut z = [0u8; ENTRY_N];
    for (r, (out, y)) in z.iter_mut().zip(y).enumerate() {
        *out = mix(y, t, r as u32, 0) as u8;
    }
    let mut h = blake3::Hasher::new();
    h.update(context);
    h.update(state.as_bytes());
    h.update(&z);
    h.finalize().into()
}

/// `E * v`, exact: |y[r]| <= 256 * 128 * 127 < 2^23. With AVX2 where the CPU has it: the
/// product is the step's only arithmetic over its 64 KiB, and the plain loop (about 20 us a
/// step on a Zen 5 core) would make the walk compute-bound instead of memory-bound.
fn matvec(entry: &[i8], v: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above; `entry` is 256 x 256 bytes (`step`
        // asserts it).
        return unsafe { matvec_avx2(entry, v) };
    }
    matvec_portable(entry, v)
}

fn matvec_portable(entry: &[i8], v: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
    let mut y = [0i32; ENTRY_N];
    for (row, y) in entry.chunks_exact(ENTRY_N).zip(y.iter_mut()) {
        *y = row.iter().zip(v).map(|(&a, &b)| i32::from(a) * i32::from(b)).sum();
    }
    y
}

/// Each row's 256 bytes widened to i16 and multiplied by the widened vector with `vpmaddwd`
/// (pairs of products, at most 2 * 128 * 127, summed in i32: exact), two accumulators a row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn matvec_avx2(entry: &[i8], v: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
    use std::arch::x86_64::*;
    const AHEAD_ROWS: usize = super::pool::PREFETCH_AHEAD / ENTRY_N;
    assert_eq!(entry.len(), ENTRY_BYTES);
    // SAFETY (every load below): 16-byte unaligned loads at offsets below 65536 of `entry` and
    // below 256 of `v`, both of which are that long.
    unsafe {
        let wide: [__m256i; 16] =
            core::array::from_fn(|i| _mm256_cvtepi8_epi16(_mm_loadu_si128(v.as_ptr().add(16 * i).cast())));
        let mut y = [0i32; ENTRY_N];
        for (r, y) in y.iter_mut().enumerate() {
            let row = entry.as_ptr().add(r * ENTRY_N);
            // The row one page ahead: the hardware prefetcher does not cross into it.
            if r + AHEAD_ROWS < ENTRY_N {
                for line in 0..ENTRY_N / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(row.add(AHEAD_ROWS * ENTRY_N + 64 * line).cast());
                }
            }
            let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for i in (0..16).step_by(2) {
                let a = _mm256_cvtepi8_epi16(_mm_loadu_si128(row.add(16 * i).cast()));
                let b = _mm256_cvtepi8_epi16(_mm_loadu_si128(row.add(16 * i + 16).cast()));
                even = _mm256_add_epi32(even, _mm256_madd_epi16(a, wide[i]));
                odd = _mm256_add_epi32(odd, _mm256_madd_epi16(b, wide[i + 1]));
            }
            let sum = _mm256_add_epi32(even, odd);
            let half = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            let quarter = _mm_add_epi32(half, _mm_shuffle_epi32(half, 0b01_00_11_10));
            *y = _mm_cvtsi128_si32(_mm_add_epi32(quarter, _mm_shuffle_epi32(quarter, 0b10_11_00_01)));
        }
        y
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector path and the plain loop agree, at the extremes of int8 too (the reference
    /// walk of tests/memory.rs checks whichever path this CPU takes against the definition).
    #[test]
    fn every_matvec_path_is_exact() {
        let mut entry: Vec<i8> = (0..ENTRY_BYTES)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as i8)
            .collect();
        entry[..ENTRY_N].fill(-128);
        entry[ENTRY_N..2 * ENTRY_N].fill(127);
        for seed in 0..8u8 {
            let mut v = walk_vector(&Digest([seed; 32]));
            if seed == 0 {
                v.fill(-127);
            }
            let want = matvec_portable(&entry, &v);
            assert_eq!(matvec(&entry, &v), want, "seed {seed}");
            if seed == 0 {
                assert_eq!(want[0], 256 * 128 * 127);
            }
        }
    }
}
