//! Pool entries and the pool's commitment (PROTOCOL.md 18.2), and a pool held in host memory.
//!
//! Entry `e` of a device's pool is `X_64` of a chain of size 256 whose matrices come from the
//! pool's own key: the work function itself, so that an entry costs 64 GEMM steps to make and
//! nothing cheaper gives its bytes.

use super::params::{ENTRY_BYTES, ENTRY_N, ENTRY_STEPS, PoolSpec};
use crate::aligned::AlignedBytes;
use crate::backend::{BackendError, CancelToken};
use crate::digest::Digest;
use crate::gemm::{CpuGemm, PackedB};
use crate::matrix::{Matrix, generate_a, generate_b};
use crate::merkle::{MerkleProof, MerkleTree};
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
}

/// A whole pool in host memory, with its Merkle tree: what the CPU backend holds resident.
pub struct HostPool {
    spec: PoolSpec,
    bytes: AlignedBytes,
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
            bytes,
            tree,
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
        let at = entry as usize * ENTRY_BYTES;
        &self.bytes.as_slice()[at..at + ENTRY_BYTES]
    }
}

impl EntrySource for HostPool {
    fn entries(&self) -> u64 {
        self.spec.entries()
    }

    fn entry(&self, entry: u64) -> Cow<'_, [i8]> {
        Cow::Borrowed(bytemuck::cast_slice(self.entry_bytes(entry)))
    }
}
