//! Exact int8 x int8 -> int32 matrix products on the CPU, with the chain's `mix` fused in.
//!
//! B is packed once per chain into 32-column panels ([`PackedB`]). A kernel ([`KernelKind`])
//! computes one register tile, a few rows of A against one panel, over the whole k range or,
//! for the kernels that take k in blocks, over one block of it with the sums carried from the
//! block before. The driver here walks the tiles, parallel over blocks of whole output rows with
//! rayon, and hands each finished tile, already the exact product, to the epilogue (`mix`, or a
//! plain copy).
//!
//! How the rows and k are cut, and which operand streams past L1, is `schedule`'s; the tuning
//! settings read from the environment are `settings`'.
//!
//! Kernels, fastest first: AMX-INT8 `tdpbssd`, AVX-512 VNNI and AVX-VNNI `vpdpbusd`, AVX2
//! `vpmaddwd` on widened bytes, and a portable loop. All are exact: PROTOCOL.md "Exactness"
//! gives the argument, and `tests/gemm_oracle.rs` checks each against [`naive`].

mod epilogue;
mod kernels;
pub mod naive;
mod packed;
mod schedule;
mod scratch;
mod settings;

pub use kernels::{CACHE_HINTS_ENV, K_BLOCK_ENV, KERNEL_ENV, KernelChoice, KernelKind, UnknownKernel};
pub use packed::PackedB;

use crate::matrix::Matrix;
use kernels::{Streamed, Sums, TileOperands};
use rayon::prelude::*;
use schedule::{k_spans, rows_per_task, streamed_operand};
use scratch::ScratchPool;
use settings::{cache_hints_from_env, k_block_from_env};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Where the tasks lay out their rows of A, kept from one product to the next.
    scratch: ScratchPool,
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
            scratch: ScratchPool::default(),
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
        let whole = self.run(a, b, &mut out, &|| false, |tile, out, at| {
            let first = at.offset;
            for (i, row) in tile.iter().enumerate() {
                out[first + i * n..first + i * n + TILE_COLS].copy_from_slice(row);
            }
        });
        assert!(whole, "a product nothing stops stopped");
        out
    }

    /// One chain step: `out = mix(x * b, step)` element-wise, each element keyed by its row and
    /// column; the int32 product is never stored.
    pub fn step(&self, x: &Matrix, b: &PackedB, step: u32, out: &mut Matrix) {
        let whole = self.step_unless(x, b, step, out, &|| false);
        assert!(whole, "a step nothing stops stopped");
    }

    /// [`CpuGemm::step`], given up once `stop()` is true: each task asks before every panel of
    /// B, so a cancelled step ends within one panel's work (a step at n = 8192 takes tens of
    /// seconds on a CPU). Returns whether the step ran whole; if not, `out` is partly written
    /// and must not be used.
    #[must_use = "an unfinished step leaves `out` partly written"]
    pub fn step_unless(
        &self,
        x: &Matrix,
        b: &PackedB,
        step: u32,
        out: &mut Matrix,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> bool {
        assert_eq!(out.n(), x.n(), "output matrix has the wrong size");
        let (n, mix_tile) = (x.n(), epilogue::mix_tile());
        self.run(x, b, out.as_mut_slice(), stop, |tile, out, at| {
            mix_tile(tile, step, out, at, n)
        })
    }

    /// Drives the tiles: each rayon task owns a block of whole output rows ([`Product::task`]).
    /// `epilogue(tile, block, at)` writes a finished tile's row i at `block[at.offset + i*n..]`;
    /// `at` also says where in the whole product that row lies. Each task gives up, before a
    /// panel, once `stop()` is true; `run` returns whether every task ran whole.
    fn run<T, F>(&self, a: &Matrix, b: &PackedB, out: &mut [T], stop: &(dyn Fn() -> bool + Sync), epilogue: F) -> bool
    where
        T: Send,
        F: Fn(&[[i32; TILE_COLS]], &mut [T], TilePlace) + Sync,
    {
        let product = Product::new(self, a, b);
        assert_eq!(out.len(), product.n * product.n);
        let stopped = AtomicBool::new(false);
        self.pool.install(|| {
            out.par_chunks_mut(product.rows_per_task * product.n)
                .enumerate()
                .for_each(|(task, block)| {
                    if !product.task(task, block, stop, &epilogue) {
                        stopped.store(true, Ordering::Relaxed);
                    }
                });
        });
        !stopped.into_inner()
    }
}

