//! The CUDA backend against the CPU backend, bit for bit: every kernel, several n, M, K and c,
//! every single device and the multi-device split, and chain openings (`advance`).
//!
//! Needs a CUDA GPU, so every test is ignored by default: `cargo test` lists them as ignored on
//! a machine without one (CI has none), and `scripts/gpu-check.sh` runs them with `--ignored` on
//! a GPU host, where no GPU is a failure, never a pass.

use gpu_attest_shared::backend::{Backend, CancelToken};
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::cuda::detect::detect;
use gpu_attest_shared::cuda::{CudaBackend, CudaOptions, GpuInfo, GpuKernel};
use gpu_attest_shared::engine::execute;
use gpu_attest_shared::matrix::generate_a;
use gpu_attest_shared::params::{ChallengeParams, Work};

/// The GPUs of this host; a run without any fails (these tests run only when asked for).
fn gpus() -> Vec<GpuInfo> {
    match detect() {
        Ok(d) => d.gpus,
        Err(e) => panic!("no GPU to test on: {e}"),
    }
}

fn work(n: u32, num_chains: u64, iterations: u32, checkpoint_every: u32, tag: u8) -> Work {
    Work::new(ChallengeParams {
        nonce: [tag; 32],
        seed: [tag.wrapping_add(1); 32],
        miner_key: [tag.wrapping_add(2); 32],
        n,
        num_chains,
        iterations,
        checkpoint_every,
    })
    .unwrap()
}

fn kernels_for(gpus: &[GpuInfo]) -> Vec<GpuKernel> {
    GpuKernel::ALL
        .into_iter()
        .filter(|k| gpus.iter().all(|g| k.supports(g.compute_capability)))
        .collect()
}

/// Shapes that cover: the smallest n, n not a multiple of the tensor kernel's 128 tile, one
/// chain and many (batching), K = c and c < K, and one large n.
const SHAPES: [(u32, u64, u32, u32); 6] = [
    (64, 5, 3, 1),
    (192, 3, 4, 2),
    (256, 17, 2, 2),
    (512, 2, 6, 3),
    (1024, 2, 2, 1),
    (2048, 1, 2, 2),
];

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn every_kernel_matches_the_cpu_on_every_device() {
    let gpus = gpus();
    let cpu = CpuBackend::new(0, None).unwrap();
    let cancel = CancelToken::new();
    for kernel in kernels_for(&gpus) {
        for gpu in &gpus {
            let options = CudaOptions {
                ordinals: Some(vec![gpu.ordinal]),
                kernel: Some(kernel),
                ..CudaOptions::default()
            };
            let cuda = CudaBackend::new(&options).unwrap();
            for (tag, &(n, m, k, c)) in SHAPES.iter().enumerate() {
                let work = work(n, m, k, c, tag as u8);
                let want = execute(&cpu, &work, &|_| {}, &cancel).unwrap();
                let got = execute(&cuda, &work, &|_| {}, &cancel).unwrap();
                assert_eq!(
                    got.chains, want.chains,
                    "{kernel} on device {} ({}) differs at n={n} M={m} K={k} c={c}",
                    gpu.ordinal, gpu.name
                );
                println!("ok: {kernel} on {} ({}) n={n} M={m} K={k} c={c}", gpu.ordinal, gpu.name);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn multi_gpu_split_commits_like_the_cpu_with_as_many_devices() {
    let gpus = gpus();
    let cancel = CancelToken::new();
    // Every GPU, and (with 3 or more) a subset given out of order.
    let mut subsets: Vec<Vec<u32>> = vec![gpus.iter().map(|g| g.ordinal).collect()];
    if gpus.len() >= 3 {
        subsets.push(vec![gpus[2].ordinal, gpus[0].ordinal]);
    }
    for ordinals in subsets {
        let cuda = CudaBackend::new(&CudaOptions {
            ordinals: Some(ordinals.clone()),
            ..CudaOptions::default()
        })
        .unwrap();
        let cpu = CpuBackend::new(0, None)
            .unwrap()
            .with_logical_devices(cuda.device_count());
        for (m, tag) in [(1u64, 40u8), (7, 41), (cuda.device_count() as u64 * 3 + 1, 42)] {
            let work = work(256, m, 3, 1, tag);
            let want = execute(&cpu, &work, &|_| {}, &cancel).unwrap();
            let got = execute(&cuda, &work, &|_| {}, &cancel).unwrap();
            assert_eq!(got.commitment, want.commitment, "devices {ordinals:?}, M={m}");
            println!("ok: devices {ordinals:?} M={m}: G = {}", got.commitment.global);
        }
    }
}

/// Checkpoints hashed on the host (the fallback) and on the device agree with the CPU.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn host_and_device_hashing_agree() {
    let _ = gpus();
    let cancel = CancelToken::new();
    let cpu = CpuBackend::new(0, None).unwrap();
    let on_host = CudaBackend::new(&CudaOptions {
        ordinals: Some(vec![0]),
        host_hashing: true,
        ..CudaOptions::default()
    })
    .unwrap();
    for (n, m, k, c) in [(64u32, 9u64, 4u32, 2u32), (192, 2, 2, 1), (1024, 3, 2, 2)] {
        let work = work(n, m, k, c, 60);
        let want = execute(&cpu, &work, &|_| {}, &cancel).unwrap();
        let got = execute(&on_host, &work, &|_| {}, &cancel).unwrap();
        assert_eq!(got.chains, want.chains, "host hashing, n={n} M={m} K={k} c={c}");
    }
    println!("ok: host hashing on {}", on_host.describe());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn advance_matches_the_cpu() {
    let _ = gpus();
    let cancel = CancelToken::new();
    let cpu = CpuBackend::new(0, None).unwrap();
    let cuda = CudaBackend::new(&CudaOptions::default()).unwrap();
    for n in [64u32, 320, 1024] {
        let work = work(n, 4, 9, 3, 77);
        let start = generate_a(work.key(), 3, work.n());
        for (first, steps) in [(0u32, 3u32), (3, 3), (2, 7), (8, 1)] {
            let want = cpu.advance(&work, 3, start.clone(), first, steps, &cancel).unwrap();
            let got = cuda.advance(&work, 3, start.clone(), first, steps, &cancel).unwrap();
            assert_eq!(got, want, "n={n} steps {first}..{}", first + steps);
        }
    }
    println!("ok: advance on {}", cuda.describe());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn cancellation_stops_a_gpu_challenge() {
    let _ = gpus();
    let cuda = CudaBackend::new(&CudaOptions::default()).unwrap();
    let cancel = CancelToken::new();
    cancel.cancel();
    let err = execute(&cuda, &work(1024, 8, 64, 8, 9), &|_| {}, &cancel).unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
    // The devices stay usable afterwards.
    let again = execute(&cuda, &work(64, 2, 2, 1, 10), &|_| {}, &CancelToken::new());
    assert!(again.is_ok(), "{again:?}");
}
