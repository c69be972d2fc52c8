//! The `[transcripts]` section of the validator's configuration: which verdicts keep their
//! transcript (PROTOCOL.md 21), and how much disk all of them may take.

use serde::{Deserialize, Serialize};

/// Which verdicts keep their transcript.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepTranscripts {
    /// Failing verdicts only: the ones an operator disputes.
    Failures,
    /// Every verdict, pass or fail: for a network owner auditing this validator.
    All,
    /// None.
    None,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TranscriptConfig {
    pub keep: KeepTranscripts,
    /// The most the kept transcripts may take together, in MiB: past it the oldest go first. A
    /// GPU challenge's transcript is tens of MiB (BENCHMARKS.md), a CPU one's a few.
    pub budget_mib: u64,
}

impl Default for TranscriptConfig {
    fn default() -> Self {
        TranscriptConfig {
            keep: KeepTranscripts::Failures,
            budget_mib: 2048,
        }
    }
}

impl TranscriptConfig {
    /// Whether a verdict that `passed` keeps its transcript.
    pub fn keeps(&self, passed: bool) -> bool {
        match self.keep {
            KeepTranscripts::All => true,
            KeepTranscripts::Failures => !passed,
            KeepTranscripts::None => false,
        }
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_mib.saturating_mul(1 << 20)
    }

    pub fn problem(&self) -> Option<String> {
        (self.keep != KeepTranscripts::None && self.budget_mib == 0).then(|| {
            "transcripts.budget_mib = 0 keeps no transcript; set keep = \"none\" to keep none, or a budget in MiB"
                .into()
        })
    }
}
