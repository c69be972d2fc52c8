//! The locality walk's messages (PROTOCOL.md 20.10) and their conversions: the request, the
//! open request's samples and one opened segment. Every list is bounded by the largest walk,
//! state and chain the protocol allows, so a hostile message is a named [`WireError`], never a
//! large allocation or a panic.

use crate::fields::{WireError, bytes32, digests, signature, wire_err};
use crate::v1;
use gpu_attest_shared::Digest;
use gpu_attest_shared::memory::locality::{
    LineProof, LocalityWalk, MAX_KEPT_ENDS, MAX_SEGMENT_STEPS, MAX_WALKERS, SegmentOpening, State,
};
use gpu_attest_shared::memory::slice::{CHUNK_BYTES, SlicePath};
use gpu_attest_shared::merkle::MerkleProof;
use gpu_attest_shared::params::{MAX_CHAINS, MAX_N, MAX_SEGMENTS};
use gpu_attest_shared::statement::locality::SegmentSample;

/// Levels of a tree over `leaves` leaves at most: `ceil(log2(leaves))`.
const fn levels(leaves: u64) -> usize {
    (u64::BITS - (leaves - 1).leading_zeros()) as usize
}

/// A locality root has `G <= MAX_KEPT_ENDS` leaves.
const MAX_GENERATION_PROOF: usize = levels(MAX_KEPT_ENDS);
/// A state of `n^2 <= MAX_N^2` bytes is at most `MAX_N^2 / 1024` chunks.
const MAX_CHUNK_PATH: usize = levels((MAX_N as u64 * MAX_N as u64) / CHUNK_BYTES as u64);
/// A device root over at most `MAX_CHAINS` chains.
const MAX_CHAIN_PROOF: usize = levels(MAX_CHAINS);

/// The signed request as sent: the walk's shape (the global root is the commitment's, not
/// sent), the deadline, the validator's key and its signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalityRequest {
    pub walk: LocalityWalk,
    pub deadline_ms: u64,
    pub validator_key: [u8; 32],
    pub signature: [u8; 64],
}

pub fn request_to_wire(r: &LocalityRequest) -> v1::LocalityRequest {
    v1::LocalityRequest {
        nonce: r.walk.nonce.to_vec(),
        seed: r.walk.seed.to_vec(),
        walkers: r.walk.walkers,
        generations: r.walk.generations,
        steps: r.walk.steps,
        deadline_unix_ms: r.deadline_ms,
        validator_key: r.validator_key.to_vec(),
        signature: r.signature.to_vec(),
    }
}

/// The request as received, with `global` the commitment's root the receiver holds for its
/// nonce. Its shape is checked by [`LocalityWalk::check_shape`], not here.
pub fn request_from_wire(r: &v1::LocalityRequest, global: Digest) -> Result<LocalityRequest, WireError> {
    Ok(LocalityRequest {
        walk: LocalityWalk {
            nonce: bytes32("nonce", &r.nonce)?,
            seed: bytes32("seed", &r.seed)?,
            global,
            walkers: r.walkers,
            generations: r.generations,
            steps: r.steps,
        },
        deadline_ms: r.deadline_unix_ms,
        validator_key: bytes32("validator_key", &r.validator_key)?,
        signature: signature("signature", &r.signature)?,
    })
}

/// The nonce a request names, before anything else is read: which commitment's root to use.
pub fn request_nonce(r: &v1::LocalityRequest) -> Result<[u8; 32], WireError> {
    bytes32("nonce", &r.nonce)
}

pub fn sample_to_wire(s: &SegmentSample) -> v1::LocalitySample {
    v1::LocalitySample {
        device: s.device,
        generation: s.generation,
        walker: s.walker,
    }
}

pub fn sample_from_wire(s: &v1::LocalitySample) -> SegmentSample {
    SegmentSample {
        device: s.device,
        generation: s.generation,
        walker: s.walker,
    }
}

