//! The real `validator` binary: one-line errors and its offline commands.

use std::process::Command;

fn validator() -> Command {
    Command::new(env!("CARGO_BIN_EXE_validator"))
}

#[test]
fn verdicts_without_a_database_is_one_clear_line() {
    let out = validator()
        .args(["verdicts", "--database", "/nonexistent/gpu-attest.db"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no database"), "{stderr}");
}

#[test]
fn attest_without_a_key_says_how_to_make_one() {
    let out = validator()
        .args([
            "attest",
            "--miner",
            "http://127.0.0.1:1",
            "--key-file",
            "/nonexistent/v.key",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("validator keygen"), "{stderr}");
}

/// Without a GPU (CI), verifying on CUDA is refused in one line that names the way out; nothing
/// is written to the database.
#[test]
fn gpu_verification_without_a_gpu_is_one_clear_line() {
    if gpu_attest_kernels::detect::driver_present() {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED: this host has an NVIDIA driver");
        return;
    }
    let dir = std::env::temp_dir().join(format!("gpu-attest-validator-cli-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("v.key");
    assert!(
        validator()
            .args(["keygen", "--key-file"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    let out = validator()
        .args([
            "attest",
            "--backend",
            "cuda",
            "--miner",
            "http://127.0.0.1:1",
            "--key-file",
        ])
        .arg(&key)
        .arg("--database")
        .arg(dir.join("v.db"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot verify on GPUs: no NVIDIA driver"), "{stderr}");
    assert!(stderr.contains("--backend cpu"), "{stderr}");
    assert!(
        !dir.join("v.db").exists(),
        "a validator that could not start created its database"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn print_config_round_trips() {
    let out = validator()
        .args(["serve", "--print-config", "--samples", "5"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let parsed: gpu_attest_validator::ValidatorConfig = toml::from_str(&text).unwrap();
    assert_eq!(parsed.samples, 5);
}
