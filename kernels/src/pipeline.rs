//! The two-stream batch pipeline on one device: a batch of chains from generation to its last
//! checkpoint, steps queued two groups ahead of the host, and checkpoints hashed on the second
//! stream beside the steps (or, as a fallback, copied to the host and hashed there with the
//! blake3 crate).

use super::device::{DeviceRuntime, hash_scratch_words};
use super::plan;
use super::pool_states::CudaPoolStates;
use super::words::{digest_from_words, key_words};
use cudarc::driver::{CudaEvent, CudaSlice};
use gpu_attest_shared::backend::PoolStates;
use gpu_attest_shared::backend::{BackendError, CancelToken, ChainProgress};
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::{ENTRY_BYTES, ENTRY_N, ENTRY_STEPS};
use gpu_attest_shared::params::Work;
use rayon::prelude::*;
use std::collections::VecDeque;
use std::ops::Range;

/// Steps per group the host queues on a device. The host keeps at most two groups queued:
/// before queueing a group it waits for the one before the last, so the device never drains
/// while the host waits, and a cancelled challenge keeps the GPU busy for at most two groups.
const STEPS_IN_FLIGHT: u32 = 8;

/// blake3 of each n x n matrix in `host`, in order.
fn hash_matrices(host: &[i8], nn: usize) -> Vec<Digest> {
    host.par_chunks(nn)
        .map(|m| Digest::hash(bytemuck::cast_slice(m)))
        .collect()
}

/// Checkpoint digests in the order the device writes them: slots (see `plan::DIGEST_SLOTS`), each
/// holding `count` 8-word digests (one per chain of the batch), one `Vec` per checkpoint.
fn digests_by_checkpoint(words: &[u32], count: usize) -> Vec<Vec<Digest>> {
    words
        .chunks(count * 8)
        .map(|slot| slot.chunks(8).map(digest_from_words).collect())
        .collect()
}

/// The first step that writes over a checkpoint taken before step `next_step`: X and the next X
/// swap every step, so `next_step` reads the checkpoint into the other buffer, and the step
/// after it writes into the checkpoint's.
fn overwriting_step(next_step: u32) -> u32 {
    next_step + 1
}

/// Removes from `hashing` (in order) and returns the hashes that must be done before step
/// `step` runs: those whose matrix that step overwrites, and any before them.
fn due_before<E>(hashing: &mut VecDeque<(E, u32)>, step: u32) -> Vec<E> {
    let due = hashing.iter().take_while(|(_, overwrite)| *overwrite <= step).count();
    hashing.drain(..due).map(|(hash, _)| hash).collect()
}

/// The device buffers of one batch: X, the next X, B transposed, hashing scratch, and the
/// checkpoint digests not yet copied to the host.
struct BatchBuffers {
    x: CudaSlice<i8>,
    next: CudaSlice<i8>,
    bt: CudaSlice<i8>,
    hash_a: CudaSlice<u32>,
    hash_b: CudaSlice<u32>,
    /// `plan::DIGEST_SLOTS` slots of one digest per chain.
    digests: CudaSlice<u32>,
    /// Slots of `digests` filled since the last copy to the host.
    digests_pending: usize,
    /// Checkpoint hashes still running on the hash stream: the event that ends each, and the
    /// first step whose GEMM overwrites the matrix it reads (the main stream waits there).
    hashing: VecDeque<(CudaEvent, u32)>,
    /// Host copy of X, for hashing on the host (and for `advance`'s result).
    host: Vec<i8>,
    /// `host` holds a checkpoint that is not hashed yet.
    hash_pending: bool,
}

/// Where a batch's checkpoint digests go: one call per checkpoint, one digest per chain.
type Record<'a> = &'a mut dyn FnMut(Vec<Digest>);

/// What the steps of a batch need of its chains: their size and checkpoint interval. A
/// challenge's chains take them from its `Work`; a pool's entries are chains of size 256 whose
/// one checkpoint, `X_64`, is the entry itself.
#[derive(Clone, Copy, Debug)]
struct ChainShape {
    n: usize,
    checkpoint_every: u32,
}

