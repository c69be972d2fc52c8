//! AVX2 without VNNI (AMD Zen 2/3, Intel Haswell to Comet Lake): exact through 16-bit products.
//!
//! The byte instruction `vpmaddubsw` is not used: it adds two u8 x s8 products into an i16 and
//! *saturates* (2 x 255 x 127 overflows), which would make results wrong rather than slow.
//! Instead both operands are sign-extended to i16 and `vpmaddwd` adds pairs of i16 x i16
//! products into i32: each pair is at most 2 x 128 x 128 = 2^15, exact. A is signed, so there
//! is no bias to undo.
//!
//! Where the time goes: `vpmaddwd` has no accumulating form before AVX-VNNI, so every 16
//! multiply-adds cost a `vpmaddwd` and a `vpaddd`, and that pair bounds the kernel (0.14-0.16
//! TOPS per thread measured on a Zen 3; [`register_peak`] measures it, and `miner bench` prints
//! it). The rest of the inner loop is kept as small as it can be:
//! - A is widened to i16 once per product ([`pack_a`], O(n^2)) instead of once per tile and
//!   column group (O(n^3 / 8)), and laid out so that one k-quad of a tile's eight rows is one
//!   cache line: each row's four k come in as one 64-bit broadcast load.
//! - B comes widened too, once per chain ([`PackedB::widened_panels`](crate::gemm::PackedB),
//!   the byte panels sign-extended in place). Widened in the loop instead, it took two
//!   `vpmovsxbw` per eight pairs, on the shuffle port that the `vpaddd`s share on Intel cores:
//!   the inner loop is now the ceiling's own pairs plus loads.
//! - k is walked in blocks of [`BLOCK_QUADS`] so that the block's B (16 KiB) and A (4 KiB) stay
//!   in L1 while the eight 4-row x 8-column sub-tiles of the tile take their turns over it; the
//!   partial sums wait in a small array between blocks.

use crate::gemm::TILE_COLS;
use std::arch::x86_64::*;

pub(super) const TILE_ROWS: usize = 8;

/// Bytes of prepared A per element of A: i16.
pub(super) const A_ELEMENT_BYTES: usize = 2;

/// Bytes of B's panel per element: i16 ([`PackedB::widened_panels`](crate::gemm::PackedB)).
pub(super) const B_ELEMENT_BYTES: usize = 2;

/// k-quads per block; 64 quads of B are 16 KiB of the widened panel.
const BLOCK_QUADS: usize = 64;

pub(super) fn is_available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// [`pack_a_into`] into a buffer of its own.
#[cfg(test)]
fn pack_a(a: &[u8], n: usize) -> crate::aligned::AlignedBytes {
    use crate::aligned::AlignedBytes;
    let mut packed = AlignedBytes::zeroed(a.len() * A_ELEMENT_BYTES);
    pack_a_into(a, n, packed.as_mut_slice());
    packed
}

/// A widened to i16 in strips of TILE_ROWS rows, into `packed` (`a.len() * 2` bytes, every one
/// of which it overwrites): strip s, k-quad q is one 64-byte line holding `A[8s + r][4q + t]`
/// at i16 index `r*4 + t`. Strip s starts at byte `s * TILE_ROWS * n * 2`.
///
/// This runs before every product (each task packs its own rows), so it is vectorised too: at
/// n = 256 a byte-by-byte rearrangement took a fifth of the step.
pub(super) fn pack_a_into(a: &[u8], n: usize, packed: &mut [u8]) {
    assert!(n.is_multiple_of(16) && a.len().is_multiple_of(TILE_ROWS * n));
    assert_eq!(
        packed.len(),
        a.len() * A_ELEMENT_BYTES,
        "the packed layout is two bytes an element"
    );
    assert!(is_available(), "the AVX2 layout of A is only built on CPUs with AVX2");
    // SAFETY: AVX2 was checked just above, and the sizes.
    unsafe { pack_a_avx2(a, n, packed) };
}

