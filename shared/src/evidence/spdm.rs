//! An NVIDIA attestation report: the SPDM 1.1 GET_MEASUREMENTS request the driver sent, followed
//! by the GPU's signed MEASUREMENTS response (DMTF DSP0274 1.1, sections 10.11 and 10.12).
//!
//! ```text
//! request  (37 bytes): version 0x11 | code 0xE0 | param1 | param2 | nonce (32) | slot id
//! response:            version 0x11 | code 0x60 | param1 | param2 | blocks (1) | record length (le24)
//!                      | measurement record | responder nonce (32) | opaque length (le16)
//!                      | opaque data | signature (96: r || s, P-384)
//! ```
//!
//! The signature covers `request || response` up to the signature. Every length is checked
//! against the bytes present before it is used, and nothing may follow the signature.

use super::fault::EvidenceFault;
use std::collections::BTreeMap;

/// Bytes in the GET_MEASUREMENTS request that opens a report.
pub const REQUEST_BYTES: usize = 37;
/// Bytes in a raw ECDSA P-384 signature (`r || s`).
pub const SIGNATURE_BYTES: usize = 96;
/// SPDM version 1.1, the one NVIDIA's GPUs speak.
pub const SPDM_VERSION_1_1: u8 = 0x11;
/// GET_MEASUREMENTS request code.
pub const GET_MEASUREMENTS: u8 = 0xE0;
/// MEASUREMENTS response code.
pub const MEASUREMENTS: u8 = 0x60;
/// Request param1 bit 0: a signature is requested.
const SIGNATURE_REQUESTED: u8 = 0x01;
/// Request param2 0xFF: all measurement blocks.
const ALL_MEASUREMENTS: u8 = 0xFF;
/// The largest report accepted: NVML's report buffer is 8 KiB (`NVML_CC_GPU_ATTESTATION_REPORT_SIZE`).
pub const MAX_REPORT_BYTES: usize = 16 * 1024;

/// NVIDIA's opaque-data field types (from NVIDIA's public verifier).
pub mod opaque {
    pub const DRIVER_VERSION: u16 = 3;
    pub const CHIP_SKU: u16 = 15;
    pub const PROJECT: u16 = 17;
    pub const PROJECT_SKU: u16 = 18;
    pub const FWID: u16 = 20;
    pub const PROTECTED_PCIE_STATUS: u16 = 21;
    pub const CHIP_INFO: u16 = 35;
    pub const FEATURE_FLAG: u16 = 36;
}

/// A report read but not yet trusted: [`super::check`] verifies its signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttestationReport {
    /// The requester nonce: the one the miner gave the driver, covered by the signature.
    pub request_nonce: [u8; 32],
    /// Number of measurement blocks in the record.
    pub measurement_blocks: u8,
    /// The opaque data's fields by type; a type that appears twice is refused.
    pub opaque: BTreeMap<u16, Vec<u8>>,
    /// `r || s`.
    pub signature: [u8; SIGNATURE_BYTES],
    /// The bytes the signature covers: the whole report but its last 96 bytes.
    signed_len: usize,
}

impl AttestationReport {
    /// Reads a report, refusing anything that is not exactly one request and one signed response.
    pub fn parse(bytes: &[u8]) -> Result<Self, EvidenceFault> {
        if bytes.len() > MAX_REPORT_BYTES {
            return Err(malformed(format!(
                "the report is {} bytes, more than the {MAX_REPORT_BYTES} accepted",
                bytes.len()
            )));
        }
        let mut at = Cursor { bytes, position: 0 };
        let request = at.take(REQUEST_BYTES, "the GET_MEASUREMENTS request")?;
        if request[0] != SPDM_VERSION_1_1 || request[1] != GET_MEASUREMENTS {
            return Err(malformed(format!(
                "the report does not open with an SPDM 1.1 GET_MEASUREMENTS request (version {:#04x}, code {:#04x})",
                request[0], request[1]
            )));
        }
        if request[2] & SIGNATURE_REQUESTED == 0 || request[3] != ALL_MEASUREMENTS {
            return Err(malformed(format!(
                "the request did not ask for every measurement signed (param1 {:#04x}, param2 {:#04x})",
                request[2], request[3]
            )));
        }
        let request_nonce: [u8; 32] = request[4..36].try_into().expect("32 bytes");

        let header = at.take(8, "the MEASUREMENTS response header")?;
        if header[0] != SPDM_VERSION_1_1 || header[1] != MEASUREMENTS {
            return Err(malformed(format!(
                "the response is not an SPDM 1.1 MEASUREMENTS response (version {:#04x}, code {:#04x})",
                header[0], header[1]
            )));
        }
        let measurement_blocks = header[4];
        let record_len = u32::from_le_bytes([header[5], header[6], header[7], 0]) as usize;
        let record = at.take(record_len, "the measurement record")?;
        check_measurement_record(record, measurement_blocks)?;
        at.take(32, "the responder nonce")?;
        let opaque_len = u16::from_le_bytes(at.take(2, "the opaque length")?.try_into().expect("2 bytes")) as usize;
        let opaque = parse_opaque(at.take(opaque_len, "the opaque data")?)?;
        let signed_len = at.position;
        let signature: [u8; SIGNATURE_BYTES] = at.take(SIGNATURE_BYTES, "the signature")?.try_into().expect("96 bytes");
        if at.position != bytes.len() {
            return Err(malformed(format!(
                "{} bytes follow the signature",
                bytes.len() - at.position
            )));
        }
        Ok(Self {
            request_nonce,
            measurement_blocks,
            opaque,
            signature,
            signed_len,
        })
    }

