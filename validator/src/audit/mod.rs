//! `validator audit FILE`: a verdict checked again offline from its transcript (PROTOCOL.md
//! 22.3), with no database, no network and no GPU.
//!
//! The audit runs the validator's own checks on the messages as they were received and the
//! times as they were read: the signatures, the commitment's checks, every opened chain segment
//! and walk step recomputed on the CPU (every chain, under the full policy), each walk root's
//! time against its deadline. From those it derives the verdict again, reasons, rates and
//! memory figures included, and compares it with the verdict the transcript states, naming
//! every part that differs.
//!
//! - [`replay`]: the attestation again, from the transcript.
//! - this module: the report, and what its exit code says.

mod replay;
mod stream;

use crate::transcript::{self, TranscriptError};
use gpu_attest_shared::Backend;
use gpu_attest_shared::keys::PublicKey;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What an audit found.
#[derive(Debug, Default)]
pub struct Report {
    /// The verdict's id and miner, as the transcript states them.
    pub verdict: String,
    /// Each check that held, for people.
    pub confirmed: Vec<String>,
    /// Each part where the transcript and the re-derived verdict disagree, or a signature fails.
    pub differs: Vec<String>,
    /// Parts the audit cannot re-derive offline and takes as the transcript states them (each
    /// says why).
    pub taken_as_stated: Vec<String>,
    pub elapsed: Duration,
}

/// What an audit's exit status says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Every part re-derived and equal to what the transcript states.
    Confirmed,
    /// Everything re-derived is equal, but some parts are taken as stated (listed).
    ConfirmedInPart,
    /// A part differs, or a signature fails: the transcript was changed, or the validator that
    /// wrote it judged wrongly.
    Differs,
}

impl Finding {
    /// The exit status: 0, 3 and 1 (2 is for a file that cannot be read at all).
    pub fn exit_code(self) -> u8 {
        match self {
            Finding::Confirmed => 0,
            Finding::ConfirmedInPart => 3,
            Finding::Differs => 1,
        }
    }
}

impl Report {
    pub fn finding(&self) -> Finding {
        if !self.differs.is_empty() {
            Finding::Differs
        } else if !self.taken_as_stated.is_empty() {
            Finding::ConfirmedInPart
        } else {
            Finding::Confirmed
        }
    }

    pub(crate) fn confirm(&mut self, what: impl Into<String>) {
        self.confirmed.push(what.into());
    }

    pub(crate) fn differ(&mut self, what: impl Into<String>) {
        self.differs.push(what.into());
    }

    pub(crate) fn take_as_stated(&mut self, what: impl Into<String>) {
        self.taken_as_stated.push(what.into());
    }
}

impl Report {
    /// The report as `validator audit --json` prints it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "verdict": self.verdict,
            "finding": match self.finding() {
                Finding::Confirmed => "confirmed",
                Finding::ConfirmedInPart => "confirmed-in-part",
                Finding::Differs => "differs",
            },
            "confirmed": self.confirmed,
            "taken_as_stated": self.taken_as_stated,
            "differs": self.differs,
            "seconds": self.elapsed.as_secs_f64(),
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "audit of {}", self.verdict)?;
        for line in &self.confirmed {
            writeln!(f, "  confirmed: {line}")?;
        }
        for line in &self.taken_as_stated {
            writeln!(f, "  taken as stated: {line}")?;
        }
        for line in &self.differs {
            writeln!(f, "  DIFFERS: {line}")?;
        }
        let summary = match self.finding() {
            Finding::Confirmed => "CONFIRMED: the verdict follows from the transcript".to_string(),
            Finding::ConfirmedInPart => format!(
                "CONFIRMED IN PART: what was re-derived agrees; {} part(s) taken as stated",
                self.taken_as_stated.len()
            ),
            Finding::Differs => format!("DIFFERS in {} part(s)", self.differs.len()),
        };
        write!(f, "{summary} (audited in {:.1} s)", self.elapsed.as_secs_f64())
    }
}

/// Audits the transcript file `bytes` on `backend` (the CPU's, in the `audit` command).
/// `signer`: the validator key the file must be signed by, where the auditor knows it; else the
/// key it names is reported. Errors only when the file cannot be read as a transcript.
pub async fn audit(
    bytes: &[u8],
    signer: Option<PublicKey>,
    backend: Arc<dyn Backend>,
    reexecute: bool,
) -> Result<Report, TranscriptError> {
    let options = replay::Options {
        reexecute,
        ..Default::default()
    };
    audit_with(bytes, signer, backend, options).await
}

/// [`audit`], with device evidence checked against `anchors` instead of NVIDIA's root: for
/// tests, whose evidence comes from the project's test PKI.
#[cfg(feature = "test-support")]
pub async fn audit_with_anchors(
    bytes: &[u8],
    signer: Option<PublicKey>,
    backend: Arc<dyn Backend>,
    anchors: gpu_attest_shared::evidence::TrustAnchors,
) -> Result<Report, TranscriptError> {
    let options = replay::Options {
        anchors: Some(anchors),
        ..Default::default()
    };
    audit_with(bytes, signer, backend, options).await
}

async fn audit_with(
    bytes: &[u8],
    signer: Option<PublicKey>,
    backend: Arc<dyn Backend>,
    mut options: replay::Options,
) -> Result<Report, TranscriptError> {
    let started = Instant::now();
    let opened = transcript::open(bytes)?;
    let mut report = Report::default();
    match (opened.signer, opened.signature_valid) {
        (Some(key), true) => report.confirm(format!("the transcript is signed by validator {key}")),
        (Some(key), false) => report.differ(format!(
            "the transcript's signature does not verify with the key it names ({key}): a byte of it changed after signing, or another key signed it"
        )),
        (None, _) => report.differ("the transcript names no validator key of 32 bytes"),
    }
    let mut trusted = opened.signature_valid;
    if let Some(expected) = signer
        && opened.signer != Some(expected)
    {
        trusted = false;
        report.differ(format!(
            "signed by {}, not by the validator key given ({expected})",
            opened.signer.map_or_else(|| "no key".into(), |k| k.to_string())
        ));
    }
    options.trusted = trusted;
    replay::replay(&opened, backend, options, &mut report).await;
    report.elapsed = started.elapsed();
    Ok(report)
}
