//! B rearranged for the register tile: per 32-column panel, for each group of four k, the four
//! bytes of every column side by side, so one 64-byte load feeds sixteen columns' dot products.

use super::TILE_COLS;
use crate::aligned::AlignedBytes;
use crate::matrix::Matrix;

/// B packed once per chain (B is the same for all K steps) and reused by every product.
pub struct PackedB {
    n: usize,
    /// Panel p occupies `[p*32n, (p+1)*32n)`; inside it, k-quad q holds 128 bytes:
    /// `[q*128 + lane*4 + t] = B[4q + t][32p + lane]`. Cache-line aligned, so that each
    /// 16-column half of a k-quad (an AMX tile row, a zmm load) is one line.
    panels: AlignedBytes,
    /// `sum_k B[k][j]`, to undo the bias on A.
    col_sums: Vec<i32>,
}

impl PackedB {
    pub fn new(b: &Matrix) -> Self {
        let n = b.n();
        assert!(
            n.is_multiple_of(TILE_COLS) && n.is_multiple_of(4),
            "n={n} cannot be packed"
        );
        let src = b.as_bytes();
        let mut panels = AlignedBytes::zeroed(n * n);
        for (p, panel) in panels.as_mut_slice().chunks_exact_mut(TILE_COLS * n).enumerate() {
            for (q, quad) in panel.chunks_exact_mut(4 * TILE_COLS).enumerate() {
                for lane in 0..TILE_COLS {
                    for t in 0..4 {
                        quad[lane * 4 + t] = src[(4 * q + t) * n + p * TILE_COLS + lane];
                    }
                }
            }
        }
        let mut col_sums = vec![0i32; n];
        for row in b.as_slice().chunks_exact(n) {
            for (sum, &v) in col_sums.iter_mut().zip(row) {
                *sum += i32::from(v);
            }
        }
        PackedB { n, panels, col_sums }
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub(super) fn panel(&self, p: usize) -> &[u8] {
        &self.panels.as_slice()[p * TILE_COLS * self.n..(p + 1) * TILE_COLS * self.n]
    }

    pub(super) fn col_sums(&self, p: usize) -> &[i32; TILE_COLS] {
        self.col_sums[p * TILE_COLS..(p + 1) * TILE_COLS]
            .try_into()
            .expect("panel width")
    }
}
