//! `vpdpbusd` on 512-bit registers (AVX-512 VNNI): 64 multiply-adds per instruction.
//!
//! `vpdpbusd` multiplies *unsigned* by signed bytes, so this kernel reads A biased by +128 and
//! the driver subtracts `128 * column_sum(B)` afterwards (PROTOCOL.md "Exactness").

use crate::gemm::TILE_COLS;
use std::arch::x86_64::*;

pub(super) const TILE_ROWS: usize = 8;

pub(super) fn is_available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// Sixteen accumulators (8 rows x 2 registers of 16 columns) live in registers for the whole
/// k loop; each k-quad costs two loads of B, eight 4-byte broadcasts of A and 16 `vpdpbusd`.
///
/// # Safety
/// The CPU must have AVX-512F/BW/VNNI; `rows` holds TILE_ROWS rows of n biased bytes, `panel`
/// 32n packed bytes and `out` TILE_ROWS rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile(rows: &[u8], n: usize, panel: &[u8], out: &mut [[i32; TILE_COLS]]) {
    debug_assert!(rows.len() == TILE_ROWS * n && panel.len() == TILE_COLS * n && out.len() == TILE_ROWS);
    let mut acc = [[_mm512_setzero_si512(); 2]; TILE_ROWS];
    let a = rows.as_ptr();
    let b = panel.as_ptr();
    for q in 0..n / 4 {
        // SAFETY (all loads): q < n/4, so b + q*128 + 128 <= b + 32n = panel's end, and
        // a + r*n + 4q + 4 <= a + 8n = rows' end.
        let (b0, b1) = unsafe {
            (
                _mm512_loadu_si512(b.add(q * 128).cast()),
                _mm512_loadu_si512(b.add(q * 128 + 64).cast()),
            )
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let a4 = unsafe { a.add(r * n + 4 * q).cast::<i32>().read_unaligned() };
            let a4 = _mm512_set1_epi32(a4);
            acc[0] = _mm512_dpbusd_epi32(acc[0], a4, b0);
            acc[1] = _mm512_dpbusd_epi32(acc[1], a4, b1);
        }
    }
    for (dst, acc) in out.iter_mut().zip(acc) {
        // SAFETY: each row of `out` is 32 i32 = two 64-byte stores.
        unsafe {
            _mm512_storeu_si512(dst.as_mut_ptr().cast(), acc[0]);
            _mm512_storeu_si512(dst.as_mut_ptr().add(16).cast(), acc[1]);
        }
    }
}
