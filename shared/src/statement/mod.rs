//! The signed messages of the exchange and their canonical encodings (PROTOCOL.md section 13).
//!
//! Signatures cover these byte strings, never a serialisation library's output, so that any
//! implementation can reproduce them and a re-encoding cannot change what was signed. Each starts
//! with its own domain string, so a signature of one kind can never be passed off as another.

pub mod locality;
pub mod memory_v3;
pub mod memory_v4;

use crate::commitment::{DeviceRoot, WorkCommitment};
pub use crate::device::DeviceInfo;
use crate::digest::Digest;
use crate::encoding::{put_digests, put_inventory, put_str, put_u32};
use crate::inventory::HardwareClaim;
use crate::keys::{KeyPair, PublicKey, SignatureError};
use crate::matrix::Matrix;
use crate::memory::chain_pool::ChainPoolParams;
use crate::memory::params::MemoryParams;
use crate::merkle::MerkleProof;
use crate::params::ChallengeParams;

/// What the validator asks for: segment `segment` of chain `chain` (steps `segment*c ..
/// (segment+1)*c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleRequest {
    pub chain: u64,
    pub segment: u32,
}

/// The miner's answer to one [`SampleRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainOpening {
    pub chain: u64,
    pub segment: u32,
    /// All K/c + 1 checkpoint hashes of the chain.
    pub checkpoints: Vec<Digest>,
    /// Path from the chain's leaf to its device root.
    pub proof: MerkleProof,
    /// `X_{segment * c}`.
    pub start: Matrix,
}

const CHALLENGE_DOMAIN: &[u8] = b"gpu-attest v1 challenge";
const COMMITMENT_DOMAIN: &[u8] = b"gpu-attest v1 commitment statement";
/// Version 3's challenge and commitment (PROTOCOL.md 18.4): version 2's fields under these
/// domains, with the memory phase's appended.
const CHALLENGE_V3_DOMAIN: &[u8] = b"gpu-attest v3 challenge";
const CHALLENGE_V4_DOMAIN: &[u8] = b"gpu-attest v4 challenge";
const COMMITMENT_V3_DOMAIN: &[u8] = b"gpu-attest v3 commitment statement";
/// What a challenge with a finish-by time appends to its domain (PROTOCOL.md 13.1): the same
/// fields then `le64(finish_by_unix_ms)`, under a domain no challenge without one has.
const FINISH_BY_SUFFIX: &[u8] = b" with finish-by";
pub(crate) const OPEN_REQUEST_DOMAIN: &[u8] = b"gpu-attest v1 open request";
const OPENING_DOMAIN: &[u8] = b"gpu-attest v1 opening";

/// What the validator signs when it issues work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub params: ChallengeParams,
    /// Validator's clock, Unix milliseconds.
    pub issued_at_ms: u64,
    /// Validator's clock, Unix milliseconds; the commitment must arrive before it.
    pub deadline_ms: u64,
    pub validator_key: PublicKey,
    /// Digest of the hardware the challenge was sized for ([`HardwareClaim::digest`]): the
    /// commitment must name exactly that hardware.
    pub inventory_digest: Digest,
    /// The memory phase: present in a version 3 challenge (PROTOCOL.md 18) or a version 4 one
    /// (20), each signed under a domain of its own with its fields appended; absent in a
    /// version 2 one.
    pub memory: Option<MemoryPhase>,
    /// Validator's clock, Unix milliseconds: the miner may work past the deadline until then,
    /// so that a late commitment still proves the rate it was made at (PROTOCOL.md 14.3). Only
    /// for a miner whose inventory says it takes one; `None` stops the work at the deadline.
    pub finish_by_ms: Option<u64>,
}

/// A challenge's memory phase, by protocol version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryPhase {
    /// Pools filled after the chains, walked in segments (PROTOCOL.md 18).
    V3(MemoryParams),
    /// The pool chains' own final states, every walk state committed (PROTOCOL.md 20).
    V4(ChainPoolParams),
}

impl MemoryPhase {
    /// Version 3's parameters, if this is version 3's phase.
    pub fn v3(&self) -> Option<&MemoryParams> {
        match self {
            MemoryPhase::V3(m) => Some(m),
            MemoryPhase::V4(_) => None,
        }
    }

    /// The protocol version this phase belongs to.
    pub fn protocol_version(&self) -> u32 {
        match self {
            MemoryPhase::V3(_) => 3,
            MemoryPhase::V4(_) => 4,
        }
    }
}

