//! The locality walk's signed statements (docs/design/locality.md; PROTOCOL.md 20.10): the
//! request, one locality root per device, the open request and one opened segment. As
//! version 4's (`super::memory_v4`), each is a domain of its own followed by fixed-width fields
//! and length-prefixed lists, so that no statement's bytes can be read as another's.

use super::memory_v4::{WALK_ROOT_DOMAIN, WalkRoot};
use super::redomained;
use crate::encoding::{put_digests, put_path, put_u32};
use crate::memory::locality::{LocalityWalk, SegmentOpening, State};

const REQUEST_DOMAIN: &[u8] = b"gpu-attest v4 locality request";
const ROOT_DOMAIN: &[u8] = b"gpu-attest v4 locality root";
const OPEN_REQUEST_DOMAIN: &[u8] = b"gpu-attest v4 locality open request";
const OPENING_DOMAIN: &[u8] = b"gpu-attest v4 locality tree opening";

/// Most segments one locality open request may ask for of one device.
pub const MAX_SEGMENT_SAMPLES_PER_DEVICE: usize = 256;

/// One segment to open: walker `w` of generation `g` of device `j`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SegmentSample {
    pub device: u32,
    pub generation: u32,
    pub walker: u32,
}

/// `"gpu-attest v4 locality request" || nonce || seed || le32(W) || le32(G) || le32(C) ||
/// le64(deadline_unix_ms)`.
pub fn request_bytes(walk: &LocalityWalk, deadline_ms: u64) -> Vec<u8> {
    let mut out = REQUEST_DOMAIN.to_vec();
    out.extend(walk.nonce);
    out.extend(walk.seed);
    out.extend(walk.walkers.to_le_bytes());
    out.extend(walk.generations.to_le_bytes());
    out.extend(walk.steps.to_le_bytes());
    out.extend(deadline_ms.to_le_bytes());
    out
}

/// A device's locality root: 20.7's walk root statement (`root.walk_seed` the locality seed,
/// `root.root` the locality root) under the domain `"gpu-attest v4 locality root"`.
pub fn root_bytes(root: &WalkRoot) -> Vec<u8> {
    redomained(root.signing_bytes(), WALK_ROOT_DOMAIN, ROOT_DOMAIN)
}

/// `"gpu-attest v4 locality open request" || nonce || list(le32(j) || le32(g) || le32(w))`.
pub fn open_request_bytes(nonce: &[u8; 32], samples: &[SegmentSample]) -> Vec<u8> {
    let mut out = OPEN_REQUEST_DOMAIN.to_vec();
    out.extend(nonce);
    put_u32(&mut out, samples.len());
    for s in samples {
        out.extend(s.device.to_le_bytes());
        out.extend(s.generation.to_le_bytes());
        out.extend(s.walker.to_le_bytes());
    }
    out
}

fn put_states(out: &mut Vec<u8>, states: &[State]) {
    put_u32(out, states.len());
    for s in states {
        out.extend(s.to_bytes());
    }
}

