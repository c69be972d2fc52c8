//! Reading the fields of a wire message: lengths checked, lists bounded, and each fault a
//! [`WireError`] naming its field. Every conversion from the wire (`convert`, `evidence`,
//! `memory_v4`) reads through these.

use gpu_attest_shared::Digest;
use thiserror::Error;

/// A wire message that cannot be a valid protocol message, with the field at fault.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("field `{field}`: {problem}")]
pub struct WireError {
    pub field: &'static str,
    pub problem: String,
}

pub(crate) fn wire_err(field: &'static str, problem: impl Into<String>) -> WireError {
    WireError {
        field,
        problem: problem.into(),
    }
}

pub(crate) fn bytes32(field: &'static str, bytes: &[u8]) -> Result<[u8; 32], WireError> {
    bytes
        .try_into()
        .map_err(|_| wire_err(field, format!("must be 32 bytes, got {}", bytes.len())))
}

pub(crate) fn signature(field: &'static str, bytes: &[u8]) -> Result<[u8; 64], WireError> {
    bytes
        .try_into()
        .map_err(|_| wire_err(field, format!("must be a 64-byte signature, got {} bytes", bytes.len())))
}

pub(crate) fn digests(field: &'static str, list: &[Vec<u8>], max: usize) -> Result<Vec<Digest>, WireError> {
    if list.len() > max {
        return Err(wire_err(
            field,
            format!("{} entries, at most {max} allowed", list.len()),
        ));
    }
    list.iter().map(|b| bytes32(field, b).map(Digest)).collect()
}
