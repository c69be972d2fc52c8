//! The shipped rate table: what a class is expected to do before this validator has observed
//! it, and the physical ceiling no learned rate may pass. Operators may replace it with
//! `[[rates]]` rows in the config file.

use crate::config::rates::RateEntry;
use crate::verdict::class::{RateClass, Unit, WALK_KERNEL};

/// Rate assumed for a class no row matches: deliberately low, so that the challenge is small and
/// the first verdict teaches the validator the real rate.
pub const FALLBACK_OPS_PER_SEC: f64 = 1.0e9;

/// The ceiling for a class no row gives a peak: the fastest hardware of its kind that this table
/// knows, per unit (B200 dense int8 per device; AMX-INT8 at 5 GHz per core).
pub fn backend_ceiling(unit: Unit) -> f64 {
    match unit {
        Unit::Device => 4.5e15,
        Unit::Core => AMX_PEAK_PER_CORE,
    }
}

/// Per-core ceilings are the instruction set's int8 throughput per cycle at 5 GHz, above any
/// shipping server clock: AMX `tdpbssd` 2048 ops/cycle; AVX-512 `vpdpbusd` on two ports 256;
/// 256-bit `vpdpbusd` 128; AVX2 `vpmaddwd` 64 (also the bound for the portable kernel, which
/// compilers vectorise at most that wide).
const AMX_PEAK_PER_CORE: f64 = 2048.0 * 5.0e9;

impl RateEntry {
    pub fn matches(&self, class: &RateClass) -> bool {
        let kernel_matches = if self.kernel.is_empty() {
            !class.is_walk()
        } else if self.kernel == WALK_KERNEL {
            class.is_walk()
        } else {
            self.kernel == class.kernel
        };
        self.backend == class.backend
            && kernel_matches
            && occurs(&class.model.to_lowercase(), &self.model.to_lowercase())
    }
}

/// Whether `pattern` occurs in `text`, a `#` in the pattern standing for any one ASCII digit
/// (so that one row can name every MIG profile, `mig #g.`). An empty pattern occurs anywhere.
fn occurs(text: &str, pattern: &str) -> bool {
    let (text, pattern) = (text.as_bytes(), pattern.as_bytes());
    pattern.is_empty()
        || text.windows(pattern.len()).any(|window| {
            window
                .iter()
                .zip(pattern)
                .all(|(&t, &p)| t == p || (p == b'#' && t.is_ascii_digit()))
        })
}

/// The shipped row for a class, if any matches.
pub fn row_for<'a>(rates: &'a [RateEntry], class: &RateClass) -> Option<&'a RateEntry> {
    rates.iter().find(|r| r.matches(class))
}

/// The physical ceiling per unit for a class.
pub fn peak_for(rates: &[RateEntry], class: &RateClass) -> f64 {
    rates
        .iter()
        .find(|r| r.peak_ops_per_sec > 0.0 && r.matches(class))
        .map(|r| r.peak_ops_per_sec)
        .unwrap_or_else(|| backend_ceiling(class.unit()))
}