    /// The bytes the signature covers, out of the report this was parsed from.
    pub fn signed_bytes<'a>(&self, report: &'a [u8]) -> &'a [u8] {
        &report[..self.signed_len.min(report.len())]
    }

    /// An opaque field read as NUL-padded ASCII text (project, SKU, chip), trimmed.
    pub fn opaque_text(&self, field: u16) -> Option<String> {
        let raw = self.opaque.get(&field)?;
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let text = std::str::from_utf8(&raw[..end]).ok()?.trim();
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic() || b == b' ')).then(|| text.to_string())
    }

    /// The firmware id the report names (48 bytes, SHA-384 of the running firmware), if any.
    pub fn fwid(&self) -> Option<&[u8]> {
        self.opaque.get(&opaque::FWID).map(Vec::as_slice)
    }

    /// The CC feature the report states, when it states one: 0 single-GPU passthrough,
    /// 1 multi-GPU passthrough, 2 protected PCIe.
    pub fn feature_flag(&self) -> Option<u32> {
        let raw = self.opaque.get(&opaque::FEATURE_FLAG)?;
        (raw.len() <= 4).then(|| {
            let mut le = [0u8; 4];
            le[..raw.len()].copy_from_slice(raw);
            u32::from_le_bytes(le)
        })
    }
}

/// Each block is `index | specification (1 = DMTF) | le16 size | size bytes`, and the blocks fill
/// the record exactly.
fn check_measurement_record(record: &[u8], blocks: u8) -> Result<(), EvidenceFault> {
    if blocks == 0 {
        return Err(malformed("the report has no measurement blocks".into()));
    }
    let mut at = Cursor {
        bytes: record,
        position: 0,
    };
    for _ in 0..blocks {
        let head = at.take(4, "a measurement block header")?;
        if head[1] != 1 {
            return Err(malformed(format!(
                "measurement block {} is not in the DMTF format (specification {})",
                head[0], head[1]
            )));
        }
        let size = u16::from_le_bytes([head[2], head[3]]) as usize;
        at.take(size, "a measurement block")?;
    }
    if at.position != record.len() {
        return Err(malformed("the measurement blocks do not fill the record".into()));
    }
    Ok(())
}

/// `le16 type | le16 size | size bytes`, repeated to the end.
fn parse_opaque(bytes: &[u8]) -> Result<BTreeMap<u16, Vec<u8>>, EvidenceFault> {
    let mut fields = BTreeMap::new();
    let mut at = Cursor { bytes, position: 0 };
    while at.position < bytes.len() {
        let head = at.take(4, "an opaque field header")?;
        let kind = u16::from_le_bytes([head[0], head[1]]);
        let size = u16::from_le_bytes([head[2], head[3]]) as usize;
        let value = at.take(size, "an opaque field")?;
        if fields.insert(kind, value.to_vec()).is_some() {
            return Err(malformed(format!("opaque field {kind} appears twice")));
        }
    }
    Ok(fields)
}

fn malformed(detail: String) -> EvidenceFault {
    EvidenceFault::Malformed(detail)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], EvidenceFault> {
        let end = self.position.checked_add(len).filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(malformed(format!(
                "the report ends inside {what} ({len} bytes wanted at offset {}, {} there)",
                self.position,
                self.bytes.len() - self.position
            )));
        };
        let slice = &self.bytes[self.position..end];
        self.position = end;
        Ok(slice)
    }
}
