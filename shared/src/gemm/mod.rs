//! Exact int8 x int8 -> int32 matrix products on the CPU, with the chain's `mix` fused in.
//!
//! B is packed once per chain into 32-column panels ([`PackedB`]). A kernel ([`KernelKind`])
//! computes one register tile, a few rows of A against one panel, over the whole k range or,
//! for the kernels that take k in blocks, over one block of it with the sums carried from the
//! block before. The driver here walks the tiles, parallel over blocks of whole output rows with
//! rayon, and hands each finished row to the epilogue (bias correction, then `mix` or a plain
//! copy).
//!
//! Kernels, fastest first: AMX-INT8 `tdpbssd`, AVX-512 VNNI and AVX-VNNI `vpdpbusd`, AVX2
//! `vpmaddwd` on widened bytes, and a portable loop. All are exact: PROTOCOL.md "Exactness"
//! gives the argument, and `tests/gemm_oracle.rs` checks each against [`naive`].

mod epilogue;
mod kernels;
pub mod naive;
mod packed;

pub use kernels::{CACHE_HINTS_ENV, K_BLOCK_ENV, KERNEL_ENV, KernelChoice, KernelKind, UnknownKernel};
pub use packed::PackedB;

use crate::matrix::Matrix;
use kernels::{Streamed, Sums, TileOperands};
use rayon::prelude::*;
use std::ops::Range;
use thiserror::Error;

/// Columns per register tile (and per packed panel of B).
const TILE_COLS: usize = 32;
/// The most rows any kernel's tile has (AMX's).
const MAX_TILE_ROWS: usize = 32;
/// The L1 data cache the cache hints plan for: 48 KiB on every CPU with AMX so far (Sapphire,
/// Emerald and Granite Rapids), the only kernel that takes the hints.
const L1_BYTES: usize = 48 << 10;