/// GPU rows: the ceiling is the datasheet's dense int8 tensor-core figure (half the figure
/// NVIDIA prints "with sparsity"); the expected rate is half the ceiling, until this project
/// has measured its own kernels on the model (BENCHMARKS.md). More specific names come first.
const GPU_ROWS: &[(&str, f64, &str)] = &[
    (
        "B200",
        4.5e15,
        "NVIDIA HGX B200 datasheet: 72 POPS int8 with sparsity per 8 GPUs",
    ),
    (
        "H200 NVL",
        1.671e15,
        "NVIDIA H200 datasheet: 3,341 TOPS int8 with sparsity (NVL)",
    ),
    (
        "H200",
        1.979e15,
        "NVIDIA H200 datasheet: 3,958 TOPS int8 with sparsity (SXM)",
    ),
    (
        "H100 PCIe",
        1.513e15,
        "NVIDIA H100 datasheet: 3,026 TOPS int8 with sparsity (PCIe)",
    ),
    (
        "H100 NVL",
        1.671e15,
        "NVIDIA H100 datasheet: 3,341 TOPS int8 with sparsity (NVL)",
    ),
    (
        "H100",
        1.979e15,
        "NVIDIA H100 datasheet: 3,958 TOPS int8 with sparsity (SXM5)",
    ),
    ("A100", 6.24e14, "NVIDIA A100 datasheet: 1,248 TOPS int8 with sparsity"),
    ("A10", 2.5e14, "NVIDIA A10 datasheet: 500 TOPS int8 with sparsity"),
    ("L40S", 7.33e14, "NVIDIA L40S datasheet: 1,466 TOPS int8 with sparsity"),
    ("L40", 3.62e14, "NVIDIA L40 datasheet: 724 TOPS int8 with sparsity"),
    ("L4", 2.425e14, "NVIDIA L4 datasheet: 485 TOPS int8 with sparsity"),
    (
        "RTX 4090",
        6.606e14,
        "NVIDIA Ada Lovelace whitepaper: RTX 4090, 1,321.2 TOPS int8 with sparsity",
    ),
];

/// This project's portable kernel, n = 256, per core (`miner bench`, BENCHMARKS.md): the rate
/// assumed for a CPU kernel this table does not know, which is at least as fast.
const PORTABLE: f64 = 3.5e9;
const UNMEASURED_CPU: &str =
    "ceiling: the instruction set at 5 GHz; expected: the portable kernel's rate, until observed";

