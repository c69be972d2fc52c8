//! What a pool's fill costs in chain operations (PROTOCOL.md 18.6 step 5).
//!
//! The fill is the chain pipeline at n = 256 (an entry is one 256 x 256 matrix), and a kernel
//! runs far below its rate at a challenge's n there: with a K loop of 256, each tile's loads and
//! its mix epilogue weigh as much as its matrix instructions. So one fill operation is timed as
//! `fill_weight` operations of the class's rate. Measured on an NVIDIA H200 (BENCHMARKS.md,
//! 2026-11-26), fill rate against the same kernel's rate at n = 2048:
//! - wgmma: 238 to 241 TOPS against 894 to 904, 3.7 to 3.8 times slower;
//! - TMA: 213 to 214 against 948, 4.4 times; on 2026-11-29, 209 to 210 against 957, 4.6 times;
//! - tensor: 214 against 612, 2.9 times;
//! - tiled: 75 at n = 256 against 84 at n = 2048 (chains, not a fill), 1.1 times;
//! - the CPU's AMX kernel (2 threads, this project's machine): a fill at 2.6 to 2.7 TOPS against
//!   3.0 for chains at n = 256, the CPU challenge's own size, 1.2 times.
//!
//! Each weight sits just above its measurement, so an honest host's fill fits its budget. The
//! weight is also what makes a version 3 pass teach its class's rate: the share of the class's
//! rate a verdict proves counts the fill at this weight ([`crate::throughput`]), so a class
//! learned from passes with pools has the rate its chains run at, not one diluted by the slower
//! fill. The weight is a budget, not a proof: the proven rate counts each fill operation once.

/// The weight of the fill for a claim on `backend` with `kernel`: chain operations at the
/// class's rate per fill operation. The table is normative (PROTOCOL.md 18.6): validators that
/// share rate files must count the fill alike.
pub fn fill_weight(backend: &str, kernel: &str) -> f64 {
    match (backend, kernel) {
        ("cpu", _) => 1.25,
        ("cuda", "tiled") => 1.25,
        ("cuda", "tensor") => 3.0,
        ("cuda", "wgmma") => 4.0,
        ("cuda", "tma") => 4.75,
        // A backend or kernel this table does not know yet (pingpong and multicast among them:
        // their fill was never measured): the largest measured weight, tma's, so that an
        // unmeasured kernel's honest fill is not given less time than the slowest measured one.
        _ => 4.75,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::memory::FillWork;

    /// Every weight covers the slowdown measured for its kernel, with the margin above it small
    /// enough that a pass still times the chains: within 15% of the measurement.
    #[test]
    fn each_weight_covers_its_measured_fill_with_a_small_margin() {
        for (backend, kernel, measured) in [
            ("cuda", "wgmma", 904.0 / 238.0),
            ("cuda", "tma", 948.0 / 213.0),
            ("cuda", "tma", 956.9 / 208.9),
            ("cuda", "tensor", 612.0 / 214.0),
            ("cuda", "tiled", 84.0 / 75.0),
            ("cpu", "amx", 3.04 / 2.60),
        ] {
            let weight = fill_weight(backend, kernel);
            assert!(
                weight >= measured && weight <= measured * 1.15,
                "{backend} {kernel}: weight {weight} against a measured {measured:.2}"
            );
        }
        assert_eq!(
            fill_weight("cpu", "avx2"),
            fill_weight("cpu", "amx"),
            "one weight for every CPU kernel"
        );
        assert_eq!(fill_weight("cuda", "a-kernel-from-the-future"), 4.75);
        assert_eq!(fill_weight("cuda", "pingpong"), fill_weight("cuda", "tma"));
    }

    #[test]
    fn no_fill_weighs_nothing() {
        assert_eq!(FillWork::NONE.weighted_ops(), 0.0);
        assert_eq!(FillWork { ops: 3.0, weight: 4.0 }.weighted_ops(), 12.0);
    }
}
