//! The service's edge: what the miner's core returns, put into the messages of `proto/`. The
//! core takes decoded requests (`gpu_attest_proto::convert`'s `*_from_wire`) and returns signed
//! statements; only the service and its opening rounds see the wire types.

use crate::core::{Opened, Signed, SignedOpening};
use gpu_attest_proto::convert::{commitment_to_wire, opening_to_wire, walk_opening_to_wire, walk_statement_to_wire};
use gpu_attest_proto::evidence::evidence_to_wire;
use gpu_attest_proto::memory_v4::{step_opening_to_wire, walk_root_to_wire};
use gpu_attest_proto::v1;
use gpu_attest_shared::evidence::DeviceEvidence;
use gpu_attest_shared::statement::Commitment;
use gpu_attest_shared::statement::memory_v3::WalkStatement;
use gpu_attest_shared::statement::memory_v4::WalkRoot;

/// The commitment, with the device evidence signed beside it (PROTOCOL.md 19.3) when given.
pub fn commitment(signed: &Signed<Commitment>, evidence: Option<&Signed<Vec<DeviceEvidence>>>) -> v1::Commitment {
    let mut wire = commitment_to_wire(&signed.statement, &signed.signature);
    if let Some(evidence) = evidence {
        wire.evidence = evidence_to_wire(&evidence.statement);
        wire.evidence_signature = evidence.signature.to_vec();
    }
    wire
}

pub fn walk_statement(signed: &Signed<WalkStatement>) -> v1::WalkStatement {
    walk_statement_to_wire(&signed.statement, &signed.signature)
}

/// One device's signed walk root (PROTOCOL.md 20.8).
pub fn walk_root(signed: &Signed<WalkRoot>) -> v1::DeviceWalkRoot {
    let root = &signed.statement;
    walk_root_to_wire(root.device, &root.root, root.device_us, &signed.signature)
}

/// A chain opening is the message itself; a walk opening rides in its `walk` field and an
/// opened step in its `step` field, after the chain openings of the same stream (PROTOCOL.md
/// 18.4, 20.8).
pub fn opening(signed: &SignedOpening) -> v1::ChainOpening {
    match &signed.opening {
        Opened::Chain(opening) => opening_to_wire(&signed.nonce, opening, &signed.signature),
        Opened::Walk(opening) => v1::ChainOpening {
            walk: Some(walk_opening_to_wire(&signed.nonce, opening, &signed.signature)),
            ..Default::default()
        },
        Opened::Step { device, opening } => v1::ChainOpening {
            step: Some(step_opening_to_wire(*device, opening, &signed.signature)),
            ..Default::default()
        },
    }
}
