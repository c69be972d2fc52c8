//! Chooses the compute backend from the configuration and the hardware present.

use crate::config::{BackendChoice, MinerConfig};
use crate::selftest;
use gpu_attest_kernels::checks::{CheckedKernelError, start_checked};
use gpu_attest_kernels::detect::{Detection, GpuDetectError, detect};
use gpu_attest_kernels::{CudaBackend, CudaInitError};
use gpu_attest_shared::Backend;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::statement::DeviceInfo;
use std::sync::Arc;

/// The backend a miner runs, with what it reports about itself. Its devices are the
/// backend's own ([`Backend::devices`]).
#[derive(Clone)]
pub struct SelectedBackend {
    pub backend: Arc<dyn Backend>,
    /// `cpu` or `cuda`.
    pub name: String,
    pub kernel: String,
    /// Why `auto` chose what it chose, and how the GPU kernels were built, for the log and
    /// `miner info`.
    pub notes: Vec<String>,
    /// What the self-check found on the selected devices (the GPU kernels checked before the
    /// CUDA backend started; empty on the CPU), for `miner info` and GetInventory.
    pub self_checks: Vec<selftest::KernelCheck>,
}

impl SelectedBackend {
    /// What each device states in the inventory, in partition order.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.backend.devices()
    }

    pub fn is_cuda(&self) -> bool {
        self.name == CUDA
    }
}

const CUDA: &str = "cuda";

#[derive(Debug, thiserror::Error)]
pub enum BackendSelectError {
    /// Not a `source`: the message already carries it.
    #[error("the cuda backend cannot start: {0}")]
    Cuda(CudaInitError),
    #[error("the cuda backend cannot start: {0}")]
    GpuSelftest(String),
    /// A self-check faulted a GPU, which only a fresh process can use again; the fault is
    /// cached, so the next start goes on to the next kernel. Never answered by falling back to
    /// the CPU.
    #[error(
        "{0}: a CUDA fault cannot be cleared inside the process, so the miner must restart (the next start skips the kernel that faulted)"
    )]
    GpuFaulted(String),
    #[error("cannot start the cpu backend: {0}")]
    Cpu(String),
}

pub fn select(config: &MinerConfig) -> Result<SelectedBackend, BackendSelectError> {
    match config.backend {
        BackendChoice::Cpu => cpu(config, Vec::new()),
        _ => select_detected(config, &detect()),
    }
}

/// As [`select`], from a detection the caller already made (`miner info` prints it too).
pub fn select_detected(
    config: &MinerConfig,
    detection: &Result<Detection, GpuDetectError>,
) -> Result<SelectedBackend, BackendSelectError> {
    let start_cuda = || -> Result<SelectedBackend, BackendSelectError> {
        let detection = detection
            .as_ref()
            .map_err(|e| BackendSelectError::Cuda(CudaInitError::Detect(e.clone())))?;
        start_checked_cuda(config, detection)
    };
    match config.backend {
        BackendChoice::Cuda => start_cuda(),
        BackendChoice::Cpu => cpu(config, Vec::new()),
        BackendChoice::Auto => start_cuda().or_else(|e| {
            // A faulted GPU is usable again after a restart: mining on the CPU until someone
            // restarts the miner would waste it.
            if matches!(e, BackendSelectError::GpuFaulted(_)) {
                return Err(e);
            }
            let reason = match e {
                BackendSelectError::Cuda(e) => e.to_string(),
                other => other.to_string(),
            };
            cpu(
                config,
                vec![format!("no usable GPU ({reason}), so auto selected the CPU backend")],
            )
        }),
    }
}

/// The CUDA backend on a kernel that passed its self-check on every selected GPU (see
/// [`start_checked`]): the configured kernel, or under `auto` the first of
/// [`GpuKernel::FASTEST_FIRST`] that every selected GPU runs and passed on. What every check
/// found goes into the notes.
fn start_checked_cuda(config: &MinerConfig, detection: &Detection) -> Result<SelectedBackend, BackendSelectError> {
    let options = config.cuda_options();
    let (backend, checks) = start_checked(detection, &options, config.cpu_threads).map_err(|e| match e {
        CheckedKernelError::Cuda(e) => BackendSelectError::Cuda(e),
        CheckedKernelError::GpuFaulted(what) => BackendSelectError::GpuFaulted(what),
        CheckedKernelError::Selftest(why) => BackendSelectError::GpuSelftest(why),
    })?;
    // Version 4's walk is checked only where the miner is to say 4 (the default): until it has
    // passed, the backend keeps no chain pools and the miner says 3 (2 where its GPUs hold no
    // pools), which a validator of this release attests for compute only or refuses.
    let chain_pools = config.limits.protocol_4.then(|| backend.check_chain_pools());
    // The locality walk only where it is turned on and version 4's pools are kept: its outcome
    // stays with each device, whose pools then walk lines or answer that they cannot.
    let locality = (config.gpu_locality_walk && matches!(chain_pools, Some(Ok(())))).then(|| backend.check_locality());
    let mut selected = cuda_selection(backend);
    selected.notes.extend(checks.iter().map(|c| format!("self-check: {c}")));
    match chain_pools {
        Some(Ok(())) => selected
            .notes
            .push("self-check: the version 4 walk matches the CPU's on every GPU".into()),
        Some(Err(why)) => selected.notes.push(format!(
            "self-check: {why}; this miner says protocol version 3, whose memory phase validators of this release refuse: report this line with `miner info`'s output"
        )),
        None => {}
    }
    match locality {
        Some(Ok(())) => selected
            .notes
            .push("self-check: the locality walk and its openings match the CPU's on every GPU".into()),
        Some(Err(why)) => selected.notes.push(format!(
            "self-check: the locality walk failed, {why}; this miner answers locality requests that it cannot walk lines (its verdicts state no locality bound): report this line with `miner info`'s output"
        )),
        None => {}
    }
    selected.self_checks = checks;
    Ok(selected)
}

fn cuda_selection(backend: CudaBackend) -> SelectedBackend {
    SelectedBackend {
        name: CUDA.to_string(),
        kernel: backend.kernel().to_string(),
        notes: backend.module_notes(),
        backend: Arc::new(backend),
        self_checks: Vec::new(),
    }
}

fn cpu(config: &MinerConfig, notes: Vec<String>) -> Result<SelectedBackend, BackendSelectError> {
    let kernel = config
        .cpu_kernel
        .resolve()
        .map_err(|e| BackendSelectError::Cpu(e.to_string()))?;
    let backend = CpuBackend::new(config.cpu_threads, kernel).map_err(|e| BackendSelectError::Cpu(e.to_string()))?;
    // Its cores are the threads it computes on; its memory, the configured claim.
    let cores = backend.threads() as u32;
    let backend = backend.claiming(cores, config.cpu_memory_mib << 20);
    Ok(SelectedBackend {
        name: "cpu".to_string(),
        kernel: backend.kernel().to_string(),
        backend: Arc::new(backend),
        notes,
        self_checks: Vec::new(),
    })
}
