//! Sampled and full verification: an honest miner passes, and each way of cheating fails with
//! its own reason.

use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::commitment::{DeviceTree, WorkCommitment};
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::engine::{self, Execution};
use gpu_attest_shared::merkle::{MerkleTree, ProofError};
use gpu_attest_shared::opening::{ChainOpening, SampleRequest, draw_samples, open_chain};
use gpu_attest_shared::verify::{Rejection, VerifyError, check_commitment, verify_full, verify_opening};
use gpu_attest_shared::{CancelToken, ChallengeParams, Work};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

fn work() -> Work {
    Work::new(ChallengeParams {
        nonce: [7; 32],
        seed: [8; 32],
        miner_key: [9; 32],
        n: 64,
        num_chains: 6,
        iterations: 8,
        checkpoint_every: 2,
    })
    .unwrap()
}

fn backend() -> CpuBackend {
    CpuBackend::new(2, None).unwrap().with_logical_devices(2)
}

fn honest() -> Execution {
    engine::execute(&backend(), &work(), &|_| {}, &CancelToken::new()).unwrap()
}

/// The miner's side of an opening, from whatever (possibly dishonest) state it kept.
fn open(exec: &Execution, request: SampleRequest) -> ChainOpening {
    let checkpoints = &exec.chains[request.chain as usize].checkpoints;
    open_chain(
        &backend(),
        &work(),
        checkpoints,
        &exec.trees,
        request,
        &CancelToken::new(),
    )
    .unwrap()
}

fn verify(exec: &Execution, request: SampleRequest) -> Result<(), VerifyError> {
    let opening = open(exec, request);
    verify_opening(
        &backend(),
        &work(),
        &exec.commitment,
        request,
        &opening,
        &CancelToken::new(),
    )
}

