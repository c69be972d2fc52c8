//! The walk step both memory phases take (PROTOCOL.md 18.3; version 4's in 20.4): the entry or
//! slice a state names, the step's vector from the state, the exact product with the 64 KiB it
//! reads and the next state. Version 3's walk (`walk`) and version 4's (`slice_walk`) differ only
//! in the domain they take it under and in what they read, so the step outlives version 3.

use super::params::{ENTRY_BYTES, ENTRY_N};
use super::pool::PREFETCH_AHEAD;
use crate::digest::Digest;
use crate::mix::mix;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// The entry a state names: `le64(s[0..8]) mod P`.
pub fn entry_index(state: &Digest, entries: u64) -> u64 {
    let mut low = [0u8; 8];
    low.copy_from_slice(&state.0[..8]);
    u64::from_le_bytes(low) % entries
}

/// The step's vector: the first 256 bytes of ChaCha8 keyed by the state (stream 0), each with
/// its lowest bit set, so that every element is odd and no column of the entry can be skipped.
pub fn walk_vector(state: &Digest) -> [i8; ENTRY_N] {
    let mut bytes = [0u8; ENTRY_N];
    ChaCha8Rng::from_seed(state.0).fill_bytes(&mut bytes);
    bytes.map(|b| (b | 1) as i8)
}

/// One walk step, step number `t` of its walker, under the domain `context`: `y = E * v`
/// (int32, exact), `z[r] = mix(y[r], t, r, 0)`, `s' = blake3(context || s || z)`. Version 4
/// takes it over a 64 KiB slice of a chain state under `"gpu-attest v4 walk step"`, version 3
/// over a pool entry under `"gpu-attest v3 walk step"`.
pub fn step_under(context: &[u8], entry: &[i8], state: &Digest, t: u32) -> Digest {
    assert_eq!(entry.len(), ENTRY_BYTES, "a pool entry is 256 x 256 bytes");
    let y = matvec(entry, &walk_vector(state));
    let mut z = [0u8; ENTRY_N];
    for (r, (out, y)) in z.iter_mut().zip(y).enumerate() {
        *out = mix(y, t, r as u32, 0) as u8;
    }
    let mut h = blake3::Hasher::new();
    h.update(context);
    h.update(state.as_bytes());
    h.update(&z);
    h.finalize().into()
}

/// `E * v`, exact: |y[r]| <= 256 * 128 * 127 < 2^23. With AVX2 where the CPU has it: the
/// product is the step's only arithmetic over its 64 KiB, and the plain loop (about 20 us a
/// step on a Zen 5 core) would make the walk compute-bound instead of memory-bound.
fn matvec(entry: &[i8], v: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above; `entry` is 256 x 256 bytes (`step_under`
        // asserts it).
        return unsafe { matvec_avx2(entry, v) };
    }
    matvec_portable(entry, v)
}

fn matvec_portable(entry: &[i8], v: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
    let mut y = [0i32; ENTRY_N];
    for (row, y) in entry.chunks_exact(ENTRY_N).zip(y.iter_mut()) {
        *y = row.iter().zip(v).map(|(&a, &b)| i32::from(a) * i32::from(b)).sum();
    }
    y
}

/// Each row's 256 bytes widened to i16 and multiplied by the widened vector with `vpmaddwd`
/// (pairs of products, at most 2 * 128 * 127, summed in i32: exact), two accumulators a row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn matvec_avx2(entry: &[i8], v: &[i8; ENTRY_N]) -> [i32; ENTRY_N] {
    use std::arch::x86_64::*;
    const AHEAD_ROWS: usize = PREFETCH_AHEAD / ENTRY_N;
    assert_eq!(entry.len(), ENTRY_BYTES);
    // SAFETY (every load below): 16-byte unaligned loads at offsets below 65536 of `entry` and
    // below 256 of `v`, both of which are that long.
    unsafe {
        let wide: [__m256i; 16] =
            core::array::from_fn(|i| _mm256_cvtepi8_epi16(_mm_loadu_si128(v.as_ptr().add(16 * i).cast())));
        let mut y = [0i32; ENTRY_N];
        for (r, y) in y.iter_mut().enumerate() {
            let row = entry.as_ptr().add(r * ENTRY_N);
            // The row one page ahead: the hardware prefetcher does not cross into it.
            if r + AHEAD_ROWS < ENTRY_N {
                for line in 0..ENTRY_N / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(row.add(AHEAD_ROWS * ENTRY_N + 64 * line).cast());
                }
            }
            let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for i in (0..16).step_by(2) {
                let a = _mm256_cvtepi8_epi16(_mm_loadu_si128(row.add(16 * i).cast()));
                let b = _mm256_cvtepi8_epi16(_mm_loadu_si128(row.add(16 * i + 16).cast()));
                even = _mm256_add_epi32(even, _mm256_madd_epi16(a, wide[i]));
                odd = _mm256_add_epi32(odd, _mm256_madd_epi16(b, wide[i + 1]));
            }
            let sum = _mm256_add_epi32(even, odd);
            let half = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            let quarter = _mm_add_epi32(half, _mm_shuffle_epi32(half, 0b01_00_11_10));
            *y = _mm_cvtsi128_si32(_mm_add_epi32(quarter, _mm_shuffle_epi32(quarter, 0b10_11_00_01)));
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector path and the plain loop agree, at the extremes of int8 too (the reference
    /// walk of tests/memory.rs checks whichever path this CPU takes against the definition).
    #[test]
    fn every_matvec_path_is_exact() {
        let mut entry: Vec<i8> = (0..ENTRY_BYTES)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as i8)
            .collect();
        entry[..ENTRY_N].fill(-128);
        entry[ENTRY_N..2 * ENTRY_N].fill(127);
        for seed in 0..8u8 {
            let mut v = walk_vector(&Digest([seed; 32]));
            if seed == 0 {
                v.fill(-127);
            }
            let want = matvec_portable(&entry, &v);
            assert_eq!(matvec(&entry, &v), want, "seed {seed}");
            if seed == 0 {
                assert_eq!(want[0], 256 * 128 * 127);
            }
        }
    }
}