/// One product `a * b` as its tasks share it: the operands, the sizes, and how k is cut.
struct Product<'p> {
    kernel: KernelKind,
    n: usize,
    tile_rows: usize,
    a_bytes: &'p [u8],
    /// Bytes of one row of A in the kernel's layout.
    a_row_bytes: usize,
    b: &'p PackedB,
    /// B's panels as the kernel reads them (widened for AVX2), `panel_bytes` each.
    b_panels: &'p [u8],
    panel_bytes: usize,
    /// k in the engine's blocks, and k whole: a task of one strip takes the latter.
    blocked_spans: Vec<Range<usize>>,
    whole_of_k: Vec<Range<usize>>,
    rows_per_task: usize,
    cache_hints: bool,
    scratch: &'p ScratchPool,
}

/// A task's own state while it walks its tiles.
struct TaskTiles {
    /// The task's first row of the whole product.
    first_row: usize,
    /// Two tile buffers: while the kernel computes one tile, the epilogue of the previous one
    /// runs in the slots the kernel offers (`between`), a few rows at a time: AMX's tile unit
    /// leaves the vector units free meanwhile.
    tiles: [SumRows; 2],
    /// Which of `tiles` the next tile goes to.
    current: usize,
    /// The finished tile whose epilogue has not run yet: which buffer, and where it goes.
    pending: Option<(usize, TilePlace)>,
    /// Each strip's sums between blocks of k (empty when k is taken in one pass).
    partial: SumRows,
}

impl<'p> Product<'p> {
    fn new(gemm: &'p CpuGemm, a: &'p Matrix, b: &'p PackedB) -> Self {
        let n = a.n();
        let kernel = gemm.kernel;
        let tile_rows = kernel.tile_rows();
        assert_eq!(b.n(), n, "A and B differ in size");
        assert!(
            n.is_multiple_of(TILE_COLS) && n.is_multiple_of(tile_rows) && n.is_multiple_of(64),
            "n={n} is not a multiple of 64 and of the {kernel} kernel's {tile_rows}x{TILE_COLS} tile"
        );
        Product {
            kernel,
            n,
            tile_rows,
            a_bytes: a.as_bytes(),
            a_row_bytes: n * kernel.a_element_bytes(),
            b,
            b_panels: match kernel.b_element_bytes() {
                1 => b.panels(),
                _ => b.widened_panels(),
            },
            panel_bytes: TILE_COLS * n * kernel.b_element_bytes(),
            blocked_spans: k_spans(n, gemm.k_block(n)),
            whole_of_k: k_spans(n, n),
            rows_per_task: rows_per_task(
                n,
                gemm.threads(),
                tile_rows,
                n * kernel.a_element_bytes(),
                kernel.task_a_bytes(),
            ),
            cache_hints: gemm.cache_hints(),
            scratch: &gemm.scratch,
        }
    }

    /// Task `task`: the output rows `block` from row `task * rows_per_task` on. Panels of B are
    /// the outer loop, so one panel (32n bytes) stays in L2 while the block's rows stream by,
    /// and blocks of k the next, so that the panel's block of k stays in L1 while the strips of
    /// rows pass over it. Returns false if `stop()` ended it before a panel.
    fn task<T, F>(&self, task: usize, block: &mut [T], stop: &(dyn Fn() -> bool + Sync), epilogue: &F) -> bool
    where
        F: Fn(&[[i32; TILE_COLS]], &mut [T], TilePlace),
    {
        let n = self.n;
        let first_row = task * self.rows_per_task;
        let block_rows = block.len() / n;
        // Each task lays out its own rows of A for the kernel: every layout is one of whole
        // strips of `tile_rows` rows, so a block of rows packs on its own. Done in the task, the
        // packing runs on every thread, and into this core's cache, instead of on one thread
        // before any tile starts (at n = 1024 on 16 threads that serial pass was a large share
        // of the step).
        let mut scratch = self.scratch.take();
        let prepared = self.kernel.prepare_a(
            &self.a_bytes[first_row * n..(first_row + block_rows) * n],
            n,
            scratch.buffer(),
        );
        // Blocking k pays when a panel's block of B serves several strips of this task from
        // L1; for a task of one strip it would only add the stores and reloads of the sums, so
        // such a task takes k in one pass.
        let k_spans: &[Range<usize>] = if block_rows > self.tile_rows {
            &self.blocked_spans
        } else {
            &self.whole_of_k
        };
        let mut state = TaskTiles {
            first_row,
            tiles: [SumRows::new(MAX_TILE_ROWS), SumRows::new(MAX_TILE_ROWS)],
            current: 0,
            pending: None,
            partial: SumRows::new(if k_spans.len() > 1 { block_rows } else { 0 }),
        };
        let thread = self.kernel.begin();
        for panel in 0..n / TILE_COLS {
            if stop() {
                return false;
            }
            for (block_of_k, k) in k_spans.iter().enumerate() {
                let pass = Pass {
                    panel,
                    k: k.clone(),
                    first: block_of_k == 0,
                    last: block_of_k + 1 == k_spans.len(),
                };
                self.pass(&thread, prepared, &pass, block, &mut state, epilogue);
            }
        }
        if let Some((which, at)) = state.pending {
            epilogue(&state.tiles[which].rows_mut()[..self.tile_rows], block, at);
        }
        true
    }

