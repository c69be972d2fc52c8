//! Version 4's signed statements of the memory phase (PROTOCOL.md 20.7): the walk request, one
//! walk root per device, the open request with its walk steps, and one opened step. Each is a
//! domain of its own followed by fixed-width fields and length-prefixed lists (PROTOCOL.md 13),
//! so that no statement's bytes can be read as another's.

use super::{OPEN_REQUEST_DOMAIN, SampleRequest, redomained};
use crate::digest::Digest;
use crate::encoding::{put_digests, put_path, put_u32};
use crate::keys::PublicKey;
use crate::memory::slice_walk::StepOpening;

pub(crate) const WALK_REQUEST_DOMAIN: &[u8] = b"gpu-attest v4 walk request";
pub(crate) const WALK_ROOT_DOMAIN: &[u8] = b"gpu-attest v4 walk root";
const OPEN_REQUEST_DOMAIN_V4: &[u8] = b"gpu-attest v4 open request";
const STEP_OPENING_DOMAIN: &[u8] = b"gpu-attest v4 step opening";

/// Most walk steps one open request may ask for of one device: above the largest count a
/// validator of this release opens on any device (its cap, 1649 steps: PROTOCOL.md 20.9 step 6),
/// with room for a validator that opens more.
pub const MAX_STEP_SAMPLES_PER_DEVICE: usize = 2048;

/// Most walk steps one open request may ask for, in all, of a commitment on `devices` devices:
/// [`MAX_STEP_SAMPLES_PER_DEVICE`] each, so that no host is refused for its size.
pub fn max_step_samples(devices: usize) -> usize {
    MAX_STEP_SAMPLES_PER_DEVICE.saturating_mul(devices.max(1))
}

/// One walk step to open: device `j`, walker `w`, step `t` (the step from `s_{w,t}` to
/// `s_{w,t+1}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepSample {
    pub device: u32,
    pub walker: u32,
    pub step: u32,
}

/// The validator's walk request: `nonce || walk_seed || le64(deadline_unix_ms)` under this
/// version's domain (version 3's request re-domains these bytes until it is retired).
pub fn walk_request_bytes(nonce: &[u8; 32], walk_seed: &[u8; 32], deadline_ms: u64) -> Vec<u8> {
    let mut out = WALK_REQUEST_DOMAIN.to_vec();
    out.extend(nonce);
    out.extend(walk_seed);
    out.extend(deadline_ms.to_le_bytes());
    out
}

/// A device's walk root as the miner signs it once that device's walk has ended: the
/// validator's clock for device `j` stops when this arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkRoot {
    pub nonce: [u8; 32],
    pub miner_key: PublicKey,
    pub validator_key: PublicKey,
    pub walk_seed: [u8; 32],
    pub device: u32,
    /// `walk_root_j` (PROTOCOL.md 20.4).
    pub root: Digest,
    /// The walk as the device timed it, microseconds: informational, never trusted.
    pub device_us: u64,
}

impl WalkRoot {
    /// `nonce || miner_key || validator_key || walk_seed || le32(j) || walk_root_j ||
    /// le64(device_us)`.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let mut out = WALK_ROOT_DOMAIN.to_vec();
        out.extend(self.nonce);
        out.extend(self.miner_key.0);
        out.extend(self.validator_key.0);
        out.extend(self.walk_seed);
        out.extend(self.device.to_le_bytes());
        out.extend(self.root.0);
        out.extend(self.device_us.to_le_bytes());
        out
    }
}

/// The version 4 open request: 13.3's fields under this version's domain, then
/// `list(le32(j) || le32(w) || le32(t))`.
pub fn open_request_bytes(nonce: &[u8; 32], chains: &[SampleRequest], steps: &[StepSample]) -> Vec<u8> {
    let mut out = redomained(
        super::open_request_bytes(nonce, chains),
        OPEN_REQUEST_DOMAIN,
        OPEN_REQUEST_DOMAIN_V4,
    );
    put_u32(&mut out, steps.len());
    for s in steps {
        out.extend(s.device.to_le_bytes());
        out.extend(s.walker.to_le_bytes());
        out.extend(s.step.to_le_bytes());
    }
    out
}

