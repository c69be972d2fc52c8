//! The real `miner` binary against stand-ins for the NVIDIA libraries (see `fake-driver/`): a
//! CUDA 12 driver with NVRTC 13, a driver with no GPU, NVML without libcuda, and the other ways
//! a GPU host can be wrong. Each must give one line that names what was found and what is
//! needed, fall back to the CPU under `auto`, and never panic. These run without a GPU: the
//! libraries are fakes built by the test, which is why this is not a GPU test.
#![cfg(target_os = "linux")]

use crate::common;

use common::fake_driver::{FakeLib, build, library_path};
use common::process::{Dir, assert_one_line_failure, cmd};
use std::path::Path;
use std::process::Output;

/// `miner` with `args`, loading the libraries in `libs` first, with the `FAKE_*` answers in `env`.
fn miner(libs: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    cmd("miner")
        .args(args)
        .env("LD_LIBRARY_PATH", library_path(libs))
        .env("GPU_ATTEST_KERNEL_CACHE", libs.join("kernel-cache"))
        .env_remove("CUDA_VISIBLE_DEVICES")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Under `--backend cuda`, every command that needs the backend refuses in one line containing
/// each of `needles`; under `auto`, `miner info` runs on the CPU and says why.
fn assert_refused_then_cpu(libs: &Path, env: &[(&str, &str)], needles: &[&str]) -> serde_json::Value {
    for args in [
        &["info", "--backend", "cuda"][..],
        &["bench", "--backend", "cuda", "--sizes", "64", "--seconds", "0.01"],
        &["serve", "--backend", "cuda", "--listen", "127.0.0.1:0"],
    ] {
        let out = miner(libs, args, env);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for needle in needles {
            assert_one_line_failure(&out, needle);
        }
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("the cuda backend cannot start"),
            "{args:?}"
        );
    }
    let out = miner(libs, &["info", "--json"], env);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["backend"], "cpu", "{info}");
    let note = info["notes"][0].as_str().unwrap_or_default();
    assert!(note.starts_with("no usable GPU ("), "{info}");
    for needle in needles {
        assert!(note.contains(needle), "{needle:?} not in {note:?}");
    }
    info
}

#[test]
fn a_cuda_12_driver_with_nvrtc_13_is_refused_naming_both() {
    let dir = Dir::fresh("fake-cuda12-nvrtc13");
    let libs = build(&dir.0, &[FakeLib::Cuda, FakeLib::Nvrtc, FakeLib::Nvml]);
    let env = [("FAKE_CUDA_VERSION", "12040"), ("FAKE_NVRTC_VERSION", "13.0")];
    let info = assert_refused_then_cpu(
        &libs,
        &env,
        &[
            "supports CUDA 12.4",
            "NVRTC found is 13.0",
            "R580",
            "nvidia-cuda-nvrtc-cu12",
        ],
    );
    // What was found is still reported: the driver, and the GPU behind it.
    assert_eq!(info["cuda_driver"], "12.4", "{info}");
    assert_eq!(info["gpus"], 1, "{info}");
    assert_eq!(info["gpu_devices"][0]["compute_capability"], serde_json::json!([9, 0]));
}

/// NVRTC no newer than the driver passes the version check; the fake driver then refuses to
/// open a context, which must be an error line too, not a panic.
#[test]
fn a_cuda_12_driver_with_nvrtc_12_gets_past_the_version_check() {
    let dir = Dir::fresh("fake-cuda12-nvrtc12");
    let libs = build(&dir.0, &[FakeLib::Cuda, FakeLib::Nvrtc, FakeLib::Nvml]);
    let env = [("FAKE_CUDA_VERSION", "12040"), ("FAKE_NVRTC_VERSION", "12.4")];
    let out = miner(&libs, &["info", "--backend", "cuda"], &env);
    assert_one_line_failure(&out, "CUDA device 0: CUDA_ERROR_NOT_SUPPORTED");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("NVRTC found"));
}

