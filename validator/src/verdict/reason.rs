//! Why a verdict failed: a stable code for programs and a sentence for people.
//!
//! Every reason a verdict can carry has its own [`ReasonCode`]. The engine's
//! [`Rejection`]s map one to one onto codes, so a new rejection cannot reach a verdict without
//! a code of its own (the match below stops compiling). Codes are stored and served as their
//! kebab-case names; those names are part of the validator's API and never change meaning.

use gpu_attest_shared::verify::Rejection;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

macro_rules! reason_codes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// The kind of a failure, one per distinct way a miner's answer can be wrong.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ReasonCode {
            $($(#[$doc])* $variant,)*
        }

        impl ReasonCode {
            pub const ALL: &[ReasonCode] = &[$(ReasonCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ReasonCode::$variant => $name,)*
                }
            }

            /// The code named `name`; a name this version does not know reads as `Unclassified`.
            pub fn from_name(name: &str) -> Self {
                match name {
                    $($name => ReasonCode::$variant,)*
                    _ => ReasonCode::Unclassified,
                }
            }
        }
    };
}

reason_codes! {
    // Before the commitment.
    /// The miner neither accepted nor refused the challenge within the accept window, or
    /// refused it only after (PROTOCOL.md 14.3): the challenge stood issued.
    NotAccepted = "not-accepted",
    /// The commitment (or `Accepted`) names hardware other than the challenge was sized for.
    HardwareMismatch = "hardware-mismatch",
    /// A progress event that cannot be true of the accepted partition.
    ImpossibleProgress = "impossible-progress",
    /// Events out of the order of PROTOCOL.md 14.3 (progress before `Accepted`, two `Accepted`).
    StreamOutOfOrder = "stream-out-of-order",
    /// The miner ended the challenge with an error after accepting it (other than reaching the
    /// deadline: that is `commitment-timed-out`).
    MinerFailed = "miner-failed",
    /// The stream ended without a commitment.
    NoCommitment = "no-commitment",
    /// No commitment in time: the miner stopped at the deadline, or at the finish-by time when
    /// the challenge had one (`DEADLINE_EXCEEDED`), or nothing came within that plus the grace.
    CommitmentTimedOut = "commitment-timed-out",
    /// The commitment arrived, but after the deadline by the validator's clock (by the finish-by
    /// time, it is verified and may be a graded miss: PROTOCOL.md 17).
    LateCommitment = "late-commitment",
    // The commitment itself.
    MalformedCommitment = "malformed-commitment",
    CommitmentWrongMiner = "commitment-wrong-miner",
    CommitmentSignature = "commitment-signature",
    CommitmentWrongValidator = "commitment-wrong-validator",
    NonceMismatch = "nonce-mismatch",
    DeviceCount = "device-count",
    PartitionNotCanonical = "partition-not-canonical",
    EmptyDeviceRoot = "empty-device-root",
    GlobalChecksumMismatch = "global-checksum-mismatch",
    // Full re-execution.
    ReexecutionMismatch = "reexecution-mismatch",
    // Sampled openings.
    OpenRefused = "open-refused",
    OpeningsTimedOut = "openings-timed-out",
    OpeningMissing = "opening-missing",
    OpeningFailed = "opening-failed",
    MalformedOpening = "malformed-opening",
    OpeningWrongChallenge = "opening-wrong-challenge",
    OpeningSignature = "opening-signature",
    OpeningForWrongRequest = "opening-for-wrong-request",
    CheckpointCount = "checkpoint-count",
    LeafNotCommitted = "leaf-not-committed",
    StartMatrixMismatch = "start-matrix-mismatch",
    OpenedMatrixSize = "opened-matrix-size",
    OpenedMatrixMismatch = "opened-matrix-mismatch",
    SegmentMismatch = "segment-mismatch",
    // The memory phase (protocol version 3, PROTOCOL.md 18.4 and 18.5).
    /// The commitment does not name one pool per device, in index order, of the planned size.
    PoolNotCanonical = "pool-not-canonical",
    /// The miner refused the walk request, or failed the walk.
    WalkRefused = "walk-refused",
    /// No walk statement within the walk deadline plus its grace.
    WalkTimedOut = "walk-timed-out",
    /// The walk statement arrived after the walk deadline by the validator's clock.
    LateWalk = "late-walk",
    MalformedWalk = "malformed-walk",
    WalkSignature = "walk-signature",
    /// The walk statement names another nonce, walk seed, miner or validator.
    WalkWrongChallenge = "walk-wrong-challenge",
    /// The walk statement does not name one walk root per device, in index order.
    WalkNotCanonical = "walk-not-canonical",
    WalkOpeningSignature = "walk-opening-signature",
    WalkOpeningForWrongRequest = "walk-opening-for-wrong-request",
    WalkCheckpointCount = "walk-checkpoint-count",
    WalkLeafNotCommitted = "walk-leaf-not-committed",
    WalkStartMismatch = "walk-start-mismatch",
    MalformedWalkOpening = "malformed-walk-opening",
    /// A walk step's entry is not in the committed pool at the index its state names.
    PoolEntryNotCommitted = "pool-entry-not-committed",
    /// A walk step's entry is not the work function's (a fake pool).
    PoolEntryMismatch = "pool-entry-mismatch",
    /// A walk segment's steps do not lead to its next checkpoint (faked steps). In version 4,
    /// where every state is committed, a step that does not give the next state.
    WalkSegmentMismatch = "walk-segment-mismatch",
    /// Version 4: an opened step's states are not at their places in the walker's tree.
    WalkStateNotCommitted = "walk-state-not-committed",
    // The locality walk (PROTOCOL.md 20.10), where the validator asks for it.
    /// The miner refused or failed the locality walk or its openings after accepting the
    /// challenge (other than answering UNIMPLEMENTED: a miner that cannot walk lines gets a
    /// verdict without the walk).
    LocalityRefused = "locality-refused",
    /// A device's locality root came after its deadline, or none came in time.
    LocalityTimedOut = "locality-timed-out",
    /// A locality root not signed by the miner over this locality walk.
    LocalityRootSignature = "locality-root-signature",
    /// A locality root or opening that does not decode, a root for no device or for one twice,
    /// a walk that ended without every device's root, or an opening round that ended early.
    MalformedLocality = "malformed-locality",
    LocalityOpeningSignature = "locality-opening-signature",
    /// An opened locality segment that is not the one asked for in its place.
    LocalityOpeningForWrongRequest = "locality-opening-for-wrong-request",
    /// A generation's end states in an opening are not the ones the locality root committed.
    LocalityGenerationNotCommitted = "locality-generation-not-committed",
    /// A line of an opened segment is not part of its chain's committed state.
    LocalityLineNotCommitted = "locality-line-not-committed",
    /// An opened segment's lines do not lead from its start to its committed end (a made-up
    /// end state: a walker not walked, or split and walked side by side).
    LocalitySegmentMismatch = "locality-segment-mismatch",
    // Device evidence (PROTOCOL.md 19.4).
    /// A device offers no evidence, and the validator requires it.
    IdentityNotOffered = "identity-not-offered",
    /// A device is in CC DEVTOOLS mode, in which its memory can be read.
    IdentityDevtools = "identity-devtools",
    /// The evidence, or a report in it, does not decode or is not one entry per device.
    IdentityMalformed = "identity-malformed",
    /// The miner's signature over its evidence statement does not verify.
    IdentityStatementSignature = "identity-statement-signature",
    /// A certificate chain that does not link, or a leaf that names no device.
    IdentityChain = "identity-chain",
    IdentityChainExpired = "identity-chain-expired",
    /// A chain that does not end at a pinned root.
    IdentityUntrustedRoot = "identity-untrusted-root",
    /// A report whose signature does not verify with its chain's attestation key.
    IdentitySignature = "identity-signature",
    /// A report made for another challenge, miner, claim or slot.
    IdentityWrongNonce = "identity-wrong-nonce",
    /// A certified device of another chip than the claimed model, or one part for two slots.
    IdentityDeviceMismatch = "identity-device-mismatch",
    /// A report whose project SKU the operator lists as another model.
    IdentitySkuMismatch = "identity-sku-mismatch",
    /// Evidence for a model this validator knows no chip for, under `required`.
    IdentityUnknownModel = "identity-unknown-model",
    /// A verdict stored before reasons had codes, or by a newer validator.
    Unclassified = "unclassified",
}

