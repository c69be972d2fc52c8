//! A commitment's device evidence under the validator's policy (PROTOCOL.md 19.4).

use crate::config::identity::{IdentityConfig, IdentityPolicy};
use crate::store::{Store, StoreError};
use crate::untrusted::miner_text;
use crate::verdict::identity::{DeviceIdentity, IdentityProof, IdentityStatus};
use crate::verdict::reason::{Reason, ReasonCode};
use gpu_attest_proto::WireError;
use gpu_attest_proto::evidence::SignedEvidence;
use gpu_attest_shared::evidence::{
    EvidenceFault, EvidenceTrust, GenuineDevice, check_evidence_set, evidence_statement_bytes, spdm_nonces,
};
use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::statement::{Challenge, Commitment, DeviceInfo};

/// The evidence as it came off the wire: `Ok(None)` when the miner sent none.
pub type WireEvidence = Result<Option<SignedEvidence>, WireError>;

/// Checks the evidence of a commitment that has passed PROTOCOL.md 14.4, against `claimed`, the
/// devices the challenge was sized for. Returns what the verdict states, `None` under `off`, and
/// the reasons it fails. Every text that comes from the miner's bytes (certificate names, say)
/// is made safe to print first.
pub fn check_commitment_evidence(
    config: &IdentityConfig,
    trust: &EvidenceTrust,
    challenge: &Challenge,
    commitment: &Commitment,
    claimed: &[DeviceInfo],
    evidence: &WireEvidence,
    now_unix_secs: u64,
) -> (Option<IdentityProof>, Vec<Reason>) {
    if config.policy == IdentityPolicy::Off {
        return (None, Vec::new());
    }
    let required = config.policy == IdentityPolicy::Required;
    let all = |status: IdentityStatus, line: &str, reason: Option<&str>| IdentityProof {
        policy: config.policy.as_str().into(),
        devices: claimed
            .iter()
            .map(|device| DeviceIdentity {
                index: device.index,
                status,
                line: line.into(),
                reason: reason.map(str::to_string),
                part: None,
            })
            .collect(),
    };
    // A fault of the list as a whole refuses every device with it.
    let refuse_all = |code: ReasonCode, line: String| {
        let proof = all(IdentityStatus::Refused, &line, Some(code.as_str()));
        (Some(proof), vec![Reason::new(code, line)])
    };
    let signed = match evidence {
        Err(error) => {
            let line = miner_text(&format!("the evidence does not decode: {error}"));
            return refuse_all(ReasonCode::IdentityMalformed, line);
        }
        Ok(None) => {
            let proof = all(IdentityStatus::NotOffered, "not offered (not stated)", None);
            let reasons = if required {
                vec![Reason::new(
                    ReasonCode::IdentityNotOffered,
                    "the miner sent no device evidence, and this validator requires it",
                )]
            } else {
                Vec::new()
            };
            return (Some(proof), reasons);
        }
        Ok(Some(signed)) => signed,
    };
    if let Some((code, line)) = statement_fault(signed, claimed, commitment) {
        return refuse_all(code, line);
    }

    let nonces = spdm_nonces(challenge, signed.devices.len());
    let outcomes = check_evidence_set(
        signed
            .devices
            .iter()
            .zip(&nonces)
            .zip(claimed)
            .map(|((device, nonce), claimed)| (device, *nonce, claimed.name.as_str())),
        trust,
        now_unix_secs,
    );
    let mut reasons = Vec::new();
    let devices = outcomes
        .into_iter()
        .map(|(index, outcome)| judge_device(index, outcome, required, &mut reasons))
        .collect();
    (
        Some(IdentityProof {
            policy: config.policy.as_str().into(),
            devices,
        }),
        reasons,
    )
}

