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

#[cfg(test)]
mod emulated;
mod peak;
mod unit;

pub(in crate::gemm) use peak::register_peak;
pub(in crate::gemm) use unit::TileSession;

use super::{KernelKind, Streamed, Sums, TileOperands};
use crate::aligned::AlignedBytes;
use crate::gemm::TILE_COLS;
use std::ops::Range;
use std::sync::OnceLock;
use unit::{TileUnit, Tmm};

/// Rows of A per tile: two 16-row AMX tiles.
pub(super) const TILE_ROWS: usize = 32;

/// A rearranged into strips of 32 rows, and inside each strip into k-blocks of 32 rows x 64
/// bytes (2 KiB, one after the other): `[s*32n + kb*2048 + r*64 + t] = A[32s + r][64kb + t]`.
///
/// Read in place, a 16-row tile of A has a row stride of n bytes: at n = 2048 or 4096 its 16
/// lines fall into one or two L1 sets and evict each other, and every row is a separate page
/// at large n. Packed, each tile is 1 KiB of consecutive lines and the strip streams in order.
/// Row strip s stays at byte offset s*32n, so the driver slices strips as it would rows.
pub(super) fn pack_a(a: &[u8], n: usize) -> AlignedBytes {
    let mut packed = AlignedBytes::zeroed(a.len());
    pack_a_into(a, n, packed.as_mut_slice());
    packed
}

