//! The AMX tile unit as the kernel uses it: the tile configuration, the per-thread session
//! that loads it, and the four operations of the kernel's schedule, each one small `asm!`
//! block (stable Rust has no AMX intrinsics). The compiler never allocates the tile registers
//! itself, so nothing disturbs them between blocks.

use super::TILE_ROWS;
use crate::gemm::TILE_COLS;
use crate::gemm::kernels::Streamed;
use std::arch::asm;

/// The tile configuration: palette 1, tiles 0-7 all 16 rows x 64 bytes.
/// tmm0-3 hold the 32x32 int32 result, tmm4-5 two 16-row slices of A, tmm6-7 two 16-column
/// slices of B.
#[repr(C, align(64))]
pub(super) struct TileConfig {
    pub(super) palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    /// Bytes per row of each tile.
    pub(super) colsb: [u16; 16],
    /// Rows of each tile.
    pub(super) rows: [u8; 16],
}

pub(super) static CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// The tile configuration loaded on this thread, for as long as the value lives. Not `Send`:
/// tile state belongs to a thread. Loading it costs tens of cycles, so the driver holds one per
/// block of rows rather than one per tile.
pub(in crate::gemm) struct TileSession {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl TileSession {
    /// Loads [`CONFIG`]; panics unless [`is_available`](super::is_available).
    pub(in crate::gemm) fn start() -> Self {
        assert!(super::is_available(), "AMX tile session on a CPU or OS without AMX");
        // SAFETY: checked just above.
        unsafe { Self::start_unchecked() }
    }

    /// # Safety
    /// The CPU has AMX-TILE and Linux granted this process the tile state.
    pub(super) unsafe fn start_unchecked() -> Self {
        // SAFETY: per the contract; ldtilecfg reads the 64-byte configuration and nothing else.
        unsafe { asm!("ldtilecfg [{cfg}]", cfg = in(reg) &CONFIG, options(nostack, readonly)) };
        TileSession {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for TileSession {
    fn drop(&mut self) {
        // SAFETY: returns the tiles to their initial state; touches no memory. Releasing lets
        // the kernel skip saving 8 KiB of tile state at every context switch.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// The four things the kernel asks of the tile unit. [`Tmm`] does them with AMX instructions;
/// the tests run the same schedule on an emulator of those instructions, so the schedule, the
/// layouts and the carried sums are checked on any CPU, and on AMX hardware the self-test
/// checks the instructions.
pub(super) trait TileUnit {
    /// tmm0-3 (the 32x32 sums) := 0.
    fn zero_sums(&mut self);
    /// tmm0-3 := `c` (32 rows of 32 int32: tmm0 rows 0-15 columns 0-15, tmm1 columns 16-31,
    /// tmm2 and tmm3 rows 16-31).
    fn load_sums(&mut self, c: &[[i32; TILE_COLS]; TILE_ROWS]);
    /// `c` := tmm0-3, laid out as in [`load_sums`](Self::load_sums).
    fn store_sums(&mut self, c: &mut [[i32; TILE_COLS]; TILE_ROWS]);
    /// One k-step of 64: `a` is one k-block of a packed strip (32 rows x 64 bytes), `b` 16
    /// k-quads of the panel (16 x 128 bytes); tmm0-3 += A * B. `streamed` says which
    /// operand's loads carry the T1 hint (`tileloaddt1`, the same load as far as the result
    /// goes).
    fn step(&mut self, a: &[u8; 2048], b: &[u8; 2048], streamed: Streamed);
}

/// One k-step: two loads of A (rows 0-15 and 16-31), two of B (columns 0-15 and 16-31), four
/// `tdpbssd`, each load just before its first use; `$load_a` and `$load_b` name the load
/// instruction for each operand (`tileloadd`, or `tileloaddt1` for a streamed one).
macro_rules! step {
    ($load_a:literal, $load_b:literal, $a:expr, $b:expr) => {
        asm!(
            concat!($load_a, " tmm4, [{a} + {lda}*1]"),
            concat!($load_b, " tmm6, [{b} + {ldb}*1]"),
            "tdpbssd tmm0, tmm4, tmm6",
            concat!($load_b, " tmm7, [{b} + {ldb}*1 + 64]"),
            "tdpbssd tmm1, tmm4, tmm7",
            concat!($load_a, " tmm5, [{a} + {lda}*1 + 1024]"),
            "tdpbssd tmm2, tmm5, tmm6",
            "tdpbssd tmm3, tmm5, tmm7",
            a = in(reg) $a.as_ptr(),
            lda = in(reg) 64usize,
            b = in(reg) $b.as_ptr(),
            ldb = in(reg) 4 * TILE_COLS,
            options(nostack, readonly),
        )
    };
}

/// The tile unit of this thread, configured: the session proves it.
pub(super) struct Tmm<'s> {
    pub(super) _configured: &'s TileSession,
}

impl TileUnit for Tmm<'_> {
    fn zero_sums(&mut self) {
        // SAFETY: no memory is touched; the tiles are configured (the session).
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            )
        };
    }

    fn load_sums(&mut self, c: &[[i32; TILE_COLS]; TILE_ROWS]) {
        let c = c.as_ptr().cast::<i32>();
        // SAFETY: the loads read 32 rows of 128 bytes, the 4 KiB of `c`; tiles configured.
        unsafe {
            asm!(
                "tileloadd tmm0, [{c} + {ldc}*1]",
                "tileloadd tmm1, [{c} + {ldc}*1 + 64]",
                "tileloadd tmm2, [{c16} + {ldc}*1]",
                "tileloadd tmm3, [{c16} + {ldc}*1 + 64]",
                c = in(reg) c,
                c16 = in(reg) c.add(16 * TILE_COLS),
                ldc = in(reg) 4 * TILE_COLS,
                options(nostack, readonly),
            );
        }
    }

    fn store_sums(&mut self, c: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
        let c = c.as_mut_ptr().cast::<i32>();
        // SAFETY: the stores write 32 rows of 128 bytes, the 4 KiB of `c`; tiles configured.
        unsafe {
            asm!(
                "tilestored [{c} + {ldc}*1], tmm0",
                "tilestored [{c} + {ldc}*1 + 64], tmm1",
                "tilestored [{c16} + {ldc}*1], tmm2",
                "tilestored [{c16} + {ldc}*1 + 64], tmm3",
                c = in(reg) c,
                c16 = in(reg) c.add(16 * TILE_COLS),
                ldc = in(reg) 4 * TILE_COLS,
                options(nostack),
            );
        }
    }

    fn step(&mut self, a: &[u8; 2048], b: &[u8; 2048], streamed: Streamed) {
        // SAFETY (each arm): the loads read 2 KiB from each of `a` and `b` (16 rows of 64 bytes
        // at strides 64 and 128, plus the second halves at +1024 and +64). The tile registers
        // persist between asm blocks: the compiler never allocates them. The arms differ only
        // in which loads carry the T1 cache hint.
        unsafe {
            match streamed {
                Streamed::Neither => step!("tileloadd", "tileloadd", a, b),
                Streamed::A => step!("tileloaddt1", "tileloadd", a, b),
                Streamed::B => step!("tileloadd", "tileloaddt1", a, b),
            }
        }
    }
}
