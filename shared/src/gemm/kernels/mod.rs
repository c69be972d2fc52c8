//! The CPU kernels: each computes one register tile, `tile[r][c] = sum_k a[r][k] * b[k][c]`, for
//! `tile_rows()` rows of A and one 32-column packed panel of B, over the whole k range or, for
//! the kernels that take k in blocks ([`KernelKind::takes_k_blocks`]), over one span of it with
//! the sums carried from the span before ([`Sums`]).
//!
//! Every kernel is exact (bit-identical to the naive oracle); they differ only in speed and in
//! which CPUs run them. [`KernelKind::ALL`] lists them fastest first, and the default is the
//! first one this CPU (and operating system) runs.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512_vnni;
#[cfg(target_arch = "x86_64")]
mod avx_vnni;
mod portable;
#[cfg(target_arch = "x86_64")]
mod vnni_pack;

use super::TILE_COLS;
use crate::aligned::AlignedBytes;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use thiserror::Error;

/// The environment variable that forces a kernel by name, over any configuration: tests and
/// operators use it to run a whole daemon on one kernel.
pub const KERNEL_ENV: &str = "GPU_ATTEST_CPU_KERNEL";

/// The environment variable that sets how much of k the kernels that block k take per pass (a
/// positive multiple of 64; "auto" or empty for the kernel's default). A tuning knob for
/// benchmarks: every block size gives the same, exact, result.
pub const K_BLOCK_ENV: &str = "GPU_ATTEST_CPU_K_BLOCK";

/// The environment variable that turns the kernels' cache hints off ("off"; "auto" or empty:
/// on). A tuning knob for benchmarks, to measure what the hints buy: they change where data is
/// cached, never the result.
pub const CACHE_HINTS_ENV: &str = "GPU_ATTEST_CPU_CACHE_HINTS";

/// Which operand of a tile call the driver will not read again before the other operand fills
/// L1 many times over, so that its loads should not displace the other one from L1. A hint: it
/// changes where data is cached, never the result. The AMX kernel loads the streamed operand
/// with `tileloaddt1` (the SDM: "data would be reused but does not need to be resident in the
/// nearest cache levels"); the vector kernels take no hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Streamed {
    /// The pass's operands fit in L1 together: load both normally.
    Neither,
    /// The rows of A: the panel's block of B is re-read by the next strip of rows, the strip's
    /// block of A only at the next panel.
    A,
    /// The panel of B: a task of one strip walks the panels with the same rows of A.
    B,
}

/// Where a tile's sums start, and where they go. The driver walks k in blocks for the kernels
/// that take them; each block's partial sums are carried into the next.
pub(super) enum Sums<'a> {
    /// `out = A * B` over the span: the first (or only) block.
    Fresh(&'a mut [[i32; TILE_COLS]]),
    /// `out += A * B` over the span, in place: a middle block.
    Add(&'a mut [[i32; TILE_COLS]]),
    /// `out = carry + A * B` over the span: the last block, whose finished tile goes to the
    /// epilogue's buffer while the carried sums stay where they are.
    Carried {
        carry: &'a [[i32; TILE_COLS]],
        out: &'a mut [[i32; TILE_COLS]],
    },
}

/// What one tile call multiplies: `rows`, some rows of A in a kernel's layout (see
/// [`KernelKind::prepare_a`]), and `panel`, one packed panel of B (widened to i16 for the
/// kernels whose [`KernelKind::b_element_bytes`] is 2), both over the whole of k, of
/// size n; `bias_correction`, the panel's `-128 * column_sum(B)`, where the `vpdpbusd` kernels,
/// which multiply *unsigned* A and so read it biased by +128, start their sums (the others
/// ignore it); `k`, the span of k this call covers (`0..n` for one pass); and `streamed`, the
/// operand the driver re-reads last (a cache hint).
pub(super) struct TileOperands<'a> {
    pub(super) rows: &'a [u8],
    pub(super) panel: &'a [u8],
    pub(super) bias_correction: &'a [i32; TILE_COLS],
    pub(super) n: usize,
    pub(super) k: Range<usize>,
    pub(super) streamed: Streamed,
}

