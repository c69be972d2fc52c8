//! Version 4's memory-phase messages (PROTOCOL.md 20.8) and their conversions: the step samples
//! an open request asks for, each device's signed walk root, and one opened step. Every list is
//! bounded by the largest walk, pool and chain a challenge may ask for, so a hostile message is a
//! named [`WireError`], never a large allocation or a panic.

use crate::fields::{WireError, bytes32, digests, signature, wire_err};
use crate::v1;
use gpu_attest_shared::Digest;
use gpu_attest_shared::memory::chain_pool::MAX_WALK_STEPS;
use gpu_attest_shared::memory::params::MAX_WALKERS;
use gpu_attest_shared::memory::slice::{SLICE_BYTES, SlicePath};
use gpu_attest_shared::memory::slice_walk::StepOpening;
use gpu_attest_shared::merkle::MerkleProof;
use gpu_attest_shared::params::{MAX_CHAINS, MAX_N, MAX_SEGMENTS};
use gpu_attest_shared::statement::memory_v4::StepSample;

/// Levels of a tree over `leaves` leaves at most: `ceil(log2(leaves))`.
const fn levels(leaves: u64) -> usize {
    (u64::BITS - (leaves - 1).leading_zeros()) as usize
}

/// A walker's tree has `L + 1 <= 2^20 + 1` leaves.
const MAX_STATE_PROOF: usize = levels(MAX_WALK_STEPS as u64 + 1);
/// A device's walk tree has `W <= 2^16` leaves.
const MAX_WALKER_PROOF: usize = levels(MAX_WALKERS as u64);
/// A state of `n^2 <= MAX_N^2` bytes is at most `MAX_N^2 / 65536` slices (1024).
const MAX_SLICE_PATH: usize = levels((MAX_N as u64 * MAX_N as u64) / SLICE_BYTES as u64);
/// A device root over at most `MAX_CHAINS` chains.
const MAX_CHAIN_PROOF: usize = levels(MAX_CHAINS);

pub fn step_sample_to_wire(s: &StepSample) -> v1::StepSampleRequest {
    v1::StepSampleRequest {
        device: s.device,
        walker: s.walker,
        step: s.step,
    }
}

pub fn step_sample_from_wire(s: &v1::StepSampleRequest) -> StepSample {
    StepSample {
        device: s.device,
        walker: s.walker,
        step: s.step,
    }
}

/// Device `device`'s signed walk root.
pub fn walk_root_to_wire(device: u32, root: &Digest, device_us: u64, sig: &[u8; 64]) -> v1::DeviceWalkRoot {
    v1::DeviceWalkRoot {
        device,
        root: root.0.to_vec(),
        device_us,
        signature: sig.to_vec(),
    }
}

/// A device's walk root as sent: `(device, walk_root_j, device_us, signature)`.
pub fn walk_root_from_wire(r: &v1::DeviceWalkRoot) -> Result<(u32, Digest, u64, [u8; 64]), WireError> {
    Ok((
        r.device,
        Digest(bytes32("root", &r.root)?),
        r.device_us,
        signature("signature", &r.signature)?,
    ))
}

fn to_bytes(digests: &[Digest]) -> Vec<Vec<u8>> {
    digests.iter().map(|d| d.0.to_vec()).collect()
}

/// One opened step of device `device`, signed.
pub fn step_opening_to_wire(device: u32, o: &StepOpening, sig: &[u8; 64]) -> v1::StepOpening {
    v1::StepOpening {
        device,
        walker: o.walker,
        step: o.step,
        walker_root: o.walker_root.0.to_vec(),
        walker_proof: to_bytes(&o.walker_proof.siblings),
        start_proof: to_bytes(&o.start_proof.siblings),
        before: o.before.0.to_vec(),
        before_proof: to_bytes(&o.before_proof.siblings),
        after: o.after.0.to_vec(),
        after_proof: to_bytes(&o.after_proof.siblings),
        slice: o.slice.clone(),
        slice_path: o.slice_path.siblings.iter().map(|cv| cv.to_vec()).collect(),
        checkpoints: to_bytes(&o.checkpoints),
        chain_proof: to_bytes(&o.chain_proof.siblings),
        signature: sig.to_vec(),
    }
}

