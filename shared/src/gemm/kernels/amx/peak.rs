//! The ceiling the AMX kernel is measured against.

use super::unit::TileSession;
use crate::aligned::AlignedBytes;
use std::arch::asm;

/// What `tdpbssd` alone reaches on this core: `iterations` rounds of four independent
/// `tdpbssd` on tiles that never leave the registers, as operations (2 per multiply-add) per
/// second. The ceiling the kernel is measured against; None without AMX.
///
/// The operand tiles hold pseudo-random bytes, as real matrices do: on zeroed tiles `tdpbssd`
/// ran up to about 10% faster on the project's machine, a ceiling no real product reaches.
pub(in crate::gemm) fn register_peak(iterations: u64) -> Option<f64> {
    if !super::is_available() {
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