impl TileOperands<'_> {
    /// Panics unless the operands are `tile_rows` rows of the kernel's bytes per element of A
    /// and one panel of its bytes per element of B, over a positive multiple of 64, and `k` is
    /// whole blocks of 64 inside it: the kernels read exactly these bytes, so every unsafe load
    /// in them rests on this check.
    pub(super) fn check(&self, kernel: KernelKind) {
        let (n, k) = (self.n, &self.k);
        assert!(n > 0 && n.is_multiple_of(64), "n={n} is not a positive multiple of 64");
        let a_row = n * kernel.a_element_bytes();
        assert_eq!(self.rows.len(), kernel.tile_rows() * a_row, "rows of A");
        assert_eq!(self.panel.len(), TILE_COLS * n * kernel.b_element_bytes(), "panel of B");
        assert!(
            k.start < k.end && k.end <= n && k.start.is_multiple_of(64) && k.end.is_multiple_of(64),
            "k span {k:?} is not whole 64-blocks of 0..{n}"
        );
    }

    /// Whether the call covers the whole of k.
    pub(super) fn whole(&self) -> bool {
        self.k == (0..self.n)
    }
}

/// Where a `vpdpbusd` tile's accumulators start: at the panel's bias correction (the first or
/// only block of k: the correction is of the whole of k, so it is added once), at the sums
/// already in the output (a middle block), or at carried sums (the last block).
#[cfg(target_arch = "x86_64")]
pub(super) enum VnniStart<'a> {
    Bias(&'a [i32; TILE_COLS]),
    Out,
    Carry(&'a [[i32; TILE_COLS]]),
}

impl<'a> Sums<'a> {
    /// A `vpdpbusd` tile's start and its output, for a panel of `bias_correction`.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn vnni(self, bias_correction: &'a [i32; TILE_COLS]) -> (VnniStart<'a>, &'a mut [[i32; TILE_COLS]]) {
        match self {
            Sums::Fresh(out) => (VnniStart::Bias(bias_correction), out),
            Sums::Add(out) => (VnniStart::Out, out),
            Sums::Carried { carry, out } => (VnniStart::Carry(carry), out),
        }
    }

    /// The rows the result goes to.
    pub(super) fn out_rows(&self) -> usize {
        match self {
            Sums::Fresh(out) | Sums::Add(out) => out.len(),
            Sums::Carried { carry, out } => {
                assert_eq!(carry.len(), out.len(), "carried sums and output differ in rows");
                out.len()
            }
        }
    }

    /// For a kernel that adds into memory: `out` holding the span's starting sums (zero, the
    /// sums already there, or the carried ones), ready for the span's products to be added.
    pub(super) fn start(self) -> &'a mut [[i32; TILE_COLS]] {
        match self {
            Sums::Fresh(out) => {
                out.fill([0; TILE_COLS]);
                out
            }
            Sums::Add(out) => out,
            Sums::Carried { carry, out } => {
                out.copy_from_slice(carry);
                out
            }
        }
    }
}

/// Which inner loop computes the tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// AMX-INT8 `tdpbssd`: 16x16x64 tiles, signed x signed.
    Amx,
    /// `vpdpbusd` on 512-bit registers: 64 multiply-adds per instruction.
    Avx512Vnni,
    /// `vpdpbusd` on 256-bit registers (VEX-encoded AVX-VNNI).
    AvxVnni,
    /// `vpmaddwd` on bytes widened to 16 bits: exact without VNNI.
    Avx2,
    /// Plain Rust over the same packed layout; the compiler vectorises what it can.
    Portable,
}

impl fmt::Display for KernelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("unknown CPU kernel {given:?}; the kernels are {}", KernelKind::names())]
pub struct UnknownKernel {
    pub given: String,
}

impl FromStr for KernelKind {
    type Err = UnknownKernel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        KernelKind::ALL
            .into_iter()
            .find(|k| k.name() == wanted)
            .ok_or_else(|| UnknownKernel { given: s.to_string() })
    }
}

