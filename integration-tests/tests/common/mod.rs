//! Shared set-up: real servers on port-0 loopback listeners, shut down when the test ends.

#![allow(dead_code)]

pub mod breakable;
pub mod cheats;
pub mod fake_driver;
pub mod fleet;
pub mod locality_cheats;
pub mod mangled;
pub mod memory_cheats;
pub mod ninety_percent;
pub mod operated;
pub mod pki;
pub mod pool_cheat;
pub mod process;
pub mod slow;
pub mod state_cheats;
pub mod step_fakes;
pub mod v4;

use gpu_attest_daemon::PeerRateLimiter;
use gpu_attest_miner::MinerCore;
use gpu_attest_miner::backends::SelectedBackend;
use gpu_attest_miner::config::Limits;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_miner::server::ServeOptions;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_validator::Attestor;
use gpu_attest_validator::config::memory::MemoryConfig;
use gpu_attest_validator::config::rates::RateEntry;
use gpu_attest_validator::config::{ChallengeConfig, DeadlineConfig, Policy, ValidatorConfig};
use gpu_attest_validator::store::{Store, VerdictFilter};
use gpu_attest_validator::verdict::Verdict;
use gpu_attest_validator::verdict::reason::ReasonCode;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A server task that stops when this is dropped.
pub struct Running {
    pub address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Running {
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Tells the server to stop, as SIGTERM does a daemon.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

pub async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a port-0 loopback listener");
    let address = listener.local_addr().unwrap();
    (listener, address)
}

/// Cores each test CPU device states; an honest test miner computes on this many threads.
pub const TEST_CORES: u32 = 2;

/// Memory each test CPU device claims: 1 MiB, a pool of 15 entries at the default 950 permille,
/// filled in a fraction of a second.
pub const TEST_MEMORY_BYTES: u64 = 1 << 20;

/// `n` devices of the CPU backend, each presented as a device in the inventory.
pub fn cpu_backend(devices: u32) -> SelectedBackend {
    cpu_backend_on(TEST_CORES as usize, devices)
}

/// `devices` devices that each state [`TEST_CORES`] cores, computed on `threads` threads in all:
/// honest when `threads` is `TEST_CORES * devices` or more (tests share the cores), and
/// under-provisioned below that.
pub fn cpu_backend_on(threads: usize, devices: u32) -> SelectedBackend {
    let cpu = test_cpu(threads).with_logical_devices(devices);
    selected(cpu.kernel(), Arc::new(cpu))
}

/// The CPU backend on `threads` threads, each device stating [`TEST_CORES`] cores and claiming
/// [`TEST_MEMORY_BYTES`].
pub fn test_cpu(threads: usize) -> CpuBackend {
    CpuBackend::new(threads, None)
        .unwrap()
        .claiming(TEST_CORES, TEST_MEMORY_BYTES)
}

/// A miner's selection of `backend`, the CPU backend (or one wrapping it) on `kernel`.
pub fn selected(
    kernel: gpu_attest_shared::gemm::KernelKind,
    backend: Arc<dyn gpu_attest_shared::Backend>,
) -> SelectedBackend {
    SelectedBackend {
        kernel: kernel.to_string(),
        backend,
        name: "cpu".into(),
        notes: Vec::new(),
        self_checks: Vec::new(),
    }
}

pub fn miner_core(seed: u8, allowed: &[PublicKey], devices: u32) -> Arc<MinerCore> {
    miner_core_with(seed, allowed, devices, Limits::default(), NonceLog::in_memory())
}

/// A miner with its own limits and nonce log.
pub fn miner_core_with(
    seed: u8,
    allowed: &[PublicKey],
    devices: u32,
    limits: Limits,
    nonces: NonceLog,
) -> Arc<MinerCore> {
    miner_on(seed, allowed, cpu_backend(devices), limits, nonces)
}

/// A miner on the given backend.
pub fn miner_on(
    seed: u8,
    allowed: &[PublicKey],
    backend: SelectedBackend,
    limits: Limits,
    nonces: NonceLog,
) -> Arc<MinerCore> {
    Arc::new(MinerCore::new(
        KeyPair::from_seed([seed; 32]),
        allowed.iter().copied().collect::<HashSet<_>>(),
        limits,
        backend,
        Duration::from_secs(60),
        nonces,
    ))
}

/// The hardware `cpu_backend(devices)` claims: what a challenge to such a miner is sized for.
pub fn cpu_claim(devices: u32) -> HardwareClaim {
    let selected = cpu_backend(devices);
    HardwareClaim {
        devices: selected.devices(),
        backend: selected.name,
        kernel: selected.kernel,
    }
}

/// An open request for `samples` of the commitment `nonce`, signed by `signer` (PROTOCOL.md 13.3).
pub fn signed_open_request(
    nonce: [u8; 32],
    signer: &KeyPair,
    samples: &[gpu_attest_shared::opening::SampleRequest],
) -> gpu_attest_proto::v1::OpenChainsRequest {
    gpu_attest_proto::v1::OpenChainsRequest {
        nonce: nonce.to_vec(),
        samples: samples.iter().map(gpu_attest_proto::convert::sample_to_wire).collect(),
        validator_key: signer.public_key().0.to_vec(),
        signature: signer
            .sign(&gpu_attest_shared::statement::open_request_bytes(&nonce, samples))
            .to_vec(),
        walk_samples: Vec::new(),
        step_samples: Vec::new(),
    }
}

/// Limits loose enough that only the tests about limits meet them.
pub fn generous_limiter() -> PeerRateLimiter {
    PeerRateLimiter::new(1_000_000, 10_000)
}

pub fn miner_options() -> ServeOptions {
    ServeOptions {
        limiter: generous_limiter(),
        ..gpu_attest_miner::server::plaintext_options(&Limits::default())
    }
}

/// The real miner server around `core`, plaintext on loopback.
pub async fn spawn_miner(core: Arc<MinerCore>) -> Running {
    spawn_miner_with(core, miner_options()).await
}

pub async fn spawn_miner_with(core: Arc<MinerCore>, options: ServeOptions) -> Running {
    let (listener, address) = listener().await;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(gpu_attest_miner::server::serve(core, listener, options, async {
        let _ = stopped.await;
    }));
    Running {
        address,
        stop: Some(stop),
    }
}

/// The standard health service's status for `service` at `url` (a `ServingStatus` as i32).
pub async fn health_status(url: &str, service: &str) -> i32 {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

/// A temporary directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("gpu-attest-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub const VALIDATOR_SEED: u8 = 0xee;

pub fn validator_key() -> PublicKey {
    KeyPair::from_seed([VALIDATOR_SEED; 32]).public_key()
}

/// The test rate table's CPU rate, per core: test miners state 2 cores, so 1.3e7 ops/s each.
pub const TEST_CPU_RATE_PER_CORE: f64 = 6.5e6;

/// Small challenges: n = 64, 4 steps, a checkpoint every 2, and 8 samples. At the test rate a
/// chain is expected to take 161 ms, so a one-device miner gets 5 chains (0.75 s of target work)
/// and sampling opens every chain. The deadline is twice the expected time, 1.6 s, above the
/// 1.5 s floor; far more than the real work needs (a few milliseconds), so that a loaded test
/// machine never fails an honest miner.
pub fn validator_config(dir: &TempDir, policy: Policy) -> ValidatorConfig {
    ValidatorConfig {
        database: dir.path("validator.db"),
        policy,
        samples: 8,
        cpu_threads: 2,
        challenge: ChallengeConfig {
            gpu_n: 64,
            cpu_n: 64,
            iterations: 4,
            checkpoint_every: 2,
            target_seconds: 0.75,
        },
        deadline: DeadlineConfig {
            slack: 2.0,
            cpu_slack: 2.0,
            first_contact_slack: 2.0,
            min_ms: 1_500,
            ..DeadlineConfig::default()
        },
        rates: vec![RateEntry {
            backend: "cpu".into(),
            kernel: String::new(),
            model: String::new(),
            ops_per_sec: TEST_CPU_RATE_PER_CORE,
            peak_ops_per_sec: 0.0,
            source: "integration tests".into(),
        }],
        // The chains' tests run version 2 challenges; the memory phase has tests of its own
        // (`memory.rs`), with `memory_validator_config`.
        memory: MemoryConfig {
            enabled: false,
            ..MemoryConfig::default()
        },
        ..ValidatorConfig::default()
    }
}

pub async fn attestor(config: &ValidatorConfig) -> Arc<Attestor> {
    let store = Store::open(&config.database).await.unwrap();
    let backend = CpuBackend::new(2, None).unwrap();
    Arc::new(Attestor::new(
        KeyPair::from_seed([VALIDATOR_SEED; 32]),
        config.clone(),
        Arc::new(backend),
        false,
        Arc::new(store),
    ))
}

/// One attestation of the miner at `url` by a fresh validator, checking that the verdict it
/// reports is the one it stored. The directory holds the validator's database.
pub async fn attest(url: &str, policy: Policy) -> (Verdict, TempDir) {
    let dir = TempDir::new("attest");
    let attestor = attestor(&validator_config(&dir, policy)).await;
    let verdict = attest_with(&attestor, url).await;
    assert_eq!(
        stored_verdicts(&attestor).await.len(),
        1,
        "a fresh validator stored one verdict"
    );
    (verdict, dir)
}

/// The newest hundred verdicts `attestor` has stored, newest first.
pub async fn stored_verdicts(attestor: &Attestor) -> Vec<Verdict> {
    attestor
        .store()
        .verdicts(&VerdictFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// One attestation of the miner at `url` by `attestor`, checking that the verdict it reports is
/// the newest it stored.
pub async fn attest_with(attestor: &Attestor, url: &str) -> Verdict {
    let verdict = attestor
        .attest(url, &|_| {})
        .await
        .expect("attestation runs to a verdict");
    // What was reported is what was stored.
    let stored = attestor
        .store()
        .verdicts(&VerdictFilter {
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(stored, vec![verdict.clone()]);
    verdict
}

/// The verdict failed, and one of its reasons is `code`.
/// The verdict failed on the walk's clock (a root or statement late, or none by the time the
/// validator gave up), and proves no memory, nor, in version 4, any bound.
pub fn assert_late(verdict: &Verdict) {
    assert!(!verdict.passed, "a cheating miner passed: {verdict:?}");
    assert!(
        verdict
            .reasons
            .iter()
            .any(|r| matches!(r.code, ReasonCode::LateWalk | ReasonCode::WalkTimedOut)),
        "not failed on time: {:?}",
        verdict.reasons
    );
    let memory = verdict.memory.as_ref().unwrap();
    eprintln!("{memory}");
    assert_eq!(memory.proven_bytes(), 0);
    assert_eq!(memory.proven_walk_bytes_per_sec, None);
    assert!(
        memory
            .devices
            .iter()
            .filter_map(|d| d.walk.as_ref())
            .all(|w| w.held_at_least.is_none() && w.proven_bytes_per_sec.is_none())
    );
}

pub fn assert_failed_with(verdict: &Verdict, code: ReasonCode) {
    failed_with(verdict, code);
}

/// The first reason of `verdict` with `code`, after asserting that the verdict failed and has one.
pub fn failed_with(verdict: &Verdict, code: ReasonCode) -> &gpu_attest_validator::verdict::reason::Reason {
    assert!(!verdict.passed, "a cheating miner passed: {verdict:?}");
    let reason = verdict.reasons.iter().find(|r| r.code == code);
    reason.unwrap_or_else(|| panic!("no reason is {code}; reasons: {:?}", verdict.reasons))
}

pub fn validator_options() -> gpu_attest_validator::server::ServeOptions {
    gpu_attest_validator::server::ServeOptions {
        limiter: generous_limiter(),
        ..gpu_attest_validator::server::plaintext_options(&gpu_attest_validator::ValidatorConfig::default())
    }
}

/// The real validator server around `attestor`, without the scheduler.
pub async fn spawn_validator(attestor: Arc<Attestor>) -> Running {
    let (listener, _) = listener().await;
    spawn_validator_on(attestor, listener)
}

/// [`spawn_validator`] on `listener` (to come back at an address a client knows).
pub fn spawn_validator_on(attestor: Arc<Attestor>, listener: TcpListener) -> Running {
    let address = listener.local_addr().expect("a bound listener");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(gpu_attest_validator::server::serve(
        attestor,
        listener,
        None,
        validator_options(),
        async {
            let _ = stopped.await;
        },
    ));
    Running {
        address,
        stop: Some(stop),
    }
}
