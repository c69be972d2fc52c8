//! B rearranged for the register tile: per 32-column panel, for each group of four k, the four
//! bytes of every column side by side, so one 64-byte load feeds sixteen columns' dot products.

use super::TILE_COLS;
use crate::aligned::AlignedBytes;
use crate::matrix::Matrix;
use std::sync::OnceLock;

/// B packed once per chain (B is the same for all K steps) and reused by every product.
pub struct PackedB {
    n: usize,
    /// Panel p occupies `[p*32n, (p+1)*32n)`; inside it, k-quad q holds 128 bytes:
    /// `[q*128 + lane*4 + t] = B[4q + t][32p + lane]`. Cache-line aligned, so that each
    /// 16-column half of a k-quad (an AMX tile row, a zmm load) is one line.
    panels: AlignedBytes,
    /// `-128 * sum_k B[k][j]`: where the kernels that read A biased by +128 start each column's
    /// sums, so that their tiles come out as the exact product (PROTOCOL.md "Exactness").
    bias_correction: Vec<i32>,
    /// `panels` with every byte sign-extended to a little-endian i16, in the same order, for the
    /// AVX2 kernel, which multiplies 16-bit lanes: built on its first use, so that only that
    /// kernel pays for it (twice the panels' memory), once per chain instead of in every tile.
    widened: OnceLock<AlignedBytes>,
}

impl PackedB {
    pub fn new(b: &Matrix) -> Self {
        let n = b.n();
        assert!(
            n.is_multiple_of(TILE_COLS) && n.is_multiple_of(4),
            "n={n} cannot be packed"
        );
        let src = b.as_bytes();
        // Line l holds half h of k-quad q of panel p: 16 columns x 4 k, built in place (a
        // validator packs a fresh B for every sampled chain, so this is on its critical path).
        let lines_per_panel = TILE_COLS * n / 64;
        let panels = AlignedBytes::from_lines(n * n / 64, |l| {
            let (p, within) = (l / lines_per_panel, l % lines_per_panel);
            let (q, half) = (within / 2, within % 2);
            let col0 = p * TILE_COLS + half * 16;
            interleave_quad(std::array::from_fn(|t| {
                src[(4 * q + t) * n + col0..][..16].try_into().expect("16 bytes")
            }))
        });
        let mut col_sums = vec![0i32; n];
        for row in b.as_slice().chunks_exact(n) {
            for (sum, &v) in col_sums.iter_mut().zip(row) {
                *sum += i32::from(v);
            }
        }
        // |sum| <= 128 * 8192 = 2^20, so -128 * sum fits in an i32 with room to spare.
        let bias_correction = col_sums.into_iter().map(|sum| sum.wrapping_mul(-128)).collect();
        PackedB {
            n,
            panels,
            bias_correction,
            widened: OnceLock::new(),
        }
    }

    pub fn n(&self) -> usize {
        self.n
    }

    /// Panel p alone.
    #[cfg(test)]
    pub(super) fn panel(&self, p: usize) -> &[u8] {
        &self.panels.as_slice()[p * TILE_COLS * self.n..(p + 1) * TILE_COLS * self.n]
    }

    /// Every panel, panel p at `[p*32n, (p+1)*32n)`.
    pub(super) fn panels(&self) -> &[u8] {
        self.panels.as_slice()
    }

    /// Every panel, each byte as an i16 in its place (`2 * 32n` bytes a panel), built on the
    /// first call.
    pub(super) fn widened_panels(&self) -> &[u8] {
        self.widened
            .get_or_init(|| {
                let bytes = self.panels.as_slice();
                AlignedBytes::from_lines(bytes.len() * 2 / 64, |l| {
                    let mut line = [0u8; 64];
                    for (pair, &b) in line.chunks_exact_mut(2).zip(&bytes[l * 32..(l + 1) * 32]) {
                        pair.copy_from_slice(&i16::from(b as i8).to_le_bytes());
                    }
                    line
                })
            })
            .as_slice()
    }