impl From<&Rejection> for ReasonCode {
    fn from(r: &Rejection) -> Self {
        match r {
            Rejection::NonceMismatch { .. } => ReasonCode::NonceMismatch,
            Rejection::DeviceCount(_) => ReasonCode::DeviceCount,
            Rejection::PartitionNotCanonical { .. } => ReasonCode::PartitionNotCanonical,
            Rejection::EmptyDeviceRoot(_) => ReasonCode::EmptyDeviceRoot,
            Rejection::GlobalChecksumMismatch { .. } => ReasonCode::GlobalChecksumMismatch,
            Rejection::ReexecutionMismatch { .. } => ReasonCode::ReexecutionMismatch,
            // A validator asks only for samples within its challenge: an opening that answers
            // another is one for the wrong request.
            Rejection::OpeningForWrongRequest { .. } | Rejection::NoSuchSample { .. } => {
                ReasonCode::OpeningForWrongRequest
            }
            Rejection::CheckpointCount { .. } => ReasonCode::CheckpointCount,
            Rejection::StartMatrixMismatch { .. } => ReasonCode::StartMatrixMismatch,
            Rejection::LeafNotCommitted { .. } => ReasonCode::LeafNotCommitted,
            Rejection::OpenedMatrixSize { .. } => ReasonCode::OpenedMatrixSize,
            Rejection::OpenedMatrixMismatch { .. } => ReasonCode::OpenedMatrixMismatch,
            Rejection::SegmentMismatch { .. } => ReasonCode::SegmentMismatch,
        }
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ReasonCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ReasonCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(ReasonCode::from_name(&String::deserialize(d)?))
    }
}

