//! AVX2 without VNNI (AMD Zen 2/3/4 without AVX-512 use, Intel Haswell to Comet Lake): exact
//! through 16-bit products.
//!
//! The byte instruction `vpmaddubsw` is not used: it adds two u8 x s8 products into an i16 and
//! *saturates* (2 x 255 x 127 overflows), which would make results wrong rather than slow.
//! Instead both operands are sign-extended to i16 (`vpmovsxbw`) and `vpmaddwd` adds pairs of
//! i16 x i16 products into i32: each pair is at most 2 x 128 x 128 = 2^15, exact. A is signed,
//! so there is no bias to undo.

use crate::gemm::TILE_COLS;
use std::arch::x86_64::*;

pub(super) const TILE_ROWS: usize = 8;

pub(super) fn is_available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// A 4-row x 8-column sub-tile per pass: per k-quad, two B loads widened to i16 (4 columns x 4 k
/// each), four A quads widened and repeated across the register, eight `vpmaddwd`. Each i32 lane
/// then holds half of a column's k-quad (k 0-1 or 2-3); adjacent lanes are added at the end.
///
/// # Safety
/// The CPU must have AVX2; `rows` holds TILE_ROWS rows of n signed bytes, `panel` 32n packed
/// bytes and `out` TILE_ROWS rows.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn tile(rows: &[u8], n: usize, panel: &[u8], out: &mut [[i32; TILE_COLS]]) {
    debug_assert!(rows.len() == TILE_ROWS * n && panel.len() == TILE_COLS * n && out.len() == TILE_ROWS);
    let a = rows.as_ptr();
    let b = panel.as_ptr();
    for row_group in 0..TILE_ROWS / 4 {
        for col_group in 0..TILE_COLS / 8 {
            let mut acc = [[_mm256_setzero_si256(); 2]; 4];
            for q in 0..n / 4 {
                // SAFETY: q < n/4 and col_group < 4 keep b + q*128 + col_group*32 + 32 within
                // the panel's 32n bytes; row_group*4 + r < 8 keeps A's reads within 8n bytes.
                let (b0, b1) = unsafe {
                    let p = b.add(q * 128 + col_group * 32);
                    (
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast())),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16).cast())),
                    )
                };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let row = row_group * 4 + r;
                    let a4 = unsafe { a.add(row * n + 4 * q).cast::<i32>().read_unaligned() };
                    // (a0, a1, a2, a3) as i16, four times over, against (column c, k 0..3).
                    let a4 = _mm256_cvtepi8_epi16(_mm_set1_epi32(a4));
                    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(a4, b0));
                    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(a4, b1));
                }
            }
            for (r, acc) in acc.into_iter().enumerate() {
                // hadd gives [c0 c1 c4 c5 | c2 c3 c6 c7]; the permute puts the columns in order.
                let sums = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[0], acc[1]), 0b11_01_10_00);
                let dst = &mut out[row_group * 4 + r][col_group * 8..col_group * 8 + 8];
                // SAFETY: `dst` is 8 i32 = one 32-byte store.
                unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), sums) };
            }
        }
    }
}
