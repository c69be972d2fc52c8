//! The 8x32 register tile: `tile[r][c] = sum_k biased_a[r][k] * b[k][c]` over the whole k range.

use super::{TILE_COLS, TILE_ROWS};
use std::fmt;

/// Which inner loop computes the tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// `vpdpbusd` on 512-bit registers: 64 multiply-adds per instruction.
    Avx512Vnni,
    /// Plain Rust over the same packed layout; the compiler vectorises what it can.
    Portable,
}

impl fmt::Display for KernelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelKind::Avx512Vnni => "avx512-vnni",
            KernelKind::Portable => "portable",
        })
    }
}

impl KernelKind {
    pub const ALL: [KernelKind; 2] = [KernelKind::Avx512Vnni, KernelKind::Portable];

    pub fn is_available(self) -> bool {
        match self {
            KernelKind::Portable => true,
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx512Vnni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            KernelKind::Avx512Vnni => false,
        }
    }

    pub fn best_available() -> Self {
        Self::ALL
            .into_iter()
            .find(|k| k.is_available())
            .unwrap_or(KernelKind::Portable)
    }

    /// `rows` holds TILE_ROWS rows of biased A (n bytes each); `panel` one packed panel of B.
    pub(super) fn tile(self, rows: &[u8], n: usize, panel: &[u8], out: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
        assert_eq!(rows.len(), TILE_ROWS * n);
        assert_eq!(panel.len(), TILE_COLS * n);
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx512Vnni => {
                assert!(self.is_available(), "avx512-vnni kernel selected on a CPU without it");
                // SAFETY: the CPU features were checked just above, and the slice lengths
                // asserted at entry are exactly what the kernel reads.
                unsafe { avx512::tile(rows, n, panel, out) }
            }
            _ => portable_tile(rows, n, panel, out),
        }
    }
}

fn portable_tile(rows: &[u8], n: usize, panel: &[u8], out: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
    *out = [[0; TILE_COLS]; TILE_ROWS];
    for (q, quad) in panel.chunks_exact(4 * TILE_COLS).enumerate() {
        for (r, acc) in out.iter_mut().enumerate() {
            let a = &rows[r * n + 4 * q..r * n + 4 * q + 4];
            let a = [a[0] as i32, a[1] as i32, a[2] as i32, a[3] as i32];
            for (lane, b) in acc.iter_mut().zip(quad.chunks_exact(4)) {
                let dot = a[0] * (b[0] as i8 as i32)
                    + a[1] * (b[1] as i8 as i32)
                    + a[2] * (b[2] as i8 as i32)
                    + a[3] * (b[3] as i8 as i32);
                *lane = lane.wrapping_add(dot);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{TILE_COLS, TILE_ROWS};
    use std::arch::x86_64::*;

    /// Sixteen accumulators (8 rows x 2 registers of 16 columns) live in registers for the whole
    /// k loop; each k-quad costs two loads of B, eight 4-byte broadcasts of A and 16 `vpdpbusd`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile(rows: &[u8], n: usize, panel: &[u8], out: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
        let mut acc = [[_mm512_setzero_si512(); 2]; TILE_ROWS];
        let a = rows.as_ptr();
        let b = panel.as_ptr();
        for q in 0..n / 4 {
            // SAFETY (all loads): q < n/4, so b + q*128 + 128 <= b + 32n = panel's end, and
            // a + r*n + 4q + 4 <= a + 8n = rows' end; the caller asserted both lengths.
            let (b0, b1) = unsafe {
                (
                    _mm512_loadu_si512(b.add(q * 128).cast()),
                    _mm512_loadu_si512(b.add(q * 128 + 64).cast()),
                )
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let a4 = unsafe { a.add(r * n + 4 * q).cast::<i32>().read_unaligned() };
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
}
