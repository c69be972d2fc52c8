//! The real binaries as a user runs them: where they are, scratch directories, daemons that
//! are killed when a test ends, and the one-line failures every command promises.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
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

/// A failed command (exit status 2, an error) that said why in one line.
pub fn assert_one_line_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains(needle), "{stderr}");
}

/// `miner serve` on one thread, keyed by `m.key` in `d` and allowing `validator_key`. The
/// miner keeps its nonce log beside its key by default: in `d`, the test's.
pub fn serve_miner(d: &Path, validator_key: &str) -> Command {
    let mut serve = cmd("miner");
    serve
        .current_dir(d)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--cpu-threads",
            "1",
            "--allow-validator",
            validator_key,
            "--key-file",
        ])
        .arg(d.join("m.key"));
    serve
}

/// Starts `serve` and returns it with the address it printed.
pub fn start(mut command: Command) -> (Daemon, String) {
    command.stderr(Stdio::null());
    start_logging(command)
}

/// Starts `serve` with its stderr (its logs) wherever `command` sends it, and returns it with
/// the address it printed.
pub fn start_logging(mut command: Command) -> (Daemon, String) {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (Daemon(child), format!("http://{address}"))
}

pub fn keygen(bin: &str, path: &Path) -> String {
    let out = cmd(bin).args(["keygen", "--key-file"]).arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("public key: "))
        .unwrap()
        .to_string()
}

/// `validator.toml` in `dir`: its key `v.key`, its database `v.db`, small CPU challenges
/// without the memory phase (n = 64 is too small for version 4's slices; the demo and
/// `walk_v4.rs` run the memory phase end to end).
pub fn write_small_validator_config(dir: &Path) {
    std::fs::write(
        dir.join("validator.toml"),
        format!(
            "key_file = {:?}\ndatabase = {:?}\nsamples = 4\ncpu_threads = 1\n\
             [challenge]\ncpu_n = 64\niterations = 4\ncheckpoint_every = 2\ntarget_seconds = 0.5\n\
             [deadline]\nmin_ms = 2000\n[memory]\nenabled = false\n\
             [[rates]]\nbackend = \"cpu\"\nops_per_sec = 2e9\n",
            dir.join("v.key"),
            dir.join("v.db")
        ),
    )
    .unwrap();
}

pub fn attest(dir: &Path, url: &str) -> Output {
    cmd("validator")
        .args(["attest", "--json", "--miner", url, "--config"])
        .arg(dir.join("validator.toml"))
        .output()
        .unwrap()
}

pub fn verdict_count(dir: &Path) -> usize {
    let out = cmd("validator")
        .args(["verdicts", "--json", "--database"])
        .arg(dir.join("v.db"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
        .unwrap()
        .len()
}

/// `GET /metrics` over a bare HTTP/1.1 connection (what `curl` does), the body returned.
pub fn scrape(address: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// The value of the sample `series` (name and labels, as exposed), if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
}

/// Sends `signal` (`-STOP`, `-KILL`, ...) to the process `pid`, as `kill` does.
pub fn signal(pid: i32, signal: &str) {
    let status = Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// A private CA and certificates for `localhost` (validator, operator, one miner) in `d/pki`,
/// made by `validator tls-certs`; the folder.
pub fn tls_certs(d: &Path) -> PathBuf {
    let pki = d.join("pki");
    let out = cmd("validator")
        .args([
            "tls-certs",
            "--validator-host",
            "localhost",
            "--miner-host",
            "localhost",
            "--out",
        ])
        .arg(&pki)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("wrote") && said.contains("operator.pem"), "{said}");
    pki
}
