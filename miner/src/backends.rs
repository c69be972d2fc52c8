//! Chooses the compute backend from the configuration and the hardware present.

use crate::config::{BackendChoice, MinerConfig};
use crate::inventory::cpu_device;
use gpu_attest_shared::Backend;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::statement::DeviceInfo;
use std::sync::Arc;

/// The backend a miner runs, with what it reports about itself.
#[derive(Clone)]
pub struct SelectedBackend {
    pub backend: Arc<dyn Backend>,
    /// `cpu` or `cuda`.
    pub name: String,
    pub kernel: String,
    pub devices: Vec<DeviceInfo>,
    /// Why `auto` chose what it chose, for the log and `miner info`.
    pub note: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendSelectError {
    #[error(
        "the cuda backend is not available: this build of the miner has no CUDA support yet; run with --backend cpu or --backend auto"
    )]
    CudaUnavailable,
    #[error("cannot start the cpu backend: {0}")]
    Cpu(String),
}

pub fn select(config: &MinerConfig) -> Result<SelectedBackend, BackendSelectError> {
    match config.backend {
        BackendChoice::Cuda => Err(BackendSelectError::CudaUnavailable),
        BackendChoice::Cpu => cpu(config, None),
        BackendChoice::Auto => cpu(
            config,
            Some("no GPU backend in this build, so auto selected the CPU backend".to_string()),
        ),
    }
}

fn cpu(config: &MinerConfig, note: Option<String>) -> Result<SelectedBackend, BackendSelectError> {
    let backend = CpuBackend::new(config.cpu_threads, None).map_err(|e| BackendSelectError::Cpu(e.to_string()))?;
    Ok(SelectedBackend {
        name: "cpu".to_string(),
        kernel: backend.kernel().to_string(),
        backend: Arc::new(backend),
        devices: vec![cpu_device()],
        note,
    })
}