#[derive(Debug, Error)]
pub enum GemmError {
    #[error("the {kernel} CPU kernel is not available on this machine: it {reason}")]
    KernelUnavailable { kernel: KernelKind, reason: &'static str },
    #[error("{KERNEL_ENV}: {0}")]
    UnknownKernel(#[from] UnknownKernel),
    #[error("could not start the CPU thread pool: {0}")]
    ThreadPool(String),
    #[error("{K_BLOCK_ENV}={given:?}: the k block is a positive multiple of 64, or \"auto\"")]
    BadKBlock { given: String },
    #[error("{CACHE_HINTS_ENV}={given:?}: the cache hints are \"auto\" (on) or \"off\"")]
    BadCacheHints { given: String },
}

/// A CPU GEMM engine: one kernel choice and one thread pool, reused for every product.
pub struct CpuGemm {
    kernel: KernelKind,
    pool: rayon::ThreadPool,
    /// How much of k one pass takes (a multiple of 64), for the kernels that take k in blocks;
    /// None: the kernel's default.
    k_block: Option<usize>,
    /// Whether the tile calls say which operand streams ([`Streamed`]); off only to measure
    /// what the hints buy.
    cache_hints: bool,
}

impl CpuGemm {
    /// `threads = 0` uses every core. `kernel = None` takes the kernel named by
    /// [`KERNEL_ENV`] if set, else the fastest this CPU supports; `Some(k)` takes exactly k.
    /// The k block is [`K_BLOCK_ENV`]'s if set, else the kernel's default; the cache hints are
    /// on unless [`CACHE_HINTS_ENV`] says "off".
    pub fn new(threads: usize, kernel: Option<KernelKind>) -> Result<Self, GemmError> {
        let kernel = match kernel {
            Some(k) => k,
            None => KernelKind::from_env()?.unwrap_or_else(KernelKind::best_available),
        };
        if let Some(reason) = kernel.unavailable_reason() {
            return Err(GemmError::KernelUnavailable { kernel, reason });
        }
        let k_block = k_block_from_env()?;
        let cache_hints = cache_hints_from_env()?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("cpu-gemm-{i}"))
            .build()
            .map_err(|e| GemmError::ThreadPool(e.to_string()))?;
        Ok(CpuGemm {
            kernel,
            pool,
            k_block,
            cache_hints,
        })
    }

    /// The same engine taking `k_block` of k per pass (rounded up to a multiple of 64; None:
    /// the kernel's default), for the kernels that take k in blocks. The result is the same
    /// for every block size; tests use small blocks to walk many of them.
    pub fn with_k_block(mut self, k_block: Option<usize>) -> Self {
        // Past 2^40 every n is one block anyway; the cap keeps the rounding from overflowing.
        self.k_block = k_block.map(|k| k.clamp(1, 1 << 40).next_multiple_of(64));
        self
    }

    /// How much of k one pass over a tile takes at size n.
    pub fn k_block(&self, n: usize) -> usize {
        if !self.kernel.takes_k_blocks() {
            return n;
        }
        self.k_block.or(self.kernel.default_k_block()).map_or(n, |k| k.min(n))
    }

    pub fn kernel(&self) -> KernelKind {
        self.kernel
    }

    /// Whether this engine's kernel gets cache hints: on by default for the kernels that take
    /// them (AMX), off when [`CACHE_HINTS_ENV`] says so.
    pub fn cache_hints(&self) -> bool {
        self.cache_hints && self.kernel.takes_cache_hints()
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `f` inside this engine's thread pool, so that parallel work around the GEMMs (several
    /// small chains at once) shares the same threads instead of oversubscribing the cores.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// The exact product `a * b` as int32, row-major. n is a multiple of 64, as every
    /// challenge's is.
    pub fn product(&self, a: &Matrix, b: &PackedB) -> Vec<i32> {
        let n = a.n();
        let mut out = vec![0i32; n * n];
        self.run(a, b, &mut out, |tile, out, at| {
            let first = at.offset;
            for (i, row) in tile.iter().enumerate() {
                out[first + i * n..first + i * n + TILE_COLS].copy_from_slice(row);
            }
        });
        out
    }

    /// One chain step: `out = mix(x * b, step)` element-wise, each element keyed by its row and
    /// column; the int32 product is never stored.
    pub fn step(&self, x: &Matrix, b: &PackedB, step: u32, out: &mut Matrix) {
        assert_eq!(out.n(), x.n(), "output matrix has the wrong size");
        let (n, mix_tile) = (x.n(), epilogue::mix_tile());
        self.run(x, b, out.as_mut_slice(), |tile, out, at| {
            mix_tile(tile, step, out, at, n)
        });
    }

    /// Drives the tiles: each rayon task owns a block of whole output rows; inside it, panels of
    /// B are the outer loop so one panel (32n bytes) stays in L2 while the block's rows stream
    /// by, and blocks of k the next, so that the panel's block of k stays in L1 while the
    /// strips of rows pass over it. Between blocks of k each strip's sums wait in `partial`.
    /// `epilogue(tile, block, at)` writes a finished tile's row i at `block[at.offset + i*n..]`;
    /// `at` also says where in the whole product that row lies.
    fn run<T, F>(&self, a: &Matrix, b: &PackedB, out: &mut [T], epilogue: F)
    where
        T: Send,
        F: Fn(&[[i32; TILE_COLS]], &mut [T], TilePlace) + Sync,
    {
        let n = a.n();
        let kernel = self.kernel;
        let tile_rows = kernel.tile_rows();
        assert_eq!(b.n(), n, "A and B differ in size");
        assert!(
            n.is_multiple_of(TILE_COLS) && n.is_multiple_of(tile_rows) && n.is_multiple_of(64),
            "n={n} is not a multiple of 64 and of the {kernel} kernel's {tile_rows}x{TILE_COLS} tile"
        );
        assert_eq!(out.len(), n * n);
        let blocked_spans = k_spans(n, self.k_block(n));
        let whole_of_k = k_spans(n, n);
        let biased = kernel.wants_biased_a();
        let a_bytes = a.as_bytes();
        let a_row_bytes = n * kernel.a_element_bytes();
        let rows_per_task = rows_per_task(n, self.threads(), tile_rows);
        let cache_hints = self.cache_hints();
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
                    let mut tiles = [SumRows::new(MAX_TILE_ROWS), SumRows::new(MAX_TILE_ROWS)];
                    // Blocking k pays when a panel's block of B serves several strips of this
                    // task from L1; for a task of one strip it would only add the stores and
                    // reloads of the sums, so such a task takes k in one pass.
                    let k_spans: &[Range<usize>] = if block_rows > tile_rows {
                        &blocked_spans
                    } else {
                        &whole_of_k
                    };
                    let mut partial = SumRows::new(if k_spans.len() > 1 { block_rows } else { 0 });
                    let partial = partial.rows_mut();
                    let mut pending: Option<(usize, TilePlace)> = None;
                    let mut current = 0;
                    let thread = kernel.begin();
                    for panel in 0..n / TILE_COLS {
                        let col0 = panel * TILE_COLS;
                        let col_sums = b.col_sums(panel);
                        for (block_of_k, k) in k_spans.iter().enumerate() {
                            let (first_pass, last_pass) = (block_of_k == 0, block_of_k + 1 == k_spans.len());
                            let streamed = match cache_hints {
                                true => streamed_operand(block_rows / tile_rows, tile_rows, k.len()),
                                false => Streamed::Neither,
                            };
                            for r in (0..block_rows).step_by(tile_rows) {
                                let rows = &a[r * a_row_bytes..(r + tile_rows) * a_row_bytes];
                                let [t0, t1] = &mut tiles;
                                let (tile, previous) = if current == 0 { (t0, t1) } else { (t1, t0) };
                                let tile = &mut tile.rows_mut()[..tile_rows];
                                let previous = &previous.rows_mut()[..tile_rows];
                                let strip = r..r + tile_rows;
                                let sums = match (first_pass, last_pass) {
                                    (true, true) => Sums::Fresh(&mut *tile),
                                    (true, false) => Sums::Fresh(&mut partial[strip]),
                                    (false, false) => Sums::Add(&mut partial[strip]),
                                    (false, true) => Sums::Carried {
                                        carry: &partial[strip],
                                        out: &mut *tile,
                                    },
                                };
                                let mut between = |slot: usize, slots: usize| {
                                    if let Some((_, at)) = pending {
                                        let per_slot = tile_rows.div_ceil(slots);
                                        let from = (slot * per_slot).min(tile_rows);
                                        let to = ((slot + 1) * per_slot).min(tile_rows);
                                        if from < to {
                                            epilogue(&previous[from..to], &mut *block, at.down(from, n));
                                        }
                                    }
                                };
                                let ops = TileOperands {
                                    rows,
                                    panel: b.panel(panel),
                                    n,
                                    k: k.clone(),
                                    streamed,
                                };
                                kernel.tile(&thread, ops, sums, &mut between);
                                // The previous tile's epilogue ran inside that call.
                                pending = None;
                                if last_pass {
                                    if biased {
                                        tile.iter_mut().for_each(|row| epilogue::undo_bias(row, col_sums));
                                    }
                                    let at = TilePlace {
                                        offset: r * n + col0,
                                        row: first_row + r,
                                        col: col0,
                                    };
                                    pending = Some((current, at));
                                    current ^= 1;
                                }
                            }
                        }
                    }
                    if let Some((which, at)) = pending {
                        epilogue(&tiles[which].rows_mut()[..tile_rows], block, at);
                    }
                });
        });
    }
}