/// Widens each row 16 bytes at a time and sends each of the resulting four k-quads (8 bytes) to
/// its line of the strip, at the row's place in it.
///
/// # Safety
/// The CPU must have AVX2; `packed` is `a.len() * 2` bytes and n a multiple of 16.
#[target_feature(enable = "avx2")]
unsafe fn pack_a_avx2(a: &[u8], n: usize, packed: &mut [u8]) {
    for (strip, dst) in packed.chunks_exact_mut(TILE_ROWS * n * A_ELEMENT_BYTES).enumerate() {
        for r in 0..TILE_ROWS {
            let row = &a[(strip * TILE_ROWS + r) * n..][..n];
            for (c, bytes) in row.chunks_exact(16).enumerate() {
                // SAFETY: `bytes` is 16 bytes. Quad 4c + i of row r goes to line 4c + i at byte
                // r*8; with 4c + 3 < n/4 and r*8 + 8 <= 64 every store lies within `dst`.
                unsafe {
                    let wide = _mm256_cvtepi8_epi16(_mm_loadu_si128(bytes.as_ptr().cast()));
                    let (low, high) = (_mm256_castsi256_si128(wide), _mm256_extracti128_si256::<1>(wide));
                    let at = dst.as_mut_ptr().add(4 * c * 64 + r * 8);
                    _mm_storel_epi64(at.cast(), low);
                    _mm_storel_epi64(at.add(64).cast(), _mm_unpackhi_epi64(low, low));
                    _mm_storel_epi64(at.add(128).cast(), high);
                    _mm_storel_epi64(at.add(192).cast(), _mm_unpackhi_epi64(high, high));
                }
            }
        }
    }
}

/// One tile, TILE_ROWS rows x 32 columns. Per k-quad a 4-row x 8-column sub-tile costs two
/// 32-byte loads of the widened B (each 4 columns x 4 k, as i16), four 64-bit broadcasts of A
/// (one row's 4 k, as i16), and eight `vpmaddwd` + `vpaddd`. An i32 lane then holds half of
/// one column's k-quad (k 0-1 or 2-3); adjacent lanes are added once at the end.
///
/// # Safety
/// The CPU must have AVX2; `strip` holds one strip of [`pack_a`] (TILE_ROWS * n * 2 bytes),
/// `panel` one widened panel (32n * 2 bytes) and `out` TILE_ROWS rows.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn tile(strip: &[u8], n: usize, panel: &[u8], out: &mut [[i32; TILE_COLS]]) {
    assert!(
        strip.len() == TILE_ROWS * n * A_ELEMENT_BYTES
            && panel.len() == TILE_COLS * n * B_ELEMENT_BYTES
            && out.len() == TILE_ROWS
    );
    let quads = n / 4;
    let (a, b) = (strip.as_ptr(), panel.as_ptr());
    // partial[r][g]: row r, columns 4g..4g+4, as two i32 lanes per column.
    let mut partial = [[_mm256_setzero_si256(); TILE_COLS / 4]; TILE_ROWS];
    for first_quad in (0..quads).step_by(BLOCK_QUADS) {
        let block = first_quad..(first_quad + BLOCK_QUADS).min(quads);
        for (row_group, col_group) in SUB_TILES {
            // SAFETY: AVX2 is present (this function's own contract), and the block's quads are
            // below n/4, as `sub_tile` needs.
            unsafe { sub_tile(a, b, block.clone(), (row_group, col_group), &mut partial) };
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

/// The tile's 4-row x 8-column sub-tiles, as (row group, column group): a block of k is run
/// through each in turn while the block's A and B stay in L1.
const SUB_TILES: [(usize, usize); (TILE_ROWS / 4) * (TILE_COLS / 8)] = {
    let mut all = [(0, 0); (TILE_ROWS / 4) * (TILE_COLS / 8)];
    let mut i = 0;
    while i < all.len() {
        // Column groups outermost, as the loops were written: each B load serves both row groups.
        all[i] = (i % (TILE_ROWS / 4), i / (TILE_ROWS / 4));
        i += 1;
    }
    all
};

/// One sub-tile over the k-quads `block`: its accumulators from `partial`, the block's
/// `vpmaddwd` + `vpaddd` into them, and back.
///
/// # Safety
/// The CPU must have AVX2; `a` and `b` are the strip and panel of [`tile`], and every quad of
/// `block` is below n/4.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sub_tile(
    a: *const u8,
    b: *const u8,
    block: std::ops::Range<usize>,
    (row_group, col_group): (usize, usize),
    partial: &mut [[__m256i; TILE_COLS / 4]; TILE_ROWS],
) {
    let mut acc: [[__m256i; 2]; 4] =
        std::array::from_fn(|r| std::array::from_fn(|h| partial[row_group * 4 + r][col_group * 2 + h]));
    // Two quads an iteration, so that the loop's counter and branch cost half as much beside
    // the vector pairs. Every block is a whole number of pairs of quads: n is a multiple of 64.
    for first in block.step_by(2) {
        for q in [first, first + 1] {
            // SAFETY: q < n/4 and col_group < 4 keep b + q*256 + col_group*64 + 64 within the
            // widened panel's 64n bytes; q*64 + 64 <= 16n keeps A's reads within the strip's
            // 16n bytes.
            let (b0, b1) = unsafe {
                let p = b.add(q * 256 + col_group * 64);
                (_mm256_loadu_si256(p.cast()), _mm256_loadu_si256(p.add(32).cast()))
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                // (a0, a1, a2, a3) of this row, four times over, against (column, k 0..3).
                // SAFETY: within the strip, as said above.
                let a4 = unsafe { a.add(q * 64 + (row_group * 4 + r) * 8).cast::<i64>().read_unaligned() };
                let a4 = _mm256_set1_epi64x(a4);
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(a4, b0));
                acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(a4, b1));
            }
        }
    }
    for (r, acc) in acc.into_iter().enumerate() {
        partial[row_group * 4 + r][col_group * 2..col_group * 2 + 2].copy_from_slice(&acc);
    }
}

