//! Exact int8 x int8 -> int32 matrix products on the CPU, with the chain's `mix` fused in.
//!
//! B is packed once per chain into 32-column panels ([`PackedB`]). A kernel ([`KernelKind`])
//! computes one register tile, a few rows of A against one panel over the whole k range; the
//! driver here walks the tiles, parallel over blocks of whole output rows with rayon, and hands
//! each finished row to the epilogue (bias correction, then `mix` or a plain copy).
//!
//! Kernels, fastest first: AMX-INT8 `tdpbssd`, AVX-512 VNNI and AVX-VNNI `vpdpbusd`, AVX2
//! `vpmaddwd` on widened bytes, and a portable loop. All are exact: PROTOCOL.md "Exactness"
//! gives the argument, and `tests/gemm_oracle.rs` checks each against [`naive`].

mod epilogue;
mod kernels;
pub mod naive;
mod packed;

pub use kernels::{KERNEL_ENV, KernelChoice, KernelKind, UnknownKernel};
pub use packed::PackedB;

use crate::matrix::Matrix;
use rayon::prelude::*;
use thiserror::Error;

/// Columns per register tile (and per packed panel of B).
const TILE_COLS: usize = 32;
/// The most rows any kernel's tile has (AMX's).
const MAX_TILE_ROWS: usize = 32;

