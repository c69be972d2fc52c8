//! Why evidence proves nothing: one kind per verdict reason (PROTOCOL.md 19.4). Every step of
//! the check returns it, so it sits apart from the steps.

use thiserror::Error;

/// Why evidence proves nothing. Each has its own verdict reason ([`EvidenceFault::reason`]).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum EvidenceFault {
    #[error("no evidence offered ({0})")]
    NotOffered(String),
    #[error("the device is in CC DEVTOOLS mode, in which its memory can be read: {0}")]
    DevTools(String),
    #[error("the report does not decode: {0}")]
    Malformed(String),
    #[error("the certificate chain is broken: {0}")]
    Chain(String),
    #[error("the certificate chain is out of its validity period: {0}")]
    ChainExpired(String),
    #[error("the certificate chain does not end at a pinned root: {0}")]
    UntrustedRoot(String),
    #[error("the report's signature does not verify with the chain's attestation key: {0}")]
    Signature(String),
    #[error("the report answers another nonce: {0}")]
    WrongNonce(String),
    #[error("the certified device is not the one the inventory claims: {0}")]
    DeviceMismatch(String),
    #[error("the validator cannot judge this model's evidence: {0}")]
    UnknownModel(String),
    #[error("the report's SKU is not the claimed model: {0}")]
    SkuMismatch(String),
}

impl EvidenceFault {
    /// The verdict reason code (PROTOCOL.md section 16 and 19.5).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotOffered(_) => "identity-not-offered",
            Self::DevTools(_) => "identity-devtools",
            Self::Malformed(_) => "identity-malformed",
            Self::Chain(_) => "identity-chain",
            Self::ChainExpired(_) => "identity-chain-expired",
            Self::UntrustedRoot(_) => "identity-untrusted-root",
            Self::Signature(_) => "identity-signature",
            Self::WrongNonce(_) => "identity-wrong-nonce",
            Self::DeviceMismatch(_) => "identity-device-mismatch",
            Self::UnknownModel(_) => "identity-unknown-model",
            Self::SkuMismatch(_) => "identity-sku-mismatch",
        }
    }
}