/// The test mode of several slots a GPU gives each slot a context of its own, which cudarc
/// makes with cuCtxCreate_v4 and would panic on a driver without it: the miner names the entry
/// point instead. The flag is a test mode's, kept out of `--help`.
#[test]
fn gpu_slots_on_a_driver_without_contexts_of_their_own_are_refused_naming_the_entry_point() {
    let dir = Dir::fresh("fake-gpu-slots");
    let libs = build(&dir.0, &[FakeLib::Cuda, FakeLib::Nvrtc, FakeLib::Nvml]);
    let env = [("FAKE_CUDA_VERSION", "12040"), ("FAKE_NVRTC_VERSION", "12.4")];
    let out = miner(&libs, &["info", "--backend", "cuda", "--gpu-slots", "2"], &env);
    assert_one_line_failure(&out, "needs cuCtxCreate_v4 from the driver");
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 slots a GPU"));
    // Under `auto` it would mine on the CPU unnoticed: refused, naming the flag to add.
    let out = miner(&libs, &["info", "--gpu-slots", "2"], &env);
    assert_one_line_failure(&out, "is a test mode of the cuda backend: add --backend cuda");
    let help = miner(&libs, &["serve", "--help"], &env);
    assert!(help.status.success());
    assert!(!String::from_utf8_lossy(&help.stdout).contains("gpu-slots"));
}

#[test]
fn a_driver_older_than_cuda_12_is_refused_with_the_branch_needed() {
    let dir = Dir::fresh("fake-cuda11");
    let libs = build(&dir.0, &[FakeLib::Cuda, FakeLib::Nvrtc, FakeLib::Nvml]);
    assert_refused_then_cpu(
        &libs,
        &[("FAKE_CUDA_VERSION", "11080")],
        &["supports CUDA 11.8; the miner needs CUDA 12.0 or newer (driver R525 or newer)"],
    );
}

#[test]
fn a_driver_with_no_gpu_says_so() {
    let dir = Dir::fresh("fake-no-gpu");
    let libs = build(&dir.0, &[FakeLib::Cuda, FakeLib::Nvrtc, FakeLib::Nvml]);
    let info = assert_refused_then_cpu(&libs, &[("FAKE_CUDA_DEVICES", "0")], &["no GPU visible to CUDA"]);
    assert_eq!(info["gpus"], 0, "{info}");
}

/// cudarc panics when it calls an entry point the library lacks; the miner checks them all
/// before its first call into the driver.
#[test]
fn a_driver_library_missing_an_entry_point_is_named_not_called() {
    let dir = Dir::fresh("fake-no-launch");
    let libs = build(&dir.0, &[FakeLib::CudaWithoutLaunch, FakeLib::Nvrtc, FakeLib::Nvml]);
    assert_refused_then_cpu(
        &libs,
        &[],
        &["lacks an entry point that the miner calls: cuLaunchKernel"],
    );
}

/// NVML answers but libcuda cannot be loaded: a broken install or a container without the
/// compute capability, which is not the same as a host without GPUs.
#[test]
fn nvml_without_libcuda_is_a_broken_install_not_no_gpu() {
    // The real driver library, where there is one, is found whatever LD_LIBRARY_PATH says.
    // SAFETY: only tries to load the library.
    if gpu_attest_kernels::detect::driver_present() {
        gpu_attest_shared::prerequisite::skip(
            "nvml_without_libcuda_is_a_broken_install_not_no_gpu",
            "this host has a real libcuda, so its absence cannot be faked here",
        );
        return;
    }
    let dir = Dir::fresh("fake-nvml-only");
    let libs = build(&dir.0, &[FakeLib::Nvml]);
    assert_refused_then_cpu(
        &libs,
        &[("FAKE_NVML_DEVICES", "2")],
        &[
            "NVML sees 2 GPUs (driver 550.54.15)",
            "libcuda.so.1",
            "NVIDIA_DRIVER_CAPABILITIES",
        ],
    );
}