#[derive(Debug, Error)]
pub enum GemmError {
    #[error("the {kernel} CPU kernel is not available on this machine: it {reason}")]
    KernelUnavailable { kernel: KernelKind, reason: &'static str },
    #[error("{KERNEL_ENV}: {0}")]
    UnknownKernel(#[from] UnknownKernel),
    #[error("could not start the CPU thread pool: {0}")]
    ThreadPool(String),
}

/// A CPU GEMM engine: one kernel choice and one thread pool, reused for every product.
pub struct CpuGemm {
    kernel: KernelKind,
    pool: rayon::ThreadPool,
}

impl CpuGemm {
    /// `threads = 0` uses every core. `kernel = None` takes the kernel named by
    /// [`KERNEL_ENV`] if set, else the fastest this CPU supports; `Some(k)` takes exactly k.
    pub fn new(threads: usize, kernel: Option<KernelKind>) -> Result<Self, GemmError> {
        let kernel = match kernel {
            Some(k) => k,
            None => KernelKind::from_env()?.unwrap_or_else(KernelKind::best_available),
        };
        if let Some(reason) = kernel.unavailable_reason() {
            return Err(GemmError::KernelUnavailable { kernel, reason });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("cpu-gemm-{i}"))
            .build()
            .map_err(|e| GemmError::ThreadPool(e.to_string()))?;
        Ok(CpuGemm { kernel, pool })
    }

    pub fn kernel(&self) -> KernelKind {
        self.kernel
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `f` inside this engine's thread pool, so that parallel work around the GEMMs (several
    /// small chains at once) shares the same threads instead of oversubscribing the cores.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// The exact product `a * b` as int32, row-major.
    pub fn product(&self, a: &Matrix, b: &PackedB) -> Vec<i32> {
        let n = a.n();
        let mut out = vec![0i32; n * n];
        self.run(a, b, &mut out, |tile, out, first| {
            for (i, row) in tile.iter().enumerate() {
                out[first + i * n..first + i * n + TILE_COLS].copy_from_slice(row);
            }
        });
        out
    }

    /// One chain step: `out = mix(x * b, step)` element-wise; the int32 product is never stored.
    pub fn step(&self, x: &Matrix, b: &PackedB, step: u32, out: &mut Matrix) {
        assert_eq!(out.n(), x.n(), "output matrix has the wrong size");
        let (n, mix_tile) = (x.n(), epilogue::mix_tile());
        self.run(x, b, out.as_mut_slice(), |tile, out, first| {
            mix_tile(tile, step, out, first, n)
        });
    }

    /// Drives the tiles: each rayon task owns a block of whole output rows; inside it, panels of
    /// B are the outer loop so one panel (32n bytes) stays in L2 while the block's rows stream by.
    /// `epilogue(tile, block, first)` writes a finished tile's row i at `block[first + i*n..]`.
    fn run<T, F>(&self, a: &Matrix, b: &PackedB, out: &mut [T], epilogue: F)
    where
        T: Send,
        F: Fn(&[[i32; TILE_COLS]], &mut [T], usize) + Sync,
    {
        let n = a.n();
        let kernel = self.kernel;
        let tile_rows = kernel.tile_rows();
        assert_eq!(b.n(), n, "A and B differ in size");
        assert!(
            n.is_multiple_of(TILE_COLS) && n.is_multiple_of(tile_rows),
            "n={n} is not a multiple of the {kernel} kernel's {tile_rows}x{TILE_COLS} tile"
        );
        assert_eq!(out.len(), n * n);
        let biased = kernel.wants_biased_a();
        let a_bytes = a.as_bytes();
        let a_row_bytes = n * kernel.a_element_bytes();
        let rows_per_task = rows_per_task(n, self.threads(), tile_rows);
        self.pool.install(|| {
            out.par_chunks_mut(rows_per_task * n)
                .enumerate()
                .for_each(|(task, block)| {
                    let first_row = task * rows_per_task;
                    let block_rows = block.len() / n;
                    // Each task lays out its own rows of A for the kernel: every layout is one of
                    // whole strips of `tile_rows` rows, so a block of rows packs on its own. Done
                    // in the task, the packing runs on every thread, and into this core's cache,
                    // instead of on one thread before any tile starts (at n = 1024 on 16 threads
                    // that serial pass was a large share of the step).
                    let prepared = kernel.prepare_a(&a_bytes[first_row * n..(first_row + block_rows) * n], n);
                    let a = prepared.as_slice();
                    // Two tile buffers: while the kernel computes one tile, the epilogue of the
                    // previous one runs in the slots the kernel offers (`between`), a few rows
                    // at a time: AMX's tile unit leaves the vector units free meanwhile.
                    let mut tiles = [[[0i32; TILE_COLS]; MAX_TILE_ROWS]; 2];
                    let mut pending: Option<(usize, usize)> = None;
                    let mut current = 0;
                    let thread = kernel.begin();
                    for panel in 0..n / TILE_COLS {
                        let col0 = panel * TILE_COLS;
                        let col_sums = b.col_sums(panel);
                        for r in (0..block_rows).step_by(tile_rows) {
                            let rows = &a[r * a_row_bytes..(r + tile_rows) * a_row_bytes];
                            let [t0, t1] = &mut tiles;
                            let (tile, previous) = if current == 0 { (t0, t1) } else { (t1, t0) };
                            let tile = &mut tile[..tile_rows];
                            let previous = &previous[..tile_rows];
                            let mut between = |slot: usize, slots: usize| {
                                if let Some((_, first)) = pending {
                                    let per_slot = tile_rows.div_ceil(slots);
                                    let from = (slot * per_slot).min(tile_rows);
                                    let to = ((slot + 1) * per_slot).min(tile_rows);
                                    if from < to {
                                        epilogue(&previous[from..to], &mut *block, first + from * n);
                                    }
                                }
                            };
                            kernel.tile(&thread, rows, n, b.panel(panel), tile, &mut between);
                            if biased {
                                tile.iter_mut().for_each(|row| epilogue::undo_bias(row, col_sums));
                            }
                            pending = Some((current, r * n + col0));
                            current ^= 1;
                        }
                    }
                    if let Some((which, first)) = pending {
                        epilogue(&tiles[which][..tile_rows], block, first);
                    }
                });
        });
    }
}

/// The register-only ceiling of `kernel`'s instructions on `threads` threads at once (0: every
/// core), in operations per second: each thread runs the kernel's multiply-accumulate on operands
/// that never touch memory, for about `seconds`. Measured for the AMX kernel (`tdpbssd` on
/// tiles of pseudo-random bytes) and the AVX2 kernel (`vpmaddwd` + `vpaddd`); None for the others
/// or when this CPU lacks the kernel. `miner bench` reports it, so that the kernels' speed can be
/// read as a share of what the hardware does.
pub fn register_peak(kernel: KernelKind, threads: usize, seconds: f64) -> Option<f64> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t,
    };
    // Rounds per second, roughly, so that the run lasts about `seconds`: four tdpbssd take some
    // 64 cycles at 3 GHz; eight vpmaddwd + vpaddd pairs ran at 0.6-0.7e9 rounds/s on a Zen 3.
    let rounds_per_second = match kernel {
        KernelKind::Amx => 5e7,
        _ => 7e8,
    };
    let iterations = (seconds * rounds_per_second) as u64;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| s.spawn(move || kernels::register_peak(kernel, iterations)))
            .collect();
        handles.into_iter().map(|h| h.join().ok().flatten()).sum()
    })
}

/// Enough tasks for rayon to balance (four per thread; one per thread for small products, where
/// each task's fixed cost, scheduling and the AMX tile configuration, would show), each a whole
/// number of tiles.
fn rows_per_task(n: usize, threads: usize, tile_rows: usize) -> usize {
    let per_thread = if n <= 512 { 1 } else { 4 };
    let tasks = (threads * per_thread).max(1);
    n.div_ceil(tasks).next_multiple_of(tile_rows).clamp(tile_rows, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_split_is_whole_tiles() {
        for n in (64..=8192).step_by(64) {
            for threads in 1..=16 {
                for tile_rows in [8, 32] {
                    let rows = rows_per_task(n, threads, tile_rows);
                    assert_eq!(rows % tile_rows, 0);
                    assert!(rows >= tile_rows && rows <= n);
                }
            }
        }
    }
}
