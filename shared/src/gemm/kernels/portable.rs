//! Plain Rust over the packed layout: runs anywhere, and is the fallback when no vector kernel
//! fits the CPU. A is signed here (no bias), so the tile is the exact product directly.
//!
//! It takes k in blocks like the AMX kernel, which makes it the kernel that checks the driver's
//! blocked walk on every CPU (`tests/gemm_oracle.rs` runs it with small blocks).

use super::TileOperands;
use crate::gemm::TILE_COLS;

/// Rows of A per tile.
pub(super) const TILE_ROWS: usize = 8;

/// Adds the product of `ops.rows` (row-major, stride n) and `ops.panel` over the span `ops.k`
/// of k to `out`.
pub(super) fn tile(ops: &TileOperands<'_>, out: &mut [[i32; TILE_COLS]]) {
    let TileOperands { rows, panel, n, k, .. } = ops;
    let quads = panel[k.start * TILE_COLS..k.end * TILE_COLS].chunks_exact(4 * TILE_COLS);
    for (q, quad) in (k.start / 4..).zip(quads) {
        for (r, acc) in out.iter_mut().enumerate() {
            let a: [u8; 4] = rows[r * n + 4 * q..r * n + 4 * q + 4].try_into().expect("4 bytes");
            let a = a.map(|v| i32::from(v as i8));
            for (lane, b) in acc.iter_mut().zip(quad.chunks_exact(4)) {
                let dot = a[0] * i32::from(b[0] as i8)
                    + a[1] * i32::from(b[1] as i8)
                    + a[2] * i32::from(b[2] as i8)
                    + a[3] * i32::from(b[3] as i8);
                *lane = lane.wrapping_add(dot);
            }
        }
    }
}