/// Which operand of a pass over one panel's block of k (`k_len` of k, for a task of `strips`
/// strips of `tile_rows` rows) to load without displacing the other from L1. Both fit: neither.
/// Otherwise, with the strips innermost in the walk, the panel's block of B (32 x k_len) is
/// re-read by the very next strip while a strip's block of A waits for the next panel: A
/// streams. A task of one strip walks the panels with the same rows of A: B streams. oneDNN's
/// AMX GEMM makes the same choice (the operand of the innermost loop loads with the T1 hint
/// once A, B and C outgrow L1).
fn streamed_operand(strips: usize, tile_rows: usize, k_len: usize) -> Streamed {
    let (a_block, b_block) = (strips * tile_rows * k_len, TILE_COLS * k_len);
    if a_block + b_block <= L1_BYTES {
        Streamed::Neither
    } else if strips > 1 {
        Streamed::A
    } else {
        Streamed::B
    }
}

/// [`CACHE_HINTS_ENV`]: on unless it says "off".
fn cache_hints_from_env() -> Result<bool, GemmError> {
    match std::env::var(CACHE_HINTS_ENV) {
        Ok(given) => parse_cache_hints(&given),
        Err(std::env::VarError::NotPresent) => Ok(true),
        Err(std::env::VarError::NotUnicode(given)) => Err(GemmError::BadCacheHints {
            given: given.to_string_lossy().into_owned(),
        }),
    }
}

