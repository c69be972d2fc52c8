//! `vpdpbusd` on 256-bit registers (AVX-VNNI, the VEX encoding): for CPUs with VNNI but without
//! AVX-512 (Intel Alder Lake and later clients, Sierra Forest). Biased A, and sums that start at
//! the bias correction, as in the AVX-512 kernel.

use super::VnniStart;
use crate::gemm::TILE_COLS;
use std::arch::x86_64::*;
use std::ops::Range;

pub(super) const TILE_ROWS: usize = super::vnni_pack::STRIP_ROWS;

pub(super) fn is_available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("avxvnni")
}

/// Sixteen 256-bit registers allow a 4-row x 16-column sub-tile (8 accumulators, 2 of B, one
/// broadcast); the 8x32 tile is four of them, each over the k span.
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI; lengths and `k` as in the AVX-512 kernel.
#[target_feature(enable = "avx2,avxvnni")]
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
    if let VnniStart::Carry(carry) = start {
        assert_eq!(carry.len(), TILE_ROWS);
    }
    let a = rows.as_ptr();
    let b = panel.as_ptr();
    for row_group in 0..TILE_ROWS / 4 {
        for col_group in 0..TILE_COLS / 16 {
            // SAFETY: AVX2 and AVX-VNNI are present (this function's own contract); the groups
            // are within the tile, and the lengths are as `tile` was given them.
            unsafe { sub_tile(a, b, k.clone(), &start, (row_group, col_group), out) };
        }
    }
}

/// One 4-row x 16-column sub-tile over the k span: sums that start where `start` says, the
/// `vpdpbusd` of every k-quad, then stored to `out`.
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI; `a`, `b`, `k`, `start` and `out` as [`tile`] has
/// them (A in `vnni_pack`'s strip), `row_group < TILE_ROWS / 4` and `col_group < TILE_COLS / 16`.
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn sub_tile(
    a: *const u8,
    b: *const u8,
    k: Range<usize>,
    start: &VnniStart<'_>,
    (row_group, col_group): (usize, usize),
    out: &mut [[i32; TILE_COLS]],
) {
    // SAFETY: col_group < 2, so the two 8-lane loads stay within a row's 32 i32.
    let load = |row: &[i32; TILE_COLS]| unsafe {
        let c = row.as_ptr().add(col_group * 16);
        [_mm256_loadu_si256(c.cast()), _mm256_loadu_si256(c.add(8).cast())]
    };
    let mut acc: [[__m256i; 2]; 4] = match start {
        VnniStart::Bias(bias_correction) => [load(bias_correction); 4],
        VnniStart::Out => std::array::from_fn(|r| load(&out[row_group * 4 + r])),
        VnniStart::Carry(carry) => std::array::from_fn(|r| load(&carry[row_group * 4 + r])),
    };
    for q in k.start / 4..k.end / 4 {
        // SAFETY: q < n/4 and col_group < 2 keep b + q*128 + col_group*64 + 64 within the
        // panel's 32n bytes; row_group*4 + r < 8 keeps A's reads within 8n bytes.
        let (b0, b1) = unsafe {
            let p = b.add(q * 128 + col_group * 64);
            (_mm256_loadu_si256(p.cast()), _mm256_loadu_si256(p.add(32).cast()))
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let row = row_group * 4 + r;
            // SAFETY: within the strip's 8n bytes, as said above.
            let a4 = unsafe { a.add(q * 32 + row * 4).cast::<i32>().read_unaligned() };
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

/// What this thread reaches on the VEX `vpdpbusd ymm` alone: `iterations` rounds of 12
/// independent `vpdpbusd` on operands that never leave the registers, as operations per
/// second; None without AVX-VNNI. The ceiling the kernel is measured against.
pub(super) fn register_peak(iterations: u64) -> Option<f64> {
    // SAFETY: the features were detected first; the loop reads the 128 bytes it is given.
    is_available().then(|| {
        super::time_ceiling(iterations, 12.0 * 32.0 * 2.0, |operands, rounds| unsafe {
            register_loop(operands, rounds)
        })
    })
}

/// # Safety
/// The CPU must have AVX2 and AVX-VNNI; `iterations` must not be 0 (`dec` would wrap).
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn register_loop(operands: &[u8; 128], iterations: u64) {
    // SAFETY (caller): the features are present; the two loads read 64 of the 128 bytes of
    // `operands`, and the loop touches no memory. `{vex}` asks for the AVX-VNNI encoding (the
    // EVEX form would need AVX-512 VL).
    unsafe {
        std::arch::asm!(
            "vmovdqu ymm14, [{p}]",
            "vmovdqu ymm15, [{p} + 64]",
            "2:",
            "{{vex}} vpdpbusd ymm0, ymm14, ymm15",
            "{{vex}} vpdpbusd ymm1, ymm15, ymm14",
            "{{vex}} vpdpbusd ymm2, ymm14, ymm15",
            "{{vex}} vpdpbusd ymm3, ymm15, ymm14",
            "{{vex}} vpdpbusd ymm4, ymm14, ymm15",
            "{{vex}} vpdpbusd ymm5, ymm15, ymm14",
            "{{vex}} vpdpbusd ymm6, ymm14, ymm15",
            "{{vex}} vpdpbusd ymm7, ymm15, ymm14",
            "{{vex}} vpdpbusd ymm8, ymm14, ymm15",
            "{{vex}} vpdpbusd ymm9, ymm15, ymm14",
            "{{vex}} vpdpbusd ymm10, ymm14, ymm15",
            "{{vex}} vpdpbusd ymm11, ymm15, ymm14",
            "dec {i}",
            "jnz 2b",
            p = in(reg) operands.as_ptr(),
            i = inout(reg) iterations => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
            out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
            out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm14") _, out("ymm15") _,
            options(nostack, readonly),
        );
    }
}