impl From<&Work> for ChainShape {
    fn from(work: &Work) -> Self {
        ChainShape {
            n: work.n(),
            checkpoint_every: work.checkpoint_every(),
        }
    }
}

/// The shape that makes pool entries: checkpoint only at the last of the `ENTRY_STEPS` steps.
const ENTRY_SHAPE: ChainShape = ChainShape {
    n: ENTRY_N,
    checkpoint_every: ENTRY_STEPS,
};

impl DeviceRuntime {
    fn buffers(&self, chains: usize, n: usize, host_copy: bool) -> Result<BatchBuffers, BackendError> {
        let len = chains * n * n;
        let words = chains * hash_scratch_words(n);
        Ok(BatchBuffers {
            x: self.alloc(len)?,
            next: self.alloc(len)?,
            bt: self.alloc(len)?,
            hash_a: self.alloc_words(words)?,
            hash_b: self.alloc_words(words)?,
            digests: self.alloc_words(chains * plan::DIGEST_SLOTS * 8)?,
            digests_pending: 0,
            hashing: VecDeque::new(),
            host: if host_copy { vec![0; len] } else { Vec::new() },
            hash_pending: false,
        })
    }

    /// Takes the checkpoint of X in `buf.x`: hashed on the device into the next digest slot
    /// (copied to the host when the slots are full, see `flush_device_digests`), or copied to
    /// the host to be hashed while the next step runs (see `flush_host_hash`).
    /// `next_step` is the step the chains run next.
    fn checkpoint(
        &self,
        buf: &mut BatchBuffers,
        count: usize,
        n: usize,
        next_step: u32,
        record: Record<'_>,
    ) -> Result<(), BackendError> {
        if self.host_hashing {
            self.download(&buf.x, &mut buf.host[..count * n * n])?;
            buf.hash_pending = true;
        } else {
            let slot = buf.digests_pending;
            let hashed = self.blake3_into(
                &buf.x,
                count,
                n,
                &mut buf.hash_a,
                &mut buf.hash_b,
                &mut buf.digests,
                slot,
            )?;
            buf.hashing.push_back((hashed, overwriting_step(next_step)));
            buf.digests_pending += 1;
            if buf.digests_pending == plan::DIGEST_SLOTS {
                self.flush_device_digests(buf, count, record)?;
            }
        }
        Ok(())
    }

    /// Copies the digests waiting in `buf.digests` to the host and records them, in order.
    fn flush_device_digests(
        &self,
        buf: &mut BatchBuffers,
        count: usize,
        record: Record<'_>,
    ) -> Result<(), BackendError> {
        if buf.digests_pending == 0 {
            return Ok(());
        }
        let mut words = vec![0u32; buf.digests_pending * count * 8];
        self.download_words(&buf.digests, &mut words)?;
        buf.digests_pending = 0;
        for checkpoint in digests_by_checkpoint(&words, count) {
            record(checkpoint);
        }
        Ok(())
    }

    fn flush_host_hash(buf: &mut BatchBuffers, count: usize, n: usize, record: Record<'_>) {
        if buf.hash_pending {
            record(hash_matrices(&buf.host[..count * n * n], n * n));
            buf.hash_pending = false;
        }
    }

