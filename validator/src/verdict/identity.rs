//! What a verdict states of device identity (PROTOCOL.md 19.5): one line per device.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdentityStatus {
    /// The device's evidence verified: a genuine, nonce-bound NVIDIA part of its claimed chip.
    Genuine,
    /// The device offered no report (CC off or unsupported, or the miner stated nothing).
    NotOffered,
    /// The device's evidence did not verify; `reason` says why.
    Refused,
    /// The device offered evidence for a model this validator knows no chip for: not judged
    /// (a failure only under `required`, as `identity-unknown-model`).
    Unjudged,
}

impl IdentityStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Genuine => "genuine",
            Self::NotOffered => "not-offered",
            Self::Refused => "refused",
            Self::Unjudged => "unjudged",
        }
    }

    /// The status named `name`; one this version does not know reads as `Unjudged`, which
    /// claims nothing.
    pub fn from_name(name: &str) -> Self {
        [Self::Genuine, Self::NotOffered, Self::Refused]
            .into_iter()
            .find(|s| s.as_str() == name)
            .unwrap_or(Self::Unjudged)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceIdentity {
    pub index: u32,
    pub status: IdentityStatus,
    /// `genuine NVIDIA GH100 G520/0200 (device 48B0..., cc), nonce-bound`, `not offered (CC
    /// off)`, or the failure's message.
    pub line: String,
    /// The reason code of a refusal (PROTOCOL.md 19.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The certified part, `(chip, device id)`, of a genuine device: a passing verdict records
    /// it, so that the same part answering for another miner key is seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<(String, String)>,
}

/// The identity section of one verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityProof {
    /// The policy the verdict was judged under: `when-offered` or `required`.
    pub policy: String,
    pub devices: Vec<DeviceIdentity>,
}

impl IdentityProof {
    /// Devices whose evidence verified.
    pub fn genuine(&self) -> usize {
        self.devices
            .iter()
            .filter(|d| d.status == IdentityStatus::Genuine)
            .count()
    }
}
