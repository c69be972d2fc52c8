//! NVIDIA confidential-computing evidence, read through NVML (PROTOCOL.md 19.1 and 19.3): per
//! GPU its CC state, and where CC is on, the signed report over this challenge's nonce and the
//! attestation certificate chain.

use gpu_attest_shared::evidence::{CcState, DeviceChain, DeviceEvidence};
use gpu_attest_shared::statement::DeviceInfo;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

/// What [`NvmlEvidence::gather`] found: one entry per device, and what went wrong on the way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gathered {
    pub devices: Vec<DeviceEvidence>,
    pub problems: Vec<String>,
}

/// NVML, started once, asked for evidence on every commitment.
pub struct NvmlEvidence {
    nvml: Nvml,
}

impl NvmlEvidence {
    /// NVML as the system loads it, or why it cannot start.
    pub fn open() -> Result<Self, String> {
        Nvml::init()
            .map(|nvml| Self { nvml })
            .map_err(|e| format!("NVML unavailable: {e}"))
    }

    /// NVML from a library file of the caller's choosing (a test's stand-in).
    pub fn open_at(library: &std::path::Path) -> Result<Self, String> {
        Nvml::builder()
            .lib_path(library.as_os_str())
            .init()
            .map(|nvml| Self { nvml })
            .map_err(|e| format!("NVML at {} unavailable: {e}", library.display()))
    }

    /// Every GPU NVML sees, by its NVML index, with its name and UUID: what `miner evidence`
    /// asks, whether or not CUDA can run on it.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>, String> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| format!("NVML cannot count GPUs: {e}"))?;
        (0..count)
            .map(|index| {
                let device = self
                    .nvml
                    .device_by_index(index)
                    .map_err(|e| format!("GPU {index}: {e}"))?;
                Ok(DeviceInfo {
                    index,
                    name: device.name().map_err(|e| format!("GPU {index}'s name: {e}"))?,
                    uuid: device.uuid().map_err(|e| format!("GPU {index}'s UUID: {e}"))?,
                    ..DeviceInfo::default()
                })
            })
            .collect()
    }

    /// One entry per device, in the order given, each asked with its own nonce. A device CC is
    /// off or unsupported on offers nothing, and says which; a device whose report or chain
    /// cannot be read offers nothing, with the problem beside it for the log, so that the
    /// validator's policy decides.
    pub fn gather(&self, devices: &[DeviceInfo], nonces: &[[u8; 32]]) -> Gathered {
        let (system, mut problems) = self.system_state();
        let devices = devices
            .iter()
            .zip(nonces)
            .map(|(info, nonce)| match system {
                CcState::On | CcState::ProtectedPcie => match self.device_evidence(info, *nonce) {
                    Ok((report, certificates)) => DeviceEvidence {
                        index: info.index,
                        cc_state: system,
                        report,
                        certificates,
                    },
                    Err(why) => {
                        problems.push(format!("device {} ({}): no CC evidence: {why}", info.index, info.uuid));
                        DeviceEvidence::not_offered(info.index, system)
                    }
                },
                state => DeviceEvidence::not_offered(info.index, state),
            })
            .collect();
        Gathered { devices, problems }
    }

    /// The system's CC state: NVML keeps one for every GPU of the host.
    fn system_state(&self) -> (CcState, Vec<String>) {
        let Ok(device) = self.nvml.device_by_index(0) else {
            return (CcState::NotSupported, Vec::new());
        };
        let mut problems = Vec::new();
        let mut state = |result: Result<bool, NvmlError>| match result {
            Ok(on) => Some(on),
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound) => None,
            Err(error) => {
                problems.push(format!("NVML could not read the CC settings: {error}"));
                None
            }
        };
        let cc = match state(device.is_cc_enabled()) {
            None => CcState::NotSupported,
            Some(false) => CcState::Off,
            Some(true) if state(device.is_cc_dev_mode_enabled()) == Some(true) => CcState::DevTools,
            Some(true) if state(device.is_multi_gpu_protected_pcie_enabled()) == Some(true) => CcState::ProtectedPcie,
            Some(true) => CcState::On,
        };
        (cc, problems)
    }

    fn device_evidence(&self, info: &DeviceInfo, nonce: [u8; 32]) -> Result<(Vec<u8>, Vec<Vec<u8>>), String> {
        let device = self
            .nvml
            .device_by_uuid(info.uuid.as_str())
            .map_err(|e| format!("NVML does not know {}: {e}", info.uuid))?;
        let report = device
            .confidential_compute_gpu_attestation_report(nonce)
            .map_err(|e| format!("the attestation report: {e}"))?;
        let certificate = device
            .confidential_compute_gpu_certificate()
            .map_err(|e| format!("the certificate chain: {e}"))?;
        let chain = DeviceChain::pem_to_der(&certificate.attestation_cert_chain).map_err(|e| e.to_string())?;
        Ok((report.attestation_report, chain))
    }
}