/// [`pack_a`] into `out`, `a.len()` bytes, every one of which it overwrites.
pub(super) fn pack_a_into(a: &[u8], n: usize, out: &mut [u8]) {
    assert!(n.is_multiple_of(64) && a.len().is_multiple_of(TILE_ROWS * n) && out.len() == a.len());
    // The lines in the result's order: strips, then k-blocks, then rows within the strip (a
    // division per line to find its source cost as much as the copy).
    let mut lines = out.chunks_exact_mut(64);
    for strip in a.chunks_exact(TILE_ROWS * n) {
        for kb in 0..n / 64 {
            for r in 0..TILE_ROWS {
                let line = lines.next().expect("as many lines as A has");
                line.copy_from_slice(&strip[r * n + kb * 64..][..64]);
            }
        }
    }
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

/// A 32x32 product with k = 192 against the plain dot product, with extreme values in it, so
/// that an emulator or hypervisor that gets `tdpbssd` wrong turns the kernel off instead of
/// producing wrong results. It walks k in three blocks of 64, so the three ways a block's sums
/// start (zero, in place, carried) and the loads and stores of the sums are checked as well,
/// and each block with another form of the k-step's loads (plain, and T1-hinted on A or B).
fn self_test() -> bool {
    // SAFETY: only called from `is_available` after the CPU check and the permission request
    // succeeded (it cannot call `is_available` itself: that is still being decided).
    let session = unsafe { TileSession::start_unchecked() };
    let exact = self_test_on(&mut Tmm { _configured: &session });
    drop(session);
    exact
}

fn self_test_on(unit: &mut impl TileUnit) -> bool {
    const K: usize = 192;
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
    let packed = pack_a(&a, K);
    let (mut partial, mut out) = ([[0i32; TILE_COLS]; TILE_ROWS], [[0i32; TILE_COLS]; TILE_ROWS]);
    let none = &mut |_, _| {};
    let strip = packed.as_slice();
    // Each pass loads with another of the step's three forms (no hint, A streamed, B streamed),
    // so every load instruction the kernel runs is checked on this unit.
    let pass = |k: Range<usize>, streamed| TileOperands {
        streamed,
        ..operands(strip, K, &panel, k)
    };
    tile_on(unit, pass(0..64, Streamed::Neither), Sums::Fresh(&mut partial), none);
    // Cleared between passes, as another strip's pass would in the driver: the later passes
    // must reload their sums, or they come out wrong.
    unit.zero_sums();
    tile_on(unit, pass(64..128, Streamed::A), Sums::Add(&mut partial), none);
    unit.zero_sums();
    let last = Sums::Carried {
        carry: &partial,
        out: &mut out,
    };
    tile_on(unit, pass(128..K, Streamed::B), last, none);
    (0..TILE_ROWS).all(|i| {
        (0..TILE_COLS).all(|j| {
            let want: i32 = (0..K)
                .map(|k| i32::from(a[i * K + k] as i8) * i32::from(b[k * TILE_COLS + j]))
                .sum();
            out[i][j] == want
        })
    })
}

/// How much of k one pass over a tile takes, unless [`K_BLOCK_ENV`](super::K_BLOCK_ENV) says
/// otherwise. Per pass, a 32-column panel's block of B (32 KiB) is read by every strip of the
/// task's rows, so it can stay in L1 (48 KiB on Sapphire Rapids) while the strips' blocks of A
/// stream from L2; the sums are stored and reloaded once per pass (8 tile moves per 64 tile
/// loads). Unblocked, each tile streams both its A strip and its B panel (32n bytes each) from
/// L2. n <= 1024 is one pass. Swept on a 2-thread AMX Xeon (2026-11-27, with tasks already
/// within L2, [`TASK_A_BYTES`]): 1024 and one pass were level at n = 1024-8192, 512 and 256
/// slower (each pass ends in a store and reload of the sums after the tile unit drains).
pub(in crate::gemm) const K_BLOCK: usize = 1024;

/// The most of A one task takes: half of the 2 MiB L2 of every CPU with AMX so far, so that a
/// task's rows stay in L2 while every panel of B passes over them, beside the panel and the
/// output. A task reads its rows once per panel: from L3 they were the limit at n >= 4096. On
/// a 2-thread Xeon, tasks of 1 MiB instead of 2 (n = 4096) and 4 (8192) took the kernel from
/// 2.7-2.8 to 3.6-3.8 TOPS at n = 4096 and from 2.0-2.1 to 3.2-3.4 at 8192; n <= 2048, whose
/// tasks were already that small on 2 threads, did not change. The vector kernels do not take
/// it: the same cap cost avx512-vnni 10% at n = 8192.
pub(in crate::gemm) const TASK_A_BYTES: usize = 1 << 20;

/// The 32x32 tile over the span `ops.k` of k: the sums start as `sums` says, then per 64 of k two
/// loads of A (rows 0-15 and 16-31 of the packed strip's k-block), two of B (columns 0-15 and
/// 16-31 of the panel: the packed k-quads are 128 bytes apart, each half 64 bytes, exactly a B
/// tile's rows in AMX's layout) and four `tdpbssd`.
///
/// `between(step, steps)` is called after each of the span's `steps` k-steps has been issued.
/// The tile unit works through them on its own, so the core's vector units are idle meanwhile:
/// the driver spreads the previous tile's epilogue over these calls. Measured on the project's
/// machine, that recovers most of what running the epilogue after the tile costs (40% -> 51% of
/// the register-only rate at n = 1024; issuing the next tile first and mixing afterwards, and
/// relying on out-of-order execution to overlap them, recovered nothing). `between` is a generic
/// closure, not a `dyn` one, and this function and [`tile_on`] are inlined into the driver's
/// pass, so that the side work compiles into the k-step loop instead of behind two indirect
/// calls a step: paired on the project's 2-vCPU AMX Xeon (2026-11-29, six pairs), 1.11x at
/// n = 1024 and 1.08x at 2048.
///
/// `session` proves the tiles are configured on this thread. `ops.rows` is one strip of
/// [`pack_a`] (32n signed bytes), `ops.panel` 32n packed bytes, both over the whole of k.
#[inline(always)]
pub(super) fn tile(
    session: &TileSession,
    ops: TileOperands<'_>,
    sums: Sums<'_>,
    between: &mut impl FnMut(usize, usize),
) {
    tile_on(&mut Tmm { _configured: session }, ops, sums, between);
}

/// The operands of a tile call, spelled out (no cache hint: the emulator and the self-test
/// compute the same either way, and the self-test's operands fit in L1).
fn operands<'a>(rows: &'a [u8], n: usize, panel: &'a [u8], k: Range<usize>) -> TileOperands<'a> {
    TileOperands {
        rows,
        panel,
        bias_correction: &[0; TILE_COLS],
        n,
        k,
        streamed: Streamed::Neither,
    }
}

#[inline(always)]
fn tile_on(unit: &mut impl TileUnit, ops: TileOperands<'_>, sums: Sums<'_>, between: &mut impl FnMut(usize, usize)) {
    ops.check(KernelKind::Amx);
    let TileOperands {
        rows,
        panel,
        k,
        streamed,
        ..
    } = ops;
    let out: &mut [[i32; TILE_COLS]; TILE_ROWS] = match sums {
        Sums::Fresh(out) => {
            unit.zero_sums();
            out.try_into().expect("the sums are 32 rows")
        }
        Sums::Add(out) => {
            let out: &mut [[i32; TILE_COLS]; TILE_ROWS] = out.try_into().expect("the sums are 32 rows");
            unit.load_sums(out);
            out
        }
        Sums::Carried { carry, out } => {
            unit.load_sums(carry.try_into().expect("the carried sums are 32 rows"));
            out.try_into().expect("the sums are 32 rows")
        }
    };
    // One k-block of the strip is 32 rows x 64 bytes, and 64 k of the panel is 16 k-quads of
    // 128 bytes: both 2 KiB, so the span is the same byte range of each.
    let span = k.start / 64 * 2048..k.end / 64 * 2048;
    let (a, b) = (&rows[span.clone()], &panel[span]);
    // One loop per form of the loads, so that the step's form is not chosen again every step.
    match streamed {
        Streamed::Neither => k_steps(unit, a, b, Streamed::Neither, between),
        Streamed::A => k_steps(unit, a, b, Streamed::A, between),
        Streamed::B => k_steps(unit, a, b, Streamed::B, between),
    }
    unit.store_sums(out);
}

/// The k-steps over `a` and `b` (whole steps of 2 KiB each), `between` after each.
#[inline(always)]
fn k_steps(unit: &mut impl TileUnit, a: &[u8], b: &[u8], streamed: Streamed, between: &mut impl FnMut(usize, usize)) {
    let steps = a.len() / 2048;
    for (i, (a, b)) in a.chunks_exact(2048).zip(b.chunks_exact(2048)).enumerate() {
        unit.step(a.try_into().expect("2 KiB"), b.try_into().expect("2 KiB"), streamed);
        between(i, steps);
    }
}

/// The kernel's schedule on an emulator of the AMX instructions it uses, so that it is checked
/// on every CPU; on AMX hardware the same schedule runs in [`self_test`] on the real unit.
#[cfg(test)]
mod tests {
    use super::emulated::Emulated;
    use super::*;
    use crate::gemm::{PackedB, naive};
    use crate::matrix::generate;

    /// The layout as the driver rebuilds it every product, into a buffer a larger A left
    /// dirty: every byte where [`pack_a`]'s definition puts it (on any CPU: no AMX needed).
    #[test]
    fn pack_a_into_a_dirty_buffer_overwrites_every_byte() {
        let n = 192;
        let a: Vec<u8> = (0..2 * TILE_ROWS * n).map(|i| (i * 37 + i / 7) as u8).collect();
        let mut scratch = AlignedBytes::zeroed(0);
        scratch.reuse(3 * a.len()).fill(0xA5);
        let packed = scratch.reuse(a.len());
        pack_a_into(&a, n, packed);
        for strip in 0..2 {
            for kb in 0..n / 64 {
                for r in 0..TILE_ROWS {
                    let at = strip * TILE_ROWS * n + kb * 2048 + r * 64;
                    let src = (strip * TILE_ROWS + r) * n + kb * 64;
                    assert_eq!(
                        &packed[at..at + 64],
                        &a[src..src + 64],
                        "strip {strip} k-block {kb} row {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_self_test_passes_on_the_emulated_unit() {
        assert!(self_test_on(&mut Emulated::new()));
    }

    /// Every 32x32 tile of an n = 256 product, its k walked in uneven blocks (64, 128, 64) in
    /// the driver's order (blocks of k outer, strips inner, so each pass starts on another
    /// strip's sums and must reload its own), and once whole: each equals the oracle's.
    #[test]
    fn blocked_tiles_match_the_oracle() {
        let n = 256;
        let (a, b) = (generate(&[3; 32], 1, n), generate(&[3; 32], 2, n));
        let want = naive::product(&a, &b);
        let packed_a = pack_a(a.as_bytes(), n);
        let packed_b = PackedB::new(&b);
        let mut unit = Emulated::new();
        let none = &mut |_: usize, _: usize| {};
        let strips = n / TILE_ROWS;
        let strip_rows = |s: usize| &packed_a.as_slice()[s * TILE_ROWS * n..][..TILE_ROWS * n];
        for panel in 0..n / TILE_COLS {
            let panel_bytes = packed_b.panel(panel);
            let mut partial = vec![[[7i32; TILE_COLS]; TILE_ROWS]; strips];
            let mut blocked = vec![[[-1i32; TILE_COLS]; TILE_ROWS]; strips];
            for (s, sums) in partial.iter_mut().enumerate() {
                tile_on(
                    &mut unit,
                    operands(strip_rows(s), n, panel_bytes, 0..64),
                    Sums::Fresh(sums),
                    none,
                );
            }
            for (s, sums) in partial.iter_mut().enumerate() {
                tile_on(
                    &mut unit,
                    operands(strip_rows(s), n, panel_bytes, 64..192),
                    Sums::Add(sums),
                    none,
                );
            }
            for (s, (carry, out)) in partial.iter().zip(&mut blocked).enumerate() {
                let last = Sums::Carried { carry, out };
                tile_on(&mut unit, operands(strip_rows(s), n, panel_bytes, 192..n), last, none);
            }
            for (s, blocked) in blocked.iter().enumerate() {
                let mut whole = [[0i32; TILE_COLS]; TILE_ROWS];
                let ops = operands(strip_rows(s), n, panel_bytes, 0..n);
                tile_on(&mut unit, ops, Sums::Fresh(&mut whole), none);
                for (i, (whole_row, blocked_row)) in whole.iter().zip(blocked).enumerate() {
                    let row = s * TILE_ROWS + i;
                    let oracle = &want[row * n + panel * TILE_COLS..][..TILE_COLS];
                    assert_eq!(whole_row.as_slice(), oracle, "row {row}, panel {panel}, whole k");
                    assert_eq!(blocked_row.as_slice(), oracle, "row {row}, panel {panel}, blocked k");
                }
            }
        }
    }

    /// A pass that adds to carried sums must load them: with the load left out (the unit's
    /// sums cleared instead), the self-test fails. This is what keeps the self-test able to
    /// catch a tile load that a CPU or hypervisor gets wrong.
    #[test]
    fn the_self_test_fails_when_the_sums_are_not_reloaded() {
        struct NoReload(Emulated);
        impl TileUnit for NoReload {
            fn zero_sums(&mut self) {
                self.0.zero_sums()
            }
            fn load_sums(&mut self, _: &[[i32; TILE_COLS]; TILE_ROWS]) {
                self.0.zero_sums()
            }
            fn store_sums(&mut self, c: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
                self.0.store_sums(c)
            }
            fn step(&mut self, a: &[u8; 2048], b: &[u8; 2048], streamed: Streamed) {
                self.0.step(a, b, streamed)
            }
        }
        assert!(!self_test_on(&mut NoReload(Emulated::new())));
    }

    /// The self-test runs each form of the k-step's loads: a unit that gets any one of them
    /// wrong (here, loading zeros for B under that hint) fails it.
    #[test]
    fn the_self_test_checks_every_form_of_the_step() {
        struct WrongUnder(Emulated, Streamed);
        impl TileUnit for WrongUnder {
            fn zero_sums(&mut self) {
                self.0.zero_sums()
            }
            fn load_sums(&mut self, c: &[[i32; TILE_COLS]; TILE_ROWS]) {
                self.0.load_sums(c)
            }
            fn store_sums(&mut self, c: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
                self.0.store_sums(c)
            }
            fn step(&mut self, a: &[u8; 2048], b: &[u8; 2048], streamed: Streamed) {
                let zeros = [0u8; 2048];
                self.0.step(a, if streamed == self.1 { &zeros } else { b }, streamed)
            }
        }
        for form in [Streamed::Neither, Streamed::A, Streamed::B] {
            assert!(!self_test_on(&mut WrongUnder(Emulated::new(), form)), "{form:?}");
        }
    }

    /// The side-work hook is offered once per k-step of the span, numbered from 0.
    #[test]
    fn between_is_called_once_per_step_of_the_span() {
        let n = 512;
        let (rows, panel) = (vec![1u8; TILE_ROWS * n], vec![1u8; TILE_COLS * n]);
        let mut calls = Vec::new();
        let mut out = [[0i32; TILE_COLS]; TILE_ROWS];
        let sums = Sums::Fresh(&mut out);
        tile_on(
            &mut Emulated::new(),
            operands(&rows, n, &panel, 128..384),
            sums,
            &mut |i, of| calls.push((i, of)),
        );
        assert_eq!(calls, (0..4).map(|i| (i, 4)).collect::<Vec<_>>());
        assert!(out.iter().flatten().all(|&v| v == 256), "256 products of 1 x 1");
    }
}
