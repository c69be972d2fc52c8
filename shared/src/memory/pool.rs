//! Pool entries and the pool's commitment (PROTOCOL.md 18.2), and a pool held in host memory.
//!
//! Entry `e` of a device's pool is `X_64` of a chain of size 256 whose matrices come from the
//! pool's own key: the work function itself, so that an entry costs 64 GEMM steps to make and
//! nothing cheaper gives its bytes.

use super::params::{ENTRY_BYTES, ENTRY_N, ENTRY_STEPS, PoolSpec};
use crate::aligned::AlignedBytes;
use crate::digest::Digest;
use crate::failure::{BackendError, CancelToken};
use crate::gemm::{CpuGemm, PackedB};
use crate::matrix::{Matrix, a_row, generate_a, generate_b};
use crate::merkle::{MerkleProof, MerkleTree};
use crate::mix::mix;
use rayon::prelude::*;
use std::borrow::Cow;

/// Entry `entry` of `spec`'s pool, made on `gemm`'s threads.
pub fn make_entry(gemm: &CpuGemm, spec: &PoolSpec, entry: u64) -> Matrix {
    let b = PackedB::new(&generate_b(spec.key(), entry, ENTRY_N));
    let mut x = generate_a(spec.key(), entry, ENTRY_N);
    let mut next = Matrix::zeros(ENTRY_N);
    for step in 0..ENTRY_STEPS {
        gemm.step(&x, &b, step, &mut next);
        std::mem::swap(&mut x, &mut next);
    }
    x
}

/// Row `row` of entry `entry`, made alone: row r of a chain's product depends only on row r of
/// the matrix before it and on B, so one row costs 64 vector-matrix products (8.4 million
/// operations, 1/256 of the entry). A validator checks drawn rows of each opened entry this
/// way (PROTOCOL.md 18.5, check 7).
pub fn entry_row(spec: &PoolSpec, entry: u64, row: u32) -> [i8; ENTRY_N] {
    EntryB::new(spec, entry).row(spec, entry, row)
}

/// Whether the entry bytes `bytes` hold, at each of `rows`, what the work function makes there.
pub fn entry_rows_match(spec: &PoolSpec, entry: u64, bytes: &[u8], rows: &[u32]) -> bool {
    if bytes.len() != ENTRY_BYTES {
        return false;
    }
    let b = EntryB::new(spec, entry);
    rows.iter().all(|&row| {
        let at = row as usize * ENTRY_N;
        row < ENTRY_N as u32 && bytemuck::cast_slice::<i8, u8>(&b.row(spec, entry, row)) == &bytes[at..at + ENTRY_N]
    })
}

/// An entry's B, its rows taken in pairs for `vpmaddwd`: word `p * 256 + c` holds
/// `B[2p][c]` in its low 16 bits and `B[2p+1][c]` in its high 16, both sign-extended.
struct EntryB {
    pairs: Vec<i32>,
}

impl EntryB {
    fn new(spec: &PoolSpec, entry: u64) -> Self {
        let b = generate_b(spec.key(), entry, ENTRY_N);
        let b = b.as_slice();
        let pairs = (0..ENTRY_BYTES / 2)
            .map(|at| {
                let (p, c) = (at / ENTRY_N, at % ENTRY_N);
                let low = i16::from(b[2 * p * ENTRY_N + c]) as u16;
                let high = i16::from(b[(2 * p + 1) * ENTRY_N + c]) as u16;
                (u32::from(high) << 16 | u32::from(low)) as i32
            })
            .collect();
        EntryB { pairs }
    }

    fn row(&self, spec: &PoolSpec, entry: u64, row: u32) -> [i8; ENTRY_N] {
        let mut x = [0u8; ENTRY_N];
        a_row(spec.key(), entry, row, &mut x);
        let mut x: [i8; ENTRY_N] = x.map(|b| b as i8);
        for step in 0..ENTRY_STEPS {
            let y = self.times(&x);
            for (c, (out, y)) in x.iter_mut().zip(y).enumerate() {
                *out = mix(y, step, row, c as u32);
            }
        }
        x
    }

