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
        // Line l holds half h of k-quad q of panel p: 16 columns x 4 k, built in place (a
        // validator packs a fresh B for every sampled chain, so this is on its critical path).
        let lines_per_panel = TILE_COLS * n / 64;
        let panels = AlignedBytes::from_lines(n * n / 64, |l| {
            let (p, within) = (l / lines_per_panel, l % lines_per_panel);
            let (q, half) = (within / 2, within % 2);
            let col0 = p * TILE_COLS + half * 16;
            let rows: [&[u8]; 4] = std::array::from_fn(|t| &src[(4 * q + t) * n + col0..][..16]);
            std::array::from_fn(|i| rows[i % 4][i / 4])
        });
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