/// The validator's locality open request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenLinesRequest {
    pub nonce: [u8; 32],
    pub samples: Vec<SegmentSample>,
    pub validator_key: [u8; 32],
    pub signature: [u8; 64],
}

pub fn open_request_to_wire(r: &OpenLinesRequest) -> v1::OpenLinesRequest {
    v1::OpenLinesRequest {
        nonce: r.nonce.to_vec(),
        samples: r.samples.iter().map(sample_to_wire).collect(),
        validator_key: r.validator_key.to_vec(),
        signature: r.signature.to_vec(),
    }
}

/// The open request as received. How many samples one may carry is the receiver's limit.
pub fn open_request_from_wire(r: &v1::OpenLinesRequest) -> Result<OpenLinesRequest, WireError> {
    Ok(OpenLinesRequest {
        nonce: bytes32("nonce", &r.nonce)?,
        samples: r.samples.iter().map(sample_from_wire).collect(),
        validator_key: bytes32("validator_key", &r.validator_key)?,
        signature: signature("signature", &r.signature)?,
    })
}

fn states_to_wire(states: &[State]) -> Vec<Vec<u8>> {
    states.iter().map(|s| s.to_bytes().to_vec()).collect()
}

fn digests_to_wire(digests: &[Digest]) -> Vec<Vec<u8>> {
    digests.iter().map(|d| d.0.to_vec()).collect()
}

fn states(field: &'static str, list: &[Vec<u8>]) -> Result<Vec<State>, WireError> {
    Ok(digests(field, list, MAX_WALKERS as usize)?
        .iter()
        .map(|d| State::from_bytes(&d.0))
        .collect())
}

/// One opened segment of device `device`, signed.
pub fn opening_to_wire(device: u32, o: &SegmentOpening, sig: &[u8; 64]) -> v1::LocalityOpening {
    v1::LocalityOpening {
        device,
        generation: o.generation,
        walker: o.walker,
        ends: states_to_wire(&o.ends),
        ends_proof: digests_to_wire(&o.ends_proof.siblings),
        lines: o
            .lines
            .iter()
            .map(|line| v1::LineProof {
                chunk: line.chunk.clone(),
                chunk_path: line.chunk_path.siblings.iter().map(|cv| cv.to_vec()).collect(),
                checkpoints: digests_to_wire(&line.checkpoints),
                chain_proof: digests_to_wire(&line.chain_proof.siblings),
            })
            .collect(),
        signature: sig.to_vec(),
    }
}

