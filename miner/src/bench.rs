//! `miner bench`: GEMM throughput per backend, kernel and device; on GPUs also against
//! cuBLASLt int8 plus a mix pass, and a whole challenge against its GEMM-only time.

use gpu_attest_kernels::bench::{int8_peak_tops, step_floor_seconds};
use gpu_attest_kernels::walk_bench::WalkBench;
use gpu_attest_kernels::{CudaBackend, CudaInitError, CudaOptions, GpuKernel};
use gpu_attest_shared::Backend;
use gpu_attest_shared::backend::CancelToken;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::gemm::{CpuGemm, GemmError, KernelKind, PackedB, register_peak};
use gpu_attest_shared::matrix::{Matrix, generate, generate_a};
use gpu_attest_shared::memory::bench::MemoryBench;
use gpu_attest_shared::params::{ChallengeParams, Work};
use serde::Serialize;
use std::time::{Duration, Instant};

/// `miner bench` on the CPU: the kernels' rows, each read against its kernel's register-only
/// ceiling, the ceilings themselves, and the sampled verification when asked for.
#[derive(Debug, Serialize)]
pub struct CpuReport {
    pub rows: Vec<BenchRow>,
    /// The ceilings of the kernels timed and of the fastest kernel this CPU runs, fastest
    /// first: the first is this CPU's int8 limit on these threads (where that kernel has one).
    pub ceilings: Vec<Ceiling>,
    pub sampled_verify: Option<SampledVerify>,
    /// The memory phase on this machine: read and copy bandwidth, version 3's walk and fill
    /// and version 4's walk against them (None with `--memory-mib 0`).
    pub memory: Option<MemoryBench>,
}

impl CpuReport {
    /// `rows`, each with its share of its kernel's ceiling in `ceilings`.
    pub fn new(
        mut rows: Vec<BenchRow>,
        ceilings: Vec<Ceiling>,
        sampled_verify: Option<SampledVerify>,
        memory: Option<MemoryBench>,
    ) -> Self {
        for row in &mut rows {
            row.share_of_ceiling = ceilings
                .iter()
                .find(|c| c.kernel == row.kernel)
                .map(|c| row.tops / c.tops);
        }
        CpuReport {
            rows,
            ceilings,
            sampled_verify,
            memory,
        }
    }
}

/// What a kernel's own multiply-accumulate reaches with nothing else in the loop, on operands
/// that never touch memory: the most any GEMM built on it can do.
#[derive(Debug, Serialize)]
pub struct Ceiling {
    pub kernel: String,
    pub instructions: &'static str,
    pub tops: f64,
}

/// The ceilings of `benched` and of the fastest kernel this CPU runs (its limit), on `threads`
/// threads (those the rows ran on, [`BenchRow::threads`]), fastest kernel first: each the best of three runs of about a tenth
/// of a second, since one short run can land on a slow moment of a shared machine and read low.
pub fn ceilings(threads: usize, benched: &[KernelKind]) -> Vec<Ceiling> {
    let fastest = KernelKind::best_available();
    KernelKind::ALL
        .into_iter()
        .filter(|&k| k.is_available() && (k == fastest || benched.contains(&k)))
        .filter_map(|kernel| {
            let instructions = kernel.ceiling_instructions()?;
            let ops = (0..3)
                .filter_map(|_| register_peak(kernel, threads, 0.1))
                .max_by(f64::total_cmp)?;
            Some(Ceiling {
                kernel: kernel.to_string(),
                instructions,
                tops: ops / 1e12,
            })
        })
        .collect()
}

/// The CPU work of verifying openings: per sampled chain, regenerate A_i and hash it, hash the
/// opened matrix, recompute `steps` steps from it and hash the result. Signatures and Merkle
/// proofs cost microseconds and are left out.
#[derive(Debug, Serialize)]
pub struct SampledVerify {
    pub n: usize,
    pub samples: u64,
    pub steps: u32,
    pub kernel: String,
    pub seconds: f64,
}