impl Challenge {
    /// PROTOCOL.md 13.1, or 18.4 when the challenge carries a memory phase; either followed
    /// by the finish-by time, under its own domain, when the challenge has one.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let (bytes, domain) = match &self.memory {
            None => (self.v2_signing_bytes(), CHALLENGE_DOMAIN),
            Some(MemoryPhase::V3(memory)) => (challenge_v3_bytes(self.v2_signing_bytes(), memory), CHALLENGE_V3_DOMAIN),
            Some(MemoryPhase::V4(pool)) => (challenge_v4_bytes(self.v2_signing_bytes(), pool), CHALLENGE_V4_DOMAIN),
        };
        match self.finish_by_ms {
            None => bytes,
            Some(finish_by_ms) => {
                let mut out = redomained(bytes, domain, &[domain, FINISH_BY_SUFFIX].concat());
                out.extend(finish_by_ms.to_le_bytes());
                out
            }
        }
    }

    fn v2_signing_bytes(&self) -> Vec<u8> {
        let mut out = CHALLENGE_DOMAIN.to_vec();
        out.extend(self.params.key_material());
        out.extend(self.issued_at_ms.to_le_bytes());
        out.extend(self.deadline_ms.to_le_bytes());
        out.extend(self.validator_key.0);
        out.extend(self.inventory_digest.0);
        out
    }

    pub fn sign(&self, validator: &KeyPair) -> [u8; 64] {
        validator.sign(&self.signing_bytes())
    }

    pub fn verify(&self, signature: &[u8]) -> Result<(), SignatureError> {
        self.validator_key.verify(&self.signing_bytes(), signature)
    }
}

/// What the miner signs when it commits: the work commitment, who it is for, and what it ran on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commitment {
    pub work: WorkCommitment,
    pub miner_key: PublicKey,
    /// The validator whose challenge this answers.
    pub validator_key: PublicKey,
    pub inventory: Vec<DeviceInfo>,
    pub backend: String,
    pub kernel: String,
    /// The miner's own measurement of the work; the validator measures the deadline itself.
    pub compute_ms: u64,
    /// Every device's pool (PROTOCOL.md 18.4), in device order, when it answers a version 3
    /// challenge; `None` for version 2, whose statement has no such list.
    pub pools: Option<Vec<PoolCommitment>>,
}

impl Commitment {
    /// PROTOCOL.md 13.2, or 18.4 when the commitment names pools.
    pub fn signing_bytes(&self) -> Vec<u8> {
        match &self.pools {
            None => self.v2_signing_bytes(),
            Some(pools) => commitment_v3_bytes(self.v2_signing_bytes(), pools),
        }
    }

    fn v2_signing_bytes(&self) -> Vec<u8> {
        let mut out = COMMITMENT_DOMAIN.to_vec();
        out.extend(self.work.nonce);
        out.extend(self.miner_key.0);
        out.extend(self.validator_key.0);
        out.extend(self.work.global.0);
        put_devices(&mut out, &self.work.devices);
        put_inventory(&mut out, &self.inventory);
        put_str(&mut out, &self.backend);
        put_str(&mut out, &self.kernel);
        out.extend(self.compute_ms.to_le_bytes());
        out
    }

    pub fn sign(&self, miner: &KeyPair) -> [u8; 64] {
        miner.sign(&self.signing_bytes())
    }

    pub fn verify(&self, signature: &[u8]) -> Result<(), SignatureError> {
        self.miner_key.verify(&self.signing_bytes(), signature)
    }

    /// The hardware this commitment says it ran on.
    pub fn claim(&self) -> HardwareClaim {
        HardwareClaim {
            backend: self.backend.clone(),
            kernel: self.kernel.clone(),
            devices: self.inventory.clone(),
        }
    }
}

/// `bytes` with its domain `old` replaced by `new`: the same fields, another statement.
pub(crate) fn redomained(bytes: Vec<u8>, old: &[u8], new: &[u8]) -> Vec<u8> {
    assert!(
        bytes.starts_with(old),
        "a statement re-domained from a domain it does not start with"
    );
    let mut out = new.to_vec();
    out.extend_from_slice(&bytes[old.len()..]);
    out
}

/// The version 3 challenge: 13.1's fields (`v2`, that challenge's version 2 bytes), then
/// `le32(pool_permille) || le32(W) || le32(L) || le32(c_w)`.
fn challenge_v3_bytes(v2: Vec<u8>, memory: &MemoryParams) -> Vec<u8> {
    let mut out = redomained(v2, CHALLENGE_DOMAIN, CHALLENGE_V3_DOMAIN);
    for value in [
        memory.pool_permille,
        memory.walkers,
        memory.walk_steps,
        memory.walk_checkpoint_every,
    ] {
        out.extend(value.to_le_bytes());
    }
    out
}