/// An opened step as sent: `(device, opening, signature)`. Lengths and list sizes are checked
/// here; whether the opening is right is 20.5's check.
pub fn step_opening_from_wire(o: &v1::StepOpening) -> Result<(u32, StepOpening, [u8; 64]), WireError> {
    if o.slice.len() != SLICE_BYTES {
        return Err(wire_err(
            "slice",
            format!("must be {SLICE_BYTES} bytes, got {}", o.slice.len()),
        ));
    }
    let proof = |field, list, max| digests(field, list, max).map(|siblings| MerkleProof { siblings });
    let slice_path = digests("slice_path", &o.slice_path, MAX_SLICE_PATH)?;
    let opening = StepOpening {
        walker: o.walker,
        step: o.step,
        walker_root: Digest(bytes32("walker_root", &o.walker_root)?),
        walker_proof: proof("walker_proof", &o.walker_proof, MAX_WALKER_PROOF)?,
        start_proof: proof("start_proof", &o.start_proof, MAX_STATE_PROOF)?,
        before: Digest(bytes32("before", &o.before)?),
        before_proof: proof("before_proof", &o.before_proof, MAX_STATE_PROOF)?,
        after: Digest(bytes32("after", &o.after)?),
        after_proof: proof("after_proof", &o.after_proof, MAX_STATE_PROOF)?,
        slice: o.slice.clone(),
        slice_path: SlicePath {
            siblings: slice_path.into_iter().map(|d| d.0).collect(),
        },
        checkpoints: digests("checkpoints", &o.checkpoints, MAX_SEGMENTS as usize + 1)?,
        chain_proof: proof("chain_proof", &o.chain_proof, MAX_CHAIN_PROOF)?,
    };
    Ok((o.device, opening, signature("signature", &o.signature)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proof_bounds_follow_the_largest_walk() {
        assert_eq!(
            (MAX_STATE_PROOF, MAX_WALKER_PROOF, MAX_SLICE_PATH, MAX_CHAIN_PROOF),
            (21, 16, 10, 20)
        );
        assert_eq!(levels(1), 0);
        assert_eq!(levels(2), 1);
        assert_eq!(levels(9), 4);
    }

    fn opening() -> StepOpening {
        let proof = |k: usize| MerkleProof {
            siblings: (0..k).map(|i| Digest([i as u8; 32])).collect(),
        };
        StepOpening {
            walker: 3,
            step: 5,
            walker_root: Digest([1; 32]),
            walker_proof: proof(2),
            start_proof: proof(4),
            before: Digest([2; 32]),
            before_proof: proof(4),
            after: Digest([3; 32]),
            after_proof: proof(4),
            slice: (0..SLICE_BYTES).map(|i| i as u8).collect(),
            slice_path: SlicePath {
                siblings: vec![[7; 32], [8; 32]],
            },
            checkpoints: vec![Digest([9; 32]); 3],
            chain_proof: proof(2),
        }
    }

    /// What goes out comes back whole; each wrong length or list too long is named.
    #[test]
    fn a_step_opening_round_trips_and_names_what_is_wrong() {
        let wire = step_opening_to_wire(1, &opening(), &[4; 64]);
        assert_eq!(step_opening_from_wire(&wire).unwrap(), (1, opening(), [4; 64]));
        type Breaks = fn(&mut v1::StepOpening);
        let broken: [(&str, Breaks); 8] = [
            ("slice", |o| o.slice.truncate(SLICE_BYTES - 1)),
            ("walker_root", |o| o.walker_root.truncate(31)),
            ("before", |o| o.before.push(0)),
            ("after_proof", |o| o.after_proof[0].clear()),
            ("walker_proof", |o| {
                o.walker_proof = vec![vec![0; 32]; MAX_WALKER_PROOF + 1]
            }),
            ("start_proof", |o| {
                o.start_proof = vec![vec![0; 32]; MAX_STATE_PROOF + 1]
            }),
            ("slice_path", |o| o.slice_path = vec![vec![0; 32]; MAX_SLICE_PATH + 1]),
            ("signature", |o| o.signature.truncate(63)),
        ];
        for (field, breaks) in broken {
            let mut message = wire.clone();
            breaks(&mut message);
            assert_eq!(step_opening_from_wire(&message).unwrap_err().field, field);
        }
    }

    #[test]
    fn a_walk_root_round_trips_and_names_what_is_wrong() {
        let wire = walk_root_to_wire(2, &Digest([5; 32]), 1234, &[6; 64]);
        assert_eq!(walk_root_from_wire(&wire).unwrap(), (2, Digest([5; 32]), 1234, [6; 64]));
        let mut short = wire.clone();
        short.root.pop();
        assert_eq!(walk_root_from_wire(&short).unwrap_err().field, "root");
        let mut unsigned = wire;
        unsigned.signature.clear();
        assert_eq!(walk_root_from_wire(&unsigned).unwrap_err().field, "signature");
        let sample = StepSample {
            device: 1,
            walker: 2,
            step: 3,
        };
        assert_eq!(step_sample_from_wire(&step_sample_to_wire(&sample)), sample);
    }
}
