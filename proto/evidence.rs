//! Device evidence (PROTOCOL.md 19) between the wire and `shared::evidence`, with the limits of
//! 19.3 applied before anything is kept.

use crate::fields::{WireError, wire_err};
use crate::v1;
use gpu_attest_shared::evidence::{CcState, DeviceEvidence};
use gpu_attest_shared::partition::MAX_DEVICES;

/// A commitment's evidence as the miner signed it: every device's entry and the statement's
/// signature (PROTOCOL.md 19.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedEvidence {
    pub devices: Vec<DeviceEvidence>,
    pub signature: [u8; 64],
}

pub fn evidence_to_wire(evidence: &[DeviceEvidence]) -> Vec<v1::DeviceEvidence> {
    evidence
        .iter()
        .map(|device| v1::DeviceEvidence {
            index: device.index,
            cc_state: device.cc_state.to_wire(),
            report: device.report.clone(),
            certificates: device.certificates.clone(),
        })
        .collect()
}

/// The commitment's evidence list and its signature: `Ok(None)` when the miner sent neither.
/// Refuses a list longer than the protocol's device limit, a report or certificate over its
/// limit, an unknown CC state, and a signature that is not 64 bytes.
pub fn evidence_from_wire(
    evidence: &[v1::DeviceEvidence],
    signature: &[u8],
) -> Result<Option<SignedEvidence>, WireError> {
    // An empty list states nothing, whatever the signature beside it (PROTOCOL.md 19.3).
    if evidence.is_empty() {
        return Ok(None);
    }
    if evidence.len() > MAX_DEVICES as usize {
        return Err(wire_err("evidence", format!("more than {MAX_DEVICES} devices")));
    }
    let signature: [u8; 64] = signature
        .try_into()
        .map_err(|_| wire_err("evidence_signature", format!("{} bytes, not 64", signature.len())))?;
    let devices = evidence
        .iter()
        .map(|device| {
            let cc_state = CcState::from_wire(device.cc_state)
                .ok_or_else(|| wire_err("evidence.cc_state", format!("unknown state {}", device.cc_state)))?;
            let entry = DeviceEvidence {
                index: device.index,
                cc_state,
                report: device.report.clone(),
                certificates: device.certificates.clone(),
            };
            match entry.wire_limit_problem() {
                Some((field, problem)) => Err(wire_err(field, problem)),
                None => Ok(entry),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(SignedEvidence { devices, signature }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_attest_shared::evidence::cert_chain::{MAX_CERTIFICATE_BYTES, MAX_CERTIFICATES};
    use gpu_attest_shared::evidence::spdm::MAX_REPORT_BYTES;

    fn device(index: u32) -> DeviceEvidence {
        DeviceEvidence {
            index,
            cc_state: CcState::On,
            report: vec![1, 2, 3],
            certificates: vec![vec![4], vec![5]],
        }
    }

    #[test]
    fn evidence_round_trips_and_nothing_sent_is_none() {
        let evidence = vec![device(0), DeviceEvidence::not_offered(1, CcState::Off)];
        let back = evidence_from_wire(&evidence_to_wire(&evidence), &[9; 64])
            .unwrap()
            .unwrap();
        assert_eq!(
            back,
            SignedEvidence {
                devices: evidence,
                signature: [9; 64]
            }
        );
        assert_eq!(evidence_from_wire(&[], &[]).unwrap(), None);
    }

    #[test]
    fn evidence_over_its_limits_is_refused_by_field() {
        let wire = evidence_to_wire(&[device(0)]);
        let field = |mut wire: Vec<v1::DeviceEvidence>, signature: &[u8], edit: fn(&mut v1::DeviceEvidence)| {
            edit(&mut wire[0]);
            evidence_from_wire(&wire, signature).unwrap_err().field
        };
        assert_eq!(field(wire.clone(), &[0; 63], |_| {}), "evidence_signature");
        assert_eq!(field(wire.clone(), &[0; 64], |d| d.cc_state = 9), "evidence.cc_state");
        assert_eq!(
            field(wire.clone(), &[0; 64], |d| d.report = vec![0; MAX_REPORT_BYTES + 1]),
            "evidence.report"
        );
        assert_eq!(
            field(wire.clone(), &[0; 64], |d| d.certificates =
                vec![vec![0]; MAX_CERTIFICATES + 1]),
            "evidence.certificates"
        );
        assert_eq!(
            field(wire.clone(), &[0; 64], |d| d.certificates =
                vec![vec![0; MAX_CERTIFICATE_BYTES + 1]]),
            "evidence.certificates"
        );
        let too_many = vec![wire[0].clone(); MAX_DEVICES as usize + 1];
        assert_eq!(evidence_from_wire(&too_many, &[0; 64]).unwrap_err().field, "evidence");
    }
}
