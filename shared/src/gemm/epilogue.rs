//! What happens to a finished tile row: undo the bias of the `vpdpbusd` kernels, then either
//! keep the exact int32 values or map them through the chain's `mix` straight into int8.
//!
//! `mix` is a handful of 32-bit multiplies and shifts per element. Compiled for the baseline
//! x86-64 target (SSE2, no 32-bit vector multiply) it runs scalar, and with the AMX kernel
//! that would cost as much as the product itself at n = 256. So the same loop is also compiled
//! with AVX2 and with AVX-512 enabled, and the widest one this CPU runs is chosen once.

use super::TILE_COLS;
use crate::mix::mix;

/// `sum((a+128) * b) - 128 * sum(b) = sum(a * b)`, exact modulo 2^32 and therefore exact.
#[inline]
pub(super) fn undo_bias(row: &mut [i32; TILE_COLS], col_sums: &[i32; TILE_COLS]) {
    for (v, &s) in row.iter_mut().zip(col_sums) {
        *v = v.wrapping_sub(s.wrapping_mul(128));
    }
}

/// Writes `mix(tile[i][j], step)` to `out[first + i*n + j]`, for a whole tile at once: one
/// dispatched call per tile rather than per row, because at 32 values a row the call and the
/// dispatch cost as much as the arithmetic.
pub(super) type MixTile = fn(&[[i32; TILE_COLS]], u32, &mut [i8], usize, usize);

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

#[inline(always)]
fn mix_tile_body(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], first: usize, n: usize) {
    for (i, row) in tile.iter().enumerate() {
        let dst = &mut out[first + i * n..first + i * n + TILE_COLS];
        for (d, &y) in dst.iter_mut().zip(row) {
            *d = mix(y, step);
        }
    }
}

fn mix_tile_portable(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], first: usize, n: usize) {
    mix_tile_body(tile, step, out, first, n)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{TILE_COLS, mix_tile_body};

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn avx512(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], first: usize, n: usize) {
        mix_tile_body(tile, step, out, first, n)
    }

    #[target_feature(enable = "avx2")]
    unsafe fn avx2(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], first: usize, n: usize) {
        mix_tile_body(tile, step, out, first, n)
    }

    /// Only handed out by `mix_tile()` after it saw AVX-512 F and BW.
    pub(super) fn mix_tile_avx512(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], first: usize, n: usize) {
        // SAFETY: the features were detected before this function was chosen.
        unsafe { avx512(tile, step, out, first, n) }
    }

    /// Only handed out by `mix_tile()` after it saw AVX2.
    pub(super) fn mix_tile_avx2(tile: &[[i32; TILE_COLS]], step: u32, out: &mut [i8], first: usize, n: usize) {
        // SAFETY: as above, for AVX2.
        unsafe { avx2(tile, step, out, first, n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_computes_the_same_mix_in_the_same_places() {
        let tile: Vec<[i32; TILE_COLS]> = (0..8)
            .map(|i| std::array::from_fn(|j| (j as i32 - 16 + i).wrapping_mul(0x0123_4567) ^ (1 << 27)))
            .collect();
        let (n, first) = (64, 64 + 32);
        for step in [0u32, 1, 77, u32::MAX] {
            let mut want = vec![0i8; n * 10];
            for (i, row) in tile.iter().enumerate() {
                for (j, &y) in row.iter().enumerate() {
                    want[first + i * n + j] = mix(y, step);
                }
            }
            let mut got = vec![0i8; n * 10];
            mix_tile()(&tile, step, &mut got, first, n);
            assert_eq!(got, want, "step {step}");
            let mut got = vec![0i8; n * 10];
            mix_tile_portable(&tile, step, &mut got, first, n);
            assert_eq!(got, want, "portable, step {step}");
        }
    }
}