    /// Runs steps `steps` on the `count` chains in `buf` (X in `buf.x`, B^T in `buf.bt`). With
    /// `record`, takes a checkpoint after every step whose number is a multiple of c.
    fn run_steps(
        &self,
        shape: ChainShape,
        buf: &mut BatchBuffers,
        count: usize,
        steps: Range<u32>,
        cancel: &CancelToken,
        mut record: Option<Record<'_>>,
    ) -> Result<(), BackendError> {
        let ChainShape { n, checkpoint_every: c } = shape;
        // A mark at the start of the group queued last, which is the end of the group before it.
        let mut last_group: Option<CudaEvent> = None;
        for step in steps {
            if step.is_multiple_of(STEPS_IN_FLIGHT) {
                cancel.check()?;
                // Wait for the group before the last one: the last stays queued, so the device
                // keeps working while this one is queued behind it.
                if let Some(mark) = last_group.take() {
                    self.wait_for(&mark)?;
                }
                last_group = Some(self.mark()?);
            }
            // A checkpoint hashed beside the steps must be read before this step overwrites it.
            for hashed in due_before(&mut buf.hashing, step) {
                self.after(&hashed)?;
            }
            self.gemm_mix(&buf.x, &buf.bt, &mut buf.next, count, n, step)?;
            std::mem::swap(&mut buf.x, &mut buf.next);
            if let Some(record) = record.as_mut() {
                // The host hashes the previous checkpoint while the device runs this step.
                Self::flush_host_hash(buf, count, n, *record);
                if (step + 1).is_multiple_of(c) {
                    self.checkpoint(buf, count, n, step + 1, *record)?;
                }
            }
        }
        if let Some(record) = record {
            Self::flush_host_hash(buf, count, n, record);
            self.flush_device_digests(buf, count, record)?;
        }
        self.synchronize()?;
        buf.hashing.clear();
        Ok(())
    }

    /// Chains `first..first + count`, from generation to the last checkpoint; with `keep`, the
    /// final states of those of them that are pool chains go into their places in the pool.
    fn run_batch(
        &self,
        work: &Work,
        first: u64,
        count: usize,
        buf: &mut BatchBuffers,
        keep: Option<&mut CudaPoolStates>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        let n = work.n();
        // B passes through `next`, which is free until the first step.
        let chains = first..first + count as u64;
        self.load_chains(
            &key_words(work.key()),
            chains,
            n,
            &mut buf.x,
            &mut buf.next,
            &mut buf.bt,
        )?;
        let mut checkpoints: Vec<Vec<Digest>> = (0..count)
            .map(|_| Vec::with_capacity(work.checkpoints_per_chain()))
            .collect();
        let mut record = |digests: Vec<Digest>| {
            for (chain, digest) in checkpoints.iter_mut().zip(digests) {
                chain.push(digest);
            }
        };
        // h_0 = blake3(A_i).
        buf.digests_pending = 0;
        self.checkpoint(buf, count, n, 0, &mut record)?;
        self.run_steps(work.into(), buf, count, 0..work.iterations(), cancel, Some(&mut record))?;
        if let Some(pool) = keep {
            // The batch's pool chains are a prefix of it: the pool is the device's first chains.
            let kept = pool.pool().first_chain..pool.pool().first_chain + pool.pool().chains;
            let to_keep = kept.end.saturating_sub(first).min(count as u64) as usize;
            if kept.contains(&first) && to_keep > 0 {
                let nn = n * n;
                let at = (first - kept.start) as usize * nn;
                self.stream
                    .memcpy_dtod(
                        &buf.x.slice(0..to_keep * nn),
                        &mut pool.device_states_mut().slice_mut(at..at + to_keep * nn),
                    )
                    .map_err(|e| self.err(e))?;
            }
        }
        Ok(checkpoints
            .into_iter()
            .enumerate()
            .map(|(i, checkpoints)| ChainResult {
                index: first + i as u64,
                checkpoints,
            })
            .collect())
    }

    pub(crate) fn run_chains(
        &self,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        self.run_chains_keeping(work, chains, None, progress, cancel)
    }