/// The version 4 challenge: 13.1's fields (`v2`, that challenge's version 2 bytes), then
/// `le32(W) || le32(L) || list(le64(N_j))` (PROTOCOL.md 20.7).
fn challenge_v4_bytes(v2: Vec<u8>, pool: &ChainPoolParams) -> Vec<u8> {
    let mut out = redomained(v2, CHALLENGE_DOMAIN, CHALLENGE_V4_DOMAIN);
    out.extend(pool.walkers.to_le_bytes());
    out.extend(pool.walk_steps.to_le_bytes());
    put_u32(&mut out, pool.pool_chains.len());
    for chains in &pool.pool_chains {
        out.extend(chains.to_le_bytes());
    }
    out
}

/// One device's pool as a version 3 commitment names it (PROTOCOL.md 18.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolCommitment {
    pub device: u32,
    /// P_j.
    pub entries: u64,
    pub root: Digest,
}

/// The version 3 commitment: 13.2's fields (`v2`), then `list(le32(j) || le64(P_j) ||
/// pool_root_j)`.
fn commitment_v3_bytes(v2: Vec<u8>, pools: &[PoolCommitment]) -> Vec<u8> {
    let mut out = redomained(v2, COMMITMENT_DOMAIN, COMMITMENT_V3_DOMAIN);
    put_u32(&mut out, pools.len());
    for pool in pools {
        out.extend(pool.device.to_le_bytes());
        out.extend(pool.entries.to_le_bytes());
        out.extend(pool.root.0);
    }
    out
}

/// The validator's signed request for openings: only the challenge's issuer may make the miner
/// recompute.
pub fn open_request_bytes(nonce: &[u8; 32], samples: &[SampleRequest]) -> Vec<u8> {
    let mut out = OPEN_REQUEST_DOMAIN.to_vec();
    out.extend(nonce);
    put_u32(&mut out, samples.len());
    for s in samples {
        out.extend(s.chain.to_le_bytes());
        out.extend(s.segment.to_le_bytes());
    }
    out
}

/// The miner's signed answer for one opening. The opened matrix enters as its BLAKE3 hash.
pub fn opening_bytes(nonce: &[u8; 32], opening: &ChainOpening) -> Vec<u8> {
    let mut out = OPENING_DOMAIN.to_vec();
    out.extend(nonce);
    out.extend(opening.chain.to_le_bytes());
    out.extend(opening.segment.to_le_bytes());
    put_digests(&mut out, &opening.checkpoints);
    put_digests(&mut out, &opening.proof.siblings);
    out.extend(opening.start.digest().0);
    out
}

fn put_devices(out: &mut Vec<u8>, devices: &[DeviceRoot]) {
    put_u32(out, devices.len());
    for d in devices {
        out.extend(d.slice.index.to_le_bytes());
        out.extend(d.slice.offset.to_le_bytes());
        out.extend(d.slice.count.to_le_bytes());
        out.extend(d.root.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn challenge(validator: &KeyPair) -> Challenge {
        Challenge {
            finish_by_ms: None,
            params: ChallengeParams {
                nonce: [1; 32],
                seed: [2; 32],
                miner_key: [3; 32],
                n: 64,
                num_chains: 2,
                iterations: 2,
                checkpoint_every: 1,
            },
            issued_at_ms: 1000,
            deadline_ms: 2000,
            validator_key: validator.public_key(),
            inventory_digest: Digest([5; 32]),
            memory: None,
        }
    }

    #[test]
    fn challenge_signature_covers_every_field() {
        let v = KeyPair::from_seed([9; 32]);
        let c = challenge(&v);
        let sig = c.sign(&v);
        c.verify(&sig).unwrap();
        let mut later = c.clone();
        later.deadline_ms += 1;
        assert_eq!(later.verify(&sig), Err(SignatureError::Invalid));
        let mut other_miner = c.clone();
        other_miner.params.miner_key = [4; 32];
        assert_eq!(other_miner.verify(&sig), Err(SignatureError::Invalid));
        let mut other_hardware = c.clone();
        other_hardware.inventory_digest = Digest([6; 32]);
        assert_eq!(other_hardware.verify(&sig), Err(SignatureError::Invalid));
        let mut other_validator = c;
        other_validator.validator_key = KeyPair::from_seed([8; 32]).public_key();
        assert_eq!(other_validator.verify(&sig), Err(SignatureError::Invalid));
    }

    #[test]
    fn domains_separate_kinds_of_statement() {
        let v = KeyPair::from_seed([9; 32]);
        let c = challenge(&v);
        let sig = c.sign(&v);
        // The same signature never verifies as an open request over the same nonce.
        assert!(
            v.public_key()
                .verify(&open_request_bytes(&c.params.nonce, &[]), &sig)
                .is_err()
        );
    }
}
