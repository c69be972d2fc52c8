//! What one chain produces: its checkpoint hashes, and the leaf that commits to them.

use crate::digest::Digest;

const LEAF_CONTEXT: &[u8] = b"gpu-attest v1 leaf";

/// Checkpoint hashes of chain `index`: `checkpoints[j] = blake3(X_{j*c})`, j in 0..=K/c.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainResult {
    pub index: u64,
    pub checkpoints: Vec<Digest>,
}

impl ChainResult {
    pub fn leaf(&self) -> Digest {
        leaf_hash(self.index, &self.checkpoints)
    }
}

/// `blake3("gpu-attest v1 leaf" || le64(i) || h_0 || ... || h_{K/c})`.
pub fn leaf_hash(index: u64, checkpoints: &[Digest]) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(LEAF_CONTEXT);
    h.update(&index.to_le_bytes());
    for c in checkpoints {
        h.update(c.as_bytes());
    }
    h.finalize().into()
}
