//! Fuzzing with proptest: arbitrary and mutated wire messages through every decoder and
//! verifier. Nothing may panic, and nothing altered may pass. CI runs the default case count;
//! a longer run: `PROPTEST_CASES=200000 cargo test --release -p gpu-attest-integration-tests
//! --test hostile_inputs`.

mod common;

use common::*;
use gpu_attest_proto::convert::{
    challenge_from_wire, challenge_to_wire, commitment_from_wire, open_request_from_wire, opening_from_wire,
    walk_opening_from_wire, walk_request_from_wire, walk_statement_from_wire,
};
use gpu_attest_proto::v1;
use gpu_attest_shared::commitment::{DeviceRoot, WorkCommitment};
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::engine::{self, Execution};
use gpu_attest_shared::identity::Identity;
use gpu_attest_shared::opening::{ChainOpening, SampleRequest, open_chain};
use gpu_attest_shared::partition::DeviceSlice;
use gpu_attest_shared::statement::Challenge;
use gpu_attest_shared::verify::{check_commitment, verify_opening};
use gpu_attest_shared::{CancelToken, ChallengeParams, Work};
use proptest::prelude::*;
use prost::Message;
use std::sync::OnceLock;

fn params() -> ChallengeParams {
    ChallengeParams {
        nonce: [1; 32],
        seed: [2; 32],
        miner_key: Identity::from_seed([50; 32]).public_key().0,
        n: 64,
        num_chains: 5,
        iterations: 4,
        checkpoint_every: 2,
    }
}

fn backend() -> &'static CpuBackend {
    static B: OnceLock<CpuBackend> = OnceLock::new();
    B.get_or_init(|| CpuBackend::new(1, None).unwrap().with_logical_devices(2))
}

/// One honest execution and a genuine opening, computed once.
fn honest() -> &'static (Work, Execution, ChainOpening) {
    static H: OnceLock<(Work, Execution, ChainOpening)> = OnceLock::new();
    H.get_or_init(|| {
        let work = Work::new(params()).unwrap();
        let exec = engine::execute(backend(), &work, &|_| {}, &CancelToken::new()).unwrap();
        let request = SampleRequest { chain: 3, segment: 1 };
        let opening = open_chain(
            backend(),
            &work,
            &exec.chains[3].checkpoints,
            &exec.trees,
            request,
            &CancelToken::new(),
        )
        .unwrap();
        (work, exec, opening)
    })
}

/// Checks a decoded walk opening of any shape against a small walk (PROTOCOL.md 18.7's sizes):
/// whatever it holds, the check answers, without panicking.
fn check_any_walk_opening(
    opening: &gpu_attest_shared::memory::check::WalkOpening,
) -> Result<(), gpu_attest_shared::memory::check::WalkCheckError> {
    use gpu_attest_shared::memory::walk::WalkSpec;
    use gpu_attest_shared::memory::{MemoryParams, PoolSpec};
    let pool = PoolSpec::with_entries(&honest().0, 0, 4);
    let walk = WalkSpec {
        nonce: [1; 32],
        walk_seed: [2; 32],
        device: 0,
        pool_root: Digest([3; 32]),
        entries: 4,
        params: MemoryParams {
            pool_permille: 1000,
            walkers: 3,
            walk_steps: 16,
            walk_checkpoint_every: 4,
        },
    };
    let is_made =
        |entry: u64, bytes: &[u8]| gpu_attest_shared::memory::pool::entry_rows_match(&pool, entry, bytes, &[0, 255]);
    gpu_attest_shared::memory::check::check_segment(
        &walk,
        &pool,
        &Digest([4; 32]),
        (opening.walker, opening.segment),
        opening,
        &is_made,
    )
}

fn any_digest() -> impl Strategy<Value = Digest> {
    any::<[u8; 32]>().prop_map(Digest)
}

proptest! {
    /// Any bytes: decoding and conversion never panic.
    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(c) = v1::Challenge::decode(bytes.as_slice())
            && let Ok((challenge, sig)) = challenge_from_wire(&c)
        {
            let _ = challenge.verify(&sig);
            let _ = Work::new(challenge.params);
        }
        if let Ok(c) = v1::Commitment::decode(bytes.as_slice())
            && let Ok((commitment, sig)) = commitment_from_wire(&c)
        {
            let _ = commitment.verify(&sig);
            let _ = check_commitment(&honest().0, &commitment.work);
            if let Ok(Some(evidence)) = gpu_attest_proto::evidence::evidence_from_wire(&c.evidence, &c.evidence_signature) {
                for device in &evidence.devices {
                    let _ = gpu_attest_shared::evidence::check_device_evidence(
                        device,
                        &[0; 32],
                        "NVIDIA H100 80GB HBM3",
                        &gpu_attest_shared::evidence::EvidenceTrust::nvidia(Default::default()),
                        1_764_000_000,
                    );
                }
            }
        }
        if let Ok(o) = v1::ChainOpening::decode(bytes.as_slice()) {
            let _ = opening_from_wire(&o, 64);
            if let Some(walk) = &o.walk
                && let Ok((_, opening, _)) = walk_opening_from_wire(walk)
            {
                let _ = check_any_walk_opening(&opening);
            }
        }
        if let Ok(r) = v1::OpenChainsRequest::decode(bytes.as_slice()) {
            let _ = open_request_from_wire(&r);
        }
        if let Ok(w) = v1::WalkStatement::decode(bytes.as_slice())
            && let Ok((statement, sig)) = walk_statement_from_wire(&w)
        {
            let _ = statement.miner_key.verify(&statement.signing_bytes(), &sig);
        }
        if let Ok(r) = v1::WalkRequest::decode(bytes.as_slice()) {
            let _ = walk_request_from_wire(&r);
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
