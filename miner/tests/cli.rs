//! The real `miner` binary: clear one-line errors, no GPU handled as a plain statement.

use std::process::Command;

fn miner() -> Command {
    Command::new(env!("CARGO_BIN_EXE_miner"))
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-attest-miner-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// These run where CI runs, on a host without an NVIDIA driver; on a GPU host they say so and
/// skip, since the GPU path has its own checks (scripts/gpu-check.sh).
fn skip_on_gpu_host(test: &str) -> bool {
    let has_driver = gpu_attest_kernels::detect::driver_present();
    if has_driver {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: this host has an NVIDIA driver");
    }
    has_driver
}

/// A fresh miner key `m.key` in `dir`, made by the real `miner keygen`.
fn keygen(dir: &std::path::Path) -> std::path::PathBuf {
    let key = dir.join("m.key");
    let made = miner().args(["keygen", "--key-file"]).arg(&key).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    key
}

#[test]
fn info_says_plainly_there_is_no_gpu() {
    if skip_on_gpu_host("info_says_plainly_there_is_no_gpu") {
        return;
    }
    let out = miner().args(["info"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("GPUs: none usable (no NVIDIA driver"), "{text}");
    assert!(text.contains("auto selected the CPU backend"), "{text}");
    assert!(text.contains("backend: cpu"), "{text}");
    let json = miner().args(["info", "--json"]).output().unwrap();
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["backend"], "cpu");
    assert_eq!(value["gpus"], 0);
    assert!(
        value["gpu_error"].as_str().unwrap().contains("no NVIDIA driver"),
        "{value}"
    );
}

#[test]
fn serve_with_cuda_backend_exits_with_one_clear_line() {
    if skip_on_gpu_host("serve_with_cuda_backend_exits_with_one_clear_line") {
        return;
    }
    let dir = temp_dir("cuda");
    let key = keygen(&dir);
    // RUST_BACKTRACE must not turn the error into a backtrace.
    let out = miner()
        .args(["serve", "--backend", "cuda", "--key-file"])
        .arg(&key)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: the cuda backend cannot start: no NVIDIA driver"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn keygen_refuses_to_overwrite_and_serve_refuses_open_key_files() {
    let dir = temp_dir("keys");
    let key = keygen(&dir);
    let again = miner().args(["keygen", "--key-file"]).arg(&key).output().unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    // `--if-missing` (the units' first-start step) keeps the key: same bytes, its public key
    // printed, exit 0.
    let first_key = std::fs::read(&key).unwrap();
    let public = miner().args(["public-key", "--key-file"]).arg(&key).output().unwrap();
    let kept = miner()
        .args(["keygen", "--if-missing", "--key-file"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(kept.status.success(), "{}", String::from_utf8_lossy(&kept.stderr));
    let said = String::from_utf8(kept.stdout).unwrap();
    assert!(said.contains("(already there)"), "{said}");
    let public = String::from_utf8(public.stdout).unwrap();
    assert!(said.contains(&format!("public key: {}", public.trim())), "{said}");
    assert_eq!(std::fs::read(&key).unwrap(), first_key);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        // A key file gone bad is still an error under `--if-missing`: the unit stops there.
        let bad = miner()
            .args(["keygen", "--if-missing", "--key-file"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(!bad.status.success());
        assert!(String::from_utf8_lossy(&bad.stderr).contains("chmod 600"));
        let out = miner()
            .args(["serve", "--listen", "127.0.0.1:0", "--key-file"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn print_config_shows_flags_over_file_over_defaults() {
    let dir = temp_dir("config");
    let file = dir.join("miner.toml");
    std::fs::write(&file, "cpu_threads = 3\n[limits]\nmax_n = 1024\n").unwrap();
    let out = miner()
        .args(["serve", "--print-config", "--config"])
        .arg(&file)
        .args(["--cpu-threads", "1"])
        .env("GPU_ATTEST_MINER_LISTEN", "127.0.0.1:9999")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("cpu_threads = 1"), "{text}");
    assert!(text.contains("max_n = 1024"), "{text}");
    assert!(text.contains("127.0.0.1:9999"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn plaintext_on_a_public_address_is_refused_with_one_line() {
    let dir = temp_dir("plaintext");
    let key = keygen(&dir);
    let out = miner()
        .args(["serve", "--listen", "0.0.0.0:0", "--key-file"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("refusing to serve plaintext") && stderr.contains("allow_plaintext"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