/// GPU memory bandwidth from the datasheets, bytes per second: (model, the slowest variant's
/// figure, the fastest variant's, source). The walk expects 0.75 of the slowest (PROTOCOL.md
/// 18.6) and is capped at the fastest. More specific names come first.
const GPU_BANDWIDTH: &[(&str, f64, f64, &str)] = &[
    ("B200", 8.0e12, 8.0e12, "NVIDIA HGX B200 datasheet: 8 TB/s per GPU"),
    // Before "H200", which its name contains.
    (
        "GH200",
        4.0e12,
        4.9e12,
        "NVIDIA GH200 datasheet: 4 TB/s (96 GB HBM3) to 4.9 TB/s (144 GB HBM3e)",
    ),
    ("H200 NVL", 4.8e12, 4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s (NVL)"),
    ("H200", 4.8e12, 4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s (SXM)"),
    ("H100 PCIe", 2.0e12, 2.0e12, "NVIDIA H100 datasheet: 2 TB/s (PCIe)"),
    ("H100 NVL", 3.9e12, 3.9e12, "NVIDIA H100 datasheet: 3.9 TB/s (NVL)"),
    ("H100", 3.35e12, 3.35e12, "NVIDIA H100 datasheet: 3.35 TB/s (SXM5)"),
    (
        "A100",
        1.555e12,
        2.039e12,
        "NVIDIA A100 datasheet: 1,555 GB/s (40GB PCIe) to 2,039 GB/s (80GB SXM)",
    ),
    ("A10", 6.0e11, 6.0e11, "NVIDIA A10 datasheet: 600 GB/s"),
    ("L40S", 8.64e11, 8.64e11, "NVIDIA L40S datasheet: 864 GB/s"),
    ("L40", 8.64e11, 8.64e11, "NVIDIA L40 datasheet: 864 GB/s"),
    ("L4", 3.0e11, 3.0e11, "NVIDIA L4 datasheet: 300 GB/s"),
    (
        "RTX 4090",
        1.008e12,
        1.008e12,
        "NVIDIA Ada Lovelace whitepaper: RTX 4090, 1,008 GB/s",
    ),
];

/// The share of the datasheet's bandwidth a walk is expected at before it is observed.
pub const WALK_SHARE_OF_DATASHEET: f64 = 0.75;

/// The walk rows: bandwidth per GPU model, and catch-alls for other GPUs and for CPUs.
fn walk_rows() -> Vec<RateEntry> {
    let walk = |backend: &str, model: &str, bytes_per_sec: f64, peak: f64, source: String| RateEntry {
        backend: backend.into(),
        kernel: WALK_KERNEL.into(),
        model: model.into(),
        ops_per_sec: bytes_per_sec,
        peak_ops_per_sec: peak,
        source,
    };
    let mut rows: Vec<RateEntry> = ["MIG #g.", "MIG #c."]
        .into_iter()
        .map(|profile| {
            walk(
                "cuda",
                profile,
                WALK_SHARE_OF_DATASHEET * 3.35e12 / 8.0,
                4.8e12,
                "memory walk of a MIG instance: expected as an H100's 1g slice (an eighth of its memory bandwidth); ceiling: a whole H200".into(),
            )
        })
        .collect();
    rows.extend(GPU_BANDWIDTH.iter().map(|&(model, slowest, fastest, source)| {
        walk(
            "cuda",
            model,
            WALK_SHARE_OF_DATASHEET * slowest,
            fastest,
            format!("memory walk: {source}; expected {WALK_SHARE_OF_DATASHEET} of it until observed"),
        )
    }));
    rows.push(walk(
        "cuda",
        "",
        2.0e11,
        8.0e12,
        "memory walk of any other CUDA GPU: a low guess, so the first verdict measures it; ceiling: a B200".into(),
    ));
    rows.push(walk(
        "cpu",
        "",
        2.0e9,
        1.0e11,
        "memory walk on the CPU, per core: a low guess (this project's walk does 23 GB/s on two AVX2 cores, BENCHMARKS.md), so the first verdict measures it; ceiling: 100 GB/s per core, above any core's reach from DRAM or L3".into(),
    ));
    rows
}

/// The table first contact is timed by: the configured `[[rates]]` rows, then the shipped ones.
pub fn rate_table(configured: &[RateEntry]) -> Vec<RateEntry> {
    configured.iter().cloned().chain(shipped_rates()).collect()
}

/// The table the validator ships with.
pub fn shipped_rates() -> Vec<RateEntry> {
    let unmeasured = "expected rate: half the ceiling, not yet measured by this project";
    // A MIG instance is named after its GPU followed by its profile (NVML: "... MIG 1g.10gb",
    // or "... MIG 1c.3g.40gb" for a compute instance), so these rows come first: a slice is not
    // the whole GPU. They match the profile, not the bare word, so that "mig" elsewhere in a
    // name does not buy a slice's rate. Expected as the smallest slice (1g, a seventh) of an
    // H100; ceiling a whole one.
    let mut rows = walk_rows();
    rows.extend(["MIG #g.", "MIG #c."].into_iter().map(|profile| RateEntry {
            backend: "cuda".into(),
            kernel: String::new(),
            model: profile.into(),
            ops_per_sec: 1.979e15 / 2.0 / 7.0,
            peak_ops_per_sec: 1.979e15,
            source: "a MIG instance of any GPU: expected as an H100's 1g slice (a seventh of the H100 row); ceiling: a whole H100".into(),
        }));
    rows.extend(GPU_ROWS.iter().map(|&(model, dense_peak, source)| RateEntry {
        backend: "cuda".into(),
        kernel: String::new(),
        model: model.into(),
        ops_per_sec: dense_peak / 2.0,
        peak_ops_per_sec: dense_peak,
        source: format!("{source}; ceiling: the dense half; {unmeasured}"),
    }));
    rows.push(RateEntry {
        backend: "cuda".into(),
        kernel: String::new(),
        model: String::new(),
        ops_per_sec: 5.0e13,
        peak_ops_per_sec: 0.0,
        source: "any other CUDA GPU: a low guess, so the first verdict measures it".into(),
    });
    let cpu = |kernel: &str, ops_per_sec: f64, ops_per_cycle: f64, source: &str| RateEntry {
        backend: "cpu".into(),
        kernel: kernel.into(),
        model: String::new(),
        ops_per_sec,
        peak_ops_per_sec: ops_per_cycle * 5.0e9,
        source: source.into(),
    };
    rows.extend([
        cpu(
            "avx512-vnni",
            1.4e11,
            256.0,
            "this project's avx512-vnni kernel, n = 256, per core (miner bench, BENCHMARKS.md)",
        ),
        cpu(
            "avx-vnni",
            8.0e10,
            128.0,
            "this project's avx-vnni kernel, n = 256, per core, slowest run (miner bench, BENCHMARKS.md)",
        ),
        cpu(
            "avx2",
            4.0e10,
            64.0,
            "this project's avx2 kernel, n = 256, per core, slowest run (miner bench, BENCHMARKS.md)",
        ),
        cpu(
            "amx",
            2.0e11,
            2048.0,
            "this project's amx kernel, n = 256, per core, slowest run (miner bench, BENCHMARKS.md)",
        ),
        cpu(
            "portable",
            PORTABLE,
            64.0,
            "this project's portable kernel, n = 256, per core (miner bench, BENCHMARKS.md)",
        ),
        cpu("", PORTABLE, 0.0, UNMEASURED_CPU),
    ]);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(backend: &str, kernel: &str, model: &str) -> RateClass {
        RateClass {
            backend: backend.into(),
            kernel: kernel.into(),
            model: model.into(),
            n: 2048,
        }
    }

    #[test]
    fn specific_models_win_over_their_prefixes() {
        let rates = shipped_rates();
        let peak = |model: &str| peak_for(&rates, &class("cuda", "tensor", model));
        assert_eq!(peak("NVIDIA H100 80GB HBM3"), 1.979e15);
        assert_eq!(peak("NVIDIA H100 PCIe"), 1.513e15);
        assert_eq!(peak("NVIDIA H200 NVL"), 1.671e15);
        assert_eq!(peak("NVIDIA A100-SXM4-80GB"), 6.24e14);
        assert_eq!(peak("NVIDIA A10"), 2.5e14);
        assert_eq!(peak("NVIDIA L40S"), 7.33e14);
        assert_eq!(peak("NVIDIA L4"), 2.425e14);
        for slice in [
            "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb",
        ] {
            let mig = row_for(&rates, &class("cuda", "tensor", slice)).unwrap();
            assert!(
                mig.model.starts_with("MIG #"),
                "a slice is not held to the whole GPU: {slice}"
            );
        }
        // The word alone is no profile: a whole GPU does not get a slice's rate by its name.
        let worded = row_for(&rates, &class("cuda", "tensor", "NVIDIA H100 80GB HBM3 (no mig)")).unwrap();
        assert_eq!(worded.model, "H100", "{worded:?}");
        assert_eq!(peak("Some Future GPU"), backend_ceiling(Unit::Device));
        let expected = row_for(&rates, &class("cuda", "tensor", "NVIDIA H100 80GB HBM3")).unwrap();
        assert_eq!(expected.ops_per_sec, 1.979e15 / 2.0);
    }

    #[test]
    fn a_cpu_named_like_a_gpu_gets_cpu_rates() {
        // The backend decides first: a CPU miner cannot borrow a GPU row by its device name.
        let rates = shipped_rates();
        let fake = class("cpu", "portable", "NVIDIA H100");
        assert_eq!(row_for(&rates, &fake).unwrap().ops_per_sec, 3.5e9);
        assert_eq!(peak_for(&rates, &fake), 64.0 * 5.0e9);
    }

    #[test]
    fn every_row_has_a_source_and_a_positive_rate_below_its_ceiling() {
        let rates = shipped_rates();
        for row in &rates {
            assert!(!row.source.is_empty(), "{row:?}");
            assert!(row.ops_per_sec > 0.0, "{row:?}");
            let c = class(&row.backend, &row.kernel, &row.model);
            assert!(row.ops_per_sec <= peak_for(&rates, &c), "{row:?}");
        }
    }
}
