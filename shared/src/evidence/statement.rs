//! What a miner ships of each device's evidence, and the canonical bytes it signs over it
//! (PROTOCOL.md 19.3).

/// Domain of the signed evidence statement.
pub const EVIDENCE_DOMAIN: &str = "gpu-attest v1 device evidence";

/// A device's confidential-computing state, as the miner's NVML reads it. Only a report can
/// show a genuine part; the state is the host's word, signed by the miner, and says why a device
/// offers none. The numbers are the wire's and the statement's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CcState {
    /// The miner did not say (an older miner, or a CPU backend).
    Unspecified = 0,
    /// The device or driver has no confidential computing.
    NotSupported = 1,
    /// CC is supported but off.
    Off = 2,
    /// CC is on.
    On = 3,
    /// CC is on in DEVTOOLS mode, which lets tools read the GPU's memory: refused.
    DevTools = 4,
    /// Protected PCIe mode (multi-GPU) is on.
    ProtectedPcie = 5,
}

impl CcState {
    pub fn from_wire(value: i32) -> Option<Self> {
        Some(match value {
            0 => Self::Unspecified,
            1 => Self::NotSupported,
            2 => Self::Off,
            3 => Self::On,
            4 => Self::DevTools,
            5 => Self::ProtectedPcie,
            _ => return None,
        })
    }

    pub fn to_wire(self) -> i32 {
        self as i32
    }

    /// How a verdict names the state.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Unspecified => "not stated",
            Self::NotSupported => "CC not supported",
            Self::Off => "CC off",
            Self::On => "CC on",
            Self::DevTools => "CC in DEVTOOLS mode",
            Self::ProtectedPcie => "protected PCIe",
        }
    }
}

/// One device's evidence as the miner signed it: the report and the chain are empty when the
/// device offers none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEvidence {
    pub index: u32,
    pub cc_state: CcState,
    /// NVML's attestation report: the SPDM request followed by the signed response.
    pub report: Vec<u8>,
    /// The attestation certificate chain in DER, leaf first, root last.
    pub certificates: Vec<Vec<u8>>,
}

impl DeviceEvidence {
    /// A device that offers no report, with the state that says why.
    pub fn not_offered(index: u32, cc_state: CcState) -> Self {
        Self {
            index,
            cc_state,
            report: Vec::new(),
            certificates: Vec::new(),
        }
    }

    /// The first wire limit of PROTOCOL.md 19.3 this entry breaks, as the field at fault and
    /// what is wrong with it; `None` when it keeps them all.
    pub fn wire_limit_problem(&self) -> Option<(&'static str, String)> {
        use super::cert_chain::{MAX_CERTIFICATE_BYTES, MAX_CERTIFICATES};
        use super::spdm::MAX_REPORT_BYTES;
        if self.report.len() > MAX_REPORT_BYTES {
            return Some(("evidence.report", format!("more than {MAX_REPORT_BYTES} bytes")));
        }
        if self.certificates.len() > MAX_CERTIFICATES {
            return Some(("evidence.certificates", format!("more than {MAX_CERTIFICATES}")));
        }
        if self.certificates.iter().any(|c| c.len() > MAX_CERTIFICATE_BYTES) {
            return Some((
                "evidence.certificates",
                format!("a certificate of more than {MAX_CERTIFICATE_BYTES} bytes"),
            ));
        }
        None
    }

    pub fn is_offered(&self) -> bool {
        !self.report.is_empty()
    }
}

/// `"gpu-attest v1 device evidence" || nonce || miner_key || validator_key
///  || list(le32(index) || le32(cc_state) || bytes(report) || list(bytes(certificate)))`,
/// where `bytes(x)` is `le32(len(x)) || x` and `list` is `le32(count)` then the items.
pub fn evidence_statement_bytes(
    nonce: &[u8; 32],
    miner_key: &[u8; 32],
    validator_key: &[u8; 32],
    evidence: &[DeviceEvidence],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        EVIDENCE_DOMAIN.len()
            + 100
            + evidence
                .iter()
                .map(|e| 16 + e.report.len() + e.certificates.iter().map(|c| 4 + c.len()).sum::<usize>())
                .sum::<usize>(),
    );
    out.extend_from_slice(EVIDENCE_DOMAIN.as_bytes());
    out.extend_from_slice(nonce);
    out.extend_from_slice(miner_key);
    out.extend_from_slice(validator_key);
    out.extend_from_slice(&len32(evidence.len()));
    for device in evidence {
        out.extend_from_slice(&device.index.to_le_bytes());
        out.extend_from_slice(&(device.cc_state.to_wire() as u32).to_le_bytes());
        out.extend_from_slice(&len32(device.report.len()));
        out.extend_from_slice(&device.report);
        out.extend_from_slice(&len32(device.certificates.len()));
        for certificate in &device.certificates {
            out.extend_from_slice(&len32(certificate.len()));
            out.extend_from_slice(certificate);
        }
    }
    out
}

fn len32(len: usize) -> [u8; 4] {
    u32::try_from(len)
        .expect("evidence lengths are bounded far below 4 GiB")
        .to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Digest;
    use crate::evidence::spdm_nonce;

    /// PROTOCOL.md 19.6: the SPDM nonces and the evidence statement of the vectors.
    #[test]
    fn protocol_vectors() {
        let nonce: [u8; 32] = std::array::from_fn(|i| i as u8);
        let miner_key: [u8; 32] = std::array::from_fn(|i| 0x40 + i as u8);
        let inventory = Digest::from_hex("c6e4efd4e0ed888751e3fe6860c16176de081873b88b35816426f01e35e0deca").unwrap();
        let validator_key: [u8; 32] = hex::decode("cd14b37f956e953194ff7fb73b3d81dcc561d61a7538094b7c3e1a643ee5f3aa")
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(
            hex::encode(spdm_nonce(&nonce, &miner_key, &inventory, 0)),
            "4acb15a1c6d139e191e823ff6bb8faf3c0fd4f5a7ef6a6b7777425acf8f31e72"
        );
        assert_eq!(
            hex::encode(spdm_nonce(&nonce, &miner_key, &inventory, 1)),
            "b3ee581d479d5e0f29a9742769ca1939f9f171cee4fdbd9467b655ce7c99d95a"
        );
        let evidence = [
            DeviceEvidence {
                index: 0,
                cc_state: CcState::On,
                report: vec![1, 2, 3],
                certificates: vec![vec![0xAA], vec![0xBB, 0xCC]],
            },
            DeviceEvidence::not_offered(1, CcState::Off),
        ];
        let bytes = evidence_statement_bytes(&nonce, &miner_key, &validator_key, &evidence);
        assert_eq!(
            (bytes.len(), blake3::hash(&bytes).to_hex().to_string()),
            (
                175,
                "8edc04a956814516623e9107bd76d4ec6cd6c0bb5e2141e60bacc0a531cb9aeb".to_string()
            )
        );
        let doc = include_str!("../../../PROTOCOL.md");
        for quoted in [
            "4acb15a1c6d139e191e823ff6bb8faf3c0fd4f5a7ef6a6b7777425acf8f31e72",
            "b3ee581d479d5e0f29a9742769ca1939f9f171cee4fdbd9467b655ce7c99d95a",
            "8edc04a956814516623e9107bd76d4ec6cd6c0bb5e2141e60bacc0a531cb9aeb",
        ] {
            assert!(doc.contains(quoted), "PROTOCOL.md 19.6 does not quote {quoted}");
        }
    }
}
