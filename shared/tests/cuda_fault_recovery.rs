//! A faulted GPU recovers: after an illegal-address fault (sticky: every later call on the
//! context fails with it), the challenge that hit it fails with the driver's reason, and the
//! same backend runs the next challenge, bit-exact against the CPU.
//!
//! Its own test binary, so its own process: a CUDA fault poisons the device's primary context
//! for everything in the process, and the other GPU tests must not share it. Needs a CUDA GPU,
//! so it is ignored by default; `scripts/gpu-check.sh` runs it with `--ignored` on a GPU host.

use gpu_attest_shared::backend::{Backend, BackendError, CancelToken};
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::cuda::detect::detect;
use gpu_attest_shared::cuda::{CudaBackend, CudaOptions};
use gpu_attest_shared::engine::execute;
use gpu_attest_shared::params::{ChallengeParams, Work};

fn work(tag: u8) -> Work {
    Work::new(ChallengeParams {
        nonce: [tag; 32],
        seed: [tag ^ 0x5a; 32],
        miner_key: [7; 32],
        n: 256,
        num_chains: 3,
        iterations: 4,
        checkpoint_every: 2,
    })
    .unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn a_faulted_device_serves_the_next_challenge() {
    if let Err(e) = detect() {
        panic!("no GPU to test on: {e}");
    }
    let cancel = CancelToken::new();
    let cpu = CpuBackend::new(0, None).unwrap();
    let cuda = CudaBackend::new(&CudaOptions {
        ordinals: Some(vec![0]),
        ..CudaOptions::default()
    })
    .unwrap();
    let before = execute(&cuda, &work(1), &|_| {}, &cancel).unwrap();

    let fault = cuda.inject_fault(0).unwrap_err();
    let BackendError::Device { device: 0, detail } = &fault else {
        panic!("the injected fault is not a device error: {fault}");
    };
    assert!(
        detail.starts_with("CUDA_ERROR_"),
        "the driver's reason is missing: {detail}"
    );

    // The first challenge after the fault finds the context dead (the fault did not go through
    // the recovery path), fails with the driver's reason, and resets the device.
    let failed = execute(&cuda, &work(2), &|_| {}, &cancel).unwrap_err().to_string();
    assert!(failed.contains(detail.as_str()), "{failed}");
    assert!(failed.contains("reset and is ready"), "{failed}");

    // And the next one runs, exactly as before.
    let after = execute(&cuda, &work(1), &|_| {}, &cancel).unwrap();
    assert_eq!(after.chains, before.chains);
    let want = execute(&cpu, &work(3), &|_| {}, &cancel).unwrap();
    let got = execute(&cuda, &work(3), &|_| {}, &cancel).unwrap();
    assert_eq!(got.chains, want.chains);
    println!(
        "ok: device 0 recovered from an illegal-address fault ({})",
        cuda.describe()
    );
}
