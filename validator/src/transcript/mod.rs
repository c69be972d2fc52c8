//! Attestation transcripts (PROTOCOL.md 21): everything one verdict rests on, signed by the
//! validator, so that anyone can check the verdict again offline with `validator audit`.
//!
//! - [`record`]: what an attestation records as it runs (the messages as sent and received and
//!   the validator's clock readings) and the plan it recorded them under.
//! - the file, sealed (encoded and signed) and opened again, is the wire crate's
//!   (`gpu_attest_proto::transcript`), so that miners and other auditors read it alike.

pub mod record;

pub use gpu_attest_proto::transcript::{
    FORMAT, MAX_TRANSCRIPT_BYTES, Opened, TranscriptError, open, seal, seal_readable, signing_bytes,
};
pub use record::{RecordedEvidence, RecordedPlan, RecordedV4Settings, Recorder};
