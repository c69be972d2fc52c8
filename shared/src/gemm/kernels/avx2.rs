//! AVX2 without VNNI (AMD Zen 2/3, Intel Haswell to Comet Lake): exact through 16-bit products.
//!
//! The byte instruction `vpmaddubsw` is not used: it adds two u8 x s8 products into an i16 and
//! *saturates* (2 x 255 x 127 overflows), which would make results wrong rather than slow.
//! Instead both operands are sign-extended to i16 and `vpmaddwd` adds pairs of i16 x i16
//! products into i32: each pair is at most 2 x 128 x 128 = 2^15, exact. A is signed, so there
//! is no bias to undo.
//!
//! Where the time goes: `vpmaddwd` has no accumulating form before AVX-VNNI, so every 16
//! multiply-adds cost a `vpmaddwd` and a `vpaddd`, and that pair bounds the kernel (about 150
//! GOPS per core on a Zen 3 at 3.5 GHz; `miner bench` prints what a run reached). Everything
//! else in the inner loop has to stay off the vector ALUs:
//! - A is widened to i16 once per product ([`pack_a`], O(n^2)) instead of once per tile and
//!   column group (O(n^3 / 8)), and laid out so that one k-quad of a tile's eight rows is one
//!   cache line: each row's four k come in as one 64-bit broadcast load.
//! - k is walked in blocks of [`BLOCK_QUADS`] so that the block's B (8 KiB) and A (4 KiB) stay in
//!   L1 while the eight 4-row x 8-column sub-tiles of the tile take their turns over it; the
//!   partial sums wait in a small array between blocks.

use crate::aligned::AlignedBytes;
use crate::gemm::TILE_COLS;
use std::arch::x86_64::*;

pub(super) const TILE_ROWS: usize = 8;

/// Bytes of prepared A per element of A: i16.
pub(super) const A_ELEMENT_BYTES: usize = 2;

/// k-quads per block; 64 quads of B are 8 KiB of the panel.
const BLOCK_QUADS: usize = 64;

pub(super) fn is_available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// A widened to i16 in strips of TILE_ROWS rows: strip s, k-quad q is one 64-byte line holding
/// `A[8s + r][4q + t]` at i16 index `r*4 + t`. Strip s starts at byte `s * TILE_ROWS * n * 2`.
pub(super) fn pack_a(a: &[u8], n: usize) -> AlignedBytes {
    assert!(n.is_multiple_of(4) && a.len().is_multiple_of(TILE_ROWS * n));
    let quads = n / 4;
    AlignedBytes::from_lines(a.len() / 4 / TILE_ROWS, |l| {
        let (strip, q) = (l / quads, l % quads);
        let mut line = [0u8; 64];
        for r in 0..TILE_ROWS {
            let row = &a[(strip * TILE_ROWS + r) * n + 4 * q..][..4];
            for (t, &v) in row.iter().enumerate() {
                let at = (r * 4 + t) * 2;
                line[at..at + 2].copy_from_slice(&i16::from(v as i8).to_le_bytes());
            }
        }
        line
    })
}

/// One tile, TILE_ROWS rows x 32 columns. Per k-quad a 4-row x 8-column sub-tile costs two
/// 16-byte loads of B widened to i16 (each 4 columns x 4 k), four 64-bit broadcasts of A (one
/// row's 4 k, as i16), and eight `vpmaddwd` + `vpaddd`. An i32 lane then holds half of one
/// column's k-quad (k 0-1 or 2-3); adjacent lanes are added once at the end.
///
/// # Safety
/// The CPU must have AVX2; `strip` holds one strip of [`pack_a`] (TILE_ROWS * n * 2 bytes),
/// `panel` 32n packed bytes and `out` TILE_ROWS rows.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn tile(strip: &[u8], n: usize, panel: &[u8], out: &mut [[i32; TILE_COLS]]) {
    debug_assert!(
        strip.len() == TILE_ROWS * n * A_ELEMENT_BYTES && panel.len() == TILE_COLS * n && out.len() == TILE_ROWS
    );
    let quads = n / 4;
    let (a, b) = (strip.as_ptr(), panel.as_ptr());
    // partial[r][g]: row r, columns 4g..4g+4, as two i32 lanes per column.
    let mut partial = [[_mm256_setzero_si256(); TILE_COLS / 4]; TILE_ROWS];
    for first_quad in (0..quads).step_by(BLOCK_QUADS) {
        let last_quad = (first_quad + BLOCK_QUADS).min(quads);
        for col_group in 0..TILE_COLS / 8 {
            for row_group in 0..TILE_ROWS / 4 {
                let mut acc: [[__m256i; 2]; 4] =
                    std::array::from_fn(|r| std::array::from_fn(|h| partial[row_group * 4 + r][col_group * 2 + h]));
                for q in first_quad..last_quad {
                    // SAFETY: q < n/4 and col_group < 4 keep b + q*128 + col_group*32 + 32
                    // within the panel's 32n bytes; q*64 + 64 <= 16n keeps A's reads within the
                    // strip's 16n bytes.
                    let (b0, b1) = unsafe {
                        let p = b.add(q * 128 + col_group * 32);
                        (
                            _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast())),
                            _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16).cast())),
                        )
                    };
                    for (r, acc) in acc.iter_mut().enumerate() {
                        // (a0, a1, a2, a3) of this row, four times over, against (column, k 0..3).
                        let a4 = unsafe { a.add(q * 64 + (row_group * 4 + r) * 8).cast::<i64>().read_unaligned() };
                        let a4 = _mm256_set1_epi64x(a4);
                        acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(a4, b0));
                        acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(a4, b1));
                    }
                }
                for (r, acc) in acc.into_iter().enumerate() {
                    partial[row_group * 4 + r][col_group * 2..col_group * 2 + 2].copy_from_slice(&acc);
                }
            }
        }
    }
    for (dst, row) in out.iter_mut().zip(partial) {
        for (g, dst) in dst.chunks_exact_mut(8).enumerate() {
            // hadd gives [c0 c1 c4 c5 | c2 c3 c6 c7]; the permute puts the columns in order.
            let sums = _mm256_permute4x64_epi64(_mm256_hadd_epi32(row[2 * g], row[2 * g + 1]), 0b11_01_10_00);
            // SAFETY: `dst` is 8 i32 = one 32-byte store.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), sums) };
        }
    }
}
