//! The signed statements of the memory phase (PROTOCOL.md 18.4): version 3's open request is
//! version 2's under a domain of its own with the walk samples appended; the walk request, the
//! walk statement and the walk opening are new. (Version 3's challenge and commitment are
//! encoded with version 2's, in `crate::statement`.)

pub use super::PoolCommitment;
use super::{OPEN_REQUEST_DOMAIN, SampleRequest, open_request_bytes, redomained};
use crate::digest::Digest;
use crate::encoding::{put_digests, put_u32};
use crate::keys::PublicKey;
use crate::memory::check::WalkOpening;

const OPEN_REQUEST_V3_DOMAIN: &[u8] = b"gpu-attest v3 open request";
pub(crate) const WALK_REQUEST_DOMAIN: &[u8] = b"gpu-attest v3 walk request";
const WALK_STATEMENT_DOMAIN: &[u8] = b"gpu-attest v3 walk statement";
const WALK_OPENING_DOMAIN: &[u8] = b"gpu-attest v3 walk opening";

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

/// The validator's walk request: `nonce || walk_seed || le64(deadline_unix_ms)`, version 4's
/// fields under this version's domain.
pub fn walk_request_bytes(nonce: &[u8; 32], walk_seed: &[u8; 32], deadline_ms: u64) -> Vec<u8> {
    redomained(
        super::memory_v4::walk_request_bytes(nonce, walk_seed, deadline_ms),
        super::memory_v4::WALK_REQUEST_DOMAIN,
        WALK_REQUEST_DOMAIN,
    )
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
        out.extend(crate::memory::pool::entry_leaf(&entry.bytes).0);
        put_digests(&mut out, &entry.proof.siblings);
    }
    out
}