/// What this thread's vector units do on the kernel's own instruction pair, `vpmaddwd` into a
/// `vpaddd`, with nothing else in the loop: eight independent accumulators, operands that never
/// leave registers, `iterations` rounds of eight pairs. Operations per second (32 per pair:
/// 16 multiplies and 16 adds); None without AVX2. The ceiling the kernel is measured against.
pub(super) fn register_peak(iterations: u64) -> Option<f64> {
    // SAFETY: AVX2 was detected first; the loop touches no memory, so it takes no operands.
    is_available().then(|| super::time_ceiling(iterations, 8.0 * 32.0, |_, rounds| unsafe { register_loop(rounds) }))
}

/// # Safety
/// The CPU must have AVX2; `iterations` must not be 0 (`dec` would wrap and loop 2^64 times).
#[target_feature(enable = "avx2")]
unsafe fn register_loop(iterations: u64) {
    // SAFETY (caller): AVX2 is present. The operands' values do not matter to the timing.
    unsafe {
        std::arch::asm!(
            "2:",
            "vpmaddwd ymm8, ymm12, ymm14",
            "vpmaddwd ymm9, ymm12, ymm15",
            "vpmaddwd ymm10, ymm13, ymm14",
            "vpmaddwd ymm11, ymm13, ymm15",
            "vpaddd ymm0, ymm0, ymm8",
            "vpaddd ymm1, ymm1, ymm9",
            "vpaddd ymm2, ymm2, ymm10",
            "vpaddd ymm3, ymm3, ymm11",
            "vpmaddwd ymm8, ymm14, ymm12",
            "vpmaddwd ymm9, ymm14, ymm13",
            "vpmaddwd ymm10, ymm15, ymm12",
            "vpmaddwd ymm11, ymm15, ymm13",
            "vpaddd ymm4, ymm4, ymm8",
            "vpaddd ymm5, ymm5, ymm9",
            "vpaddd ymm6, ymm6, ymm10",
            "vpaddd ymm7, ymm7, ymm11",
            "dec {i}",
            "jnz 2b",
            i = inout(reg) iterations => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
            out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
            out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
            options(nostack, nomem),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised packing against the layout's definition, element by element.
    #[test]
    fn pack_a_puts_every_element_where_the_layout_says() {
        if !is_available() {
            eprintln!("SKIPPED: no AVX2 on this CPU");
            return;
        }
        for n in [64, 128, 320] {
            let a: Vec<u8> = (0..2 * TILE_ROWS * n).map(|i| (i * 37 + i / 7) as u8).collect();
            let packed = pack_a(&a, n);
            let bytes = packed.as_slice();
            assert_eq!(bytes.len(), a.len() * 2);
            for strip in 0..2 {
                for q in 0..n / 4 {
                    for r in 0..TILE_ROWS {
                        for t in 0..4 {
                            let at = strip * TILE_ROWS * n * 2 + q * 64 + (r * 4 + t) * 2;
                            let got = i16::from_le_bytes([bytes[at], bytes[at + 1]]);
                            let want = i16::from(a[(strip * TILE_ROWS + r) * n + 4 * q + t] as i8);
                            assert_eq!(got, want, "n={n} strip {strip} quad {q} row {r} k {t}");
                        }
                    }
                }
            }
        }
    }
}
