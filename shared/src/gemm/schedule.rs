//! How a product is cut up: rows into tasks for the thread pool, k into blocks per pass, and
//! which operand of a pass streams past L1. Pure arithmetic on sizes, decided before any tile
//! runs.

use super::TILE_COLS;
use super::kernels::Streamed;
use std::ops::Range;

/// The L1 data cache the cache hints plan for: 48 KiB on every CPU with AMX so far (Sapphire,
/// Emerald and Granite Rapids), the only kernel that takes the hints.
const L1_BYTES: usize = 48 << 10;

/// `0..n` cut into spans of `k_block` (the last may be shorter; all are multiples of 64).
pub(super) fn k_spans(n: usize, k_block: usize) -> Vec<Range<usize>> {
    assert!(k_block > 0 && k_block.is_multiple_of(64) || k_block == n);
    (0..n).step_by(k_block).map(|k0| k0..(k0 + k_block).min(n)).collect()
}

/// Which operand of a pass over one panel's block of k (`k_len` of k, for a task of `strips`
/// strips of `tile_rows` rows) to load without displacing the other from L1. Both fit: neither.
/// Otherwise, with the strips innermost in the walk, the panel's block of B (32 x k_len) is
/// re-read by the very next strip while a strip's block of A waits for the next panel: A
/// streams. A task of one strip walks the panels with the same rows of A: B streams. oneDNN's
/// AMX GEMM makes the same choice (the operand of the innermost loop loads with the T1 hint
/// once A, B and C outgrow L1).
pub(super) fn streamed_operand(strips: usize, tile_rows: usize, k_len: usize) -> Streamed {
    let (a_block, b_block) = (strips * tile_rows * k_len, TILE_COLS * k_len);
    if a_block + b_block <= L1_BYTES {
        Streamed::Neither
    } else if strips > 1 {
        Streamed::A
    } else {
        Streamed::B
    }
}

/// Enough tasks for rayon to balance (four per thread; one per thread for small products, where
/// each task's fixed cost, scheduling and the AMX tile configuration, would show), each a whole
/// number of tiles, and each, where the kernel asks it (`task_a_bytes`), small enough that its
/// rows of A (`a_row_bytes` a row) stay in L2.
pub(super) fn rows_per_task(
    n: usize,
    threads: usize,
    tile_rows: usize,
    a_row_bytes: usize,
    task_a_bytes: Option<usize>,
) -> usize {
    let per_thread = if n <= 512 { 1 } else { 4 };
    let tasks = (threads * per_thread).max(1);
    let balanced = n.div_ceil(tasks).next_multiple_of(tile_rows);
    let in_l2 = task_a_bytes.map_or(usize::MAX, |bytes| bytes / a_row_bytes.max(1) / tile_rows * tile_rows);
    balanced.min(in_l2).clamp(tile_rows, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AMX kernel's passes at the sizes and thread counts the issue measures: small products
    /// keep both operands in L1, a task of several strips streams A, a one-strip task B.
    #[test]
    fn the_operand_re_read_last_streams() {
        // As the driver walks: a task of one strip takes the whole of k in one pass.
        let amx_pass = |n: usize, threads: usize, k_block: usize| {
            let strips = rows_per_task(n, threads, 32, n, crate::gemm::KernelKind::Amx.task_a_bytes()) / 32;
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
    fn row_split_is_whole_tiles() {
        for n in (64..=8192).step_by(64) {
            for threads in 1..=16 {
                for tile_rows in [8, 32] {
                    for (element_bytes, cap) in [(1, None), (1, Some(1 << 20)), (2, Some(1 << 20))] {
                        let rows = rows_per_task(n, threads, tile_rows, n * element_bytes, cap);
                        assert_eq!(rows % tile_rows, 0);
                        assert!(rows >= tile_rows && rows <= n);
                        // A task's A fits under the cap, unless one tile's rows do not.
                        if let Some(cap) = cap {
                            assert!(rows == tile_rows || rows * n * element_bytes <= cap);
                        }
                    }
                }
            }
        }
    }
}
