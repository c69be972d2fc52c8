//! A commitment's device evidence under the validator's policy (PROTOCOL.md 19.4).

use super::config::{IdentityConfig, IdentityPolicy};
use super::proof::{DeviceIdentity, IdentityProof, IdentityStatus};
use crate::reason::{Reason, ReasonCode};
use gpu_attest_proto::WireError;
use gpu_attest_proto::evidence::SignedEvidence;
use gpu_attest_shared::evidence::{
    EvidenceFault, EvidenceTrust, check_evidence_set, evidence_statement_bytes, spdm_nonce,
};
use gpu_attest_shared::statement::{Challenge, Commitment};

/// The evidence as it came off the wire: `Ok(None)` when the miner sent none.
pub type WireEvidence = Result<Option<SignedEvidence>, WireError>;

/// Checks the evidence of a commitment that has passed PROTOCOL.md 14.4 (so its inventory is the
/// challenge's). Returns what the verdict states, `None` under `off`, and the reasons it fails.
pub fn check_commitment_evidence(
    config: &IdentityConfig,
    trust: &EvidenceTrust,
    challenge: &Challenge,
    commitment: &Commitment,
    evidence: &WireEvidence,
    now_unix_secs: u64,
) -> (Option<IdentityProof>, Vec<Reason>) {
    if config.policy == IdentityPolicy::Off {
        return (None, Vec::new());
    }
    let required = config.policy == IdentityPolicy::Required;
    let inventory = &commitment.inventory;
    let all = |status: IdentityStatus, line: &str, reason: Option<&str>| IdentityProof {
        policy: config.policy.as_str().into(),
        devices: inventory
            .iter()
            .map(|device| DeviceIdentity {
                index: device.index,
                status,
                line: line.into(),
                reason: reason.map(str::to_string),
            })
            .collect(),
    };
    let signed = match evidence {
        Err(error) => {
            let line = format!("the evidence does not decode: {error}");
            let proof = all(
                IdentityStatus::Refused,
                &line,
                Some(ReasonCode::IdentityMalformed.as_str()),
            );
            return (Some(proof), vec![Reason::new(ReasonCode::IdentityMalformed, line)]);
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
    let canonical = signed.devices.len() == inventory.len()
        && signed
            .devices
            .iter()
            .enumerate()
            .all(|(position, device)| device.index as usize == position);
    if !canonical {
        let line = format!(
            "the evidence lists devices {:?}, not one per inventory device in index order (0..{})",
            signed.devices.iter().map(|d| d.index).collect::<Vec<_>>(),
            inventory.len()
        );
        let proof = all(
            IdentityStatus::Refused,
            &line,
            Some(ReasonCode::IdentityMalformed.as_str()),
        );
        return (Some(proof), vec![Reason::new(ReasonCode::IdentityMalformed, line)]);
    }
    let statement = evidence_statement_bytes(
        &commitment.work.nonce,
        &commitment.miner_key.0,
        &commitment.validator_key.0,
        &signed.devices,
    );
    if commitment.miner_key.verify(&statement, &signed.signature).is_err() {
        let line = "the evidence statement's signature does not verify with the miner's key".to_string();
        let proof = all(
            IdentityStatus::Refused,
            &line,
            Some(ReasonCode::IdentityStatementSignature.as_str()),
        );
        return (
            Some(proof),
            vec![Reason::new(ReasonCode::IdentityStatementSignature, line)],
        );
    }

    let nonces: Vec<[u8; 32]> = (0..signed.devices.len() as u32)
        .map(|index| {
            spdm_nonce(
                &challenge.params.nonce,
                &challenge.params.miner_key,
                &challenge.inventory_digest,
                index,
            )
        })
        .collect();
    let outcomes = check_evidence_set(
        signed
            .devices
            .iter()
            .zip(&nonces)
            .zip(inventory)
            .map(|((device, nonce), claimed)| (device, *nonce, claimed.name.as_str())),
        trust,
        now_unix_secs,
    );
    let mut reasons = Vec::new();
    let devices = outcomes
        .into_iter()
        .map(|(index, outcome)| match outcome {
            Ok(genuine) => DeviceIdentity {
                index,
                status: IdentityStatus::Genuine,
                line: genuine.describe(),
                reason: None,
            },
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
                }
            }
            Err(fault) => {
                let code = ReasonCode::from_name(fault.reason());
                reasons.push(Reason::new(code, format!("device {index}: {fault}")));
                DeviceIdentity {
                    index,
                    status: IdentityStatus::Refused,
                    line: fault.to_string(),
                    reason: Some(code.as_str().into()),
                }
            }
        })
        .collect();
    (
        Some(IdentityProof {
            policy: config.policy.as_str().into(),
            devices,
        }),
        reasons,
    )
}
