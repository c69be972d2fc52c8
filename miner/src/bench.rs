//! `miner bench`: GEMM throughput per backend, kernel and device; on GPUs also against
//! cuBLASLt int8 plus a mix pass, and a whole challenge against its GEMM-only time.

use gpu_attest_shared::Backend;
use gpu_attest_shared::cuda::bench::{int8_peak_tops, step_floor_seconds};
use gpu_attest_shared::cuda::{CudaBackend, CudaInitError, CudaOptions, GpuKernel};
use gpu_attest_shared::gemm::{CpuGemm, KernelKind, PackedB};
use gpu_attest_shared::matrix::{Matrix, generate};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct BenchRow {
    pub backend: String,
    pub kernel: String,
    pub device: String,
    pub n: usize,
    /// Median of the timed runs, seconds per fused GEMM+mix step.
    pub seconds: f64,
    pub tops: f64,
}

/// Times the fused step on every available CPU kernel; each size runs for about `budget`.
pub fn cpu(sizes: &[usize], threads: usize, budget: Duration, device: &str) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    for kernel in KernelKind::ALL.into_iter().filter(|k| k.is_available()) {
        let Ok(gemm) = CpuGemm::new(threads, Some(kernel)) else {
            continue;
        };
        for &n in sizes {
            let (x, b) = (generate(&[1; 32], 0, n), PackedB::new(&generate(&[1; 32], 1, n)));
            let mut out = Matrix::zeros(n);
            gemm.step(&x, &b, 0, &mut out); // warm-up
            let mut times = Vec::new();
            let start = Instant::now();
            while times.len() < 3 || (start.elapsed() < budget && times.len() < 50) {
                let t = Instant::now();
                gemm.step(&x, &b, 0, &mut out);
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let seconds = times[times.len() / 2];
            rows.push(BenchRow {
                backend: "cpu".into(),
                kernel: kernel.to_string(),
                device: device.to_string(),
                n,
                seconds,
                tops: 2.0 * (n as f64).powi(3) / seconds / 1e12,
            });
        }
    }
    rows
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
    /// DESIGN.md's floor for one step, and the share of it reached (floor / achieved time).
    pub floor_seconds: Option<f64>,
    pub share_of_floor: Option<f64>,
    /// cuBLASLt int8 GEMM then a separate mix pass, per step; or why it did not run.
    pub cublaslt_seconds: Option<f64>,
    pub cublaslt_tops: Option<f64>,
    pub cublaslt_error: Option<String>,
    /// A whole challenge (generation, steps, checkpoint copies and hashing) over its GEMM-only time.
    pub challenge_over_gemm: f64,
}

/// Every kernel the selected GPUs support, on every device, at every size.
pub fn gpu(
    options: &CudaOptions,
    sizes: &[usize],
    budget: Duration,
    mut report: impl FnMut(&GpuBenchRow),
) -> Result<Vec<GpuBenchRow>, String> {
    let mut rows = Vec::new();
    for kernel in GpuKernel::ALL {
        let backend = match CudaBackend::new(&CudaOptions {
            kernel: Some(kernel),
            ..options.clone()
        }) {
            Ok(b) => b,
            Err(CudaInitError::KernelUnsupported { .. }) => continue,
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
    }
    Ok(rows)
}
