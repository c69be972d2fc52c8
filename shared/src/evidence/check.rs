//! One device's evidence against one challenge, and a commitment's evidence as a whole.

use super::cert_chain::{DeviceChain, LeafIdentity, TrustAnchors};
use super::fault::EvidenceFault;
use super::model::SkuTable;
use super::spdm::{AttestationReport, opaque};
use super::statement::{CcState, DeviceEvidence};
use p384::ecdsa::Signature;
use p384::ecdsa::signature::Verifier;
use std::collections::HashMap;

/// What the validator trusts evidence against.
#[derive(Clone, Debug)]
pub struct EvidenceTrust {
    pub anchors: TrustAnchors,
    pub table: SkuTable,
}

impl EvidenceTrust {
    pub fn nvidia(table: SkuTable) -> Self {
        Self {
            anchors: TrustAnchors::nvidia(),
            table,
        }
    }
}

/// A device whose evidence verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenuineDevice {
    pub index: u32,
    pub chip: String,
    pub device_id: String,
    pub project: Option<String>,
    pub project_sku: Option<String>,
    /// The CC feature the report's own opaque data states (`spt` single-GPU passthrough, `mpt`
    /// multi-GPU passthrough, `ppcie` protected PCIe), when it states one.
    pub mode: Option<&'static str>,
    /// The leaf's issuer (on NVIDIA's chains, the part's own boot ROM certificate), hashed.
    pub issuer_fingerprint: [u8; 32],
}

impl GenuineDevice {
    /// `genuine NVIDIA GH100 1010/0200 (device 48B02D92494BADF4), nonce-bound`: the verdict's
    /// line for the device (PROTOCOL.md 19.5).
    pub fn describe(&self) -> String {
        let sku = match (&self.project, &self.project_sku) {
            (Some(project), Some(sku)) => format!(" {project}/{sku}"),
            _ => String::new(),
        };
        let mode = self.mode.map(|mode| format!(", {mode}")).unwrap_or_default();
        format!(
            "genuine NVIDIA {}{sku} (device {}{mode}), nonce-bound",
            self.chip, self.device_id
        )
    }
}

/// Checks one device's evidence: not DEVTOOLS; the report decodes; the chain verifies up to a
/// pinned root at `now_unix_secs`; the report's signature verifies with the chain's leaf key;
/// the report answers `expected_nonce`; the leaf was issued for the firmware the report names;
/// the leaf's chip is the claimed model's; and a listed SKU is the claimed model.
pub fn check_device_evidence(
    evidence: &DeviceEvidence,
    expected_nonce: &[u8; 32],
    claimed_model: &str,
    trust: &EvidenceTrust,
    now_unix_secs: u64,
) -> Result<GenuineDevice, EvidenceFault> {
    if evidence.cc_state == CcState::DevTools {
        return Err(EvidenceFault::DevTools(format!("device {} says so", evidence.index)));
    }
    if !evidence.is_offered() {
        return Err(EvidenceFault::NotOffered(evidence.cc_state.describe().to_string()));
    }
    let (report, leaf) = signed_report(evidence, trust, now_unix_secs)?;
    if &report.request_nonce != expected_nonce {
        return Err(EvidenceFault::WrongNonce(format!(
            "it answers {}, this challenge asks {}",
            hex::encode(report.request_nonce),
            hex::encode(expected_nonce)
        )));
    }
    if report
        .fwid()
        .is_some_and(|reported| leaf.fwid.as_deref() != Some(reported))
    {
        return Err(EvidenceFault::Chain(
            "the attestation key was certified for other firmware than the report names".into(),
        ));
    }
    check_model(&report, &leaf, claimed_model, &trust.table)?;
    let project = report.opaque_text(opaque::PROJECT);
    let project_sku = report.opaque_text(opaque::PROJECT_SKU);
    let mode = match report.feature_flag() {
        Some(0) => Some("spt"),
        Some(1) => Some("mpt"),
        Some(2) => Some("ppcie"),
        _ => None,
    };
    Ok(GenuineDevice {
        index: evidence.index,
        chip: leaf.chip,
        device_id: leaf.device_id,
        project,
        project_sku,
        mode,
        issuer_fingerprint: leaf.issuer_fingerprint,
    })
}

