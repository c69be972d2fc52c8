//! Square int8 matrices and their generation from the challenge key.

use crate::aligned::AlignedBytes;
use crate::digest::Digest;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// An n x n matrix of int8, row-major, starting on a cache line (the CPU kernels read it in
/// 64-byte rows).
#[derive(Clone, PartialEq, Eq)]
pub struct Matrix {
    n: usize,
    data: AlignedBytes,
}

impl Matrix {
    pub fn zeros(n: usize) -> Self {
        Matrix {
            n,
            data: AlignedBytes::zeroed(n * n),
        }
    }

    /// Copies row-major bytes; `None` unless there are exactly n*n of them.
    pub fn from_bytes(n: usize, bytes: &[u8]) -> Option<Self> {
        (bytes.len() == n.checked_mul(n)?).then(|| Matrix {
            n,
            data: AlignedBytes::from_slice(bytes),
        })
    }

    pub fn from_vec(n: usize, data: Vec<i8>) -> Option<Self> {
        Self::from_bytes(n, bytemuck::cast_slice(&data))
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn as_slice(&self) -> &[i8] {
        bytemuck::cast_slice(self.data.as_slice())
    }

    pub fn as_mut_slice(&mut self) -> &mut [i8] {
        bytemuck::cast_slice_mut(self.data.as_mut_slice())
    }

    /// The row-major bytes, two's complement: what checkpoints hash and openings carry.
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.data.as_mut_slice()
    }

    /// `h = blake3(X)`, a checkpoint hash.
    pub fn digest(&self) -> Digest {
        Digest::hash(self.as_bytes())
    }
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix {{ n: {}, digest: {} }}", self.n, self.digest())
    }
}

/// ChaCha8 stream of the A matrix of chain `chain`.
pub fn a_stream(chain: u64) -> u64 {
    2 * chain
}

/// ChaCha8 stream of the B matrix of chain `chain`.
pub fn b_stream(chain: u64) -> u64 {
    2 * chain + 1
}

/// The first n*n bytes of ChaCha8 keyed by `key`, on `stream`, as an int8 matrix.
///
/// Large matrices are generated in 1 MiB pieces on rayon's threads (those of the pool this runs
/// in), each piece's generator set to its position in the stream; the bytes are the same as
/// one generator's. A validator regenerates A and B for every chain it samples, and ChaCha8 runs
/// under 1 GB/s on one core, about 5 ms per matrix at n = 2048.
pub fn generate(key: &[u8; 32], stream: u64, n: usize) -> Matrix {
    use rayon::prelude::*;
    /// A whole number of 64-byte ChaCha blocks.
    const PIECE: usize = 1 << 20;
    let mut m = Matrix::zeros(n);
    let fill = |position: usize, piece: &mut [u8]| fill_from(key, stream, position as u64, piece);
    let bytes = m.as_bytes_mut();
    if bytes.len() <= PIECE {
        fill(0, bytes);
    } else {
        bytes
            .par_chunks_mut(PIECE)
            .enumerate()
            .for_each(|(i, piece)| fill(i * PIECE, piece));
    }
    m
}

/// `out.len()` bytes of ChaCha8 keyed by `key`, on `stream`, from byte `position` (a multiple
/// of 4) on.
pub fn fill_from(key: &[u8; 32], stream: u64, position: u64, out: &mut [u8]) {
    let mut rng = ChaCha8Rng::from_seed(*key);
    rng.set_stream(stream);
    rng.set_word_pos(u128::from(position / 4));
    rng.fill_bytes(out);
}

/// Row `row` of A_chain, `out.len()` = n bytes of it, made alone: a checker makes one row of a
/// chain's state from it without the whole matrix.
pub fn a_row(key: &[u8; 32], chain: u64, row: u32, out: &mut [u8]) {
    fill_from(key, a_stream(chain), u64::from(row) * out.len() as u64, out);
}

/// A_i of the challenge.
pub fn generate_a(key: &[u8; 32], chain: u64, n: usize) -> Matrix {
    generate(key, a_stream(chain), n)
}