/// What is wrong with the evidence list as a whole, if anything: not one entry per claimed
/// device in index order, or a statement the miner's key did not sign.
fn statement_fault(
    signed: &SignedEvidence,
    claimed: &[DeviceInfo],
    commitment: &Commitment,
) -> Option<(ReasonCode, String)> {
    let canonical = signed.devices.len() == claimed.len()
        && signed
            .devices
            .iter()
            .enumerate()
            .all(|(position, device)| device.index as usize == position);
    if !canonical {
        let line = format!(
            "the evidence lists devices {:?}, not one per inventory device in index order (0..{})",
            signed.devices.iter().map(|d| d.index).collect::<Vec<_>>(),
            claimed.len()
        );
        return Some((ReasonCode::IdentityMalformed, line));
    }
    let statement = evidence_statement_bytes(
        &commitment.work.nonce,
        &commitment.miner_key.0,
        &commitment.validator_key.0,
        &signed.devices,
    );
    commitment
        .miner_key
        .verify(&statement, &signed.signature)
        .is_err()
        .then(|| {
            (
                ReasonCode::IdentityStatementSignature,
                "the evidence statement's signature does not verify with the miner's key".into(),
            )
        })
}

/// What one device's checked evidence says, as its verdict states it; a failure, or an absence
/// a `required` policy does not accept, adds its reason to `reasons`.
fn judge_device(
    index: u32,
    outcome: Result<GenuineDevice, EvidenceFault>,
    required: bool,
    reasons: &mut Vec<Reason>,
) -> DeviceIdentity {
    match outcome {
        Ok(genuine) => DeviceIdentity {
            index,
            status: IdentityStatus::Genuine,
            line: miner_text(&genuine.describe()),
            reason: None,
            part: Some((
                genuine.chip.to_ascii_uppercase(),
                genuine.device_id.to_ascii_uppercase(),
            )),
        },
        Err(EvidenceFault::UnknownModel(why)) => {
            let line = miner_text(&format!(
                "offered, not judged: the validator cannot judge this model's evidence: {why}"
            ));
            if required {
                reasons.push(Reason::new(
                    ReasonCode::IdentityUnknownModel,
                    format!("device {index}: {line}"),
                ));
            }
            DeviceIdentity {
                index,
                status: IdentityStatus::Unjudged,
                line,
                reason: None,
                part: None,
            }
        }
        Err(EvidenceFault::NotOffered(state)) => {
            if required {
                reasons.push(Reason::new(
                    ReasonCode::IdentityNotOffered,
                    format!("device {index} offers no evidence ({state}), and this validator requires it"),
                ));
            }
            DeviceIdentity {
                index,
                status: IdentityStatus::NotOffered,
                line: format!("not offered ({state})"),
                reason: None,
                part: None,
            }
        }
        Err(fault) => {
            let code = ReasonCode::from_name(fault.reason());
            let line = miner_text(&fault.to_string());
            reasons.push(Reason::new(code, format!("device {index}: {line}")));
            DeviceIdentity {
                index,
                status: IdentityStatus::Refused,
                line,
                reason: Some(code.as_str().into()),
                part: None,
            }
        }
    }
}

/// PROTOCOL.md 19.4 step 4: a genuine part that a passing verdict saw under another miner key
/// within `window_ms` is refused (`identity-device-mismatch`): one GPU rented out to answer for
/// many miners is one GPU. Returns the reasons, and marks those devices refused in `proof`.
pub async fn check_part_reuse(
    store: &Store,
    proof: &mut IdentityProof,
    miner_key: &[u8; 32],
    now_ms: u64,
    window_ms: u64,
) -> Result<Vec<Reason>, StoreError> {
    let mut reasons = Vec::new();
    if window_ms == 0 {
        return Ok(reasons);
    }
    for device in &mut proof.devices {
        let Some((chip, device_id)) = device.part.clone() else {
            continue;
        };
        let Some(seen) = store
            .part_seen_elsewhere(&chip, &device_id, miner_key, now_ms.saturating_sub(window_ms))
            .await?
        else {
            continue;
        };
        let line = format!(
            "part {chip}:{device_id} answered for miner {} {} s ago (verdict #{}): one part cannot stand for two miners",
            PublicKey(seen.miner_key),
            now_ms.saturating_sub(seen.seen_at_ms) / 1000,
            seen.verdict_id
        );
        reasons.push(Reason::new(
            ReasonCode::IdentityDeviceMismatch,
            format!("device {}: {line}", device.index),
        ));
        device.status = IdentityStatus::Refused;
        device.reason = Some(ReasonCode::IdentityDeviceMismatch.as_str().into());
        device.line = line;
        device.part = None;
    }
    Ok(reasons)
}
