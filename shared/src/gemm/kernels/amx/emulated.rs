//! An emulator of the AMX instructions the kernel uses, written from the instruction set
//! reference, so that the kernel's schedule, its layouts and the carried sums are checked on
//! any CPU. On AMX hardware the same schedule runs on the real unit in the self-test.

use super::TILE_ROWS;
use super::unit::{CONFIG, TileUnit};
use crate::gemm::TILE_COLS;
use crate::gemm::kernels::Streamed;

/// Tiles 0-7 as palette 1 with [`CONFIG`] shapes them: 16 rows of 64 bytes each.
pub(super) struct Emulated {
    tmm: [[[u8; 64]; 16]; 8],
}

impl Emulated {
    pub(super) fn new() -> Self {
        assert!(CONFIG.palette == 1 && CONFIG.rows[..8] == [16; 8] && CONFIG.colsb[..8] == [64; 8]);
        Emulated {
            tmm: [[[0; 64]; 16]; 8],
        }
    }

    /// `tileloadd tmm{t}, [base + offset + stride*row]`, row = 0..16.
    fn tileloadd(&mut self, t: usize, mem: &[u8], offset: usize, stride: usize) {
        for (r, row) in self.tmm[t].iter_mut().enumerate() {
            row.copy_from_slice(&mem[offset + r * stride..][..64]);
        }
    }

    fn tilestored(&self, t: usize, mem: &mut [u8], offset: usize, stride: usize) {
        for (r, row) in self.tmm[t].iter().enumerate() {
            mem[offset + r * stride..][..64].copy_from_slice(row);
        }
    }

    /// `tdpbssd tmm{c}, tmm{a}, tmm{b}` as the SDM defines it: for each row m of C and
    /// dword column j, `C[m][j] += sum_{k<16, t<4} A.byte[m][4k+t] * B.byte[k][4j+t]`, all
    /// signed, wrapping in 32 bits.
    #[allow(clippy::needless_range_loop)] // indexed as the SDM's pseudocode is
    fn tdpbssd(&mut self, c: usize, a: usize, b: usize) {
        let (ta, tb) = (self.tmm[a], self.tmm[b]);
        for m in 0..16 {
            for j in 0..16 {
                let dword: [u8; 4] = self.tmm[c][m][4 * j..4 * j + 4].try_into().unwrap();
                let mut sum = i32::from_le_bytes(dword);
                for k in 0..16 {
                    for t in 0..4 {
                        let product = i32::from(ta[m][4 * k + t] as i8) * i32::from(tb[k][4 * j + t] as i8);
                        sum = sum.wrapping_add(product);
                    }
                }
                self.tmm[c][m][4 * j..4 * j + 4].copy_from_slice(&sum.to_le_bytes());
            }
        }
    }
}

fn as_bytes(c: &[[i32; TILE_COLS]; TILE_ROWS]) -> Vec<u8> {
    c.iter().flatten().flat_map(|v| v.to_le_bytes()).collect()
}

/// Each method repeats its asm block in [`Tmm`](super::unit::Tmm), instruction by instruction, with the same
/// offsets and strides (`ldc` = 128, `lda` = 64, `ldb` = 128, `c16` = 16 rows of 128 bytes).
impl TileUnit for Emulated {
    fn zero_sums(&mut self) {
        for t in 0..4 {
            self.tmm[t] = [[0; 64]; 16];
        }
    }

    fn load_sums(&mut self, c: &[[i32; TILE_COLS]; TILE_ROWS]) {
        let c = as_bytes(c);
        self.tileloadd(0, &c, 0, 128);
        self.tileloadd(1, &c, 64, 128);
        self.tileloadd(2, &c, 16 * 128, 128);
        self.tileloadd(3, &c, 16 * 128 + 64, 128);
    }

    fn store_sums(&mut self, c: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
        let mut bytes = vec![0u8; 4096];
        self.tilestored(0, &mut bytes, 0, 128);
        self.tilestored(1, &mut bytes, 64, 128);
        self.tilestored(2, &mut bytes, 16 * 128, 128);
        self.tilestored(3, &mut bytes, 16 * 128 + 64, 128);
        for (v, b) in c.iter_mut().flatten().zip(bytes.chunks_exact(4)) {
            *v = i32::from_le_bytes(b.try_into().unwrap());
        }
    }

    /// `tileloaddt1` loads what `tileloadd` loads (the SDM gives them one operation); the hint
    /// only steers caching, which an emulator has none of.
    fn step(&mut self, a: &[u8; 2048], b: &[u8; 2048], _streamed: Streamed) {
        self.tileloadd(4, a, 0, 64);
        self.tileloadd(6, b, 0, 128);
        self.tdpbssd(0, 4, 6);
        self.tileloadd(7, b, 64, 128);
        self.tdpbssd(1, 4, 7);
        self.tileloadd(5, a, 1024, 64);
        self.tdpbssd(2, 5, 6);
        self.tdpbssd(3, 5, 7);
    }
}