    /// Runs `chains` as [`DeviceRuntime::run_chains`] does, and keeps the final states of
    /// `pool`'s chains (the first of `chains`) in the device's memory as its version 4 pool
    /// (PROTOCOL.md 20.1).
    pub(crate) fn run_pool_chains(
        &self,
        work: &Work,
        chains: Range<u64>,
        pool: ChainPool,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<(Vec<ChainResult>, CudaPoolStates), BackendError> {
        let kept = pool.first_chain..pool.first_chain + pool.chains;
        if pool.device != self.index || pool.n != work.n() || kept.start != chains.start || kept.end > chains.end {
            return Err(BackendError::PoolOutsideChains {
                pool: format!("{pool:?}"),
                device: self.index,
                chains,
            });
        }
        // The pool first: the batches are sized from what it leaves free.
        let mut states = self.pool_states(pool)?;
        let results = self.run_chains_keeping(work, chains, Some(&mut states), progress, cancel)?;
        self.synchronize()?;
        Ok((results, states))
    }

    fn run_chains_keeping(
        &self,
        work: &Work,
        chains: Range<u64>,
        mut keep: Option<&mut CudaPoolStates>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        let total = chains.end.saturating_sub(chains.start);
        if total == 0 {
            return Ok(Vec::new());
        }
        // Beside a pool, its own reserve (as version 3's fill): the states take the rest.
        let reserve = if keep.is_some() {
            plan::POOL_RESERVE_BYTES
        } else {
            plan::RESERVE_BYTES
        };
        let batch = plan::batch_size_beside(self.index, work.n(), total, self.free_memory()?, reserve)?;
        let mut buf = self.buffers(batch as usize, work.n(), self.host_hashing)?;
        let mut results = Vec::with_capacity(total as usize);
        let mut first = chains.start;
        while first < chains.end {
            let count = batch.min(chains.end - first) as usize;
            match self.run_batch(work, first, count, &mut buf, keep.as_deref_mut(), cancel) {
                Ok(batch_results) => results.extend(batch_results),
                Err(e) => {
                    // The buffers are freed in the main stream's order; a hash still reading
                    // them on the other stream must finish first. Its own error, if any, is
                    // the one already in hand.
                    let _ = self.synchronize();
                    return Err(e);
                }
            }
            first += count as u64;
            progress(first - chains.start);
        }
        Ok(results)
    }

    /// Makes entries `entries` of the pool under `key` (PROTOCOL.md 18.2) into their places in
    /// `pool` (entry e at byte e * 65536 of it), in batches of chains of size 256, and returns
    /// their leaves, `blake3(entry)`, hashed as a chain's checkpoints are. `progress` hears the
    /// entries made so far after each batch.
    pub(crate) fn make_entries(
        &self,
        key: &[u8; 32],
        entries: Range<u64>,
        pool: &mut CudaSlice<i8>,
        progress: &(dyn Fn(u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<Vec<Digest>, BackendError> {
        let total = entries.end.saturating_sub(entries.start);
        assert!(
            pool.len() as u64 >= entries.end * ENTRY_BYTES as u64,
            "the pool holds every entry made"
        );
        // Beside the pool: its own reserve, not the larger one kept beside a challenge's chains.
        let batch = plan::batch_size_beside(
            self.index,
            ENTRY_N,
            total.max(1),
            self.free_memory()?,
            plan::FILL_RESERVE_BYTES,
        )?;
        let mut buf = self.buffers(batch as usize, ENTRY_N, self.host_hashing)?;
        let mut leaves = Vec::with_capacity(total as usize);
        let mut first = entries.start;
        while first < entries.end {
            let count = batch.min(entries.end - first) as usize;
            let made = self.make_entry_batch(
                key,
                first,
                count,
                &mut buf,
                pool,
                &mut |digests| leaves.extend(digests),
                cancel,
            );
            if let Err(e) = made {
                // As in `run_chains`: a hash still reading the buffers must finish before they go.
                let _ = self.synchronize();
                return Err(e);
            }
            first += count as u64;
            progress(first - entries.start);
        }
        Ok(leaves)
    }

    /// Entries `first..first + count`: X_64 of their chains, hashed, then copied into the pool.
    #[allow(clippy::too_many_arguments)]
    fn make_entry_batch(
        &self,
        key: &[u8; 32],
        first: u64,
        count: usize,
        buf: &mut BatchBuffers,
        pool: &mut CudaSlice<i8>,
        record: Record<'_>,
        cancel: &CancelToken,
    ) -> Result<(), BackendError> {
        let n = ENTRY_N;
        self.load_chains(
            &key_words(key),
            first..first + count as u64,
            n,
            &mut buf.x,
            &mut buf.next,
            &mut buf.bt,
        )?;
        buf.digests_pending = 0;
        // The one checkpoint, after the last step, is X_64: the leaf.
        self.run_steps(ENTRY_SHAPE, buf, count, 0..ENTRY_STEPS, cancel, Some(record))?;
        let at = first as usize * ENTRY_BYTES;
        let len = count * ENTRY_BYTES;
        self.stream
            .memcpy_dtod(&buf.x.slice(0..len), &mut pool.slice_mut(at..at + len))
            .map_err(|e| self.err(e))
    }

    pub(crate) fn advance(
        &self,
        work: &Work,
        chain: u64,
        start: &Matrix,
        first: u32,
        steps: u32,
        cancel: &CancelToken,
    ) -> Result<Matrix, BackendError> {
        let n = work.n();
        let mut buf = self.buffers(1, n, true)?;
        self.upload(start.as_slice(), &mut buf.x)?;
        self.load_transposed_b(&key_words(work.key()), chain..chain + 1, n, &mut buf.next, &mut buf.bt)?;
        self.run_steps(work.into(), &mut buf, 1, first..first + steps, cancel, None)?;
        self.download(&buf.x, &mut buf.host)?;
        Ok(Matrix::from_vec(n, buf.host).expect("a buffer of n * n bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_digest_slots_come_back_one_vec_per_checkpoint_in_chain_order() {
        // Three checkpoints of a batch of two chains, as blake3_into lays them out: slot-major,
        // then chain, 8 little-endian words per digest.
        let (count, slots) = (2usize, 3usize);
        let digest = |slot: usize, chain: usize| Digest::hash(&[slot as u8, chain as u8]);
        let mut words = Vec::new();
        for slot in 0..slots {
            for chain in 0..count {
                let bytes = digest(slot, chain);
                words.extend(
                    bytes
                        .as_bytes()
                        .chunks(4)
                        .map(|w| u32::from_le_bytes(w.try_into().unwrap())),
                );
            }
        }
        let got = digests_by_checkpoint(&words, count);
        let want: Vec<Vec<Digest>> = (0..slots)
            .map(|slot| (0..count).map(|chain| digest(slot, chain)).collect())
            .collect();
        assert_eq!(got, want);
    }

    /// The run_steps schedule on a model of its two buffers: each checkpoint's hash is waited for
    /// before the step that overwrites its matrix, and not a step sooner (that step is the
    /// overlap).
    #[test]
    fn checkpoint_hashes_are_waited_for_exactly_before_their_matrix_is_overwritten() {
        for c in [1u32, 2, 3, 4] {
            let (mut x, mut next) = (0usize, 1usize);
            // (buffer hashed, step it was taken before) stands in for the hash's event.
            let mut hashing: VecDeque<((usize, u32), u32)> = VecDeque::new();
            let mut unfinished: Vec<(usize, u32)> = Vec::new();
            let checkpoint = |x: usize, next_step: u32, hashing: &mut VecDeque<_>, unfinished: &mut Vec<_>| {
                hashing.push_back(((x, next_step), overwriting_step(next_step)));
                unfinished.push((x, next_step));
            };
            checkpoint(x, 0, &mut hashing, &mut unfinished);
            for step in 0..12u32 {
                for done in due_before(&mut hashing, step) {
                    assert_ne!(done.1, step, "c={c}: the hash taken before step {step} blocks it");
                    unfinished.retain(|&u| u != done);
                }
                assert!(
                    unfinished.iter().all(|&(buffer, _)| buffer != next),
                    "c={c}: step {step} overwrites a matrix still being hashed: {unfinished:?}"
                );
                std::mem::swap(&mut x, &mut next);
                if (step + 1).is_multiple_of(c) {
                    checkpoint(x, step + 1, &mut hashing, &mut unfinished);
                }
            }
        }
    }
}
