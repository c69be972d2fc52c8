//! Property tests of the engine's invariants (proptest). Matrices stay at n = 64 and chains
//! short, so each case costs milliseconds; the properties do not depend on n.

use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::engine::{self, Execution};
use gpu_attest_shared::gemm::naive;
use gpu_attest_shared::matrix::{Matrix, generate};
use gpu_attest_shared::merkle::{MerkleTree, verify_proof};
use gpu_attest_shared::partition::{MAX_DEVICES, canonical_partition};
use gpu_attest_shared::{CancelToken, ChallengeParams, Work};
use proptest::prelude::*;
use std::collections::HashSet;

fn params(nonce: u8, chains: u64) -> ChallengeParams {
    ChallengeParams {
        nonce: [nonce; 32],
        seed: [0xa5; 32],
        miner_key: [0x3c; 32],
        n: 64,
        num_chains: chains,
        iterations: 4,
        checkpoint_every: 2,
    }
}

fn run(params: ChallengeParams, threads: usize, devices: u32) -> Execution {
    let backend = CpuBackend::new(threads, None).unwrap().with_logical_devices(devices);
    engine::execute(&backend, &Work::new(params).unwrap(), &|_| {}, &CancelToken::new()).unwrap()
}

fn leaves(chains: &[ChainResult]) -> Vec<Digest> {
    chains.iter().map(ChainResult::leaf).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The chains do not depend on how many devices or threads computed them, and the
    /// commitment for d devices is the same whether d devices ran the work or one device ran it
    /// and the commitment was assembled for d (what a validator re-executing does).
    #[test]
    fn results_independent_of_device_and_thread_count(
        nonce in any::<u8>(), chains in 1u64..12, devices in 1u32..6, threads in 1usize..4,
    ) {
        let reference = run(params(nonce, chains), 1, 1);
        let split = run(params(nonce, chains), threads, devices);
        prop_assert_eq!(&split.chains, &reference.chains);
        let work = Work::new(params(nonce, chains)).unwrap();
        let reassembled = engine::commit(&work, devices, reference.chains.clone()).unwrap();
        prop_assert_eq!(split.commitment, reassembled.commitment);
    }

    /// The partition covers 0..M exactly once, in order, sizes differing by at most one.
    #[test]
    fn partition_covers_every_chain_once(chains in 1u64..100_000, devices in 1u32..=MAX_DEVICES) {
        let p = canonical_partition(chains, devices).unwrap();
        prop_assert_eq!(p.len(), devices as usize);
        let mut next = 0;
        for (j, slice) in p.iter().enumerate() {
            prop_assert_eq!(slice.index, j as u32);
            prop_assert_eq!(slice.offset, next);
            next += slice.count;
        }
        prop_assert_eq!(next, chains);
        let (min, max) = (p.iter().map(|s| s.count).min().unwrap(), p.iter().map(|s| s.count).max().unwrap());
        prop_assert!(max - min <= 1);
    }

    /// Every proof verifies, and flipping any single bit of leaf, root or any sibling, or
    /// giving another index, makes it fail.
    #[test]
    fn merkle_proofs_verify_and_fail_on_any_flipped_bit(count in 1u64..40, pick in any::<u64>(), bit in 0usize..256) {
        let leaves: Vec<Digest> = (0..count).map(|i| Digest::hash(&i.to_le_bytes())).collect();
        let tree = MerkleTree::new(&leaves);
        let index = pick % count;
        let proof = tree.proof(index).unwrap();
        let root = tree.root();
        prop_assert!(verify_proof(&root, &leaves[index as usize], index, count, &proof).is_ok());

        let flip = |d: &Digest| { let mut d = *d; d.0[bit / 8] ^= 1 << (bit % 8); d };
        prop_assert!(verify_proof(&root, &flip(&leaves[index as usize]), index, count, &proof).is_err());
        prop_assert!(verify_proof(&flip(&root), &leaves[index as usize], index, count, &proof).is_err());
        for s in 0..proof.siblings.len() {
            let mut bad = proof.clone();
            bad.siblings[s] = flip(&bad.siblings[s]);
            prop_assert!(verify_proof(&root, &leaves[index as usize], index, count, &bad).is_err());
        }
        if count > 1 {
            let other = (index + 1) % count;
            prop_assert!(verify_proof(&root, &leaves[index as usize], other, count, &proof).is_err());
        }
    }
}