/// `miner selftest` on a GPU whose every kernel fails (here: the fake driver opens no context)
/// names each kernel and device with the reason, still checks the CPU kernels, and exits 1.
/// Under `auto`, `miner info` then runs on the CPU and says that no GPU kernel passed.
#[test]
fn selftest_reports_each_failing_gpu_kernel_and_auto_falls_back() {
    let dir = Dir::fresh("fake-selftest");
    let libs = build(&dir.0, &[FakeLib::Cuda, FakeLib::Nvrtc, FakeLib::Nvml]);
    let env = [("FAKE_CUDA_VERSION", "12040"), ("FAKE_NVRTC_VERSION", "12.4")];
    let out = miner(&libs, &["selftest", "--mid-n", "128", "--json"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = report["checks"].as_array().unwrap();
    let gpu: Vec<&serde_json::Value> = checks.iter().filter(|c| c["backend"] == "cuda").collect();
    let kernels: Vec<&str> = gpu.iter().map(|c| c["kernel"].as_str().unwrap()).collect();
    assert_eq!(
        kernels,
        ["tiled", "tensor", "wgmma", "tma", "pingpong", "multicast"],
        "every kernel a compute capability 9.0 GPU supports, the opt-in TMA kernels too"
    );
    for c in &gpu {
        assert_eq!(c["outcome"]["result"], "failed", "{c}");
        assert!(
            c["outcome"]["reason"]
                .as_str()
                .unwrap()
                .contains("CUDA_ERROR_NOT_SUPPORTED"),
            "{c}"
        );
        assert!(c["device"].as_str().unwrap().starts_with("gpu 0 (NVIDIA H100"), "{c}");
    }
    assert!(
        checks
            .iter()
            .any(|c| c["backend"] == "cpu" && c["outcome"]["result"] == "passed"),
        "{report}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("6 of ") && stderr.contains("kernels failed their self-check"),
        "{stderr}"
    );

    let out = miner(&libs, &["info", "--json"], &env);
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["backend"], "cpu", "{info}");
    let note = info["notes"][0].as_str().unwrap();
    // Every kernel auto may choose named, in its order (fastest first); not the opt-in
    // ping-pong ones.
    assert!(
        note.contains("no GPU kernel passed its self-check (tma on gpu 0")
            && note.contains("; wgmma on gpu 0")
            && note.contains("; tensor on gpu 0")
            && note.contains("; tiled on gpu 0")
            && !note.contains("pingpong on gpu 0")
            && !note.contains("multicast on gpu 0"),
        "{note}"
    );
}

/// A validator told to verify on a GPU whose every kernel fails its self-check (the miner's
/// checks, run by the same code) refuses to start, naming each kernel on the GPU and the
/// reason, with the configuration-error status (not the device-fault one: nothing faulted),
/// and leaves no database behind.
#[test]
fn a_validator_on_a_gpu_that_fails_every_kernel_refuses_to_start_naming_each() {
    let dir = Dir::fresh("fake-validator-gpu");
    let libs = build(&dir.0, &[FakeLib::Cuda, FakeLib::Nvrtc, FakeLib::Nvml]);
    let key = dir.0.join("validator.key");
    common::process::keygen("validator", &key);
    let database = dir.0.join("validator.db");
    let out = cmd("validator")
        .args(["serve", "--backend", "cuda", "--listen", "127.0.0.1:0", "--key-file"])
        .arg(&key)
        .arg("--database")
        .arg(&database)
        .env("LD_LIBRARY_PATH", library_path(&libs))
        .env("GPU_ATTEST_KERNEL_CACHE", libs.join("kernel-cache"))
        .env_remove("CUDA_VISIBLE_DEVICES")
        .envs([("FAKE_CUDA_VERSION", "12040"), ("FAKE_NVRTC_VERSION", "12.4")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let error = stderr.lines().last().unwrap_or_default();
    assert!(
        error.starts_with("error: the GPUs failed their self-check (no GPU kernel passed its self-check (tma on gpu 0")
            && error.contains("; wgmma on gpu 0")
            && error.contains("; tensor on gpu 0")
            && error.contains("; tiled on gpu 0")
            && error.contains("CUDA_ERROR_NOT_SUPPORTED")
            && error.contains("verify with --backend cpu"),
        "{stderr}"
    );
    assert!(
        !database.exists(),
        "a validator that cannot start leaves no database behind"
    );
}

/// The miner's metrics read every GPU from NVML at each scrape. The fake NVML answers fixed
/// readings for two GPUs here (the miner itself computes on the CPU), and the endpoint shows
/// each one under its NVML index and UUID, in the units the metric names say.
#[test]
fn the_metrics_read_every_gpu_from_nvml_at_each_scrape() {
    use common::process::{Daemon, keygen, sample, scrape};
    use std::io::{BufRead, BufReader};
    let dir = Dir::fresh("fake-nvml-metrics");
    let libs = build(&dir.0, &[FakeLib::Nvml]);
    keygen("miner", &dir.0.join("m.key"));
    let mut child = cmd("miner")
        .current_dir(&dir.0)
        .args([
            "serve",
            "--backend",
            "cpu",
            "--cpu-threads",
            "1",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--metrics-listen", "127.0.0.1:0", "--key-file"])
        .arg(dir.0.join("m.key"))
        .env("LD_LIBRARY_PATH", library_path(&libs))
        .env("FAKE_NVML_DEVICES", "2")
        .env("FAKE_NVML_TELEMETRY", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let _daemon = Daemon(child);
    let _listening = lines.next().unwrap().unwrap();
    let metrics_line = lines.next().unwrap().unwrap();
    let address = metrics_line
        .strip_prefix("metrics on http://")
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{metrics_line:?}"));
    let text = scrape(address);
    for (gpu, celsius) in [(0, 61.0), (1, 62.0)] {
        let series = |name: &str| format!("gpu_attest_miner_{name}{{gpu=\"{gpu}\",uuid=\"GPU-fake-{gpu}\"}}");
        assert_eq!(
            sample(&text, &series("gpu_temperature_celsius")),
            Some(celsius),
            "{text}"
        );
        assert_eq!(sample(&text, &series("gpu_power_watts")), Some(312.5), "{text}");
        assert_eq!(sample(&text, &series("gpu_utilization_ratio")), Some(0.87), "{text}");
        assert_eq!(
            sample(&text, &series("gpu_memory_used_bytes")),
            Some((3u64 << 30) as f64),
            "{text}"
        );
        assert_eq!(sample(&text, &series("gpu_sm_clock_hertz")), Some(1.98e9), "{text}");
        assert_eq!(
            sample(&text, &series("gpu_memory_clock_hertz")),
            Some(2.619e9),
            "{text}"
        );
    }
}

/// `miner evidence` through NVML (PROTOCOL.md 19): a GPU in CC mode answers a fresh nonce with a
/// report the test PKI signs (the fake NVML runs `fake-gpu-evidence` for it, as a GPU signs),
/// and the miner checks it as a validator would; with CC off, in DEVTOOLS mode or unsupported,
/// each GPU says so.
#[test]
fn miner_evidence_reads_each_gpus_cc_state_and_checks_its_report() {
    let dir = Dir::fresh("fake-nvml-evidence");
    let libs = build(&dir.0, &[FakeLib::Nvml]);
    let roots = dir.0.join("test-roots.pem");
    std::fs::write(&roots, gpu_attest_integration_tests::test_pki::TestPki::root_pem()).unwrap();
    let roots = roots.to_str().unwrap();
    let signer = env!("CARGO_BIN_EXE_fake-gpu-evidence");
    let evidence = |cc: Option<&str>, trust_test_root: bool| {
        // TELEMETRY: the GPUs answer queries at all, as on a real driver.
        let mut env = vec![
            ("FAKE_NVML_DEVICES", "2"),
            ("FAKE_NVML_TELEMETRY", "1"),
            ("FAKE_NVML_EVIDENCE", signer),
        ];
        if let Some(cc) = cc {
            env.push(("FAKE_NVML_CC", cc));
        }
        let mut args = vec!["evidence", "--json"];
        if trust_test_root {
            args.extend(["--roots", roots]);
        }
        let out = miner(&libs, &args, &env);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        found.as_array().unwrap().clone()
    };

    let on = evidence(Some("on"), true);
    assert_eq!(on.len(), 2);
    for (index, device) in on.iter().enumerate() {
        assert_eq!(device["cc_state"], "CC on");
        assert_eq!(
            device["verdict"],
            format!("genuine NVIDIA GH100 G520/0200 (device 00FACE00000000{index:02X}), nonce-bound"),
            "{device}"
        );
    }
    let untrusted = evidence(Some("on"), false);
    assert_eq!(
        untrusted[0]["reason"], "identity-untrusted-root",
        "NVIDIA's root does not sign the test PKI"
    );
    assert_eq!(evidence(Some("off"), true)[0]["verdict"], "not offered (CC off)");
    assert_eq!(evidence(Some("devtools"), true)[1]["reason"], "identity-devtools");
    assert_eq!(evidence(None, true)[0]["verdict"], "not offered (CC not supported)");
}
