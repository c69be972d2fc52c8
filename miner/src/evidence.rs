//! Where a miner's device evidence comes from (PROTOCOL.md 19): NVML on a CUDA host, nothing on
//! the CPU backend, or a source a test supplies.

use gpu_attest_kernels::evidence::NvmlEvidence;
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

/// What `miner evidence` found of one GPU.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OwnEvidence {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    /// The CC state NVML reports.
    pub cc_state: &'static str,
    /// `genuine NVIDIA ...`, `not offered (...)`, or why the evidence did not verify.
    pub verdict: String,
    /// The reason code a validator would give, when it would refuse the evidence.
    pub reason: Option<&'static str>,
}

/// Asks every GPU NVML sees for evidence over a fresh random nonce and checks it as a validator
/// would (PROTOCOL.md 19.4), against `trust` at `now_unix_secs`.
pub fn check_own_evidence(
    nvml: &NvmlEvidence,
    trust: &gpu_attest_shared::evidence::EvidenceTrust,
    now_unix_secs: u64,
) -> Result<Vec<OwnEvidence>, String> {
    let devices = nvml.devices()?;
    let mut nonces = vec![[0u8; 32]; devices.len()];
    for nonce in &mut nonces {
        getrandom::fill(nonce).map_err(|e| format!("no randomness from the operating system: {e}"))?;
    }
    let gathered = EvidenceSource::gather(nvml, &devices, &nonces);
    Ok(devices
        .iter()
        .zip(&gathered)
        .zip(&nonces)
        .map(|((device, evidence), nonce)| {
            let checked =
                gpu_attest_shared::evidence::check_device_evidence(evidence, nonce, &device.name, trust, now_unix_secs);
            let (verdict, reason) = match checked {
                Ok(genuine) => (genuine.describe(), None),
                Err(gpu_attest_shared::evidence::EvidenceFault::NotOffered(state)) => {
                    (format!("not offered ({state})"), None)
                }
                Err(fault) => (fault.to_string(), Some(fault.reason())),
            };
            OwnEvidence {
                index: device.index,
                name: device.name.clone(),
                uuid: device.uuid.clone(),
                cc_state: evidence.cc_state.describe(),
                verdict,
                reason,
            }
        })
        .collect())
}
