//! Hardware identity where the GPU can sign: NVIDIA confidential-computing (CC) evidence bound
//! to a challenge (PROTOCOL.md section 19).
//!
//! A Hopper or Blackwell GPU in CC or protected-PCIe mode answers an SPDM GET_MEASUREMENTS
//! request with a report signed (ECDSA P-384, SHA-384) by a device key whose X.509 chain ends at
//! NVIDIA's device root. The miner asks for that report with a nonce derived from the challenge
//! ([`spdm_nonce`]), so a report answers one challenge, one miner and one device slot, and cannot
//! be replayed at another time or for another miner.
//!
//! Evidence proves that a genuine NVIDIA part of the named chip answered this challenge's nonce
//! while it was open. It does not prove where that part is (a nonce can be passed to a GPU
//! elsewhere), nor that it did the work: the compute and memory phases bound the work, and the
//! validator's reuse check (one part, one miner key at a time) bounds the renting of parts.
//!
//! - [`spdm`] reads a report (request and response) without trusting any length in it.
//! - [`cert_chain`] checks a certificate chain up to a pinned root and reads the leaf's identity.
//! - [`model`] maps a claimed model to its chip, and the operator's table of project SKUs.
//! - [`check`] puts them together: one device's evidence against one challenge.
//! - [`fault`] names why evidence proves nothing, one kind per verdict reason.

pub mod cert_chain;
pub mod check;
pub mod fault;
pub mod model;
pub mod spdm;
pub mod statement;

pub use cert_chain::{DeviceChain, LeafIdentity, TrustAnchors};
pub use check::{EvidenceTrust, GenuineDevice, check_device_evidence, check_evidence_set};
pub use fault::EvidenceFault;
pub use model::{ChipEntry, SkuEntry, SkuTable, chip_of_model};
pub use spdm::AttestationReport;
pub use statement::{CcState, DeviceEvidence, EVIDENCE_DOMAIN, evidence_statement_bytes};

use crate::Digest;

/// Domain of the SPDM nonce derivation (PROTOCOL.md 19.2).
pub const SPDM_NONCE_DOMAIN: &str = "gpu-attest v1 spdm nonce";

/// Bytes in an SPDM nonce (SPDM 1.1, and NVML's `NVML_CC_GPU_CEC_NONCE_SIZE`).
pub const SPDM_NONCE_BYTES: usize = 32;

/// The nonce a miner gives the GPU of slot `index` for this challenge:
/// `blake3::derive_key(SPDM_NONCE_DOMAIN, nonce || miner_key || inventory_digest || le32(index))`.
///
/// It binds the report to the challenge (so no report made earlier answers it), to the miner's
/// key (so no other miner's report does) and to the hardware claim and slot the challenge was
/// sized for.
pub fn spdm_nonce(
    challenge_nonce: &[u8; 32],
    miner_key: &[u8; 32],
    inventory_digest: &Digest,
    index: u32,
) -> [u8; SPDM_NONCE_BYTES] {
    let mut hasher = blake3::Hasher::new_derive_key(SPDM_NONCE_DOMAIN);
    hasher.update(challenge_nonce);
    hasher.update(miner_key);
    hasher.update(inventory_digest.as_bytes());
    hasher.update(&index.to_le_bytes());
    *hasher.finalize().as_bytes()
}

/// The SPDM nonce of every slot `0..devices` of a challenge (19.2), as the miner asks its GPUs
/// and the validator checks their reports.
pub fn spdm_nonces(challenge: &crate::statement::Challenge, devices: usize) -> Vec<[u8; SPDM_NONCE_BYTES]> {
    (0..devices as u32)
        .map(|index| {
            spdm_nonce(
                &challenge.params.nonce,
                &challenge.params.miner_key,
                &challenge.inventory_digest,
                index,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spdm_nonce_changes_with_every_input() {
        let nonce = [1; 32];
        let inventory = Digest([3; 32]);
        let base = spdm_nonce(&nonce, &[2; 32], &inventory, 0);
        assert_ne!(base, spdm_nonce(&[9; 32], &[2; 32], &inventory, 0));
        assert_ne!(base, spdm_nonce(&nonce, &[9; 32], &inventory, 0));
        assert_ne!(base, spdm_nonce(&nonce, &[2; 32], &Digest([9; 32]), 0));
        assert_ne!(base, spdm_nonce(&nonce, &[2; 32], &inventory, 1));
    }
}
