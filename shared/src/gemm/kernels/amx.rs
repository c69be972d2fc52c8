//! AMX-INT8 (Intel Sapphire Rapids and later): `tdpbssd` multiplies 16x64 signed bytes of A by
//! 16x64 signed bytes of B into a 16x16 int32 tile, 16384 multiply-adds per instruction.
//!
//! Signed x signed, so A needs no bias. Stable Rust has no AMX intrinsics, so each k-step is
//! one small `asm!` block; the compiler never uses the tile registers itself, so nothing else
//! can disturb them between blocks.
//!
//! Linux hands out the 8 KiB tile state only on request: a process must ask once with
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` before any thread touches a tile, or
//! the first tile instruction raises SIGILL. A CPU, kernel or hypervisor that refuses the
//! request simply does not get this kernel.

use crate::aligned::AlignedBytes;
use crate::gemm::TILE_COLS;
use std::arch::asm;
use std::sync::OnceLock;

/// Rows of A per tile: two 16-row AMX tiles.
pub(super) const TILE_ROWS: usize = 32;

/// The tile configuration: palette 1, tiles 0-7 all 16 rows x 64 bytes.
/// tmm0-3 hold the 32x32 int32 result, tmm4-5 two 16-row slices of A, tmm6-7 two 16-column
/// slices of B.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    /// Bytes per row of each tile.
    colsb: [u16; 16],
    /// Rows of each tile.
    rows: [u8; 16],
}

static CONFIG: TileConfig = TileConfig {
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
    /// Loads [`CONFIG`]; panics unless [`is_available`].
    pub(in crate::gemm) fn start() -> Self {
        assert!(is_available(), "AMX tile session on a CPU or OS without AMX");
        // SAFETY: checked just above.
        unsafe { Self::start_unchecked() }
    }

    /// # Safety
    /// The CPU has AMX-TILE and Linux granted this process the tile state.
    unsafe fn start_unchecked() -> Self {
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

/// A rearranged into strips of 32 rows, and inside each strip into k-blocks of 32 rows x 64
/// bytes (2 KiB, one after the other): `[s*32n + kb*2048 + r*64 + t] = A[32s + r][64kb + t]`.
///
/// Read in place, a 16-row tile of A has a row stride of n bytes: at n = 2048 or 4096 its 16
/// lines fall into one or two L1 sets and evict each other, and every row is a separate page
/// at large n. Packed, each tile is 1 KiB of consecutive lines and the strip streams in order.
/// Row strip s stays at byte offset s*32n, so the driver slices strips as it would rows.
pub(super) fn pack_a(a: &[u8], n: usize) -> AlignedBytes {
    assert!(n.is_multiple_of(64) && a.len().is_multiple_of(TILE_ROWS * n));
    let lines_per_strip = TILE_ROWS * n / 64;
    // Line l of the result: strip l / lines_per_strip, then k-block, then row within the strip.
    AlignedBytes::from_lines(a.len() / 64, |l| {
        let (strip, within) = (l / lines_per_strip, l % lines_per_strip);
        let (kb, r) = (within / TILE_ROWS, within % TILE_ROWS);
        let at = (strip * TILE_ROWS + r) * n + kb * 64;
        a[at..at + 64].try_into().expect("64 bytes")
    })
}

/// Whether this process may run the kernel: the CPU has AMX-TILE and AMX-INT8, the kernel
/// granted the tile state, and a small product came out exact. Decided once per process.
pub(super) fn is_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx_int8() && request_tile_state() && self_test())
}

fn cpu_has_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
    #[allow(unused_unsafe)] // safe functions since Rust 1.87; unsafe before
    let (max_leaf, _) = unsafe { __get_cpuid_max(0) };
    if max_leaf < 7 {
        return false;
    }
    #[allow(unused_unsafe)]
    let leaf7 = unsafe { __cpuid_count(7, 0) };
    let amx_tile = leaf7.edx & (1 << 24) != 0;
    let amx_int8 = leaf7.edx & (1 << 25) != 0;
    amx_tile && amx_int8
}

#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted xsave
    // features; it reads and writes no memory of ours.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

/// Only Linux's permission protocol is implemented; elsewhere the kernel is not offered.
#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// One 32x32 product with k = 128 against the plain dot product, with extreme values in it, so
/// that an emulator or hypervisor that gets `tdpbssd` wrong turns the kernel off instead of
/// producing wrong results.
fn self_test() -> bool {
    const K: usize = 128;
    let a: Vec<u8> = (0..TILE_ROWS * K).map(|i| (i * 37 + 11) as u8).collect();
    let b: Vec<i8> = (0..K * TILE_COLS)
        .map(|i| if i % 7 == 0 { -128 } else { (i * 91 + 5) as u8 as i8 })
        .collect();
    let mut panel = vec![0u8; K * TILE_COLS];
    for q in 0..K / 4 {
        for lane in 0..TILE_COLS {
            for t in 0..4 {
                panel[q * 128 + lane * 4 + t] = b[(4 * q + t) * TILE_COLS + lane] as u8;
            }
        }
    }
    let mut out = [[0i32; TILE_COLS]; TILE_ROWS];
    let packed = pack_a(&a, K);
    // SAFETY: only called from `is_available` after the CPU check and the permission request
    // succeeded (it cannot call `is_available` itself: that is still being decided).
    let session = unsafe { TileSession::start_unchecked() };
    tile(&session, packed.as_slice(), K, &panel, &mut out, &mut |_, _| {});
    drop(session);
    (0..TILE_ROWS).all(|i| {
        (0..TILE_COLS).all(|j| {
            let want: i32 = (0..K)
                .map(|k| i32::from(a[i * K + k] as i8) * i32::from(b[k * TILE_COLS + j]))
                .sum();
            out[i][j] == want
        })
    })
}

/// The 32x32 tile over the whole k range: per 64 k, two loads of A (rows 0-15 and 16-31 of the
/// packed strip's k-block), two of B (columns 0-15 and 16-31 of the panel: the packed k-quads
/// are 128 bytes apart, each half 64 bytes, exactly a B tile's rows in AMX's layout) and four
/// `tdpbssd`, loads placed just before their first use.
///
/// `between(step, steps)` is called after each of the `steps = n/64` k-steps has been issued.
/// The tile unit works through them on its own, so the core's vector units are idle meanwhile:
/// the driver spreads the previous tile's epilogue over these calls. Measured on the project's
/// machine, that recovers most of what running the epilogue after the tile costs (40% -> 51% of
/// the register-only rate at n = 1024; issuing the next tile first and mixing afterwards, and
/// relying on out-of-order execution to overlap them, recovered nothing).
///
/// `session` proves the tiles are configured on this thread. `rows` is one strip of [`pack_a`]
/// (32n signed bytes), `panel` 32n packed bytes, `out` 32 rows; n is a multiple of 64.
pub(super) fn tile(
    _session: &TileSession,
    rows: &[u8],
    n: usize,
    panel: &[u8],
    out: &mut [[i32; TILE_COLS]],
    between: &mut dyn FnMut(usize, usize),
) {
    assert!(rows.len() == TILE_ROWS * n && panel.len() == TILE_COLS * n && out.len() == TILE_ROWS);
    assert!(n > 0 && n.is_multiple_of(64), "n={n} is not a positive multiple of 64");
    let steps = n / 64;
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
    for step in 0..steps {
        // One k-block of the strip is 32 rows x 64 bytes, and 64 k of the panel is 16 k-quads
        // of 128 bytes: both 2 KiB.
        let (a, b) = (&rows[step * 2048..][..2048], &panel[step * 2048..][..2048]);
        // SAFETY: the loads read 2 KiB from each of `a` and `b` (16 rows of 64 bytes at strides
        // 64 and 128, plus the second halves at +1024 and +64), which the slices above hold.
        // The tile registers persist between asm blocks: the compiler never allocates them.
        unsafe {
            asm!(
                "tileloadd tmm4, [{a} + {lda}*1]",
                "tileloadd tmm6, [{b} + {ldb}*1]",
                "tdpbssd tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b} + {ldb}*1 + 64]",
                "tdpbssd tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a} + {lda}*1 + 1024]",
                "tdpbssd tmm2, tmm5, tmm6",
                "tdpbssd tmm3, tmm5, tmm7",
                a = in(reg) a.as_ptr(),
                lda = in(reg) 64usize,
                b = in(reg) b.as_ptr(),
                ldb = in(reg) 4 * TILE_COLS,
                options(nostack, readonly),
            );
        }
        between(step, steps);
    }
    let c = out.as_mut_ptr().cast::<i32>();
    // SAFETY: C writes 32 rows of 128 bytes, which `out` holds (asserted above).
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

/// What `tdpbssd` alone reaches on this core: `iterations` rounds of four independent
/// `tdpbssd` on tiles that never leave the registers, as operations (2 per multiply-add) per
/// second. The ceiling the kernel is measured against; None without AMX.
///
/// The operand tiles hold pseudo-random bytes, as real matrices do: on zeroed tiles `tdpbssd`
/// ran up to about 10% faster on the project's machine, a ceiling no real product reaches.
pub(in crate::gemm) fn register_peak(iterations: u64) -> Option<f64> {
    if !is_available() {
        return None;
    }
    let operands = AlignedBytes::from_lines(64, |l| {
        std::array::from_fn(|t| ((l * 64 + t) as u32).wrapping_mul(0x9E37_79B1).to_le_bytes()[3])
    });
    let tiles = TileSession::start();
    // SAFETY: tiles are configured on this thread (`tiles` lives until after the loop); the
    // loads read 4 tiles of 1 KiB, exactly the 4 KiB of `operands`.
    unsafe {
        asm!(
            "tileloadd tmm4, [{p} + {stride}*1]",
            "tileloadd tmm5, [{p} + {stride}*1 + 1024]",
            "tileloadd tmm6, [{p} + {stride}*1 + 2048]",
            "tileloadd tmm7, [{p} + {stride}*1 + 3072]",
            p = in(reg) operands.as_slice().as_ptr(),
            stride = in(reg) 64usize,
            options(nostack, readonly),
        );
    }
    let start = std::time::Instant::now();
    // SAFETY: as above; the loop touches no memory.
    unsafe {
        asm!(
            "2:",
            "tdpbssd tmm0, tmm4, tmm6",
            "tdpbssd tmm1, tmm4, tmm7",
            "tdpbssd tmm2, tmm5, tmm6",
            "tdpbssd tmm3, tmm5, tmm7",
            "dec {i}",
            "jnz 2b",
            i = inout(reg) iterations.max(1) => _,
            options(nostack, nomem),
        );
    }
    let seconds = start.elapsed().as_secs_f64();
    drop(tiles);
    Some(iterations.max(1) as f64 * 4.0 * (16 * 16 * 64) as f64 * 2.0 / seconds)
}