/// `"gpu-attest v4 locality tree opening" || nonce || le32(j) || le32(g) || le32(w) ||
/// list(e_{g,*}) || list(its proof) || list(line)`, a
/// line being `blake3(chunk) || list(chunk path) || list(checkpoints) || list(chain leaf
/// proof)`. Chunks enter by their plain BLAKE3 hash, so the signed bytes stay small.
pub fn opening_bytes(nonce: &[u8; 32], device: u32, opening: &SegmentOpening) -> Vec<u8> {
    let mut out = OPENING_DOMAIN.to_vec();
    out.extend(nonce);
    out.extend(device.to_le_bytes());
    out.extend(opening.generation.to_le_bytes());
    out.extend(opening.walker.to_le_bytes());
    put_states(&mut out, &opening.ends);
    put_digests(&mut out, &opening.ends_proof.siblings);
    put_u32(&mut out, opening.lines.len());
    for line in &opening.lines {
        out.extend(blake3::hash(&line.chunk).as_bytes());
        put_path(&mut out, &line.chunk_path);
        put_digests(&mut out, &line.checkpoints);
        put_digests(&mut out, &line.chain_proof.siblings);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;
    use crate::keys::PublicKey;
    use crate::memory::locality::LineProof;
    use crate::memory::slice::SlicePath;
    use crate::merkle::MerkleProof;

    fn walk() -> LocalityWalk {
        LocalityWalk {
            nonce: [1; 32],
            seed: [2; 32],
            global: Digest([3; 32]),
            walkers: 4,
            generations: 5,
            steps: 6,
        }
    }

    /// Every field of the request moves its bytes; the global root is not a field (it is the
    /// commitment's, which the nonce names).
    #[test]
    fn every_request_field_is_signed() {
        let base = request_bytes(&walk(), 7);
        assert!(base.starts_with(REQUEST_DOMAIN));
        for changed in [
            LocalityWalk {
                nonce: [9; 32],
                ..walk()
            },
            LocalityWalk {
                seed: [9; 32],
                ..walk()
            },
            LocalityWalk { walkers: 9, ..walk() },
            LocalityWalk {
                generations: 9,
                ..walk()
            },
            LocalityWalk { steps: 9, ..walk() },
        ] {
            assert_ne!(request_bytes(&changed, 7), base, "{changed:?}");
        }
        assert_ne!(request_bytes(&walk(), 8), base);
        assert_eq!(base.len(), REQUEST_DOMAIN.len() + 32 + 32 + 12 + 8);
    }

    /// A locality root's signature is never a walk root's, nor the reverse.
    #[test]
    fn a_locality_root_is_not_a_walk_root() {
        let root = WalkRoot {
            nonce: [1; 32],
            miner_key: PublicKey([2; 32]),
            validator_key: PublicKey([3; 32]),
            walk_seed: [4; 32],
            device: 5,
            root: Digest([6; 32]),
            device_us: 7,
        };
        let (walk, locality) = (root.signing_bytes(), root_bytes(&root));
        assert!(locality.starts_with(ROOT_DOMAIN));
        assert_ne!(walk, locality);
        assert_eq!(&walk[WALK_ROOT_DOMAIN.len()..], &locality[ROOT_DOMAIN.len()..]);
    }

    #[test]
    fn every_opening_field_is_signed() {
        let line = LineProof {
            chunk: vec![1; 1024],
            chunk_path: SlicePath {
                siblings: vec![[2; 32]; 3],
            },
            checkpoints: vec![Digest([3; 32]); 2],
            chain_proof: MerkleProof {
                siblings: vec![Digest([4; 32])],
            },
        };
        let opening = SegmentOpening {
            generation: 2,
            walker: 1,
            ends: vec![State([5, 6, 7, 8]); 2],
            ends_proof: MerkleProof {
                siblings: vec![Digest([6; 32])],
            },
            lines: vec![line.clone(); 2],
        };
        let base = opening_bytes(&[7; 32], 0, &opening);
        assert_ne!(opening_bytes(&[8; 32], 0, &opening), base);
        assert_ne!(opening_bytes(&[7; 32], 1, &opening), base);
        let mut changes: Vec<SegmentOpening> = Vec::new();
        let mut o = opening.clone();
        o.generation = 3;
        changes.push(o);
        let mut o = opening.clone();
        o.walker = 0;
        changes.push(o);
        let mut o = opening.clone();
        o.ends[0].0[3] = 9;
        changes.push(o);
        let mut o = opening.clone();
        o.ends_proof.siblings[0].0[0] = 9;
        changes.push(o);
        let mut o = opening.clone();
        o.lines[1].chunk[1023] = 9;
        changes.push(o);
        let mut o = opening.clone();
        o.lines[0].chunk_path.siblings[2][0] = 9;
        changes.push(o);
        let mut o = opening.clone();
        o.lines[0].checkpoints[1].0[0] = 9;
        changes.push(o);
        let mut o = opening.clone();
        o.lines[1].chain_proof.siblings.push(Digest([0; 32]));
        changes.push(o);
        let mut o = opening.clone();
        o.lines.pop();
        changes.push(o);
        for (i, changed) in changes.iter().enumerate() {
            assert_ne!(opening_bytes(&[7; 32], 0, changed), base, "change {i}");
        }
    }

    #[test]
    fn every_sample_is_signed_in_order() {
        let a = SegmentSample {
            device: 0,
            generation: 1,
            walker: 2,
        };
        let b = SegmentSample {
            device: 1,
            generation: 1,
            walker: 2,
        };
        let base = open_request_bytes(&[1; 32], &[a, b]);
        assert_ne!(open_request_bytes(&[1; 32], &[b, a]), base);
        assert_ne!(open_request_bytes(&[1; 32], &[a]), base);
        assert_ne!(open_request_bytes(&[2; 32], &[a, b]), base);
    }
}