fn rejected(result: Result<(), VerifyError>) -> Rejection {
    match result {
        Err(VerifyError::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn honest_commitment_passes_every_check() {
    let exec = honest();
    check_commitment(&work(), &exec.commitment).unwrap();
    for chain in 0..6 {
        for segment in 0..4 {
            verify(&exec, SampleRequest { chain, segment }).unwrap();
        }
    }
    verify_full(&backend(), &work(), &exec.commitment, &|_| {}, &CancelToken::new()).unwrap();
    // A validator with one device re-executes a two-device miner's work to the same G.
    let single = CpuBackend::new(1, None).unwrap();
    verify_full(&single, &work(), &exec.commitment, &|_| {}, &CancelToken::new()).unwrap();
}

#[test]
fn flipped_checkpoint_hash_fails_the_segments_around_it() {
    let mut chains = honest().chains;
    chains[1].checkpoints[2].0[0] ^= 1;
    // The cheat is committed consistently: leaf, root and G all cover the flipped hash.
    let exec = engine::commit(&work(), 2, chains).unwrap();
    check_commitment(&work(), &exec.commitment).unwrap();
    assert_eq!(
        rejected(verify(&exec, SampleRequest { chain: 1, segment: 1 })),
        Rejection::SegmentMismatch { chain: 1, segment: 1 }
    );
    assert_eq!(
        rejected(verify(&exec, SampleRequest { chain: 1, segment: 2 })),
        Rejection::OpenedMatrixMismatch { chain: 1, segment: 2 }
    );
    verify(&exec, SampleRequest { chain: 1, segment: 0 }).unwrap();
    let full = verify_full(&backend(), &work(), &exec.commitment, &|_| {}, &CancelToken::new());
    assert!(matches!(rejected(full), Rejection::ReexecutionMismatch { .. }));
}

#[test]
fn wrong_leaf_is_not_in_the_committed_root() {
    let mut exec = honest();
    // Device 0 holds chains 0..3; commit a garbage leaf for chain 2 in its tree.
    let mut leaves: Vec<Digest> = exec.chains[0..3].iter().map(ChainResult::leaf).collect();
    leaves[2] = Digest::hash(b"not the leaf of chain 2");
    exec.trees[0] = DeviceTree {
        slice: exec.trees[0].slice,
        tree: MerkleTree::new(&leaves),
    };
    exec.commitment = WorkCommitment::from_trees(exec.commitment.nonce, &exec.trees);
    check_commitment(&work(), &exec.commitment).unwrap();
    assert_eq!(
        rejected(verify(&exec, SampleRequest { chain: 2, segment: 0 })),
        Rejection::LeafNotCommitted {
            chain: 2,
            reason: ProofError::RootMismatch
        }
    );
}

#[test]
fn wrong_partition_is_rejected() {
    let exec = honest();
    let mut commitment = exec.commitment.clone();
    commitment.devices[0].slice.count = 2;
    commitment.devices[1].slice.offset = 2;
    commitment.devices[1].slice.count = 4;
    assert!(matches!(
        check_commitment(&work(), &commitment).unwrap_err(),
        Rejection::PartitionNotCanonical {
            index: 0,
            got_count: 2,
            want_count: 3,
            ..
        }
    ));
    commitment.devices.clear();
    assert_eq!(
        check_commitment(&work(), &commitment).unwrap_err(),
        Rejection::DeviceCount(0)
    );
}

#[test]
fn wrong_nonce_is_rejected() {
    let mut commitment = honest().commitment;
    commitment.nonce = [0xff; 32];
    assert!(matches!(
        check_commitment(&work(), &commitment).unwrap_err(),
        Rejection::NonceMismatch { .. }
    ));
}

#[test]
fn wrong_global_checksum_is_rejected() {
    let mut commitment = honest().commitment;
    commitment.global.0[31] ^= 0x80;
    assert!(matches!(
        check_commitment(&work(), &commitment).unwrap_err(),
        Rejection::GlobalChecksumMismatch { .. }
    ));
}

#[test]
fn chains_started_from_another_matrix_are_caught() {
    let exec = honest();
    let mut opening = open(&exec, SampleRequest { chain: 0, segment: 0 });
    opening.checkpoints[0] = Digest::hash(b"some other start");
    // Recommitting would be needed to pass the Merkle check; without it the leaf fails first.
    let err = verify_opening(
        &backend(),
        &work(),
        &exec.commitment,
        SampleRequest { chain: 0, segment: 0 },
        &opening,
        &CancelToken::new(),
    );
    assert!(matches!(rejected(err), Rejection::LeafNotCommitted { chain: 0, .. }));
}

#[test]
fn malformed_openings_are_rejected_not_panicked_on() {
    let exec = honest();
    let request = SampleRequest { chain: 3, segment: 1 };
    let good = open(&exec, request);
    let check =
        |o: &ChainOpening| verify_opening(&backend(), &work(), &exec.commitment, request, o, &CancelToken::new());

    let mut o = good.clone();
    o.segment = 2;
    assert!(matches!(rejected(check(&o)), Rejection::OpeningForWrongRequest { .. }));

    // A request outside the challenge, answered to the letter, is refused before any index is
    // taken from it (found by the chain_opening fuzz target: it panicked on the segment).
    let work = work();
    for (chain, segment) in [(3, work.segments()), (work.num_chains(), 1), (3, u32::MAX)] {
        let outside = SampleRequest { chain, segment };
        let mut o = good.clone();
        (o.chain, o.segment) = (chain, segment);
        let result = verify_opening(&backend(), &work, &exec.commitment, outside, &o, &CancelToken::new());
        assert!(
            matches!(rejected(result), Rejection::NoSuchSample { .. }),
            "chain {chain} segment {segment}"
        );
    }
    let mut o = good.clone();
    o.checkpoints.pop();
    assert_eq!(
        rejected(check(&o)),
        Rejection::CheckpointCount {
            chain: 3,
            got: 4,
            want: 5
        }
    );
    let mut o = good.clone();
    o.proof.siblings.push(Digest::default());
    assert!(matches!(
        rejected(check(&o)),
        Rejection::LeafNotCommitted {
            reason: ProofError::WrongLength { .. },
            ..
        }
    ));
    let mut o = good.clone();
    o.start = gpu_attest_shared::matrix::Matrix::zeros(128);
    assert_eq!(
        rejected(check(&o)),
        Rejection::OpenedMatrixSize {
            chain: 3,
            got: 128,
            want: 64
        }
    );
    let mut o = good;
    o.start.as_mut_slice()[5] ^= 1;
    assert_eq!(
        rejected(check(&o)),
        Rejection::OpenedMatrixMismatch { chain: 3, segment: 1 }
    );
}

/// A miner that computes only half the chains and commits garbage for the rest is caught by
/// sampling every chain once (s = M draws distinct chains).
#[test]
fn skipped_chains_are_caught_by_sampling() {
    let mut chains = honest().chains;
    for chain in chains.iter_mut().skip(3) {
        for h in chain.checkpoints.iter_mut().skip(1) {
            *h = Digest::hash(&h.0);
        }
    }
    let exec = engine::commit(&work(), 2, chains).unwrap();
    let mut rng = ChaCha20Rng::from_seed([42; 32]);
    let samples = draw_samples(&mut rng, &work(), 6);
    let failures: Vec<u64> = samples
        .iter()
        .filter(|s| verify(&exec, **s).is_err())
        .map(|s| s.chain)
        .collect();
    let mut failed = failures.clone();
    failed.sort();
    assert_eq!(failed, vec![3, 4, 5]);
}

#[test]
fn samples_are_distinct_chains_within_range() {
    let mut rng = ChaCha20Rng::from_seed([1; 32]);
    let samples = draw_samples(&mut rng, &work(), 6);
    let mut chains: Vec<u64> = samples.iter().map(|s| s.chain).collect();
    chains.sort();
    chains.dedup();
    assert_eq!(chains.len(), 6);
    assert!(samples.iter().all(|s| s.chain < 6 && s.segment < 4));
    // More samples than chains: chains repeat, pairs do not, and all are in range.
    let many = draw_samples(&mut rng, &work(), 20);
    assert_eq!(many.len(), 20);
    assert!(many.iter().all(|s| s.chain < 6 && s.segment < 4));
    let mut pairs = many.clone();
    pairs.sort();
    pairs.dedup();
    assert_eq!(pairs.len(), 20, "a pair was drawn twice: {many:?}");
    // Every one of the 6 x 4 pairs, and then repeats: the miner must answer those too.
    let all = draw_samples(&mut rng, &work(), 24);
    let mut distinct = all.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 24);
    assert_eq!(draw_samples(&mut rng, &work(), 30).len(), 30);
}