/// An opened segment as sent: `(device, opening, signature)`. Lengths and list sizes are
/// checked here; whether the opening is right is 20.10's check.
pub fn opening_from_wire(o: &v1::LocalityOpening) -> Result<(u32, SegmentOpening, [u8; 64]), WireError> {
    let proof = |field, list, max| digests(field, list, max).map(|siblings| MerkleProof { siblings });
    if o.lines.len() > MAX_SEGMENT_STEPS as usize {
        return Err(wire_err(
            "lines",
            format!("{} lines, a segment has at most {MAX_SEGMENT_STEPS}", o.lines.len()),
        ));
    }
    let lines = o
        .lines
        .iter()
        .map(|line| {
            if line.chunk.len() != CHUNK_BYTES {
                return Err(wire_err(
                    "lines.chunk",
                    format!("must be {CHUNK_BYTES} bytes, got {}", line.chunk.len()),
                ));
            }
            Ok(LineProof {
                chunk: line.chunk.clone(),
                chunk_path: SlicePath {
                    siblings: digests("lines.chunk_path", &line.chunk_path, MAX_CHUNK_PATH)?
                        .into_iter()
                        .map(|d| d.0)
                        .collect(),
                },
                checkpoints: digests("lines.checkpoints", &line.checkpoints, MAX_SEGMENTS as usize + 1)?,
                chain_proof: proof("lines.chain_proof", &line.chain_proof, MAX_CHAIN_PROOF)?,
            })
        })
        .collect::<Result<Vec<_>, WireError>>()?;
    let opening = SegmentOpening {
        generation: o.generation,
        walker: o.walker,
        ends: states("ends", &o.ends)?,
        ends_proof: proof("ends_proof", &o.ends_proof, MAX_GENERATION_PROOF)?,
        lines,
    };
    Ok((o.device, opening, signature("signature", &o.signature)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proof_bounds_follow_the_largest_walk_and_state() {
        assert_eq!((MAX_GENERATION_PROOF, MAX_CHUNK_PATH, MAX_CHAIN_PROOF), (22, 16, 20));
    }

    fn opening() -> SegmentOpening {
        let proof = |k: usize| MerkleProof {
            siblings: (0..k).map(|i| Digest([i as u8; 32])).collect(),
        };
        SegmentOpening {
            generation: 3,
            walker: 1,
            ends: vec![State([5, 6, 7, 8]); 2],
            ends_proof: proof(3),
            lines: vec![
                LineProof {
                    chunk: (0..CHUNK_BYTES).map(|i| i as u8).collect(),
                    chunk_path: SlicePath {
                        siblings: vec![[7; 32]; 12],
                    },
                    checkpoints: vec![Digest([9; 32]); 3],
                    chain_proof: proof(5),
                };
                4
            ],
        }
    }

    #[test]
    fn an_opening_survives_the_wire() {
        let (device, back, sig) = opening_from_wire(&opening_to_wire(2, &opening(), &[6; 64])).unwrap();
        assert_eq!((device, back, sig), (2, opening(), [6; 64]));
    }

    #[test]
    fn a_request_survives_the_wire() {
        let request = LocalityRequest {
            walk: LocalityWalk {
                nonce: [1; 32],
                seed: [2; 32],
                global: Digest([3; 32]),
                walkers: 4,
                generations: 5,
                steps: 6,
            },
            deadline_ms: 7,
            validator_key: [8; 32],
            signature: [9; 64],
        };
        let wire = request_to_wire(&request);
        assert_eq!(request_nonce(&wire).unwrap(), [1; 32]);
        assert_eq!(request_from_wire(&wire, Digest([3; 32])).unwrap(), request);
    }

    /// Each hostile shape is refused by name.
    #[test]
    fn hostile_openings_are_named_errors() {
        let base = opening_to_wire(0, &opening(), &[6; 64]);
        let refused = |change: &dyn Fn(&mut v1::LocalityOpening)| {
            let mut o = base.clone();
            change(&mut o);
            opening_from_wire(&o).unwrap_err().field
        };
        assert_eq!(
            refused(&|o| o.lines[1].chunk.pop().map(drop).unwrap_or(())),
            "lines.chunk"
        );
        assert_eq!(refused(&|o| o.lines = vec![o.lines[0].clone(); 1025]), "lines");
        assert_eq!(
            refused(&|o| o.lines[0].chunk_path = vec![vec![0; 32]; 17]),
            "lines.chunk_path"
        );
        assert_eq!(refused(&|o| o.lines[0].chunk_path[0].push(0)), "lines.chunk_path");
        assert_eq!(
            refused(&|o| o.lines[0].checkpoints = vec![vec![0; 32]; 1026]),
            "lines.checkpoints"
        );
        assert_eq!(
            refused(&|o| o.lines[0].chain_proof = vec![vec![0; 32]; 21]),
            "lines.chain_proof"
        );
        assert_eq!(refused(&|o| o.ends = vec![vec![0; 32]; 4097]), "ends");
        assert_eq!(refused(&|o| o.ends[0].truncate(31)), "ends");
        assert_eq!(refused(&|o| o.ends_proof = vec![vec![0; 32]; 23]), "ends_proof");
        assert_eq!(refused(&|o| o.signature.pop().map(drop).unwrap_or(())), "signature");
    }
}