    /// `x * B`, exact: |sum| <= 256 * 128 * 128 = 2^22.
    fn times(&self, x: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { self.times_avx2(x) };
        }
        self.times_portable(x)
    }

    fn times_portable(&self, x: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
        let mut y = [0i32; ENTRY_N];
        for (p, pair) in self.pairs.chunks_exact(ENTRY_N).enumerate() {
            let (x0, x1) = (i32::from(x[2 * p]), i32::from(x[2 * p + 1]));
            for (y, &word) in y.iter_mut().zip(pair) {
                *y += x0 * i32::from(word as i16) + x1 * (word >> 16);
            }
        }
        y
    }

    /// A quarter of the columns at a time (eight accumulators of eight sums), every pair of
    /// B's rows one `vpmaddwd` per eight columns against the pair of x broadcast.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn times_avx2(&self, x: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
        use std::arch::x86_64::*;
        let mut y = [0i32; ENTRY_N];
        // SAFETY (every load and store): offsets stay below 128 * 256 words of `pairs` and
        // below 256 of `y`.
        unsafe {
            for quarter in 0..4 {
                let mut acc = [_mm256_setzero_si256(); 8];
                for p in 0..ENTRY_N / 2 {
                    let xs = (u32::from(x[2 * p + 1] as i16 as u16) << 16 | u32::from(x[2 * p] as i16 as u16)) as i32;
                    let xs = _mm256_set1_epi32(xs);
                    let words = self.pairs.as_ptr().add(p * ENTRY_N + quarter * 64);
                    for (k, acc) in acc.iter_mut().enumerate() {
                        let b = _mm256_loadu_si256(words.add(8 * k).cast());
                        *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(b, xs));
                    }
                }
                for (k, acc) in acc.iter().enumerate() {
                    _mm256_storeu_si256(y.as_mut_ptr().add(quarter * 64 + 8 * k).cast(), *acc);
                }
            }
        }
        y
    }
}

/// The pool tree's leaf for an entry: `blake3(entry bytes)`.
pub fn entry_leaf(entry: &[u8]) -> Digest {
    Digest::hash(entry)
}

/// Where a walk reads its entries: a resident pool, or (in tests of cheating miners) something
/// that makes or fetches them.
pub trait EntrySource: Sync {
    /// P: how many entries the pool has.
    fn entries(&self) -> u64;
    /// The 65536 bytes of entry `entry` (< P), as int8.
    fn entry(&self, entry: u64) -> Cow<'_, [i8]>;
    /// A hint that `entry` is read next: a resident pool starts fetching it into the cache.
    fn prefetch(&self, _entry: u64) {}
}

/// How far ahead a walk asks for an entry's bytes: one 4 KiB page. The CPU's own prefetchers
/// stream within a page but stop at its end, so a walk asks for the next entry's first page as
/// soon as that entry is known, and for each next page while it reads the one before
/// ([`super::walk::step`]).
pub const PREFETCH_AHEAD: usize = 4096;