/// Changing any single parameter, or the miner key, changes every leaf (every chain's matrices
/// come from a key that binds all parameters).
#[test]
fn any_parameter_change_changes_every_leaf() {
    let base = params(1, 3);
    let base_leaves = leaves(&run(base, 2, 1).chains);
    let variants = [
        ("nonce", ChallengeParams { nonce: [2; 32], ..base }),
        (
            "seed",
            ChallengeParams {
                seed: [0xa6; 32],
                ..base
            },
        ),
        (
            "miner key",
            ChallengeParams {
                miner_key: [0x3d; 32],
                ..base
            },
        ),
        ("n", ChallengeParams { n: 128, ..base }),
        ("chain count", ChallengeParams { num_chains: 4, ..base }),
        ("iterations", ChallengeParams { iterations: 6, ..base }),
        (
            "checkpoint interval",
            ChallengeParams {
                checkpoint_every: 1,
                ..base
            },
        ),
    ];
    for (what, variant) in variants {
        let changed = leaves(&run(variant, 2, 1).chains);
        for (i, leaf) in base_leaves.iter().enumerate() {
            assert_ne!(changed[i], *leaf, "changing the {what} left leaf {i} unchanged");
        }
    }
}

#[test]
fn cancelled_work_stops_with_cancelled() {
    let backend = CpuBackend::new(1, None).unwrap();
    let cancel = CancelToken::new();
    cancel.cancel();
    let err = engine::execute(&backend, &Work::new(params(1, 2)).unwrap(), &|_| {}, &cancel).unwrap_err();
    assert_eq!(err.to_string(), "the work was cancelled");
}

/// The forgery that version 1 of the protocol allowed (PROTOCOL.md "Why the mix"): keyed by the
/// step alone, a matrix of equal rows stayed one through a step, so a chain restarted from it
/// cost a vector-matrix product a step. Keyed by place, one step from such a matrix (the zero
/// matrix, or any row repeated) has no two equal rows, and so does the step after it: every
/// later step is a full GEMM.
#[test]
fn a_matrix_of_equal_rows_does_not_stay_one() {
    let n = 64;
    let b = generate(&[7; 32], 1, n);
    let row: Vec<i8> = generate(&[7; 32], 2, n).as_slice()[..n].to_vec();
    for start in [vec![0i8; n * n], row.repeat(n)] {
        let mut x = Matrix::from_vec(n, start).unwrap();
        for step in 0..2 {
            x = naive::step(&x, &b, step);
            let rows: HashSet<&[i8]> = x.as_slice().chunks_exact(n).collect();
            assert_eq!(rows.len(), n, "step {step}: equal rows survived");
        }
    }
}

/// A pool of keystream entries for the walk properties: the walk reads any bytes the same way.
fn walk_pool(entries: usize) -> gpu_attest_shared::memory::pool::PoolBytes {
    gpu_attest_shared::memory::pool::PoolBytes::keystream(&[0x77; 32], entries).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// A walk's traces depend on nothing but its spec and the pool's bytes: not on the threads
    /// it ran on, nor on how the walkers were grouped (odd counts leave a group of one), and a
    /// walker alone walks as it does among others.
    #[test]
    fn walks_are_independent_of_threads_and_grouping(
        walkers in 1u32..6,
        segments in 1u32..4,
        entries in 1usize..6,
        seed in any::<u8>(),
    ) {
        use gpu_attest_shared::memory::MemoryParams;
        use gpu_attest_shared::memory::walk::{WalkSpec, walk_all, walk_one};
        let pool = walk_pool(entries);
        let spec = WalkSpec {
            nonce: [seed; 32],
            walk_seed: [seed ^ 0x5a; 32],
            device: u32::from(seed % 3),
            pool_root: Digest([seed; 32]),
            entries: entries as u64,
            params: MemoryParams {
                pool_permille: 1000,
                walkers,
                walk_steps: 2 * segments,
                walk_checkpoint_every: 2,
            },
        };
        let on = |threads: usize| {
            let pool_threads = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool_threads.install(|| walk_all(&pool, &spec, &CancelToken::new())).unwrap()
        };
        let (one, two) = (on(1), on(2));
        prop_assert_eq!(&one.traces, &two.traces);
        prop_assert_eq!(one.root(), two.root());
        for w in 0..walkers {
            let alone = walk_one(&pool, &spec, w, &CancelToken::new()).unwrap();
            prop_assert_eq!(&alone, &one.traces[w as usize]);
            prop_assert_eq!(alone.checkpoints.len(), segments as usize + 1);
        }
    }
}