impl KernelKind {
    /// Fastest first.
    pub const ALL: [KernelKind; 5] = [
        KernelKind::Amx,
        KernelKind::Avx512Vnni,
        KernelKind::AvxVnni,
        KernelKind::Avx2,
        KernelKind::Portable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Amx => "amx",
            KernelKind::Avx512Vnni => "avx512-vnni",
            KernelKind::AvxVnni => "avx-vnni",
            KernelKind::Avx2 => "avx2",
            KernelKind::Portable => "portable",
        }
    }

    /// "amx, avx512-vnni, ...", for messages.
    pub fn names() -> String {
        KernelKind::ALL.map(KernelKind::name).join(", ")
    }

    /// Whether this CPU and operating system run the kernel. For AMX this also asks Linux for
    /// the tile state and runs a small self-test, once per process.
    pub fn is_available(self) -> bool {
        match self {
            KernelKind::Portable => true,
            #[cfg(target_arch = "x86_64")]
            KernelKind::Amx => amx::is_available(),
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx512Vnni => avx512_vnni::is_available(),
            #[cfg(target_arch = "x86_64")]
            KernelKind::AvxVnni => avx_vnni::is_available(),
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx2 => avx2::is_available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Why the kernel is not offered here, in words; None when it is.
    pub fn unavailable_reason(self) -> Option<&'static str> {
        if self.is_available() {
            return None;
        }
        Some(match self {
            KernelKind::Amx => {
                "needs AMX-TILE and AMX-INT8, and Linux granting the tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
            }
            KernelKind::Avx512Vnni => "needs AVX-512 F, BW and VNNI",
            KernelKind::AvxVnni => "needs AVX2 and AVX-VNNI",
            KernelKind::Avx2 => "needs AVX2",
            KernelKind::Portable => "always available",
        })
    }

    pub fn best_available() -> Self {
        Self::ALL
            .into_iter()
            .find(|k| k.is_available())
            .unwrap_or(KernelKind::Portable)
    }

    /// The kernel named by [`KERNEL_ENV`], if that variable is set and not empty or "auto".
    pub fn from_env() -> Result<Option<KernelKind>, UnknownKernel> {
        match std::env::var(KERNEL_ENV) {
            Ok(v) if !v.trim().is_empty() && !v.trim().eq_ignore_ascii_case("auto") => v.parse().map(Some),
            _ => Ok(None),
        }
    }

    /// What the kernel's register-only ceiling ([`register_peak`](super::register_peak))
    /// runs: the kernel's multiply-accumulate with nothing else in the loop. None for the
    /// portable kernel, whose instructions are the compiler's choice.
    pub fn ceiling_instructions(self) -> Option<&'static str> {
        match self {
            KernelKind::Amx => Some("tdpbssd on tiles that never touch memory"),
            KernelKind::Avx512Vnni => Some("vpdpbusd on zmm registers"),
            KernelKind::AvxVnni => Some("VEX vpdpbusd on ymm registers"),
            KernelKind::Avx2 => Some("vpmaddwd + vpaddd on ymm registers"),
            KernelKind::Portable => None,
        }
    }

    /// Rows of A per tile.
    pub(super) fn tile_rows(self) -> usize {
        match self {
            KernelKind::Portable => portable::TILE_ROWS,
            #[cfg(target_arch = "x86_64")]
            KernelKind::Amx => amx::TILE_ROWS,
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx512Vnni => avx512_vnni::TILE_ROWS,
            #[cfg(target_arch = "x86_64")]
            KernelKind::AvxVnni => avx_vnni::TILE_ROWS,
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx2 => avx2::TILE_ROWS,
            #[cfg(not(target_arch = "x86_64"))]
            _ => portable::TILE_ROWS,
        }
    }

    /// Bytes of prepared A per element of A: 2 where the kernel takes A widened to i16.
    pub(super) fn a_element_bytes(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx2 => avx2::A_ELEMENT_BYTES,
            _ => 1,
        }
    }

    /// Bytes of B's panel per element of B: 2 where the kernel takes B widened to i16
    /// ([`PackedB::widened_panels`](super::PackedB::widened_panels)).
    pub(super) fn b_element_bytes(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx2 => avx2::B_ELEMENT_BYTES,
            _ => 1,
        }
    }

    /// A in the layout this kernel reads: row-major as it is, biased by +128 in strips of k-quads
    /// for the `vpdpbusd` kernels (`vnni_pack`), in AMX strips, or widened to i16 in strips for
    /// AVX2. Either way, the
    /// rows of tile t start at byte `t * tile_rows() * n * a_element_bytes()`. A rearranged
    /// copy is built in `scratch`, whose memory the caller keeps from one product to the next.
    pub(super) fn prepare_a<'a>(self, a: &'a [u8], n: usize, scratch: &'a mut AlignedBytes) -> &'a [u8] {
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx512Vnni | KernelKind::AvxVnni => vnni_pack::pack_a_into(a, n, scratch.reuse(a.len())),
            #[cfg(target_arch = "x86_64")]
            KernelKind::Amx => amx::pack_a_into(a, n, scratch.reuse(a.len())),
            #[cfg(target_arch = "x86_64")]
            KernelKind::Avx2 => avx2::pack_a_into(a, n, scratch.reuse(a.len() * avx2::A_ELEMENT_BYTES)),
            _ => return a,
        }
        scratch.as_slice()
    }

    /// Whether `tile` takes a span of k and carried sums. The AVX2 kernel takes the whole of k
    /// at once: it blocks k inside its own loop.
    pub fn takes_k_blocks(self) -> bool {
        !matches!(self, KernelKind::Avx2)
    }

    /// Whether the kernel acts on `TileOperands::streamed`: AMX, whose tile loads have a T1
    /// form. The others ignore it.
    pub fn takes_cache_hints(self) -> bool {
        self == KernelKind::Amx
    }

    /// How much of k a pass takes by default, for the kernels that take k in blocks; None for
    /// the whole of k.
    pub(super) fn default_k_block(self) -> Option<usize> {
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelKind::Amx => Some(amx::K_BLOCK),
            _ => None,
        }
    }

    /// The most of A (in the kernel's layout) one task should take, for the kernels whose speed
    /// depends on a task's rows staying in L2; None: no limit beyond balancing the threads.
    pub(super) fn task_a_bytes(self) -> Option<usize> {
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelKind::Amx => Some(amx::TASK_A_BYTES),
            _ => None,
        }
    }

    /// What a thread must hold while it computes tiles with this kernel (AMX's tile
    /// configuration); start one per block of tiles, on the thread that computes them.
    pub(super) fn begin(self) -> KernelThread {
        KernelThread {
            #[cfg(target_arch = "x86_64")]
            amx: (self == KernelKind::Amx).then(amx::TileSession::start),
        }
    }

    /// Computes one tile of `ops` (whose span of k is the whole `0..n` unless the kernel
    /// [`takes_k_blocks`](Self::takes_k_blocks)); `ops.rows` holds `tile_rows()` rows of A in
    /// the layout of [`prepare_a`](Self::prepare_a). `sums` says where the sums start and go;
    /// `thread` comes from [`begin`](Self::begin) on this thread.
    ///
    /// `between(i, count)` is called for i = 0..count, at points where side work (the previous
    /// tile's epilogue) costs least: between AMX's k-steps, whose tile unit leaves the vector
    /// units idle; once after the tile for the vector kernels, which keep them busy. Inlined,
    /// with `between` generic, so that the AMX kernel's k-step loop and the side work it offers
    /// slots to compile into one loop in the driver (`amx::tile` says what that bought).
    #[inline(always)]
    pub(super) fn tile(
        self,
        thread: &KernelThread,
        ops: TileOperands<'_>,
        sums: Sums<'_>,
        between: &mut impl FnMut(usize, usize),
    ) {
        ops.check(self);
        assert_eq!(sums.out_rows(), self.tile_rows());
        let one_pass = ops.whole() && matches!(sums, Sums::Fresh(_));
        assert!(
            one_pass || self.takes_k_blocks(),
            "the {self} kernel takes the whole of k in one pass"
        );
        // Safety of every unsafe arm below: the kernel's CPU features were checked (the check
        // is cached, so this costs an atomic load), and the operands checked above are exactly
        // what the kernels read and write.
        assert!(
            self.is_available(),
            "the {self} kernel was selected on a CPU without it"
        );
        let TileOperands {
            rows,
            panel,
            bias_correction,
            n,
            ..
        } = ops;
        match (self, sums) {
            #[cfg(target_arch = "x86_64")]
            (KernelKind::Amx, sums) => {
                let session = thread.amx.as_ref().expect("begin() runs before the AMX kernel's tiles");
                return amx::tile(session, ops, sums, between);
            }
            (KernelKind::Portable, sums) => portable::tile(&ops, sums.start()),
            #[cfg(target_arch = "x86_64")]
            (KernelKind::Avx512Vnni, sums) => {
                let (start, out) = sums.vnni(bias_correction);
                unsafe { avx512_vnni::tile(rows, n, panel, ops.k.clone(), start, out) }
            }
            #[cfg(target_arch = "x86_64")]
            (KernelKind::AvxVnni, sums) => {
                let (start, out) = sums.vnni(bias_correction);
                unsafe { avx_vnni::tile(rows, n, panel, ops.k.clone(), start, out) }
            }
            #[cfg(target_arch = "x86_64")]
            (KernelKind::Avx2, Sums::Fresh(out)) => unsafe { avx2::tile(rows, n, panel, out) },
            _ => unreachable!("checked above: only the kernels that take k in blocks get carried sums"),
        }
        between(0, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_kernels() {
        for k in KernelKind::ALL {
            assert_eq!(k.name().parse::<KernelKind>().unwrap(), k);
        }
        assert_eq!("AVX512_VNNI".parse::<KernelKind>().unwrap(), KernelKind::Avx512Vnni);
        assert_eq!("auto".parse::<KernelChoice>().unwrap(), KernelChoice::Auto);
        assert_eq!(
            "amx".parse::<KernelChoice>().unwrap(),
            KernelChoice::Named(KernelKind::Amx)
        );
        let err = "sse9".parse::<KernelKind>().unwrap_err().to_string();
        assert!(
            err.contains("sse9") && err.contains("amx") && err.contains("portable"),
            "{err}"
        );
    }

    #[test]
    fn the_default_is_the_first_available_in_speed_order() {
        let best = KernelKind::best_available();
        assert!(best.is_available());
        let first = KernelKind::ALL.into_iter().position(|k| k == best).unwrap();
        assert!(KernelKind::ALL[..first].iter().all(|k| !k.is_available()));
    }

    /// A scratch buffer that held a larger A before (its bytes left over) gives the same
    /// layout as a fresh one: every kernel's preparation overwrites every byte it hands out.
    #[test]
    fn a_reused_scratch_buffer_prepares_the_same_a() {
        for kernel in KernelKind::ALL.into_iter().filter(|k| k.is_available()) {
            let n = 128;
            let rows = 2 * kernel.tile_rows();
            let a: Vec<u8> = (0..rows * n).map(|i| (i * 37 + i / 7) as u8).collect();
            let mut fresh = AlignedBytes::zeroed(0);
            let want = kernel.prepare_a(&a, n, &mut fresh).to_vec();
            let mut used = AlignedBytes::zeroed(0);
            used.reuse(4 * rows * n * kernel.a_element_bytes()).fill(0xA5);
            assert_eq!(kernel.prepare_a(&a, n, &mut used), want.as_slice(), "{kernel}");
        }
    }

    #[test]
    fn tiles_divide_every_supported_n() {
        for k in KernelKind::ALL {
            assert_eq!(crate::params::N_MULTIPLE as usize % k.tile_rows(), 0, "{k}");
        }
    }
}

/// The register-only rate of this thread on the kernel's own instructions
/// ([`KernelKind::ceiling_instructions`]), in operations per second; None for the portable
/// kernel or when this CPU lacks the kernel.
pub(super) fn register_peak(kernel: KernelKind, iterations: u64) -> Option<f64> {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        KernelKind::Amx => amx::register_peak(iterations),
        #[cfg(target_arch = "x86_64")]
        KernelKind::Avx512Vnni => avx512_vnni::register_peak(iterations),
        #[cfg(target_arch = "x86_64")]
        KernelKind::AvxVnni => avx_vnni::register_peak(iterations),
        #[cfg(target_arch = "x86_64")]
        KernelKind::Avx2 => avx2::register_peak(iterations),
        _ => {
            let _ = iterations;
            None
        }
    }
}

