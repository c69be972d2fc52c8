//! Fuzzing with proptest: arbitrary and mutated wire messages through every decoder and
//! verifier. Nothing may panic, and nothing altered may pass. CI runs the default case count;
//! `scripts/proptest-long.sh` runs many more. The coverage-guided fuzz targets
//! (`scripts/fuzz.sh`) share the entry points of `hostile`.

use crate::common;

use common::*;
use gpu_attest_integration_tests::hostile::{TARGETS, backend, check_any_walk_opening, honest, params};
use gpu_attest_proto::convert::{challenge_to_wire, opening_from_wire};
use gpu_attest_shared::commitment::{DeviceRoot, WorkCommitment};
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::opening::SampleRequest;
use gpu_attest_shared::partition::DeviceSlice;
use gpu_attest_shared::statement::Challenge;
use gpu_attest_shared::verify::{check_commitment, verify_opening};
use gpu_attest_shared::{CancelToken, ChallengeParams};
use proptest::prelude::*;

fn any_digest() -> impl Strategy<Value = Digest> {
    any::<[u8; 32]>().prop_map(Digest)
}

proptest! {
    /// Any bytes, read as every input the fuzz targets take: decoding and checking never panic.
    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        for (_, entry_point) in TARGETS {
            entry_point(&bytes);
        }
    }

    /// Walk openings of any shape (PROTOCOL.md 18.5): any walker, segment, checkpoints, proofs
    /// and entries of the right size or not. The check answers without panicking, and none
    /// passes against a walk and pool they were not made from.
    #[test]
    fn arbitrary_walk_openings_are_rejected(
        walker in any::<u32>().prop_map(|w| w % 5),
        segment in any::<u32>().prop_map(|q| q % 6),
        checkpoints in proptest::collection::vec(any_digest(), 0..8),
        proof in proptest::collection::vec(any_digest(), 0..4),
        entries in proptest::collection::vec((any::<u8>(), 0..3usize, proptest::collection::vec(any_digest(), 0..4)), 0..6),
    ) {
        use gpu_attest_shared::memory::check::{OpenedEntry, WalkOpening};
        use gpu_attest_shared::merkle::MerkleProof;
        let opening = WalkOpening {
            device: 0,
            walker,
            segment,
            checkpoints,
            proof: MerkleProof { siblings: proof },
            entries: entries
                .into_iter()
                .map(|(fill, size, siblings)| OpenedEntry {
                    bytes: vec![fill; [65536, 65535, 0][size]],
                    proof: MerkleProof { siblings },
                })
                .collect(),
        };
        prop_assert!(check_any_walk_opening(&opening).is_err());
    }

    /// Challenges with arbitrary fields reach the miner's acceptance checks and are refused
    /// without panicking; none passes without the validator's signature.
    #[test]
    fn arbitrary_challenges_are_refused(
        nonce in any::<[u8; 32]>(), n in any::<u32>(), chains in any::<u64>(), iterations in any::<u32>(),
        every in any::<u32>(), deadline in any::<u64>(), sig in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let core = miner_core(50, &[validator_key()], 1);
        let challenge = Challenge {
            finish_by_ms: None,
            params: ChallengeParams { nonce, seed: [0; 32], miner_key: core.public_key().0, n, num_chains: chains, iterations, checkpoint_every: every },
            issued_at_ms: 0,
            deadline_ms: deadline,
            validator_key: validator_key(),
            inventory_digest: cpu_claim(1).digest(),
        memory: None,
        };
        let mut wire = challenge_to_wire(&challenge, &[0; 64]);
        wire.signature = sig;
        // Decoded as the service decodes it; whatever survives decoding, the core refuses.
        let refused = match gpu_attest_proto::convert::challenge_from_wire(&wire) {
            Err(_) => true,
            Ok((decoded, signature)) => core.accept(decoded, &signature, gpu_attest_miner::core::now_ms()).is_err(),
        };
        prop_assert!(refused);
    }

    /// Random commitments (device counts past the limit, random slices and roots) are rejected.
    #[test]
    fn arbitrary_commitments_are_rejected(
        slices in proptest::collection::vec((any::<u32>(), any::<u64>(), any::<u64>(), any::<[u8; 32]>()), 0..70),
        global in any_digest(),
    ) {
        let devices = slices.into_iter().map(|(index, offset, count, root)| DeviceRoot {
            slice: DeviceSlice { index, offset, count }, root: Digest(root),
        }).collect();
        let commitment = WorkCommitment { nonce: params().nonce, devices, global };
        prop_assert!(check_commitment(&honest().0, &commitment).is_err());
    }

    /// A genuine opening with one thing changed never verifies, and never panics the verifier.
    #[test]
    fn mutated_openings_never_verify(
        field in 0usize..7, index in any::<usize>(), byte in any::<u8>(), chain in any::<u64>(), segment in any::<u32>(),
        extra in any_digest(),
    ) {
        let (work, exec, genuine) = honest();
        let request = SampleRequest { chain: genuine.chain, segment: genuine.segment };
        let mut o = genuine.clone();
        match field {
            0 => { let i = index % o.checkpoints.len(); o.checkpoints[i].0[index % 32] ^= byte | 1; }
            1 => { let i = index % o.proof.siblings.len(); o.proof.siblings[i].0[index % 32] ^= byte | 1; }
            2 => { let i = index % o.start.as_slice().len(); o.start.as_mut_slice()[i] ^= (byte | 1) as i8; }
            3 => { o.checkpoints.truncate(index % o.checkpoints.len()); }
            4 => { o.proof.siblings.push(extra); }
            5 => { o.chain = if chain == genuine.chain { chain ^ 1 } else { chain }; }
            _ => { o.segment = if segment == genuine.segment { segment ^ 1 } else { segment }; }
        }
        let result = verify_opening(backend(), work, &exec.commitment, request, &o, &CancelToken::new());
        prop_assert!(result.is_err(), "mutation {field} passed");
    }
}