    /// One block of k over one panel, strip by strip of the task's rows `a` (in the kernel's
    /// layout). Between blocks of k each strip's sums wait in `state.partial`; after the last,
    /// a strip's tile is finished and its epilogue runs during the next tile's kernel call.
    fn pass<T, F>(
        &self,
        thread: &kernels::KernelThread,
        a: &[u8],
        pass: &Pass,
        block: &mut [T],
        state: &mut TaskTiles,
        epilogue: &F,
    ) where
        F: Fn(&[[i32; TILE_COLS]], &mut [T], TilePlace),
    {
        let (n, tile_rows) = (self.n, self.tile_rows);
        let block_rows = block.len() / n;
        let col0 = pass.panel * TILE_COLS;
        let streamed = match self.cache_hints {
            true => streamed_operand(block_rows / tile_rows, tile_rows, pass.k.len()),
            false => Streamed::Neither,
        };
        let bias_correction = self.b.bias_correction(pass.panel);
        let partial = state.partial.rows_mut();
        for r in (0..block_rows).step_by(tile_rows) {
            let rows = &a[r * self.a_row_bytes..(r + tile_rows) * self.a_row_bytes];
            let [t0, t1] = &mut state.tiles;
            let (tile, previous) = if state.current == 0 { (t0, t1) } else { (t1, t0) };
            let tile = &mut tile.rows_mut()[..tile_rows];
            let previous = &previous.rows_mut()[..tile_rows];
            let strip = r..r + tile_rows;
            let sums = match (pass.first, pass.last) {
                (true, true) => Sums::Fresh(&mut *tile),
                (true, false) => Sums::Fresh(&mut partial[strip]),
                (false, false) => Sums::Add(&mut partial[strip]),
                (false, true) => Sums::Carried {
                    carry: &partial[strip],
                    out: &mut *tile,
                },
            };
            let pending = state.pending;
            let mut between = |slot: usize, slots: usize| {
                if let Some((_, at)) = pending {
                    let rows = epilogue_rows(slot, slots, tile_rows);
                    if !rows.is_empty() {
                        let first = rows.start;
                        epilogue(&previous[rows], &mut *block, at.down(first, n));
                    }
                }
            };
            let ops = TileOperands {
                rows,
                panel: &self.b_panels[pass.panel * self.panel_bytes..][..self.panel_bytes],
                bias_correction,
                n,
                k: pass.k.clone(),
                streamed,
            };
            self.kernel.tile(thread, ops, sums, &mut between);
            // The previous tile's epilogue ran inside that call.
            state.pending = None;
            if pass.last {
                let at = TilePlace {
                    offset: r * n + col0,
                    row: state.first_row + r,
                    col: col0,
                };
                state.pending = Some((state.current, at));
                state.current ^= 1;
            }
        }
    }
}

/// The fewest rows of the previous tile's epilogue run in one of the kernel's side-work slots.
/// Spread a row or two a slot, as over the 16 k-steps of a tile at n = 1024, the calls cost more
/// than they hid: on a 2-thread AMX Xeon, chunks of 8 rows took n = 1024 from 4.50-4.61 to
/// 4.87-5.27 TOPS (four rounds, interleaved), and n = 2048 and 4096 2-3% faster.
const EPILOGUE_ROWS: usize = 8;

/// The rows of the previous tile (of `tile_rows`) whose epilogue runs in side-work slot `slot`
/// of `slots`: the first slots take [`EPILOGUE_ROWS`] or more each, the rest none, so that
/// every row runs once, whatever the number of slots.
fn epilogue_rows(slot: usize, slots: usize, tile_rows: usize) -> Range<usize> {
    let per_slot = tile_rows.div_ceil(slots).max(EPILOGUE_ROWS);
    (slot * per_slot).min(tile_rows)..((slot + 1) * per_slot).min(tile_rows)
}

