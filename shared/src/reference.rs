//! The work function written out plainly, from PROTOCOL.md alone: a naive chain (sections 3 to
//! 5), a naive pool entry (18.2), a naive walk (18.3) and version 4's step (20.4). Nothing here is fast; everything
//! here is the oracle that the CPU kernels, the CUDA kernels' host emulation and the protocol
//! vectors are checked against.

use crate::chain::ChainResult;
use crate::digest::Digest;
use crate::gemm::naive;
use crate::matrix::{Matrix, generate_a, generate_b};
use crate::memory::walk::{WalkSpec, WalkerTrace};
use crate::memory::{ENTRY_N, ENTRY_STEPS, PoolSpec};
use crate::mix::mix;
use crate::params::Work;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// `X_steps` of the chain on `key`'s streams `2*index` and `2*index + 1`, of size `n`.
pub fn chain_state(key: &[u8; 32], index: u64, n: usize, steps: u32) -> Matrix {
    let b = generate_b(key, index, n);
    let mut x = generate_a(key, index, n);
    for k in 0..steps {
        x = naive::step(&x, &b, k);
    }
    x
}

/// Chain `index` of `work` with all its checkpoints, one naive GEMM step at a time.
pub fn chain(work: &Work, index: u64) -> ChainResult {
    let b = generate_b(work.key(), index, work.n());
    let mut x = generate_a(work.key(), index, work.n());
    let mut checkpoints = vec![x.digest()];
    for k in 0..work.iterations() {
        x = naive::step(&x, &b, k);
        if (k + 1) % work.checkpoint_every() == 0 {
            checkpoints.push(x.digest());
        }
    }
    ChainResult { index, checkpoints }
}

/// Entry `entry` of a pool: `X_64` of the pool key's chain `entry` at n = 256.
pub fn pool_entry(spec: &PoolSpec, entry: u64) -> Matrix {
    chain_state(spec.key(), entry, ENTRY_N, ENTRY_STEPS)
}

/// One walk step, every value named as PROTOCOL.md 18.3 names it.
pub fn walk_step(entry: &Matrix, state: &Digest, t: u32) -> Digest {
    walk_step_under(b"gpu-attest v3 walk step", entry, state, t)
}

/// Version 4's walk step over a 64 KiB slice read as a 256 x 256 int8 matrix (PROTOCOL.md 20.4):
/// 18.3's step under the domain `"gpu-attest v4 walk step"`.
pub fn walk_step_v4(slice: &Matrix, state: &Digest, t: u32) -> Digest {
    walk_step_under(b"gpu-attest v4 walk step", slice, state, t)
}

/// 18.3's step, written out: `v` from ChaCha8 keyed by the state with each byte's lowest bit
/// set, `y = E * v` in wide integers, `z[r] = mix(y[r], t, r, 0)`, and the next state the hash
/// of the domain, the state and `z`.
fn walk_step_under(domain: &[u8], entry: &Matrix, state: &Digest, t: u32) -> Digest {
    assert_eq!(entry.n(), ENTRY_N);
    let mut keystream = [0u8; ENTRY_N];
    ChaCha8Rng::from_seed(state.0).fill_bytes(&mut keystream);
    let v: Vec<i64> = keystream.iter().map(|&b| i64::from((b | 1) as i8)).collect();
    let e = entry.as_slice();
    let mut z = Vec::with_capacity(ENTRY_N);
    for r in 0..ENTRY_N {
        let y: i64 = (0..ENTRY_N).map(|c| i64::from(e[r * ENTRY_N + c]) * v[c]).sum();
        z.push(mix(y as i32, t, r as u32, 0) as u8);
    }
    let mut input = domain.to_vec();
    input.extend_from_slice(state.as_bytes());
    input.extend_from_slice(&z);
    Digest::hash(&input)
}

/// Every entry of a pool, made naively (tests keep their pools to a few entries).
pub fn pool(spec: &PoolSpec) -> Vec<Matrix> {
    (0..spec.entries()).map(|e| pool_entry(spec, e)).collect()
}

/// Walker `walker`'s trace over `pool` (every entry of the walk's pool, in order).
pub fn walk(spec: &WalkSpec, pool: &[Matrix], walker: u32) -> WalkerTrace {
    let mut state = spec.start_state(walker);
    let mut checkpoints = vec![state];
    for t in 0..spec.params.walk_steps {
        let index = u64::from_le_bytes(state.0[..8].try_into().expect("8 bytes")) % pool.len() as u64;
        state = walk_step(&pool[index as usize], &state, t);
        if (t + 1).is_multiple_of(spec.params.walk_checkpoint_every) {
            checkpoints.push(state);
        }
    }
    WalkerTrace { walker, checkpoints }
}
