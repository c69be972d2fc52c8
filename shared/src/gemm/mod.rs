//! Exact int8 x int8 -> int32 matrix products on the CPU, with the chain's `mix` fused in.
//!
//! The fast path is a packed, register-tiled GEMM (8 rows x 32 columns per tile, the whole k
//! range accumulated in registers) parallelised over row blocks with rayon. Its inner product
//! uses `vpdpbusd` (AVX-512 VNNI) where the CPU has it, and a portable loop over the same packed
//! layout elsewhere. `vpdpbusd` multiplies *unsigned* by signed bytes, so A is biased to
//! `a + 128` (XOR 0x80) and the product corrected by `128 * column_sum(B)`: every intermediate
//! is an exact integer modulo 2^32 and the final value fits in i32 (|sum| <= 128*128*8192 =
//! 2^27), so the result is exact. PROTOCOL.md "Exactness" states the argument.
//!
//! [`naive`] is the plain triple loop, kept as the oracle the tests compare against.

mod kernel;
pub mod naive;
mod packed;

pub use kernel::KernelKind;
pub use packed::PackedB;

use crate::matrix::Matrix;
use crate::mix::mix;
use rayon::prelude::*;
use thiserror::Error;

/// Rows per register tile.
const TILE_ROWS: usize = 8;
/// Columns per register tile (and per packed panel of B).
const TILE_COLS: usize = 32;

#[derive(Debug, Error)]
pub enum GemmError {
    #[error("the {0} kernel needs CPU features this machine lacks")]
    KernelUnavailable(KernelKind),
    #[error("could not start the CPU thread pool: {0}")]
    ThreadPool(String),
}

/// A CPU GEMM engine: one kernel choice and one thread pool, reused for every product.
pub struct CpuGemm {
    kernel: KernelKind,
    pool: rayon::ThreadPool,
}

impl CpuGemm {
    /// `threads = 0` uses every core; `kernel = None` picks the fastest this CPU supports.
    pub fn new(threads: usize, kernel: Option<KernelKind>) -> Result<Self, GemmError> {
        let kernel = match kernel {
            Some(k) if !k.is_available() => return Err(GemmError::KernelUnavailable(k)),
            Some(k) => k,
            None => KernelKind::best_available(),
        };
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
        let mut out = vec![0i32; a.n() * a.n()];
        self.run(a, b, &mut out, |exact, dst| dst.copy_from_slice(exact));
        out
    }

    /// One chain step: `out = mix(x * b, step)` element-wise; the int32 product is never stored.
    pub fn step(&self, x: &Matrix, b: &PackedB, step: u32, out: &mut Matrix) {
        assert_eq!(out.n(), x.n(), "output matrix has the wrong size");
        self.run(x, b, out.as_mut_slice(), |exact, dst| {
            for (d, &y) in dst.iter_mut().zip(exact) {
                *d = mix(y, step);
            }
        });
    }

    /// Drives the tiles: each rayon task owns a block of whole output rows; inside it, panels of
    /// B are the outer loop so one panel (32n bytes) stays in L2 while the block's rows stream by.
    fn run<T, F>(&self, a: &Matrix, b: &PackedB, out: &mut [T], epilogue: F)
    where
        T: Send,
        F: Fn(&[i32; TILE_COLS], &mut [T]) + Sync,
    {
        let n = a.n();
        assert_eq!(b.n(), n, "A and B differ in size");
        assert!(
            n.is_multiple_of(TILE_COLS) && n.is_multiple_of(TILE_ROWS),
            "n={n} is not a multiple of 32"
        );
        assert_eq!(out.len(), n * n);
        let biased: Vec<u8> = a.as_bytes().iter().map(|v| v ^ 0x80).collect();
        let rows_per_task = rows_per_task(n, self.threads());
        let kernel = self.kernel;
        self.pool.install(|| {
            out.par_chunks_mut(rows_per_task * n)
                .enumerate()
                .for_each(|(task, block)| {
                    let first_row = task * rows_per_task;
                    let block_rows = block.len() / n;
                    let mut tile = [[0i32; TILE_COLS]; TILE_ROWS];
                    for panel in 0..n / TILE_COLS {
                        let col0 = panel * TILE_COLS;
                        let col_sums = b.col_sums(panel);
                        for r in (0..block_rows).step_by(TILE_ROWS) {
                            let rows = &biased[(first_row + r) * n..(first_row + r + TILE_ROWS) * n];
                            kernel.tile(rows, n, b.panel(panel), &mut tile);
                            for (i, acc) in tile.iter_mut().enumerate() {
                                // Undo the +128 bias: sum((a+128)*b) - 128*sum(b) = sum(a*b).
                                for (v, &s) in acc.iter_mut().zip(col_sums) {
                                    *v = v.wrapping_sub(s.wrapping_mul(128));
                                }
                                let start = (r + i) * n + col0;
                                epilogue(acc, &mut block[start..start + TILE_COLS]);
                            }
                        }
                    }
                });
        });
    }
}

/// Enough tasks for rayon to balance (four per thread), each a whole number of tiles.
fn rows_per_task(n: usize, threads: usize) -> usize {
    let tasks = (threads * 4).max(1);
    n.div_ceil(tasks).next_multiple_of(TILE_ROWS).clamp(TILE_ROWS, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_split_is_whole_tiles() {
        for n in (64..=8192).step_by(64) {
            for threads in 1..=16 {
                let rows = rows_per_task(n, threads);
                assert_eq!(rows % TILE_ROWS, 0);
                assert!(rows >= TILE_ROWS && rows <= n);
            }
        }
    }
}
