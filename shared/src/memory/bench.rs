//! Measurements of the memory phase on the CPU: the machine's read and copy bandwidth, the
//! walks' bandwidth against them (version 3's and version 4's), and the fill's rate. `miner bench` reports them; nothing here
//! decides a verdict.

use super::chain_pool::{ChainPool, MAX_WALK_STEPS};
use super::params::{ENTRY_BYTES, ENTRY_OPS, MemoryParams, PoolSpec};
use super::pool::{EntrySource, HostPool, PoolBytes};
use super::slice::SLICE_BYTES;
use super::slice_walk::{SliceSource, SliceWalk, walk_device_until};
use super::walk::{WalkSpec, walk_all};
use crate::aligned::AlignedBytes;
use crate::digest::Digest;
use crate::failure::{BackendError, CancelToken};
use crate::gemm::CpuGemm;
use crate::params::Work;
use rayon::prelude::*;
use std::time::{Duration, Instant};

/// Bytes per second read, copied, and walked, on the engine's threads.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MemoryBench {
    pub threads: usize,
    /// The buffers' size: well past any cache.
    pub bytes: u64,
    /// Every thread summing its share of one buffer: what a read-only pass reaches.
    pub read_bytes_per_sec: f64,
    /// One buffer copied into another, counting the bytes read and those written (as STREAM's
    /// copy counts them).
    pub copy_bytes_per_sec: f64,
    /// The walk over a pool of `bytes`, counting the 64 KiB each step reads.
    pub walk_bytes_per_sec: f64,
    pub walk_share_of_read: f64,
    pub walk_share_of_copy: f64,
    /// Pool entries made per second (each `ENTRY_OPS` int8 operations), and that as TOPS.
    pub fill_entries_per_sec: f64,
    pub fill_tops: f64,
    /// Version 4's walk (PROTOCOL.md 20.4) over states of 64 KiB holding the same bytes,
    /// every state of every walker in its walker's tree, counting the 64 KiB each step reads:
    /// what an attested version 4 walk on this machine is compared with.
    pub walk_v4_bytes_per_sec: f64,
    pub walk_v4_share_of_read: f64,
}