/// B_i of the challenge.
pub fn generate_b(key: &[u8; 32], chain: u64, n: usize) -> Matrix {
    generate(key, b_stream(chain), n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent ChaCha8 block function written from RFC 7539's quarter round with the
    /// original (djb) layout rand_chacha uses: words 12-13 a 64-bit block counter, 14-15 the
    /// stream. The CUDA generator follows this same function, so it pins the byte order.
    fn chacha8_block(key: &[u8; 32], counter: u64, stream: u64) -> [u8; 64] {
        fn qr(s: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
            s[a] = s[a].wrapping_add(s[b]);
            s[d] = (s[d] ^ s[a]).rotate_left(16);
            s[c] = s[c].wrapping_add(s[d]);
            s[b] = (s[b] ^ s[c]).rotate_left(12);
            s[a] = s[a].wrapping_add(s[b]);
            s[d] = (s[d] ^ s[a]).rotate_left(8);
            s[c] = s[c].wrapping_add(s[d]);
            s[b] = (s[b] ^ s[c]).rotate_left(7);
        }
        let mut init = [0u32; 16];
        init[..4].copy_from_slice(&[0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
        for (word, chunk) in init[4..12].iter_mut().zip(key.chunks(4)) {
            *word = u32::from_le_bytes(chunk.try_into().unwrap());
        }
        init[12] = counter as u32;
        init[13] = (counter >> 32) as u32;
        init[14] = stream as u32;
        init[15] = (stream >> 32) as u32;
        let mut s = init;
        for _ in 0..4 {
            qr(&mut s, 0, 4, 8, 12);
            qr(&mut s, 1, 5, 9, 13);
            qr(&mut s, 2, 6, 10, 14);
            qr(&mut s, 3, 7, 11, 15);
            qr(&mut s, 0, 5, 10, 15);
            qr(&mut s, 1, 6, 11, 12);
            qr(&mut s, 2, 7, 8, 13);
            qr(&mut s, 3, 4, 9, 14);
        }
        let mut out = [0u8; 64];
        for i in 0..16 {
            out[4 * i..4 * i + 4].copy_from_slice(&s[i].wrapping_add(init[i]).to_le_bytes());
        }
        out
    }

    #[test]
    fn generation_matches_reference_chacha8_block_function() {
        let key: [u8; 32] = core::array::from_fn(|i| (i * 7 + 3) as u8);
        for stream in [0u64, 1, 2, 5, 0x1_0000_0001] {
            let m = generate(&key, stream, 64);
            for (block, chunk) in m.as_bytes().chunks(64).enumerate() {
                assert_eq!(
                    chunk,
                    chacha8_block(&key, block as u64, stream),
                    "stream {stream} block {block}"
                );
            }
        }
    }

    #[test]
    fn generation_in_pieces_is_one_stream() {
        let key = [0x3c; 32];
        for n in [1024, 1088, 2048] {
            let mut rng = ChaCha8Rng::from_seed(key);
            rng.set_stream(9);
            let mut whole = vec![0u8; n * n];
            rng.fill_bytes(&mut whole);
            assert!(generate(&key, 9, n).as_bytes() == whole.as_slice(), "n={n}");
        }
    }

    #[test]
    fn a_and_b_use_distinct_streams() {
        let key = [7u8; 32];
        let a0 = generate_a(&key, 0, 64);
        let b0 = generate_b(&key, 0, 64);
        let a1 = generate_a(&key, 1, 64);
        assert_ne!(a0, b0);
        assert_ne!(a0, a1);
        assert_ne!(b0, a1);
    }

    #[test]
    fn from_bytes_checks_length() {
        assert!(Matrix::from_bytes(64, &[0u8; 64 * 64]).is_some());
        assert!(Matrix::from_bytes(64, &[0u8; 64 * 64 - 1]).is_none());
        assert!(Matrix::from_bytes(usize::MAX, &[]).is_none());
    }
}