fn parse_cache_hints(given: &str) -> Result<bool, GemmError> {
    match given.trim().to_ascii_lowercase().as_str() {
        "" | "auto" | "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(GemmError::BadCacheHints {
            given: given.to_string(),
        }),
    }
}

/// Where a finished tile (or a run of its rows) goes: `offset` into the task's block of output
/// rows, and the row and column of the whole product it starts at (which `mix` is keyed by).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TilePlace {
    offset: usize,
    row: usize,
    col: usize,
}

impl TilePlace {
    /// The same tile from its row `rows` on, in rows of `n` elements.
    fn down(self, rows: usize, n: usize) -> Self {
        TilePlace {
            offset: self.offset + rows * n,
            row: self.row + rows,
            col: self.col,
        }
    }
}

/// `0..n` cut into spans of `k_block` (the last may be shorter; all are multiples of 64).
fn k_spans(n: usize, k_block: usize) -> Vec<Range<usize>> {
    assert!(k_block > 0 && k_block.is_multiple_of(64) || k_block == n);
    (0..n).step_by(k_block).map(|k0| k0..(k0 + k_block).min(n)).collect()
}

/// [`K_BLOCK_ENV`]: None when unset, empty or "auto".
fn k_block_from_env() -> Result<Option<usize>, GemmError> {
    match std::env::var(K_BLOCK_ENV) {
        Ok(given) => parse_k_block(&given),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(given)) => Err(GemmError::BadKBlock {
            given: given.to_string_lossy().into_owned(),
        }),
    }
}

fn parse_k_block(given: &str) -> Result<Option<usize>, GemmError> {
    let value = given.trim();
    if value.is_empty() || value.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match value.parse::<usize>() {
        Ok(k) if k > 0 && k.is_multiple_of(64) => Ok(Some(k)),
        _ => Err(GemmError::BadKBlock {
            given: given.to_string(),
        }),
    }
}

/// One row of a tile's int32 sums, on its own cache line pair: the AMX kernel loads and stores
/// tile rows of 64 bytes, and a row split across two lines costs two.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct SumRow([i32; TILE_COLS]);

/// Rows of sums, cache-line aligned.
struct SumRows(Vec<SumRow>);

impl SumRows {
    fn new(rows: usize) -> Self {
        SumRows(vec![SumRow([0; TILE_COLS]); rows])
    }

