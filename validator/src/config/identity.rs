//! The `[identity]` section of the validator's configuration.

use gpu_attest_shared::evidence::{ChipEntry, EvidenceTrust, SkuEntry, SkuTable};
use serde::{Deserialize, Serialize};

/// What a verdict requires of device evidence (PROTOCOL.md 19.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdentityPolicy {
    /// Evidence is not read; verdicts say nothing of identity.
    Off,
    /// Evidence a device offers must verify; a device that offers none is stated as such.
    WhenOffered,
    /// Every device must offer evidence that verifies: a host without CC-capable NVIDIA GPUs,
    /// or with CC off, fails with `identity-not-offered`.
    Required,
}

impl IdentityPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::WhenOffered => "when-offered",
            Self::Required => "required",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdentityConfig {
    /// `off`, `when-offered` (the default) or `required`.
    pub policy: IdentityPolicy,
    /// Chips beyond the built-in Hopper ones, by a word of the model name:
    /// `[[identity.chips]] model = "B200", chip = "GB100"`.
    pub chips: Vec<ChipEntry>,
    /// Board project SKUs this operator knows, and the model word each is:
    /// `[[identity.skus]] project = "G520", project_sku = "0200", model = "H100"`.
    pub skus: Vec<SkuEntry>,
    /// Hours during which a certified part seen in a passing verdict for one miner key is
    /// refused for any other (PROTOCOL.md 19.4 step 4); 0 turns the check off. A part moved to
    /// a new key waits this long.
    pub part_reuse_hours: u64,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            policy: IdentityPolicy::WhenOffered,
            chips: Vec::new(),
            skus: Vec::new(),
            part_reuse_hours: 24,
        }
    }
}

impl IdentityConfig {
    /// The reuse window in milliseconds.
    pub fn part_reuse_ms(&self) -> u64 {
        self.part_reuse_hours.saturating_mul(3_600_000)
    }

    /// Refuses rows no evidence could ever match, with the reason.
    pub fn problem(&self) -> Option<String> {
        if self.part_reuse_hours > 24 * 365 {
            return Some(format!(
                "[identity] part_reuse_hours = {} is more than a year; 0 turns the check off",
                self.part_reuse_hours
            ));
        }
        let blank = |text: &str| text.trim().is_empty() || text.split_whitespace().count() != 1;
        if let Some(row) = self.chips.iter().find(|row| blank(&row.model) || blank(&row.chip)) {
            return Some(format!(
                "[[identity.chips]] model = {:?}, chip = {:?}: each must be one word",
                row.model, row.chip
            ));
        }
        if let Some(row) = self
            .skus
            .iter()
            .find(|row| blank(&row.project) || blank(&row.project_sku) || blank(&row.model))
        {
            return Some(format!(
                "[[identity.skus]] project = {:?}, project_sku = {:?}, model = {:?}: each must be one word",
                row.project, row.project_sku, row.model
            ));
        }
        None
    }

    /// NVIDIA's pinned root and this operator's tables.
    pub fn trust(&self) -> EvidenceTrust {
        EvidenceTrust::nvidia(self.table())
    }

    pub fn table(&self) -> SkuTable {
        SkuTable {
            chips: self.chips.clone(),
            skus: self.skus.clone(),
        }
    }
}