/// The miner's signed answer for one opened step of device `device`: `nonce || le32(j) ||
/// le32(w) || le32(t) || walker_root || list(walker proof) || list(start proof) || s_t ||
/// list(its proof) || s_{t+1} || list(its proof) || blake3(slice) || list(slice path) ||
/// list(checkpoints) || list(chain leaf proof)`. The slice enters by its plain BLAKE3 hash, so
/// the signed bytes stay small; its path siblings are 32-byte chaining values like digests.
pub fn step_opening_bytes(nonce: &[u8; 32], device: u32, opening: &StepOpening) -> Vec<u8> {
    let mut out = STEP_OPENING_DOMAIN.to_vec();
    out.extend(nonce);
    out.extend(device.to_le_bytes());
    out.extend(opening.walker.to_le_bytes());
    out.extend(opening.step.to_le_bytes());
    out.extend(opening.walker_root.0);
    put_digests(&mut out, &opening.walker_proof.siblings);
    put_digests(&mut out, &opening.start_proof.siblings);
    out.extend(opening.before.0);
    put_digests(&mut out, &opening.before_proof.siblings);
    out.extend(opening.after.0);
    put_digests(&mut out, &opening.after_proof.siblings);
    out.extend(blake3::hash(&opening.slice).as_bytes());
    put_path(&mut out, &opening.slice_path);
    put_digests(&mut out, &opening.checkpoints);
    put_digests(&mut out, &opening.chain_proof.siblings);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field moves the bytes, and the domains keep the statements apart.
    #[test]
    fn every_field_is_signed_and_the_domains_differ() {
        let root = WalkRoot {
            nonce: [1; 32],
            miner_key: PublicKey([2; 32]),
            validator_key: PublicKey([3; 32]),
            walk_seed: [4; 32],
            device: 5,
            root: Digest([6; 32]),
            device_us: 7,
        };
        let base = root.signing_bytes();
        let changed = [
            WalkRoot {
                nonce: [9; 32],
                ..root.clone()
            },
            WalkRoot {
                miner_key: PublicKey([9; 32]),
                ..root.clone()
            },
            WalkRoot {
                validator_key: PublicKey([9; 32]),
                ..root.clone()
            },
            WalkRoot {
                walk_seed: [9; 32],
                ..root.clone()
            },
            WalkRoot {
                device: 9,
                ..root.clone()
            },
            WalkRoot {
                root: Digest([9; 32]),
                ..root.clone()
            },
            WalkRoot {
                device_us: 9,
                ..root.clone()
            },
        ];
        for other in changed {
            assert_ne!(other.signing_bytes(), base, "{other:?}");
        }
        let step = StepSample {
            device: 1,
            walker: 2,
            step: 3,
        };
        let with_step = open_request_bytes(&[1; 32], &[], &[step]);
        assert_ne!(
            with_step,
            open_request_bytes(&[1; 32], &[], &[StepSample { step: 4, ..step }])
        );
        let v3 = super::super::memory_v3::open_request_bytes_v3(&[1; 32], &[], &[]);
        assert_ne!(
            open_request_bytes(&[1; 32], &[], &[]),
            v3,
            "a v3 request is not a v4 one"
        );
        assert!(with_step.starts_with(OPEN_REQUEST_DOMAIN_V4));
        let v3_walk = super::super::memory_v3::walk_request_bytes(&[1; 32], &[4; 32], 7);
        let v4_walk = walk_request_bytes(&[1; 32], &[4; 32], 7);
        assert_ne!(v4_walk, v3_walk);
        // The same fields after each version's domain.
        assert_eq!(
            v4_walk[WALK_REQUEST_DOMAIN.len()..],
            v3_walk[super::super::memory_v3::WALK_REQUEST_DOMAIN.len()..]
        );
    }
}