/// One reason a verdict failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub code: ReasonCode,
    pub message: String,
}

impl Reason {
    pub fn new(code: ReasonCode, message: impl Into<String>) -> Self {
        Reason {
            code,
            message: message.into(),
        }
    }
}

impl From<&Rejection> for Reason {
    fn from(r: &Rejection) -> Self {
        Reason::new(r.into(), r.to_string())
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// Reads both what this version stores (`{"code", "message"}`) and the plain strings that
/// verdicts stored before reasons had codes.
impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Coded { code: ReasonCode, message: String },
            Plain(String),
        }
        Ok(match Stored::deserialize(d)? {
            Stored::Coded { code, message } => Reason { code, message },
            Stored::Plain(message) => Reason {
                code: ReasonCode::Unclassified,
                message,
            },
        })
    }
}

impl From<&gpu_attest_shared::memory::check::WalkCheckError> for Reason {
    fn from(e: &gpu_attest_shared::memory::check::WalkCheckError) -> Self {
        Reason::new(ReasonCode::from_name(e.code()), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way an opened version 4 step fails has a code of its own here.
    #[test]
    fn step_rejections_have_codes() {
        use gpu_attest_shared::memory::slice::SliceError;
        use gpu_attest_shared::memory::slice_walk::StepRejection as R;
        let rejections = [
            R::OutOfRange { walker: 0, step: 0 },
            R::WalkerNotCommitted(0),
            R::StartNotCommitted(0),
            R::StateNotCommitted { walker: 0, step: 0 },
            R::ChainNotCommitted(0),
            R::SliceNotCommitted {
                chain: 0,
                error: SliceError::Mismatch { slice: 0 },
            },
            R::StepMismatch { walker: 0, step: 0 },
            R::PoolStateMismatch { chain: 0, row: 0 },
        ];
        for r in &rejections {
            let code = ReasonCode::from_name(r.code());
            assert_ne!(code, ReasonCode::Unclassified, "{r}");
            assert_eq!(code.as_str(), r.code());
        }
    }

    /// Every way a walk opening fails has a code of its own here, never `unclassified`.
    #[test]
    fn walk_check_errors_have_codes() {
        use gpu_attest_shared::memory::check::WalkCheckError as E;
        let proof_error = gpu_attest_shared::merkle::ProofError::RootMismatch;
        let errors = [
            E::WrongRequest {
                got: (0, 0, 0),
                want: (0, 0, 1),
            },
            E::CheckpointCount {
                walker: 0,
                got: 1,
                want: 2,
            },
            E::LeafNotCommitted {
                device: 0,
                walker: 0,
                source: proof_error.clone(),
            },
            E::WrongStart { walker: 0 },
            E::EntryCount {
                segment: 0,
                got: 1,
                want: 8,
            },
            E::EntrySize { step: 0, got: 1 },
            E::EntryNotCommitted {
                device: 0,
                step: 0,
                entry: 0,
                source: proof_error,
            },
            E::EntryNotMade { step: 0, entry: 0 },
            E::SegmentMismatch {
                walker: 0,
                first: 0,
                end: 8,
                next: 1,
            },
        ];
        for e in &errors {
            let reason = Reason::from(e);
            assert_ne!(reason.code, ReasonCode::Unclassified, "{e}");
            assert_eq!(reason.code.as_str(), e.code());
        }
    }

    /// The codes of PROTOCOL.md's table in section 16, which peers and the Python client are
    /// built from: every code this validator can store is there, and nothing else.
    #[test]
    fn every_code_is_the_protocols_table() {
        let text = include_str!("../../../PROTOCOL.md");
        let section = &text[text.find("## 16. Verdict reasons").expect("section 16")..];
        let section = &section[..section.find("\n## 17.").expect("section 17 follows")];
        let table = &section[section.find("| code | meaning |").expect("the table")..];
        let table = &table[..table.find("\n\n").unwrap_or(table.len())];
        let mut documented: Vec<&str> = table
            .lines()
            .skip(2)
            .flat_map(|row| row.split('|').nth(1).unwrap_or("").split('`').skip(1).step_by(2))
            .collect();
        documented.sort_unstable();
        let mut ours: Vec<&str> = ReasonCode::ALL.iter().map(|c| c.as_str()).collect();
        ours.sort_unstable();
        assert_eq!(ours, documented);
    }

    #[test]
    fn names_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &code in ReasonCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} named twice");
            assert_eq!(ReasonCode::from_name(code.as_str()), code);
        }
        assert_eq!(
            ReasonCode::from_name("from-a-newer-validator"),
            ReasonCode::Unclassified
        );
    }

    #[test]
    fn stored_reasons_old_and_new_both_read() {
        let new = Reason::new(ReasonCode::HardwareMismatch, "device count: 1 vs 8");
        let json = serde_json::to_string(&vec![new.clone()]).unwrap();
        assert_eq!(
            json,
            r#"[{"code":"hardware-mismatch","message":"device count: 1 vs 8"}]"#
        );
        assert_eq!(serde_json::from_str::<Vec<Reason>>(&json).unwrap(), vec![new]);
        let old: Vec<Reason> = serde_json::from_str(r#"["global checksum differs"]"#).unwrap();
        assert_eq!(
            old,
            vec![Reason::new(ReasonCode::Unclassified, "global checksum differs")]
        );
    }
}
