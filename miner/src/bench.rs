//! `miner bench`: GEMM throughput per backend, kernel and device.

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
