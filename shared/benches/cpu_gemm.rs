//! `cpu_gemm`: int8 GEMM throughput of the CPU backend, and numpy's float32 matmul (OpenBLAS) on
//! the same shapes when python3 with numpy is present.
//!
//! criterion measures each kernel; a summary table then times the fused chain step (the
//! operation the engine runs) and numpy's `a @ b` on the same n, best of several runs each, and
//! prints their ratio. Run with `cargo bench -p gpu-attest-shared --bench cpu_gemm`.

use criterion::{BenchmarkId, Criterion, Throughput};
use gpu_attest_shared::gemm::{CpuGemm, KernelKind, PackedB};
use gpu_attest_shared::matrix::{Matrix, generate};
use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

const SIZES: [usize; 3] = [256, 1024, 2048];

fn ops(n: usize) -> u64 {
    2 * (n as u64).pow(3)
}

fn criterion_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_gemm");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    for kernel in KernelKind::ALL.into_iter().filter(|k| k.is_available()) {
        let gemm = CpuGemm::new(0, Some(kernel)).expect("thread pool");
        for n in SIZES {
            if kernel == KernelKind::Portable && n > 1024 {
                continue; // seconds per step; the portable kernel is the fallback, not the target
            }
            let (x, b) = (generate(&[1; 32], 0, n), PackedB::new(&generate(&[1; 32], 1, n)));
            let mut out = Matrix::zeros(n);
            group.throughput(Throughput::Elements(ops(n)));
            group.bench_with_input(BenchmarkId::new(kernel.to_string(), n), &n, |bench, _| {
                // On the engine's threads, as the CPU backend runs a chain's steps.
                gemm.install(|| bench.iter(|| gemm.step(black_box(&x), &b, 0, &mut out)))
            });
        }
    }
    group.finish();
}

/// Best wall time of `runs` calls.
fn best_of(runs: usize, mut f: impl FnMut()) -> Duration {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .expect("runs > 0")
}

/// numpy float32 `a @ b` seconds (best of runs), or None without python3/numpy.
fn numpy_seconds(n: usize) -> Option<f64> {
    let script = format!(
        "import numpy as np, time\n\
         a = np.random.default_rng(1).integers(-128, 128, ({n}, {n})).astype(np.float32)\n\
         b = np.random.default_rng(2).integers(-128, 128, ({n}, {n})).astype(np.float32)\n\
         a @ b\n\
         best = min((lambda t: (a @ b, time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(7))\n\
         print(best)"
    );
    let out = Command::new("python3").args(["-c", &script]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

fn summary() {
    let gemm = CpuGemm::new(0, None).expect("thread pool");
    println!(
        "\ncpu_gemm summary: fused int8 step ({} kernel, {} threads) vs numpy float32 matmul",
        gemm.kernel(),
        gemm.threads()
    );
    println!("{:>6} {:>14} {:>16} {:>8}", "n", "int8 GOP/s", "numpy GFLOP/s", "ratio");
    for n in SIZES {
        let (x, b) = (generate(&[1; 32], 0, n), PackedB::new(&generate(&[1; 32], 1, n)));
        let mut out = Matrix::zeros(n);
        let ours = gemm
            .install(|| best_of(7, || gemm.step(&x, &b, 0, &mut out)))
            .as_secs_f64();
        let ours_rate = ops(n) as f64 / ours / 1e9;
        match numpy_seconds(n) {
            Some(np) => {
                let np_rate = ops(n) as f64 / np / 1e9;
                println!("{n:>6} {ours_rate:>14.1} {np_rate:>16.1} {:>7.2}x", ours_rate / np_rate);
            }
            None => println!("{n:>6} {ours_rate:>14.1} {:>16} {:>8}", "(no numpy)", "-"),
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
    summary();
}
