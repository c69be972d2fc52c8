//! `vpdpbusd` on 256-bit registers (AVX-VNNI, the VEX encoding): for CPUs with VNNI but without
//! AVX-512 (Intel Alder Lake and later clients, AMD Zen 5 clients, Sierra Forest). Biased A, as
//! in the AVX-512 kernel.

use crate::gemm::TILE_COLS;
use std::arch::x86_64::*;

pub(super) const TILE_ROWS: usize = 8;

pub(super) fn is_available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("avxvnni")
}

/// Sixteen 256-bit registers allow a 4-row x 16-column sub-tile (8 accumulators, 2 of B, one
/// broadcast); the 8x32 tile is four of them, each over the whole k range.
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI; lengths as in the AVX-512 kernel.
#[target_feature(enable = "avx2,avxvnni")]
pub(super) unsafe fn tile(rows: &[u8], n: usize, panel: &[u8], out: &mut [[i32; TILE_COLS]]) {
    debug_assert!(rows.len() == TILE_ROWS * n && panel.len() == TILE_COLS * n && out.len() == TILE_ROWS);
    let a = rows.as_ptr();
    let b = panel.as_ptr();
    for row_group in 0..TILE_ROWS / 4 {
        for col_group in 0..TILE_COLS / 16 {
            let mut acc = [[_mm256_setzero_si256(); 2]; 4];
            for q in 0..n / 4 {
                // SAFETY: q < n/4 and col_group < 2 keep b + q*128 + col_group*64 + 64 within
                // the panel's 32n bytes; row_group*4 + r < 8 keeps A's reads within 8n bytes.
                let (b0, b1) = unsafe {
                    let p = b.add(q * 128 + col_group * 64);
                    (_mm256_loadu_si256(p.cast()), _mm256_loadu_si256(p.add(32).cast()))
                };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let row = row_group * 4 + r;
                    let a4 = unsafe { a.add(row * n + 4 * q).cast::<i32>().read_unaligned() };
                    let a4 = _mm256_set1_epi32(a4);
                    acc[0] = _mm256_dpbusd_avx_epi32(acc[0], a4, b0);
                    acc[1] = _mm256_dpbusd_avx_epi32(acc[1], a4, b1);
                }
            }
            for (r, acc) in acc.into_iter().enumerate() {
                let dst = &mut out[row_group * 4 + r][col_group * 16..col_group * 16 + 16];
                // SAFETY: `dst` is 16 i32 = two 32-byte stores.
                unsafe {
                    _mm256_storeu_si256(dst.as_mut_ptr().cast(), acc[0]);
                    _mm256_storeu_si256(dst.as_mut_ptr().add(8).cast(), acc[1]);
                }
            }
        }
    }
}
