//! 32-byte BLAKE3 digests, printed as lowercase hex.

use std::fmt;

/// A 32-byte BLAKE3 output: checkpoint hashes, leaves, Merkle nodes, roots and the global checksum.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub const LEN: usize = 32;

    pub fn hash(bytes: &[u8]) -> Self {
        // A matrix (4 MiB at n = 2048) is hashed on rayon's threads: BLAKE3's tree gives the
        // same digest however it is split, and a validator hashes three per sampled chain.
        // Below a megabyte the threads' hand-off costs more than it saves.
        const PARALLEL_FROM: usize = 1 << 20;
        if bytes.len() >= PARALLEL_FROM {
            Digest(*blake3::Hasher::new().update_rayon(bytes).finalize().as_bytes())
        } else {
            Digest(*blake3::hash(bytes).as_bytes())
        }
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, hex::FromHexError> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out)?;
        Ok(Digest(out))
    }

    /// Takes exactly 32 bytes, as they arrive in a wire message.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Digest)
    }
}

impl From<blake3::Hash> for Digest {
    fn from(hash: blake3::Hash) -> Self {
        Digest(*hash.as_bytes())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_inputs_hash_on_threads_to_the_same_digest() {
        let bytes: Vec<u8> = (0..(3 << 20) + 4096).map(|i: usize| (i * 31 + i / 977) as u8).collect();
        assert_eq!(Digest::hash(&bytes).0, *blake3::hash(&bytes).as_bytes());
    }
}
