//! The real binaries as a user runs them: where they are, scratch directories, daemons that
//! are killed when a test ends, and the one-line failures every command promises.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::OnceLock;

/// The directory holding `miner` and `validator`. `cargo test --workspace` has built them
/// beside this test's own directory; otherwise they are built into a separate target directory,
/// since this cargo invocation holds the lock on the usual one.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        if profile_dir.join("miner").exists() && profile_dir.join("validator").exists() {
            return profile_dir;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let target = root.join("target").join("e2e-binaries");
        println!(
            "miner/validator binaries not built yet; building them into {}",
            target.display()
        );
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "-q",
                "-p",
                "gpu-attest-miner",
                "-p",
                "gpu-attest-validator",
                "--bins",
            ])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(root)
            .status()
            .unwrap();
        assert!(status.success(), "building the binaries failed");
        target.join("debug")
    })
}

pub fn cmd(name: &str) -> Command {
    Command::new(bin_dir().join(name))
}

pub struct Dir(pub PathBuf);
impl Dir {
    /// An empty directory of this test's own, removed when dropped.
    pub fn fresh(tag: &str) -> Dir {
        let dir = Dir(std::env::temp_dir().join(format!("gpu-attest-{tag}-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).unwrap();
        dir
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed when dropped.
pub struct Daemon(pub Child);
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A failed command (the miner exits 1) that said why in one line.
pub fn assert_one_line_failure(out: &Output, needle: &str) {
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains(needle), "{stderr}");
}
