//! A digest or a key as the kernels hold it: eight little-endian 32-bit words (a ChaCha8 key, a
//! BLAKE3 chaining value, a walker's state).

use gpu_attest_shared::digest::Digest;

/// The matrix key as the eight little-endian words ChaCha's state takes.
pub fn key_words(key: &[u8; 32]) -> [u32; 8] {
    core::array::from_fn(|i| u32::from_le_bytes(key[4 * i..4 * i + 4].try_into().unwrap()))
}

/// The digest the device holds as eight little-endian words: the inverse of [`key_words`].
pub fn digest_from_words(words: &[u32]) -> Digest {
    let mut bytes = [0u8; 32];
    for (chunk, word) in bytes.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    Digest(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_words_are_little_endian() {
        let key: [u8; 32] = core::array::from_fn(|i| i as u8);
        let words = key_words(&key);
        assert_eq!(words[0], 0x0302_0100);
        assert_eq!(words[7], 0x1f1e_1d1c);
        assert_eq!(digest_from_words(&words), Digest(key), "and back");
    }
}
