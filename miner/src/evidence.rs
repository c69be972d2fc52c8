//! Where a miner's device evidence comes from (PROTOCOL.md 19): NVML on a CUDA host, nothing on
//! the CPU backend, or a source a test supplies.

use gpu_attest_shared::cuda::evidence::NvmlEvidence;
use gpu_attest_shared::evidence::{CcState, DeviceEvidence};
use gpu_attest_shared::statement::DeviceInfo;
use tracing::warn;

/// Gathers one entry per device, in the order given, each answering its own SPDM nonce.
pub trait EvidenceSource: Send + Sync {
    fn gather(&self, devices: &[DeviceInfo], nonces: &[[u8; 32]]) -> Vec<DeviceEvidence>;
}

/// No device can sign: every device offers nothing, in the state given (the CPU backend's is
/// "not supported"; a GPU host whose NVML would not start says "not stated").
pub struct NoEvidence(pub CcState);

impl EvidenceSource for NoEvidence {
    fn gather(&self, devices: &[DeviceInfo], _nonces: &[[u8; 32]]) -> Vec<DeviceEvidence> {
        devices
            .iter()
            .map(|d| DeviceEvidence::not_offered(d.index, self.0))
            .collect()
    }
}

impl EvidenceSource for NvmlEvidence {
    fn gather(&self, devices: &[DeviceInfo], nonces: &[[u8; 32]]) -> Vec<DeviceEvidence> {
        let gathered = NvmlEvidence::gather(self, devices, nonces);
        for problem in &gathered.problems {
            warn!("{problem}");
        }
        gathered.devices
    }
}

/// The source for a backend: NVML for CUDA, where it starts; nothing otherwise.
pub fn for_backend(is_cuda: bool) -> Box<dyn EvidenceSource> {
    if !is_cuda {
        return Box::new(NoEvidence(CcState::NotSupported));
    }
    match NvmlEvidence::open() {
        Ok(nvml) => Box::new(nvml),
        Err(why) => {
            warn!("device evidence unavailable: {why}");
            Box::new(NoEvidence(CcState::Unspecified))
        }
    }
}