/// Times a vector kernel's ceiling loop: `run(operands, rounds)` runs `rounds` (at least 1)
/// rounds of `ops_per_round` operations on two registers' worth of pseudo-random bytes
/// (on all-zero operands a multiplier may run faster than it ever does on real matrices:
/// AMX's did, by up to 10%). Operations per second.
#[cfg(target_arch = "x86_64")]
fn time_ceiling(iterations: u64, ops_per_round: f64, run: impl FnOnce(&[u8; 128], u64)) -> f64 {
    let iterations = iterations.max(1);
    let operands: [u8; 128] = std::array::from_fn(|i| (i as u32 + 1).wrapping_mul(0x9E37_79B1).to_le_bytes()[3]);
    let start = std::time::Instant::now();
    run(&operands, iterations);
    iterations as f64 * ops_per_round / start.elapsed().as_secs_f64()
}

/// Per-thread kernel state, from [`KernelKind::begin`].
pub(super) struct KernelThread {
    #[cfg(target_arch = "x86_64")]
    amx: Option<amx::TileSession>,
}

/// The `cpu_kernel` setting of both daemons: `auto` (the fastest this CPU runs) or a kernel's
/// name. [`KERNEL_ENV`] overrides it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelChoice {
    #[default]
    Auto,
    Named(KernelKind),
}

impl KernelChoice {
    /// The kernel to ask [`CpuGemm`](super::CpuGemm) for: [`KERNEL_ENV`] if set, else this
    /// setting; `None` means the fastest available.
    pub fn resolve(self) -> Result<Option<KernelKind>, UnknownKernel> {
        Ok(KernelKind::from_env()?.or(match self {
            KernelChoice::Auto => None,
            KernelChoice::Named(k) => Some(k),
        }))
    }
}

impl FromStr for KernelChoice {
    type Err = UnknownKernel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("auto") {
            Ok(KernelChoice::Auto)
        } else {
            s.parse().map(KernelChoice::Named)
        }
    }
}

impl fmt::Display for KernelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelChoice::Auto => f.write_str("auto"),
            KernelChoice::Named(k) => k.fmt(f),
        }
    }
}

impl serde::Serialize for KernelChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for KernelChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