#[test]
fn the_genuine_opening_verifies() {
    let (work, exec, genuine) = honest();
    let request = SampleRequest {
        chain: genuine.chain,
        segment: genuine.segment,
    };
    verify_opening(backend(), work, &exec.commitment, request, genuine, &CancelToken::new()).unwrap();
    // And its wire form survives the round trip.
    let wire = gpu_attest_proto::convert::opening_to_wire(&params().nonce, genuine, &[0; 64]);
    let (_, back, _) = opening_from_wire(&wire, 64).unwrap();
    assert_eq!(&back, genuine);
}

/// Version 4's genuine step opening (PROTOCOL.md 20.6) passes every check of 20.5 through its
/// wire form, and a change to any one of its fields fails: the checks the fuzz target reaches
/// can tell a genuine opening from a forged one.
#[test]
fn the_genuine_step_opening_checks_and_every_changed_field_fails() {
    use gpu_attest_integration_tests::hostile::honest_v4;
    use gpu_attest_proto::memory_v4::{step_opening_from_wire, step_opening_to_wire};
    use gpu_attest_shared::memory::slice_walk::{StepOpening, check_step};

    let v4 = honest_v4();
    let check = |o: &StepOpening| check_step(&v4.work, &v4.walk, &v4.pool, &v4.committed, o, &[0, 64, 127]);
    let (_, back, _) = step_opening_from_wire(&step_opening_to_wire(0, &v4.opening, &[0; 64])).unwrap();
    assert_eq!(back, v4.opening);
    check(&back).unwrap();
    type Change = fn(&mut StepOpening);
    let changes: [(&str, Change); 9] = [
        ("walker", |o| o.walker ^= 1),
        ("step", |o| o.step += 1),
        ("walker_root", |o| o.walker_root.0[0] ^= 1),
        ("start_proof", |o| o.start_proof.siblings[0].0[0] ^= 1),
        ("before", |o| o.before.0[0] ^= 1),
        ("after", |o| o.after.0[0] ^= 1),
        ("slice", |o| o.slice[100] ^= 1),
        ("slice_path", |o| o.slice_path.siblings[0][0] ^= 1),
        ("checkpoints", |o| o.checkpoints[0].0[0] ^= 1),
    ];
    for (field, change) in changes {
        let mut forged = v4.opening.clone();
        change(&mut forged);
        assert!(check(&forged).is_err(), "a changed {field} passed");
    }
}
