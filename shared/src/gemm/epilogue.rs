//! What happens to a finished tile: the exact int32 values (every kernel's tile is the exact
//! product, the `vpdpbusd` kernels' bias already corrected) are mapped through the chain's
//! `mix` straight into int8.
//!
//! `mix` is a handful of 32-bit multiplies and shifts per element. Compiled for the baseline
//! x86-64 target (SSE2, no 32-bit vector multiply) it runs scalar, and with the AMX kernel
//! that would cost as much as the product itself at n = 256. So the same loop is also compiled
//! with AVX2 and with AVX-512 enabled, and the widest one this CPU runs is chosen once.

use super::{TILE_COLS, TilePlace};
use crate::mix::{col_key, mix_keyed, row_key, step_key};

/// Writes `mix(tile[i][j], step, at.row + i, at.col + j)` to `out[at.offset + i*n + j]`, for a
/// whole tile at once: one dispatched call per tile rather than per row, because at 32 values a
/// row the call and the dispatch cost as much as the arithmetic.
pub(super) type MixTile = fn(&[[i32; TILE_COLS]], u32, &mut [i8], TilePlace, usize);

/// The fastest [`MixTile`] for this CPU. All of them compute the same `mix`.
pub(super) fn mix_tile() -> MixTile {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
            return x86::mix_tile_avx512;
        }
        if is_x86_feature_detected!("avx2") {
            return x86::mix_tile_avx2;
        }
    }
    mix_tile_portable
}

/// The key of element (row, col) is `step_key ^ (row_key(row) + col_key(col))` (`mix.rs`): the
/// columns' shares are computed once per tile, so each element costs one add and one xor more
/// than a mix keyed by the step alone, and the loop stays vectorisable.
#[inline(always)]
fn mix_tile_body(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], at: TilePlace, n: usize) {
    let step_key = step_key(step);
    let col_keys: [u32; TILE_COLS] = std::array::from_fn(|j| col_key((at.col + j) as u32));
    for (i, row) in tile.iter().enumerate() {
        let row_key = row_key((at.row + i) as u32);
        let dst = &mut out[at.offset + i * n..at.offset + i * n + TILE_COLS];
        for ((d, &y), &col_key) in dst.iter_mut().zip(row).zip(&col_keys) {
            *d = mix_keyed(y, step_key ^ row_key.wrapping_add(col_key));
        }
    }
}

fn mix_tile_portable(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], at: TilePlace, n: usize) {
    mix_tile_body(tile, step, out, at, n)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{TILE_COLS, TilePlace, mix_tile_body};

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn avx512(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], at: TilePlace, n: usize) {
        mix_tile_body(tile, step, out, at, n)
    }

    #[target_feature(enable = "avx2")]
    unsafe fn avx2(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], at: TilePlace, n: usize) {
        mix_tile_body(tile, step, out, at, n)
    }

    /// Only handed out by `mix_tile()` after it saw AVX-512 F and BW.
    pub(super) fn mix_tile_avx512(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], at: TilePlace, n: usize) {
        // SAFETY: the features were detected before this function was chosen.
        unsafe { avx512(tile, step, out, at, n) }
    }

    /// Only handed out by `mix_tile()` after it saw AVX2.
    pub(super) fn mix_tile_avx2(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], at: TilePlace, n: usize) {
        // SAFETY: as above, for AVX2.
        unsafe { avx2(tile, step, out, at, n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mix::mix;

    #[test]
    fn every_variant_computes_the_same_mix_in_the_same_places() {
        let tile: Vec<[i32; TILE_COLS]> = (0..8)
            .map(|i| std::array::from_fn(|j| (j as i32 - 16 + i).wrapping_mul(0x0123_4567) ^ (1 << 27)))
            .collect();
        // The tile's first row is row 1 of the task's block, which starts at row 40 of the
        // product: mix is keyed by the product's rows, not the block's.
        let n = 64;
        let at = TilePlace {
            offset: n + 32,
            row: 41,
            col: 32,
        };
        for step in [0u32, 1, 77, u32::MAX] {
            let mut want = vec![0i8; n * 10];
            for (i, row) in tile.iter().enumerate() {
                for (j, &y) in row.iter().enumerate() {
                    want[at.offset + i * n + j] = mix(y, step, (at.row + i) as u32, (at.col + j) as u32);
                }
            }
            let mut got = vec![0i8; n * 10];
            mix_tile()(&tile, step, &mut got, at, n);
            assert_eq!(got, want, "step {step}");
            let mut got = vec![0i8; n * 10];
            mix_tile_portable(&tile, step, &mut got, at, n);
            assert_eq!(got, want, "portable, step {step}");
        }
    }
}
