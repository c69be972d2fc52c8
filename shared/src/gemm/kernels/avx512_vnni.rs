//! `vpdpbusd` on 512-bit registers (AVX-512 VNNI): 64 multiply-adds per instruction.
//!
//! `vpdpbusd` multiplies *unsigned* by signed bytes, so this kernel reads A biased by +128 and
//! starts its sums at `-128 * column_sum(B)`, which makes the tile exact (PROTOCOL.md
//! "Exactness").

use super::VnniStart;
use crate::gemm::TILE_COLS;
use std::arch::x86_64::*;
use std::ops::Range;

pub(super) const TILE_ROWS: usize = super::vnni_pack::STRIP_ROWS;

pub(super) fn is_available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// Sixteen accumulators (8 rows x 2 registers of 16 columns) live in registers for the k span;
/// each k-quad costs two loads of B, eight 4-byte broadcasts of A and 16 `vpdpbusd`. The
/// accumulators start at `bias_correction` on the first block rather than zero, so the bias
/// costs nothing after the loop.
///
/// # Safety
/// The CPU must have AVX-512F/BW/VNNI; `rows` holds one strip of TILE_ROWS rows of n biased
/// bytes in `vnni_pack`'s layout, `panel`
/// 32n packed bytes, `out` (and a carry) TILE_ROWS rows, and `k` whole quads within `0..n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile(
    rows: &[u8],
    n: usize,
    panel: &[u8],
    k: Range<usize>,
    start: VnniStart<'_>,
    out: &mut [[i32; TILE_COLS]],
) {
    assert!(rows.len() == TILE_ROWS * n && panel.len() == TILE_COLS * n && out.len() == TILE_ROWS);
    assert!(k.start.is_multiple_of(4) && k.end.is_multiple_of(4) && k.end <= n);
    // SAFETY: each row is 32 i32 = two 64-byte loads.
    let load = |row: &[i32; TILE_COLS]| unsafe {
        [
            _mm512_loadu_si512(row.as_ptr().cast()),
            _mm512_loadu_si512(row.as_ptr().add(16).cast()),
        ]
    };
    let mut acc = match start {
        VnniStart::Bias(bias_correction) => [load(bias_correction); TILE_ROWS],
        VnniStart::Out => std::array::from_fn(|r| load(&out[r])),
        VnniStart::Carry(carry) => {
            assert_eq!(carry.len(), TILE_ROWS);
            std::array::from_fn(|r| load(&carry[r]))
        }
    };
    let a = rows.as_ptr();
    let b = panel.as_ptr();
    for q in k.start / 4..k.end / 4 {
        // SAFETY (all loads): q < n/4, so b + q*128 + 128 <= b + 32n = panel's end, and
        // a + q*32 + r*4 + 4 <= a + 8n = the strip's end.
        let (b0, b1) = unsafe {
            (
                _mm512_loadu_si512(b.add(q * 128).cast()),
                _mm512_loadu_si512(b.add(q * 128 + 64).cast()),
            )
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let a4 = unsafe { a.add(q * 32 + r * 4).cast::<i32>().read_unaligned() };
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

/// What this thread reaches on `vpdpbusd zmm` alone: `iterations` rounds of 16 independent
/// `vpdpbusd` on operands that never leave the registers (pseudo-random bytes, as real
/// matrices are), as operations (2 per multiply-add) per second; None without the kernel's
/// features. The ceiling the kernel is measured against.
pub(super) fn register_peak(iterations: u64) -> Option<f64> {
    // SAFETY: the features were detected first; the loop reads the 128 bytes it is given.
    is_available().then(|| {
        super::time_ceiling(iterations, 16.0 * 64.0 * 2.0, |operands, rounds| unsafe {
            register_loop(operands, rounds)
        })
    })
}

/// # Safety
/// The CPU must have AVX-512F/BW/VNNI; `iterations` must not be 0 (`dec` would wrap).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn register_loop(operands: &[u8; 128], iterations: u64) {
    // SAFETY (caller): the features are present; the two loads read the 128 bytes of
    // `operands`, and the loop touches no memory.
    unsafe {
        std::arch::asm!(
            "vmovdqu64 zmm30, [{p}]",
            "vmovdqu64 zmm31, [{p} + 64]",
            "2:",
            "vpdpbusd zmm0, zmm30, zmm31",
            "vpdpbusd zmm1, zmm31, zmm30",
            "vpdpbusd zmm2, zmm30, zmm31",
            "vpdpbusd zmm3, zmm31, zmm30",
            "vpdpbusd zmm4, zmm30, zmm31",
            "vpdpbusd zmm5, zmm31, zmm30",
            "vpdpbusd zmm6, zmm30, zmm31",
            "vpdpbusd zmm7, zmm31, zmm30",
            "vpdpbusd zmm8, zmm30, zmm31",
            "vpdpbusd zmm9, zmm31, zmm30",
            "vpdpbusd zmm10, zmm30, zmm31",
            "vpdpbusd zmm11, zmm31, zmm30",
            "vpdpbusd zmm12, zmm30, zmm31",
            "vpdpbusd zmm13, zmm31, zmm30",
            "vpdpbusd zmm14, zmm30, zmm31",
            "vpdpbusd zmm15, zmm31, zmm30",
            "dec {i}",
            "jnz 2b",
            p = in(reg) operands.as_ptr(),
            i = inout(reg) iterations => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
            out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
            out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
            out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
            out("zmm30") _, out("zmm31") _,
            options(nostack, readonly),
        );
    }
}