    /// `-128 * column_sum(B)` over panel p's columns: `sum((a + 128) * b) - 128 * sum(b)` is
    /// `sum(a * b)`, so a kernel fed A biased by +128 that starts its sums here ends exact.
    pub(super) fn bias_correction(&self, p: usize) -> &[i32; TILE_COLS] {
        self.bias_correction[p * TILE_COLS..(p + 1) * TILE_COLS]
            .try_into()
            .expect("panel width")
    }
}

/// Four rows of 16 bytes (k = 0..4 of 16 columns) to one line of 16 columns x 4 k:
/// `line[lane*4 + t] = rows[t][lane]`, a 4 x 16 byte transpose.
#[cfg(target_arch = "x86_64")]
fn interleave_quad(rows: [&[u8; 16]; 4]) -> [u8; 64] {
    // SSE2 is part of x86-64 itself, so there is nothing to detect. Byte then 16-bit unpacks do
    // the transpose in eight instructions, where the byte-by-byte loop took some 14 ms at
    // n = 2048 (a validator packs a fresh B for every chain it samples).
    use std::arch::x86_64::*;
    // SAFETY: each load reads exactly one 16-byte row; each store writes 16 of the 64 bytes.
    unsafe {
        let [r0, r1, r2, r3] = rows.map(|r| _mm_loadu_si128(r.as_ptr().cast()));
        let (r01_low, r01_high) = (_mm_unpacklo_epi8(r0, r1), _mm_unpackhi_epi8(r0, r1));
        let (r23_low, r23_high) = (_mm_unpacklo_epi8(r2, r3), _mm_unpackhi_epi8(r2, r3));
        let mut line = [0u8; 64];
        let out = line.as_mut_ptr();
        _mm_storeu_si128(out.cast(), _mm_unpacklo_epi16(r01_low, r23_low)); // lanes 0-3
        _mm_storeu_si128(out.add(16).cast(), _mm_unpackhi_epi16(r01_low, r23_low)); // 4-7
        _mm_storeu_si128(out.add(32).cast(), _mm_unpacklo_epi16(r01_high, r23_high)); // 8-11
        _mm_storeu_si128(out.add(48).cast(), _mm_unpackhi_epi16(r01_high, r23_high)); // 12-15
        line
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn interleave_quad(rows: [&[u8; 16]; 4]) -> [u8; 64] {
    interleave_quad_bytewise(rows)
}

/// The definition of [`interleave_quad`], byte by byte.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn interleave_quad_bytewise(rows: [&[u8; 16]; 4]) -> [u8; 64] {
    std::array::from_fn(|i| rows[i % 4][i / 4])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_widened_panels_are_the_panels_sign_extended() {
        let n = 64;
        let b = Matrix::from_vec(n, (0..n * n).map(|i| (i * 37 + i / 5) as i8).collect()).unwrap();
        let packed = PackedB::new(&b);
        let widened = packed.widened_panels();
        assert_eq!(widened.len(), 2 * n * n);
        for (i, &byte) in packed.panels.as_slice().iter().enumerate() {
            let wide = i16::from_le_bytes([widened[2 * i], widened[2 * i + 1]]);
            assert_eq!(wide, i16::from(byte as i8), "element {i}");
        }
        // Built once: the second call hands out the same buffer.
        assert_eq!(packed.widened_panels().as_ptr(), widened.as_ptr());
    }

    #[test]
    fn the_transpose_matches_its_definition() {
        let rows: [[u8; 16]; 4] = std::array::from_fn(|t| std::array::from_fn(|lane| (t * 16 + lane) as u8 ^ 0xa5));
        let rows = [&rows[0], &rows[1], &rows[2], &rows[3]];
        assert_eq!(interleave_quad(rows), interleave_quad_bytewise(rows));
    }
}