/// Asks the CPU to bring `bytes` into its caches, one line at a time; no effect on results.
pub fn prefetch_bytes(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint and never faults; the pointer is into `bytes`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// A committed pool as an opening reads it, wherever the pool is held: in host memory
/// ([`HostPool`]) or on a GPU.
pub trait CommittedEntries {
    /// Entry `entry`'s 65536 bytes and its proof in the pool tree; an error if there is no such
    /// entry or the device holding it fails.
    fn entry(&self, entry: u64) -> Result<(Cow<'_, [u8]>, MerkleProof), BackendError>;
}

/// Entries of given bytes, with no tree: what benchmarks walk (the walk reads any bytes the same
/// way, and making real entries past the caches takes minutes on a CPU), and what a device walk
/// is compared against.
pub struct PoolBytes {
    bytes: AlignedBytes,
}

impl PoolBytes {
    /// `bytes` as whole entries; `None` unless its length is a positive multiple of 65536.
    pub fn new(bytes: AlignedBytes) -> Option<Self> {
        (!bytes.is_empty() && bytes.len().is_multiple_of(ENTRY_BYTES)).then_some(PoolBytes { bytes })
    }

    /// `entries` entries of ChaCha8 keystream under `key`, entry e on stream e, made on the
    /// threads of the rayon pool this runs in; `None` when the memory cannot be had.
    pub fn keystream(key: &[u8; 32], entries: usize) -> Option<Self> {
        let mut bytes = AlignedBytes::try_zeroed(entries.checked_mul(ENTRY_BYTES)?)?;
        bytes
            .as_mut_slice()
            .par_chunks_mut(ENTRY_BYTES)
            .enumerate()
            .for_each(|(e, chunk)| chunk.copy_from_slice(crate::matrix::generate(key, e as u64, ENTRY_N).as_bytes()));
        PoolBytes::new(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Entry `entry`'s bytes.
    pub fn entry_bytes(&self, entry: u64) -> &[u8] {
        let at = entry as usize * ENTRY_BYTES;
        &self.bytes.as_slice()[at..at + ENTRY_BYTES]
    }
}

impl EntrySource for PoolBytes {
    fn entries(&self) -> u64 {
        (self.bytes.len() / ENTRY_BYTES) as u64
    }

    fn entry(&self, entry: u64) -> Cow<'_, [i8]> {
        Cow::Borrowed(bytemuck::cast_slice(self.entry_bytes(entry)))
    }

    fn prefetch(&self, entry: u64) {
        prefetch_bytes(&self.entry_bytes(entry)[..PREFETCH_AHEAD]);
    }
}

/// A whole pool in host memory, with its Merkle tree: what the CPU backend holds resident.
pub struct HostPool {
    spec: PoolSpec,
    entries: PoolBytes,
    tree: MerkleTree,
}

impl HostPool {
    /// Makes every entry of `spec` on `gemm`'s threads. `progress` hears the count of entries
    /// made so far, now and then; `cancel` stops the fill between entries.
    pub fn fill(
        gemm: &CpuGemm,
        spec: &PoolSpec,
        progress: &(dyn Fn(u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<Self, BackendError> {
        let len = usize::try_from(spec.bytes()).ok();
        let Some(mut bytes) = len.and_then(AlignedBytes::try_zeroed) else {
            return Err(BackendError::OutOfMemory {
                device: spec.device(),
                detail: format!("cannot allocate a pool of {} bytes in host memory", spec.bytes()),
            });
        };
        let done = std::sync::atomic::AtomicU64::new(0);
        let leaves: Result<Vec<Digest>, BackendError> = gemm.install(|| {
            bytes
                .as_mut_slice()
                .par_chunks_mut(ENTRY_BYTES)
                .enumerate()
                .map(|(e, slot)| {
                    cancel.check()?;
                    let entry = make_entry(gemm, spec, e as u64);
                    slot.copy_from_slice(entry.as_bytes());
                    let made = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if made.is_multiple_of(64) || made == spec.entries() {
                        progress(made);
                    }
                    Ok(entry_leaf(slot))
                })
                .collect()
        });
        let tree = MerkleTree::new(&leaves?);
        Ok(HostPool {
            spec: spec.clone(),
            entries: PoolBytes { bytes },
            tree,
        })
    }

    /// A pool of `spec`'s size holding `entries` as they are, committed by their own tree: what
    /// a pool filled elsewhere (or, in tests, a cheat's made-up pool) becomes. `None` unless
    /// `entries` has exactly `spec.entries()` entries.
    pub fn from_bytes(spec: &PoolSpec, entries: PoolBytes) -> Option<Self> {
        if entries.entries() != spec.entries() {
            return None;
        }
        let leaves: Vec<Digest> = entries.as_bytes().par_chunks(ENTRY_BYTES).map(entry_leaf).collect();
        Some(HostPool {
            spec: spec.clone(),
            tree: MerkleTree::new(&leaves),
            entries,
        })
    }

    pub fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    /// The pool root (PROTOCOL.md 18.2).
    pub fn root(&self) -> Digest {
        self.tree.root()
    }

    /// The inclusion proof of entry `entry` in the pool tree.
    pub fn proof(&self, entry: u64) -> Option<MerkleProof> {
        self.tree.proof(entry)
    }

    /// Entry `entry`'s bytes.
    pub fn entry_bytes(&self, entry: u64) -> &[u8] {
        self.entries.entry_bytes(entry)
    }
}

impl CommittedEntries for HostPool {
    fn entry(&self, entry: u64) -> Result<(Cow<'_, [u8]>, MerkleProof), BackendError> {
        match self.proof(entry) {
            Some(proof) if entry < self.spec.entries() => Ok((Cow::Borrowed(self.entry_bytes(entry)), proof)),
            _ => Err(no_such_entry(&self.spec, entry)),
        }
    }
}

/// What a pool answers for an entry past its end: a walk never names one (its index is taken
/// mod P), so asking is a bug of the caller's.
pub fn no_such_entry(spec: &PoolSpec, entry: u64) -> BackendError {
    BackendError::Device {
        device: spec.device(),
        detail: format!("entry {entry} asked of a pool of {} entries", spec.entries()),
    }
}

/// The pool's entries are its [`PoolBytes`]; the tree only commits to them.
impl EntrySource for HostPool {
    fn entries(&self) -> u64 {
        self.entries.entries()
    }

    fn entry(&self, entry: u64) -> Cow<'_, [i8]> {
        self.entries.entry(entry)
    }

    fn prefetch(&self, entry: u64) {
        self.entries.prefetch(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Work;

    fn spec() -> PoolSpec {
        PoolSpec::with_entries(&Work::new(crate::vectors::vector_params()).unwrap(), 2, 7)
    }

    #[test]
    fn a_row_made_alone_is_the_entry_row() {
        let gemm = CpuGemm::new(2, None).unwrap();
        let entry = make_entry(&gemm, &spec(), 5);
        for row in [0u32, 1, 128, 255] {
            let at = row as usize * ENTRY_N;
            assert_eq!(
                entry_row(&spec(), 5, row).as_slice(),
                &entry.as_slice()[at..at + ENTRY_N],
                "row {row}"
            );
        }
        let rows: Vec<u32> = (0..256).step_by(37).collect();
        assert!(entry_rows_match(&spec(), 5, entry.as_bytes(), &rows));
        // Another entry's bytes, one byte changed in a drawn row, a short entry, a row past the
        // end: none match.
        assert!(!entry_rows_match(&spec(), 4, entry.as_bytes(), &rows));
        let mut changed = entry.as_bytes().to_vec();
        changed[37 * ENTRY_N + 200] ^= 0x80;
        assert!(!entry_rows_match(&spec(), 5, &changed, &rows));
        assert!(
            entry_rows_match(&spec(), 5, &changed, &[0, 1, 2]),
            "only drawn rows are read"
        );
        assert!(!entry_rows_match(&spec(), 5, &entry.as_bytes()[1..], &rows));
        assert!(!entry_rows_match(&spec(), 5, entry.as_bytes(), &[256]));
    }

    #[test]
    fn every_vector_matrix_path_is_exact() {
        let b = EntryB::new(&spec(), 3);
        for seed in 0..6u8 {
            let mut x: [i8; ENTRY_N] =
                core::array::from_fn(|i| (i as u8).wrapping_mul(seed.wrapping_mul(29) | 1) as i8);
            if seed == 0 {
                x.fill(-128);
            }
            assert_eq!(b.times(&x), b.times_portable(&x), "seed {seed}");
        }
    }
}
