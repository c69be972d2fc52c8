//! `miner evidence`: asks this host's GPUs for confidential-computing evidence and checks it as
//! a validator would (PROTOCOL.md 19). Needs only the NVIDIA driver (NVML), not CUDA.

use super::{Answer, CommandError, print_json};
use gpu_attest_kernels::evidence::NvmlEvidence;
use gpu_attest_shared::evidence::{DeviceChain, EvidenceTrust, TrustAnchors};
use std::path::Path;

/// Checks every GPU's evidence against NVIDIA's pinned root, or the PEM roots in `roots`.
pub(super) fn check(roots: Option<&Path>, json: bool) -> Result<Answer, CommandError> {
    let nvml = NvmlEvidence::open().map_err(CommandError::NoDriver)?;
    let anchors = match roots {
        None => TrustAnchors::nvidia(),
        Some(path) => TrustAnchors::from_der(read_roots(path)?),
    };
    let trust = EvidenceTrust {
        anchors,
        table: Default::default(),
    };
    let found = crate::evidence::check_own_evidence(&nvml, &trust, now_unix_secs()).map_err(CommandError::Evidence)?;
    if json {
        print_json(&found)?;
    } else if found.is_empty() {
        println!("NVML sees no GPU");
    } else {
        println!(
            "checked against the root(s) with SHA-256 {}",
            trust.anchors.sha256_fingerprints().join(", ")
        );
        for device in &found {
            println!(
                "GPU {} {} ({}): {}; {}",
                device.index, device.name, device.uuid, device.cc_state, device.verdict
            );
        }
    }
    Ok(Answer::Yes)
}

/// The DER certificates of the PEM file at `path`.
fn read_roots(path: &Path) -> Result<Vec<Vec<u8>>, CommandError> {
    let pem = gpu_attest_daemon::command::read_file(path)?;
    DeviceChain::pem_to_der(&pem).map_err(|source| CommandError::NotPem {
        path: path.to_path_buf(),
        source,
    })
}

fn now_unix_secs() -> u64 {
    // A clock before 1970 is read as 1970: every certificate then looks not yet valid, which
    // the check reports per device.
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