/// The best of `runs` timings of `f`, as bytes per second for `bytes`.
fn best_rate(runs: usize, bytes: f64, mut f: impl FnMut()) -> f64 {
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            bytes / start.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

/// Measures everything in [`MemoryBench`] on `gemm`'s threads, with buffers of `bytes`
/// (rounded down to whole entries; at least one) and a walk of about `budget`.
/// A buffer the machine cannot give is an error, not a crash.
pub fn measure(gemm: &CpuGemm, bytes: usize, budget: Duration) -> Result<MemoryBench, BackendError> {
    let bytes = (bytes / ENTRY_BYTES).max(1) * ENTRY_BYTES;
    let threads = gemm.threads();
    // The walk reads any entry bytes the same way: keystream, not entries made (minutes here).
    let pool = gemm
        .install(|| PoolBytes::keystream(&[5; 32], bytes / ENTRY_BYTES))
        .ok_or_else(|| no_memory(bytes))?;
    let (read, copy) = read_and_copy_rates(gemm, pool.as_bytes())?;
    let cancel = CancelToken::new();
    let walk = walk_rate(gemm, &pool, budget, &cancel);
    let walk_v4 = walk_v4_rate(gemm, &pool, budget, &cancel)?;
    let fill = fill_rate(gemm, budget, &cancel)?;
    Ok(MemoryBench {
        threads,
        bytes: bytes as u64,
        read_bytes_per_sec: read,
        copy_bytes_per_sec: copy,
        walk_bytes_per_sec: walk,
        walk_share_of_read: walk / read,
        walk_share_of_copy: walk / copy,
        fill_entries_per_sec: fill,
        fill_tops: fill * ENTRY_OPS as f64 / 1e12,
        walk_v4_bytes_per_sec: walk_v4,
        walk_v4_share_of_read: walk_v4 / read,
    })
}

fn no_memory(bytes: usize) -> BackendError {
    BackendError::OutOfMemory {
        device: 0,
        detail: format!("cannot allocate the bench's buffers of {bytes} bytes"),
    }
}

/// The machine's read and copy bandwidth over `source` on every thread, best of three: what a
/// walk's bandwidth is a share of.
fn read_and_copy_rates(gemm: &CpuGemm, source: &[u8]) -> Result<(f64, f64), BackendError> {
    let bytes = source.len();
    let piece = bytes.div_ceil(gemm.threads()).next_multiple_of(64);
    let read = gemm.install(|| {
        best_rate(3, bytes as f64, || {
            let sum: u64 = source
                .par_chunks(piece)
                .map(|chunk| {
                    chunk
                        .chunks_exact(8)
                        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                        .fold(0, u64::wrapping_add)
                })
                .reduce(|| 0, u64::wrapping_add);
            std::hint::black_box(sum);
        })
    });
    let mut target = AlignedBytes::try_zeroed(bytes).ok_or_else(|| no_memory(bytes))?;
    let copy = gemm.install(|| {
        best_rate(3, 2.0 * bytes as f64, || {
            target
                .as_mut_slice()
                .par_chunks_mut(piece)
                .zip(source.par_chunks(piece))
                .for_each(|(to, from)| to.copy_from_slice(from));
        })
    });
    Ok((read, copy))
}

/// Version 3's walk over `pool`: enough walkers to keep every thread busy, steps sized to the
/// budget from a short first walk; the best of three.
fn walk_rate(gemm: &CpuGemm, pool: &PoolBytes, budget: Duration, cancel: &CancelToken) -> f64 {
    let mut params = MemoryParams {
        pool_permille: 1000,
        walkers: (gemm.threads() * 4) as u32,
        walk_steps: 64,
        walk_checkpoint_every: 8,
    };
    let spec = |params: MemoryParams| WalkSpec {
        nonce: [1; 32],
        walk_seed: [2; 32],
        device: 0,
        pool_root: Digest::default(),
        entries: pool.entries(),
        params,
    };
    let timed_walk = |params: MemoryParams| {
        let start = Instant::now();
        gemm.install(|| walk_all(pool, &spec(params), cancel))
            .expect("a walk nothing cancels runs whole");
        params.walk_bytes() as f64 / start.elapsed().as_secs_f64()
    };
    let first = timed_walk(params);
    let steps = (first * budget.as_secs_f64() / (params.walkers as f64 * ENTRY_BYTES as f64)) as u32;
    params.walk_steps = steps.clamp(64, 8 * 4096) / 8 * 8;
    (0..2).map(|_| timed_walk(params)).fold(first, f64::max)
}

/// Pools of one entry a thread, made as the miner makes them, until the budget is spent (at
/// least one): entries per second.
fn fill_rate(gemm: &CpuGemm, budget: Duration, cancel: &CancelToken) -> Result<f64, BackendError> {
    let work = Work::new(crate::vectors::vector_params()).expect("the vector challenge is valid");
    let fill_spec = PoolSpec::with_entries(&work, 0, gemm.threads() as u64);
    let (start, mut made) = (Instant::now(), 0u64);
    while made == 0 || start.elapsed() < budget {
        HostPool::fill(gemm, &fill_spec, &|_| {}, cancel)?;
        made += fill_spec.entries();
    }
    Ok(made as f64 / start.elapsed().as_secs_f64())
}

/// A pool's bytes read as states at n = 256, one 64 KiB slice each, in place: a step reads one
/// whole 64 KiB block, as it does from the miner's own states, without a second copy of the pool.
struct BytesAsStates<'a> {
    pool: ChainPool,
    bytes: &'a [u8],
}

impl SliceSource for BytesAsStates<'_> {
    fn pool(&self) -> &ChainPool {
        &self.pool
    }

    fn slice(&self, e: u64) -> &[u8] {
        &self.bytes[e as usize * SLICE_BYTES..][..SLICE_BYTES]
    }
}

/// Version 4's walk over `pool`'s bytes as states at n = 256 (one slice each), with the
/// walkers a miner runs on these threads (4 a thread) and steps sized to `budget` from a short
/// first walk; the best of three, bytes per second.
fn walk_v4_rate(gemm: &CpuGemm, pool: &PoolBytes, budget: Duration, cancel: &CancelToken) -> Result<f64, BackendError> {
    let bytes = pool.as_bytes();
    let held = BytesAsStates {
        pool: ChainPool {
            device: 0,
            first_chain: 0,
            chains: (bytes.len() / SLICE_BYTES) as u64,
            n: 256,
        },
        bytes,
    };
    let mut walk = SliceWalk {
        nonce: [1; 32],
        walk_seed: [2; 32],
        global: Digest::default(),
        walkers: (gemm.threads() * 4) as u32,
        steps: 64,
    };
    let timed = |walk: &SliceWalk| -> Result<f64, BackendError> {
        let start = Instant::now();
        gemm.install(|| walk_device_until(walk, &held, cancel))?;
        Ok(f64::from(walk.walkers) * f64::from(walk.steps) * SLICE_BYTES as f64 / start.elapsed().as_secs_f64())
    };
    let first = timed(&walk)?;
    let steps = first * budget.as_secs_f64() / (f64::from(walk.walkers) * SLICE_BYTES as f64);
    walk.steps = (steps as u32).clamp(64, MAX_WALK_STEPS);
    let mut best = first;
    for _ in 0..3 {
        best = best.max(timed(&walk)?);
    }
    Ok(best)
}