/// The report, decoded, and the leaf of its certificate chain, verified up to a pinned root at
/// `now_unix_secs`, whose key signed the report.
fn signed_report(
    evidence: &DeviceEvidence,
    trust: &EvidenceTrust,
    now_unix_secs: u64,
) -> Result<(AttestationReport, LeafIdentity), EvidenceFault> {
    let report = AttestationReport::parse(&evidence.report)?;
    let leaf = DeviceChain::decode(&evidence.certificates)?.verify(&trust.anchors, now_unix_secs)?;
    let signature = Signature::from_slice(&report.signature)
        .map_err(|_| EvidenceFault::Signature("r or s is out of range".into()))?;
    leaf.key
        .verify(report.signed_bytes(&evidence.report), &signature)
        .map_err(|_| EvidenceFault::Signature(format!("device {}", leaf.device_id)))?;
    Ok((report, leaf))
}

/// The device is the claimed model: the certificate's chip is the model's, the report names
/// that chip (where it names one), and a listed SKU is the model.
fn check_model(
    report: &AttestationReport,
    leaf: &LeafIdentity,
    claimed_model: &str,
    table: &SkuTable,
) -> Result<(), EvidenceFault> {
    match table.chip_for(claimed_model) {
        None => {
            return Err(EvidenceFault::UnknownModel(format!(
                "it knows no chip for `{claimed_model}` (an operator adds one to [[identity.chips]])"
            )));
        }
        Some(chip) if !chip.eq_ignore_ascii_case(&leaf.chip) => {
            return Err(EvidenceFault::DeviceMismatch(format!(
                "the certificate is for a {} device, `{claimed_model}` is a {chip}",
                leaf.chip
            )));
        }
        Some(_) => {}
    }
    if let Some(chip_info) = report.opaque_text(opaque::CHIP_INFO)
        && !chip_info.eq_ignore_ascii_case(&leaf.chip)
    {
        return Err(EvidenceFault::DeviceMismatch(format!(
            "the report names chip {chip_info}, its certificate {}",
            leaf.chip
        )));
    }
    let project = report.opaque_text(opaque::PROJECT);
    let project_sku = report.opaque_text(opaque::PROJECT_SKU);
    if let (Some(project), Some(sku)) = (&project, &project_sku)
        && !table.sku_may_be(project, sku, claimed_model)
    {
        return Err(EvidenceFault::SkuMismatch(format!(
            "project {project} SKU {sku} is a {}, not `{claimed_model}`",
            table.models_for_sku(project, sku).join(" or ")
        )));
    }
    Ok(())
}

/// Each device's outcome: its evidence checked, and no certified part standing for two slots.
/// A part is its chip and device id (compared without regard to ASCII case) or its leaf's
/// issuer: either seen before in the set makes the later slot a mismatch.
pub fn check_evidence_set<'a>(
    evidence: impl IntoIterator<Item = (&'a DeviceEvidence, [u8; 32], &'a str)>,
    trust: &EvidenceTrust,
    now_unix_secs: u64,
) -> Vec<(u32, Result<GenuineDevice, EvidenceFault>)> {
    let mut outcomes: Vec<(u32, Result<GenuineDevice, EvidenceFault>)> = evidence
        .into_iter()
        .map(|(device, nonce, model)| {
            (
                device.index,
                check_device_evidence(device, &nonce, model, trust, now_unix_secs),
            )
        })
        .collect();
    let mut by_id: HashMap<(String, String), u32> = HashMap::new();
    let mut by_issuer: HashMap<[u8; 32], u32> = HashMap::new();
    for (index, outcome) in &mut outcomes {
        let Ok(genuine) = outcome else { continue };
        let id = (
            genuine.chip.to_ascii_uppercase(),
            genuine.device_id.to_ascii_uppercase(),
        );
        let first = by_id
            .get(&id)
            .or_else(|| by_issuer.get(&genuine.issuer_fingerprint))
            .copied();
        if let Some(first) = first {
            *outcome = Err(EvidenceFault::DeviceMismatch(format!(
                "device {} is the part that answered for device {first}: one part cannot stand for two slots",
                genuine.device_id
            )));
        } else {
            by_id.insert(id, *index);
            by_issuer.insert(genuine.issuer_fingerprint, *index);
        }
    }
    outcomes
}