/// Times the sampled verification of an n = 2048 challenge, 32 samples of 4 steps (the
/// validator's default checkpoint spacing), one after another as the validator checks them.
pub fn sampled_verify(kernel: Option<KernelKind>, threads: usize) -> Result<SampledVerify, String> {
    const N: u32 = 2048;
    const SAMPLES: u64 = 32;
    const STEPS: u32 = 4;
    let backend = CpuBackend::new(threads, kernel).map_err(|e| e.to_string())?;
    let work = Work::new(ChallengeParams {
        nonce: [7; 32],
        seed: [9; 32],
        miner_key: [3; 32],
        n: N,
        num_chains: SAMPLES,
        iterations: 4 * STEPS,
        checkpoint_every: STEPS,
    })
    .map_err(|e| e.to_string())?;
    let cancel = CancelToken::new();
    // The opened matrices arrive over the wire: not part of the validator's work.
    let received: Vec<_> = (0..SAMPLES)
        .map(|chain| generate_a(work.key(), chain, work.n()))
        .collect();
    let start = Instant::now();
    for (chain, opened) in (0..SAMPLES).zip(received) {
        // As the validator does: A_i regenerated for checkpoint 0, the opened matrix hashed.
        if generate_a(work.key(), chain, work.n()).digest() != opened.digest() {
            return Err(format!("chain {chain}: A_i was not reproducible"));
        }
        let end = backend
            .advance(&work, chain, opened, 0, STEPS, &cancel)
            .map_err(|e| e.to_string())?;
        std::hint::black_box(end.digest());
    }
    Ok(SampledVerify {
        n: N as usize,
        samples: SAMPLES,
        steps: STEPS,
        kernel: backend.kernel().to_string(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[derive(Debug, Serialize)]
pub struct BenchRow {
    pub backend: String,
    pub kernel: String,
    pub device: String,
    pub n: usize,
    /// The threads the engine computed on.
    pub threads: usize,
    /// How much of k one pass over a tile takes (n: the whole of k); a thread's task of a
    /// single strip of rows takes the whole of k whatever this says.
    pub k_block: usize,
    /// Whether the kernel's tile loads carry cache hints (only AMX takes them; see
    /// `GPU_ATTEST_CPU_CACHE_HINTS`).
    pub cache_hints: bool,
    /// Median of the timed runs, seconds per fused GEMM+mix step.
    pub seconds: f64,
    pub tops: f64,
    /// `tops` over the kernel's register-only ceiling on the same threads ([`Ceiling`]); None
    /// for a kernel without one (portable).
    pub share_of_ceiling: Option<f64>,
}

/// Times the fused step on each of `kernels`; each size runs for about `budget`. A kernel this
/// CPU lacks, or a bad k-block or cache-hint setting, is an error rather than a missing row.
pub fn cpu(
    sizes: &[usize],
    kernels: &[KernelKind],
    threads: usize,
    budget: Duration,
    device: &str,
) -> Result<Vec<BenchRow>, GemmError> {
    let mut rows = Vec::new();
    for &kernel in kernels {
        let gemm = CpuGemm::new(threads, Some(kernel))?;
        for &n in sizes {
            let (x, b) = (generate(&[1; 32], 0, n), PackedB::new(&generate(&[1; 32], 1, n)));
            let mut out = Matrix::zeros(n);
            // Steps are timed one after another on one of the engine's threads, as the CPU
            // backend runs a chain's steps.
            let mut times = gemm.install(|| {
                gemm.step(&x, &b, 0, &mut out); // warm-up
                let mut times = Vec::new();
                let start = Instant::now();
                // Small n takes well under a millisecond a step: enough steps that the median is
                // not one scheduler hiccup, the time budget bounding the run.
                while times.len() < 3 || (start.elapsed() < budget && times.len() < 5000) {
                    let t = Instant::now();
                    gemm.step(&x, &b, 0, &mut out);
                    times.push(t.elapsed().as_secs_f64());
                }
                times
            });
            times.sort_by(f64::total_cmp);
            let seconds = times[times.len() / 2];
            rows.push(BenchRow {
                backend: "cpu".into(),
                kernel: kernel.to_string(),
                device: device.to_string(),
                n,
                threads: gemm.threads(),
                k_block: gemm.k_block(n),
                cache_hints: gemm.cache_hints(),
                seconds,
                tops: 2.0 * (n as f64).powi(3) / seconds / 1e12,
                share_of_ceiling: None,
            });
        }
    }
    Ok(rows)
}

/// The memory phase on the CPU: buffers of `mib` MiB (past the caches), a walk of about
/// `budget`, on the chosen kernel's engine (the fill's GEMMs) and threads. A kernel this CPU
/// lacks, or buffers it cannot hold, is an error in words.
pub fn memory(kernel: Option<KernelKind>, threads: usize, mib: usize, budget: Duration) -> Result<MemoryBench, String> {
    let gemm = CpuGemm::new(threads, kernel).map_err(|e| e.to_string())?;
    gpu_attest_shared::memory::bench::measure(&gemm, mib.saturating_mul(1 << 20), budget)
        .map_err(|e| format!("{e} (--memory-mib {mib}; 0 skips the memory figures)"))
}

/// One GPU measurement: a kernel on a device at one size, against cuBLASLt int8 plus mix.
#[derive(Debug, Serialize)]
pub struct GpuBenchRow {
    pub kernel: String,
    pub device: u32,
    pub name: String,
    pub n: usize,
    /// Chains per launch (the miner batches the same way).
    pub batch: usize,
    /// Seconds per chain step (one fused GEMM+mix).
    pub seconds: f64,
    pub tops: f64,
    /// The device's dense int8 peak, when known.
    pub peak_tops: Option<f64>,
    /// The floor for one step (BENCHMARKS.md), and the share of it reached (floor / achieved time).
    pub floor_seconds: Option<f64>,
    pub share_of_floor: Option<f64>,
    /// cuBLASLt int8 GEMM then a separate mix pass, per step; or why it did not run.
    pub cublaslt_seconds: Option<f64>,
    pub cublaslt_tops: Option<f64>,
    pub cublaslt_error: Option<String>,
    /// A whole challenge (generation, steps, checkpoint copies and hashing) over its GEMM-only time.
    pub challenge_over_gemm: f64,
}

/// Walkers a device walk runs: eight 128-thread blocks an SM on the largest GPUs (132 SMs) is
/// 1056 at once, and several waves of them keep the last wave from running alone.
pub const GPU_WALKERS: u32 = 8192;

/// The memory walk on every selected device: a pool of `pool_bytes` (or 90% of the free memory).
pub fn gpu_walks(
    options: &CudaOptions,
    pool_bytes: u64,
    budget: Duration,
    mut report: impl FnMut(&WalkBench),
) -> Result<Vec<WalkBench>, String> {
    let backend = CudaBackend::new(options).map_err(|e| e.to_string())?;
    (0..backend.device_count())
        .map(|device| {
            let walk = backend
                .bench_walk(device, pool_bytes, GPU_WALKERS, budget)
                .map_err(|e| e.to_string())?;
            report(&walk);
            Ok(walk)
        })
        .collect()
}

/// The GPU kernels `miner bench` times: the one chosen (`--gpu-kernel`), or under `auto` every
/// kernel, the opt-in ones included (the bench is how they are measured).
pub fn gpu_kernels_to_time(chosen: Option<GpuKernel>) -> Vec<GpuKernel> {
    chosen.map_or_else(|| GpuKernel::ALL.to_vec(), |k| vec![k])
}

/// What `miner bench` measured on the GPUs: a row per kernel, device and size, and the kernels
/// that could not be timed, with why.
pub struct GpuBench {
    pub rows: Vec<GpuBenchRow>,
    pub kernel_errors: Vec<String>,
}

/// `kernels` the selected GPUs support, on every device, at every size. A kernel that fails
/// (it does not start, or a launch fails) is reported and the others are still timed: the bench
/// is where a new kernel is first measured, and its failure must not hide the figures of the
/// rest. (A fault poisons the process's contexts, so the kernels after it fail too; a script
/// that must not lose them times a new kernel in a process of its own.)
pub fn gpu(
    options: &CudaOptions,
    kernels: &[GpuKernel],
    sizes: &[usize],
    budget: Duration,
    mut report: impl FnMut(&GpuBenchRow),
) -> GpuBench {
    let mut rows = Vec::new();
    let mut kernel_errors = Vec::new();
    for &kernel in kernels {
        if let Err(e) = gpu_kernel(options, kernel, sizes, budget, &mut rows, &mut report) {
            kernel_errors.push(format!("the {kernel} kernel: {e}"));
        }
    }
    GpuBench { rows, kernel_errors }
}

/// One kernel's rows into `rows`; Err when it could not be timed. A kernel the GPUs do not run is
/// left out without an error.
fn gpu_kernel(
    options: &CudaOptions,
    kernel: GpuKernel,
    sizes: &[usize],
    budget: Duration,
    rows: &mut Vec<GpuBenchRow>,
    report: &mut impl FnMut(&GpuBenchRow),
) -> Result<(), String> {
    let backend = match CudaBackend::new(&CudaOptions {
        kernel: Some(kernel),
        ..options.clone()
    }) {
        Ok(b) => b,
        Err(CudaInitError::KernelUnsupported { .. }) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    for device in 0..backend.device_count() {
        for &n in sizes {
            let b = backend.bench(device, n, budget).map_err(|e| e.to_string())?;
            let ops = 2.0 * (n as f64).powi(3);
            let floor = step_floor_seconds(&b.name, n);
            let row = GpuBenchRow {
                kernel: kernel.to_string(),
                device,
                name: b.name.clone(),
                n,
                batch: b.batch,
                seconds: b.fused_step,
                tops: ops / b.fused_step / 1e12,
                peak_tops: int8_peak_tops(&b.name),
                floor_seconds: floor,
                share_of_floor: floor.map(|f| f / b.fused_step),
                cublaslt_seconds: b.cublaslt_step.as_ref().ok().copied(),
                cublaslt_tops: b.cublaslt_step.as_ref().ok().map(|s| ops / s / 1e12),
                cublaslt_error: b.cublaslt_step.as_ref().err().cloned(),
                challenge_over_gemm: b.challenge_over_gemm,
            };
            report(&row);
            rows.push(row);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--gpu-kernel K` times K alone, as `--cpu-kernel` does on the CPU; `auto` times every
    /// kernel, the opt-in ones included, since the bench is where they are measured.
    #[test]
    fn the_bench_times_the_chosen_gpu_kernel_or_every_one() {
        assert_eq!(gpu_kernels_to_time(Some(GpuKernel::Multicast)), [GpuKernel::Multicast]);
        assert_eq!(gpu_kernels_to_time(None), GpuKernel::ALL);
    }

    /// Without a GPU every kernel fails to start, and each is named with why, not one error for
    /// all (a new kernel's failure must not hide the others' rows).
    #[test]
    fn each_gpu_kernel_that_cannot_be_timed_is_named() {
        let options = CudaOptions {
            ordinals: Some(vec![9999]),
            ..CudaOptions::default()
        };
        let kernels = [GpuKernel::Tiled, GpuKernel::Pingpong];
        let bench = gpu(&options, &kernels, &[64], Duration::from_millis(1), |_| {});
        assert!(bench.rows.is_empty());
        assert_eq!(bench.kernel_errors.len(), 2, "{:?}", bench.kernel_errors);
        assert!(bench.kernel_errors[0].starts_with("the tiled kernel: "));
        assert!(bench.kernel_errors[1].starts_with("the pingpong kernel: "));
    }
}
