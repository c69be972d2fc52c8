//! `validator serve` as a library: the attestor built from a config (verification backend,
//! key, store), then the API, the scheduler and the metrics endpoint until shutdown. The binary
//! calls [`run`]; tests call the same builders.

use crate::attest::Attestor;
use crate::config::{ValidatorConfig, VerifyBackend};
use crate::scheduler::Schedule;
use crate::server;
use crate::store::{Store, StoreError};
use gpu_attest_daemon::run::{Daemon, Network, ServeError};
use gpu_attest_kernels::checks::{CheckedKernelError, start_checked};
use gpu_attest_kernels::compile::default_cache_dir;
use gpu_attest_kernels::detect::detect;
use gpu_attest_kernels::{CudaBackend, CudaInitError, CudaOptions};
use gpu_attest_shared::Backend;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::gemm::GemmError;
use gpu_attest_shared::gemm::UnknownKernel;
use gpu_attest_shared::keys::{KeyError, KeyPair};
use std::future::Future;
use std::sync::Arc;
use thiserror::Error;
use tracing::info;

/// Why a validator could not start or stopped serving.
#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("{source}{hint}", hint = if source.is_missing() { format!("; run `validator keygen --key-file {path}` first") } else { String::new() })]
    Key { path: String, source: KeyError },
    #[error(transparent)]
    Kernel(#[from] UnknownKernel),
    #[error("cannot start the CPU verification backend: {0}")]
    Cpu(#[from] GemmError),
    #[error("cannot verify on GPUs: {0}; use --backend cpu")]
    Cuda(String),
    #[error("the GPUs failed their self-check ({0}); verify with --backend cpu until this is fixed")]
    SelfCheck(String),
    /// A self-check faulted a GPU. The fault is cached, so the next start skips the kernel.
    #[error(
        "{0}: a CUDA fault cannot be cleared inside the process, so the validator exits for its supervisor to restart it (exit status {status}; the next start skips the kernel that faulted)",
        status = gpu_attest_daemon::devices::EXIT_DEVICE_FAULT
    )]
    GpuFaulted(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The TLS files it reaches miners with (`[miner_tls]`).
    #[error(transparent)]
    MinerTls(gpu_attest_daemon::tls::TransportError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// The attestor `config` describes: its key, its verification backend (GPUs only once they
/// reproduce the CPU's checkpoints) and its store.
pub async fn attestor(config: &ValidatorConfig) -> Result<Attestor, DaemonError> {
    // A missing CA or client certificate fails now, not at every attestation.
    config.miner_tls.check_readable().map_err(DaemonError::MinerTls)?;
    let identity = KeyPair::load_file(&config.key_file).map_err(|source| DaemonError::Key {
        path: config.key_file.display().to_string(),
        source,
    })?;
    let (backend, on_gpu): (Arc<dyn Backend>, bool) = match config.backend {
        VerifyBackend::Cpu => {
            let cpu = CpuBackend::new(config.cpu_threads, config.cpu_kernel.resolve()?)?;
            info!(kernel = %cpu.kernel(), threads = cpu.threads(), "verifying on the CPU");
            (Arc::new(cpu), false)
        }
        VerifyBackend::Cuda => (Arc::new(checked_gpus(config)?), true),
    };
    // Opened last, so that a validator that cannot start leaves no database behind.
    let store = Store::open(&config.database).await?;
    Ok(Attestor::new(
        identity,
        config.clone(),
        backend,
        on_gpu,
        Arc::new(store),
    ))
}

/// The GPUs to verify on, on a kernel that passed its self-check on every one of them:
/// PROTOCOL.md's vector and a mid-sized challenge, checkpoint by checkpoint against the CPU,
/// with the miner's checks, cache and kernel order. A verifier that computes wrong results fails
/// honest miners. A kernel that faults a GPU is cached as failed and the validator exits with
/// the device-fault status for its supervisor to restart it, and the restart goes on to the
/// next kernel: no later context of this process can use that GPU, and without the cache each
/// restart would fault it again.
fn checked_gpus(config: &ValidatorConfig) -> Result<CudaBackend, DaemonError> {
    let detection = detect().map_err(|e| DaemonError::Cuda(CudaInitError::Detect(e).to_string()))?;
    let options = CudaOptions {
        cache_dir: default_cache_dir(),
        ..CudaOptions::default()
    };
    let (cuda, checks) = start_checked(&detection, &options, config.cpu_threads).map_err(|e| match e {
        CheckedKernelError::Cuda(e) => DaemonError::Cuda(e.to_string()),
        CheckedKernelError::GpuFaulted(what) => DaemonError::GpuFaulted(what),
        CheckedKernelError::Selftest(why) => DaemonError::SelfCheck(why),
    })?;
    for check in &checks {
        info!("self-check: {check}");
    }
    info!(kernel = %cuda.kernel(), "verifying on the GPUs: they reproduced the CPU's checkpoints");
    Ok(cuda)
}

/// Serves `config`'s validator until `shutdown` completes: the API on `config.listen`, the
/// scheduler when enabled, metrics when `[metrics] listen` is set. Logging must be set up by
/// the caller. The listening lines go to stdout.
pub async fn run(
    config: ValidatorConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let network = Network {
        listen: config.listen,
        tls: &config.tls,
        allow_plaintext: config.allow_plaintext,
        metrics: &config.metrics,
        health: &config.health,
    };
    let tls = network.server_tls()?;
    let health_probe = network.health_probe()?;
    let attestor = Arc::new(attestor(&config).await?);
    crate::metrics::restore(attestor.metrics(), attestor.store()).await?;
    let options = server::ServeOptions {
        tls,
        health_probe,
        connections: gpu_attest_daemon::connections::limits_for_this_process(),
        ..server::plaintext_options(&config)
    };
    let schedule = config.schedule.enabled.then(|| Schedule::from_config(&config.schedule));
    let daemon = Daemon {
        name: "validator",
        exposition: || gpu_attest_daemon::metrics::Exposition::new(attestor.metrics().registry(), || {}),
        announce: |address| info!(%address, validator_key = %attestor.public_key(), database = %attestor.store().location(), "validator listening"),
        grpc: |listener| server::serve(attestor.clone(), listener, schedule, options, shutdown),
        out_of_service: || attestor.out_of_service(),
    };
    Ok(gpu_attest_daemon::run::serve(network, daemon).await?)
}