    fn rows_mut(&mut self) -> &mut [[i32; TILE_COLS]] {
        // SAFETY: `SumRow` is `repr(C)` around one `[i32; 32]` of 128 bytes, a multiple of its
        // alignment, so there is no padding and a slice of them is a slice of those arrays.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), self.0.len()) }
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
    fn k_block_setting_takes_multiples_of_64_or_auto() {
        assert_eq!(parse_k_block("auto").unwrap(), None);
        assert_eq!(parse_k_block(" ").unwrap(), None);
        assert_eq!(parse_k_block(" 512 ").unwrap(), Some(512));
        for bad in ["0", "100", "-64", "1k"] {
            let err = parse_k_block(bad).unwrap_err().to_string();
            assert!(
                err.contains(K_BLOCK_ENV) && err.contains(bad) && err.contains("multiple of 64"),
                "{err}"
            );
        }
    }

    #[test]
    fn cache_hint_setting_is_auto_on_or_off() {
        for on in ["", " auto", "ON", "on "] {
            assert!(parse_cache_hints(on).unwrap(), "{on:?}");
        }
        assert!(!parse_cache_hints("Off").unwrap());
        let err = parse_cache_hints("nta").unwrap_err().to_string();
        assert!(
            err.contains(CACHE_HINTS_ENV) && err.contains("nta") && err.contains("off"),
            "{err}"
        );
    }

    /// The AMX kernel's passes at the sizes and thread counts the issue measures: small products
    /// keep both operands in L1, a task of several strips streams A, a one-strip task B.
    #[test]
    fn the_operand_re_read_last_streams() {
        // As the driver walks: a task of one strip takes the whole of k in one pass.
        let amx_pass = |n: usize, threads: usize, k_block: usize| {
            let strips = rows_per_task(n, threads, 32) / 32;
            streamed_operand(strips, 32, if strips == 1 { n } else { k_block.min(n) })
        };
        // n = 256 on 2 threads: 128 rows x 256 of A (32 KiB) and 8 KiB of B fit in 48 KiB.
        assert_eq!(amx_pass(256, 2, 1024), Streamed::Neither);
        // n = 1024 and up on 2 threads: several strips per task, a 32 KiB block of B to keep.
        for n in [1024, 2048, 4096, 8192] {
            assert_eq!(amx_pass(n, 2, 1024), Streamed::A, "n = {n}");
        }
        // 16 threads at n = 1024 and 2048: one strip per task, whose A serves every panel.
        assert_eq!(amx_pass(1024, 16, 1024), Streamed::B);
        assert_eq!(amx_pass(2048, 16, 1024), Streamed::B);
        // One strip with a small block of k fits: nothing to choose.
        assert_eq!(streamed_operand(1, 32, 512), Streamed::Neither);
    }

    #[test]
    fn k_spans_cover_k_once_in_order() {
        for n in (64..=2048).step_by(64) {
            for k_block in [64, 192, 1024, n] {
                let spans = k_spans(n, k_block);
                assert_eq!(spans.first().unwrap().start, 0);
                assert_eq!(spans.last().unwrap().end, n);
                assert!(spans.windows(2).all(|w| w[0].end == w[1].start));
                assert!(
                    spans
                        .iter()
                        .all(|s| s.len() <= k_block && s.len().is_multiple_of(64) && !s.is_empty())
                );
            }
        }
    }

    #[test]
    fn only_the_blocking_kernels_block_k() {
        let portable = CpuGemm::new(1, Some(KernelKind::Portable)).unwrap().with_k_block(None);
        assert_eq!(
            portable.k_block(2048),
            2048,
            "the portable kernel's default is the whole of k"
        );
        let portable = portable.with_k_block(Some(100));
        assert_eq!(portable.k_block(2048), 128, "rounded up to a multiple of 64");
        assert_eq!(portable.k_block(64), 64);
        let portable = portable.with_k_block(Some(usize::MAX));
        assert_eq!(
            portable.k_block(8192),
            8192,
            "a huge block is one pass, not an overflow"
        );
        for kernel in KernelKind::ALL
            .into_iter()
            .filter(|k| k.is_available() && !k.takes_k_blocks())
        {
            let gemm = CpuGemm::new(1, Some(kernel)).unwrap().with_k_block(Some(64));
            assert_eq!(gemm.k_block(1024), 1024, "{kernel}");
        }
    }

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
