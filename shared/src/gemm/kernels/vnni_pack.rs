//! A in the layout both `vpdpbusd` kernels read: biased by +128 (`vpdpbusd` multiplies
//! *unsigned* A by signed B) and laid out in strips of [`STRIP_ROWS`] rows, k-quad by k-quad.
//!
//! Strip s, k-quad q is one 32-byte block holding `A[8s + r][4q + t] ^ 0x80` at byte `r*4 + t`;
//! strip s starts at byte `s * 8 * n`. Read row-major, the kernels' eight broadcasts of a quad
//! each needed an address of its own, one row stride apart, which the compiler built with an
//! add per row inside the k loop. In strips, the eight are one pointer and eight displacements,
//! and a span of k is one piece of each strip.

use std::arch::x86_64::*;

/// Rows a strip holds: the tile rows of both `vpdpbusd` kernels.
pub(super) const STRIP_ROWS: usize = 8;

/// `a` (whole strips of n bytes a row) biased and in strips, into `packed` (`a.len()` bytes,
/// every one of which it overwrites).
pub(super) fn pack_a_into(a: &[u8], n: usize, packed: &mut [u8]) {
    assert!(n.is_multiple_of(16) && a.len().is_multiple_of(STRIP_ROWS * n));
    assert_eq!(packed.len(), a.len(), "the strips are one byte an element");
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above; the sizes were checked.
        unsafe { pack_a_avx2(a, n, packed) }
    } else {
        pack_a_scalar(a, n, packed)
    }
}

/// The layout, byte by byte: the reference the vectorised packing is held to.
fn pack_a_scalar(a: &[u8], n: usize, packed: &mut [u8]) {
    for (strip, dst) in packed.chunks_exact_mut(STRIP_ROWS * n).enumerate() {
        for r in 0..STRIP_ROWS {
            let row = &a[(strip * STRIP_ROWS + r) * n..][..n];
            for (k, &v) in row.iter().enumerate() {
                dst[(k / 4) * 32 + r * 4 + k % 4] = v ^ 0x80;
            }
        }
    }
}

/// Four k-quads of all eight rows at a time: each row's 16 bytes, rows r and r + 4 side by side
/// in one register, transposed as 4 x 4 blocks of 32-bit quads into four 32-byte blocks.
///
/// # Safety
/// The CPU must have AVX2; `packed` is `a.len()` bytes, n a multiple of 16 and `a` whole strips.
#[target_feature(enable = "avx2")]
unsafe fn pack_a_avx2(a: &[u8], n: usize, packed: &mut [u8]) {
    let bias = _mm256_set1_epi8(0x80u8 as i8);
    for (strip, dst) in packed.chunks_exact_mut(STRIP_ROWS * n).enumerate() {
        let src = &a[strip * STRIP_ROWS * n..][..STRIP_ROWS * n];
        for c in 0..n / 16 {
            // SAFETY: row r's bytes 16c .. 16c + 16 lie within the strip's 8n bytes of `src`;
            // quads 4c .. 4c + 4 are bytes 128c .. 128c + 128 of `dst`'s 8n.
            unsafe {
                let load = |r: usize| _mm_loadu_si128(src.as_ptr().add(r * n + 16 * c).cast());
                let pair = |r: usize| _mm256_xor_si256(_mm256_set_m128i(load(r + 4), load(r)), bias);
                let (y0, y1, y2, y3) = (pair(0), pair(1), pair(2), pair(3));
                let t0 = _mm256_unpacklo_epi32(y0, y1);
                let t1 = _mm256_unpackhi_epi32(y0, y1);
                let t2 = _mm256_unpacklo_epi32(y2, y3);
                let t3 = _mm256_unpackhi_epi32(y2, y3);
                let out = dst.as_mut_ptr().add(128 * c);
                _mm256_storeu_si256(out.cast(), _mm256_unpacklo_epi64(t0, t2));
                _mm256_storeu_si256(out.add(32).cast(), _mm256_unpackhi_epi64(t0, t2));
                _mm256_storeu_si256(out.add(64).cast(), _mm256_unpacklo_epi64(t1, t3));
                _mm256_storeu_si256(out.add(96).cast(), _mm256_unpackhi_epi64(t1, t3));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised packing is the scalar one, byte for byte, and the scalar one puts every
    /// element where the kernels read it: `A[8s + r][4q + t] ^ 0x80` at `s*8n + q*32 + r*4 + t`.
    #[test]
    fn strips_hold_each_biased_element_where_the_kernels_read_it() {
        for n in [16, 64, 192] {
            let a: Vec<u8> = (0..3 * STRIP_ROWS * n).map(|i| (i * 37 + i / 7) as u8).collect();
            let mut scalar = vec![0; a.len()];
            pack_a_scalar(&a, n, &mut scalar);
            for (i, &v) in a.iter().enumerate() {
                let (row, k) = (i / n, i % n);
                let (s, r) = (row / STRIP_ROWS, row % STRIP_ROWS);
                assert_eq!(
                    scalar[s * 8 * n + (k / 4) * 32 + r * 4 + k % 4],
                    v ^ 0x80,
                    "n={n} row {row} k {k}"
                );
            }
            let mut packed = vec![0x55; a.len()];
            pack_a_into(&a, n, &mut packed);
            assert_eq!(packed, scalar, "n={n}");
        }
    }
}
