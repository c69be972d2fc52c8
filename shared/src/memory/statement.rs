//! The signed statements of the memory phase (PROTOCOL.md 18.4): version 3's challenge,
//! commitment and open request are version 2's under a domain of their own with the memory
//! phase's fields appended; the walk request, the walk statement and the walk opening are new.

use super::check::WalkOpening;
use super::params::MemoryParams;
use crate::digest::Digest;
use crate::identity::PublicKey;
use crate::opening::SampleRequest;
use crate::statement::{
    CHALLENGE_DOMAIN, COMMITMENT_DOMAIN, OPEN_REQUEST_DOMAIN, open_request_bytes, put_digests, put_u32,
};

const CHALLENGE_V3_DOMAIN: &[u8] = b"gpu-attest v3 challenge";
const COMMITMENT_V3_DOMAIN: &[u8] = b"gpu-attest v3 commitment statement";
const OPEN_REQUEST_V3_DOMAIN: &[u8] = b"gpu-attest v3 open request";
const WALK_REQUEST_DOMAIN: &[u8] = b"gpu-attest v3 walk request";
const WALK_STATEMENT_DOMAIN: &[u8] = b"gpu-attest v3 walk statement";
const WALK_OPENING_DOMAIN: &[u8] = b"gpu-attest v3 walk opening";

/// `v2` with its version 1 domain `old` replaced by `new`: the same fields, another statement.
fn redomained(v2: Vec<u8>, old: &[u8], new: &[u8]) -> Vec<u8> {
    debug_assert!(v2.starts_with(old));
    let mut out = new.to_vec();
    out.extend_from_slice(&v2[old.len()..]);
    out
}

/// The version 3 challenge: 13.1's fields (`v2`, that challenge's version 2 bytes), then
/// `le32(pool_permille) || le32(W) || le32(L) || le32(c_w)`.
pub(crate) fn challenge_v3_bytes(v2: Vec<u8>, memory: &MemoryParams) -> Vec<u8> {
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

/// One device's pool as a commitment names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolCommitment {
    pub device: u32,
    /// P_j.
    pub entries: u64,
    pub root: Digest,
}

/// The version 3 commitment: 13.2's fields (`v2`), then `list(le32(j) || le64(P_j) ||
/// pool_root_j)`.
pub(crate) fn commitment_v3_bytes(v2: Vec<u8>, pools: &[PoolCommitment]) -> Vec<u8> {
    let mut out = redomained(v2, COMMITMENT_DOMAIN, COMMITMENT_V3_DOMAIN);
    put_u32(&mut out, pools.len());
    for pool in pools {
        out.extend(pool.device.to_le_bytes());
        out.extend(pool.entries.to_le_bytes());
        out.extend(pool.root.0);
    }
    out
}

/// A walk segment to open: device, walker, segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WalkSample {
    pub device: u32,
    pub walker: u32,
    pub segment: u32,
}

/// The version 3 open request: 13.3's fields, then `list(le32(j) || le32(w) || le32(q))`.
pub fn open_request_bytes_v3(nonce: &[u8; 32], chains: &[SampleRequest], walks: &[WalkSample]) -> Vec<u8> {
    let mut out = redomained(
        open_request_bytes(nonce, chains),
        OPEN_REQUEST_DOMAIN,
        OPEN_REQUEST_V3_DOMAIN,
    );
    put_u32(&mut out, walks.len());
    for w in walks {
        out.extend(w.device.to_le_bytes());
        out.extend(w.walker.to_le_bytes());
        out.extend(w.segment.to_le_bytes());
    }
    out
}

/// The validator's walk request: `nonce || walk_seed || le64(deadline_unix_ms)`.
pub fn walk_request_bytes(nonce: &[u8; 32], walk_seed: &[u8; 32], deadline_ms: u64) -> Vec<u8> {
    let mut out = WALK_REQUEST_DOMAIN.to_vec();
    out.extend(nonce);
    out.extend(walk_seed);
    out.extend(deadline_ms.to_le_bytes());
    out
}

/// The miner's walk statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkStatement {
    pub nonce: [u8; 32],
    pub miner_key: PublicKey,
    pub validator_key: PublicKey,
    pub walk_seed: [u8; 32],
    /// `(j, walk_root_j)` for every device, in index order.
    pub roots: Vec<(u32, Digest)>,
    /// The miner's own account of the walk; informational.
    pub walk_ms: u64,
}

impl WalkStatement {
    /// `nonce || miner_key || validator_key || walk_seed || list(le32(j) || walk_root_j) ||
    /// le64(walk_ms)`.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let mut out = WALK_STATEMENT_DOMAIN.to_vec();
        out.extend(self.nonce);
        out.extend(self.miner_key.0);
        out.extend(self.validator_key.0);
        out.extend(self.walk_seed);
        put_u32(&mut out, self.roots.len());
        for (device, root) in &self.roots {
            out.extend(device.to_le_bytes());
            out.extend(root.0);
        }
        out.extend(self.walk_ms.to_le_bytes());
        out
    }
}

/// The miner's signed answer for one walk segment: the entries enter as their pool leaves.
pub fn walk_opening_bytes(nonce: &[u8; 32], opening: &WalkOpening) -> Vec<u8> {
    let mut out = WALK_OPENING_DOMAIN.to_vec();
    out.extend(nonce);
    out.extend(opening.device.to_le_bytes());
    out.extend(opening.walker.to_le_bytes());
    out.extend(opening.segment.to_le_bytes());
    put_digests(&mut out, &opening.checkpoints);
    put_digests(&mut out, &opening.proof.siblings);
    put_u32(&mut out, opening.entries.len());
    for entry in &opening.entries {
        out.extend(super::pool::entry_leaf(&entry.bytes).0);
        put_digests(&mut out, &entry.proof.siblings);
    }
    out
}