/// One block of k (`k`) over one panel of B; `first` and `last` say whether sums start fresh
/// and whether the tile is finished after it.
struct Pass {
    panel: usize,
    k: Range<usize>,
    first: bool,
    last: bool,
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
/// that never touch memory ([`KernelKind::ceiling_instructions`]), for about `seconds`; None
/// for the portable kernel or when this CPU lacks the kernel. `miner bench` reports it, so that
/// the kernels' speed can be read as a share of what the hardware does.
pub fn register_peak(kernel: KernelKind, threads: usize, seconds: f64) -> Option<f64> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t,
    };
    // Rounds per second, roughly, so that the run lasts about `seconds`: four tdpbssd take some
    // 64 cycles at 3 GHz; eight vpmaddwd + vpaddd pairs ran at 0.6-0.7e9 rounds/s on a Zen 3;
    // sixteen zmm vpdpbusd at about 5e8 and twelve ymm ones at about 7e8 on a Zen 5.
    let rounds_per_second = match kernel {
        KernelKind::Amx => 5e7,
        KernelKind::Avx512Vnni => 5e8,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of a finished tile gets its epilogue exactly once, in order, for every number
    /// of slots a kernel offers (one for the vector kernels, one per k-step of the span for
    /// AMX), in chunks of at least EPILOGUE_ROWS but for the tile's last.
    #[test]
    fn every_row_of_a_tile_is_mixed_once() {
        for tile_rows in [8, 32] {
            for slots in 1..=130 {
                let chunks: Vec<_> = (0..slots)
                    .map(|slot| epilogue_rows(slot, slots, tile_rows))
                    .filter(|rows| !rows.is_empty())
                    .collect();
                let covered: Vec<usize> = chunks.iter().flat_map(|rows| rows.clone()).collect();
                assert_eq!(
                    covered,
                    (0..tile_rows).collect::<Vec<_>>(),
                    "{tile_rows} rows, {slots} slots"
                );
                // Only the last chunk may be shorter (what is left of the tile).
                let (_, rest) = chunks.split_last().unwrap();
                assert!(rest.iter().all(|rows| rows.len() >= EPILOGUE_ROWS), "{chunks:?}");
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

    /// A cancelled step ends inside itself: each task gives up at its next panel, and the
    /// caller is told the output is unfinished. Unstopped, it is the plain step.
    #[test]
    fn a_step_stops_within_itself_and_says_so() {
        use std::sync::atomic::AtomicUsize;

        let n = 256;
        let gemm = CpuGemm::new(2, None).unwrap();
        let filled = |m: usize| {
            let bytes: Vec<u8> = (0..n * n).map(|i| (i * m % 251) as u8).collect();
            Matrix::from_bytes(n, &bytes).unwrap()
        };
        let (x, b) = (filled(7), PackedB::new(&filled(13)));
        let mut whole = Matrix::zeros(n);
        gemm.step(&x, &b, 3, &mut whole);

        let asked = AtomicUsize::new(0);
        let count = || {
            asked.fetch_add(1, Ordering::Relaxed);
            false
        };
        let mut unstopped = Matrix::zeros(n);
        assert!(gemm.step_unless(&x, &b, 3, &mut unstopped, &count));
        assert_eq!(unstopped.as_bytes(), whole.as_bytes());
        let checks_in_a_step = asked.swap(0, Ordering::Relaxed);
        assert!(checks_in_a_step >= n / TILE_COLS, "{checks_in_a_step}");

        let stop_after_two = || asked.fetch_add(1, Ordering::Relaxed) >= 2;
        let mut stopped = Matrix::zeros(n);
        assert!(!gemm.step_unless(&x, &b, 3, &mut stopped, &stop_after_two));
        let kernel = gemm.kernel();
        let tasks = rows_per_task(
            n,
            gemm.threads(),
            kernel.tile_rows(),
            n * kernel.a_element_bytes(),
            kernel.task_a_bytes(),
        );
        let tasks = n.div_ceil(tasks);
        assert!(
            asked.load(Ordering::Relaxed) <= 2 + tasks,
            "the step went on after it was told to stop: {} checks",
            asked.load(Ordering::Relaxed)
        );
    }
}
