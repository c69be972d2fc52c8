//! Known-answer vectors (PROTOCOL.md section 12), computed by the fast engine on every CPU kernel
//! and device count, and checked to appear verbatim in PROTOCOL.md.

use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::engine;
use gpu_attest_shared::gemm::KernelKind;
use gpu_attest_shared::gemm::naive;
use gpu_attest_shared::identity::Identity;
use gpu_attest_shared::identity::PublicKey;
use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::matrix::{generate_a, generate_b};
use gpu_attest_shared::merkle::{MerkleTree, empty_root};
use gpu_attest_shared::mix::mix;
use gpu_attest_shared::opening::{ChainOpening, SampleRequest};
use gpu_attest_shared::selftest;
use gpu_attest_shared::statement::{Challenge, Commitment, DeviceInfo, open_request_bytes, opening_bytes};
use gpu_attest_shared::{CancelToken, ChallengeParams, Digest, Work};

const KEY: &str = "a71536a24a879fe95e09d580e7547ace15ba2ae8c1710d4b078abcceb30a4e36";
const A0_PREFIX: &str = "d6871ea5cae741e2bd086274e10518fb";
const B0_PREFIX: &str = "a80c344530341c939963c5744824eedf";
const A4_PREFIX: &str = "6dec128db9a05a5cf098a40c4990f0ef";
/// The vector's chain-0 checkpoints: the constant `miner selftest` checks its reference against,
/// so this test also proves that constant is PROTOCOL.md's and what every kernel computes.
const CHAIN0_CHECKPOINTS: [&str; 3] = selftest::VECTOR_CHAIN0_CHECKPOINTS;
const LEAVES: [&str; 5] = [
    "7666e6d5617f5633ef386bbd4129cd871b49fe4473332f2add1217b54f6b1e23",
    "957ce61c569e6ab81a6c5e738881bc93a0ebad3f3943a97821a1dd7973e81a26",
    "8d7ff5d9610d780f66805e986abb71bad331d78bd38c804365109b7cbdb9fe58",
    "2a5e647066e6da0b6c35171c926bf1e8170c9914de75ef7b1af7edd425fb9cda",
    "3336b22e71808c4a9cb9808b0b2c2cc0782bd2bd430331f5df075822467bba7d",
];
const EMPTY_ROOT: &str = "eb621929841d54d735e41bbdba1d8a377c7c734aec92ed68580c7873848f10fc";
/// (devices, device roots, G)
const COMMITMENTS: [(u32, &[&str], &str); 4] = [
    (
        1,
        &["6e43d2692aef4594623fc6714ab8da09ac6a322825727460469d6938b31a96ae"],
        "9881864a1c7668a790aa7541f274b0a3c077d9c798fd17eb7398a3f9b2e5161b",
    ),
    (
        2,
        &[
            "8412b3510411ebfdd6d15a7e2523448d9ff6dcdd102ddf95741500437b53d22d",
            "187f5cda2c92a8e855082b8c364ea6fac0a9a9875368f0c6adfaed69314e4ea6",
        ],
        "76547bb75d6d4ec35fc0bd58662be50656f1caf04a4a4b0dfb5c171d109c4c06",
    ),
    (
        3,
        &[],
        "90b9dd70843ad1d92bf32acd3f9a671587be8dc3f30738d84cf5a083c71d5a6f",
    ),
    (
        8,
        &[],
        "abe21e9be55b604772829088f62b6fb71da839e9070ded0407947b607c3f14ee",
    ),
];
const MIX: [(i32, u32, i8); 5] = [
    (0, 0, 0),
    (1, 0, 127),
    (-1, 7, -85),
    (123_456_789, 3, -81),
    (i32::MIN, u32::MAX, 46),
];

/// PROTOCOL.md section 12's challenge, as `miner selftest` runs it.
fn params() -> ChallengeParams {
    selftest::vector_params()
}

#[test]
fn key_and_matrices() {
    let work = Work::new(params()).unwrap();
    assert_eq!(hex::encode(work.key()), KEY);
    assert_eq!(hex::encode(&generate_a(work.key(), 0, 64).as_bytes()[..16]), A0_PREFIX);
    assert_eq!(hex::encode(&generate_b(work.key(), 0, 64).as_bytes()[..16]), B0_PREFIX);
    assert_eq!(hex::encode(&generate_a(work.key(), 4, 64).as_bytes()[..16]), A4_PREFIX);
    assert_eq!(empty_root().to_hex(), EMPTY_ROOT);
    for (y, k, want) in MIX {
        assert_eq!(mix(y, k), want, "mix({y}, {k})");
    }
}

#[test]
fn chains_and_commitments_on_every_kernel_and_device_count() {
    let work = Work::new(params()).unwrap();
    for kernel in KernelKind::ALL.into_iter().filter(|k| k.is_available()) {
        for (devices, roots, global) in COMMITMENTS {
            let backend = CpuBackend::new(2, Some(kernel)).unwrap().with_logical_devices(devices);
            let exec = engine::execute(&backend, &work, &|_| {}, &CancelToken::new()).unwrap();
            let checkpoints: Vec<String> = exec.chains[0].checkpoints.iter().map(|h| h.to_hex()).collect();
            assert_eq!(checkpoints, CHAIN0_CHECKPOINTS, "{kernel}");
            let leaves: Vec<String> = exec.chains.iter().map(|c| c.leaf().to_hex()).collect();
            assert_eq!(leaves, LEAVES, "{kernel}, d={devices}");
            for (device, root) in exec.commitment.devices.iter().zip(roots) {
                assert_eq!(
                    device.root.to_hex(),
                    *root,
                    "{kernel}, d={devices}, device {}",
                    device.slice.index
                );
            }
            assert_eq!(exec.commitment.global.to_hex(), global, "{kernel}, d={devices}");
        }
    }
}

#[test]
fn protocol_md_quotes_the_same_vectors() {
    let doc = include_str!("../../PROTOCOL.md");
    let mut quoted = vec![KEY, A0_PREFIX, B0_PREFIX, A4_PREFIX, EMPTY_ROOT];
    quoted.extend(CHAIN0_CHECKPOINTS);
    quoted.extend(LEAVES);
    for (_, roots, global) in COMMITMENTS {
        quoted.extend(roots.iter().copied());
        quoted.push(global);
    }
    for hex in quoted {
        assert!(doc.contains(hex), "PROTOCOL.md does not quote {hex}");
    }
    for (y, k, want) in MIX {
        assert!(
            doc.contains(&format!("mix({y}, {k}) = {want}")),
            "PROTOCOL.md lacks mix({y}, {k})"
        );
    }
}

/// The hardware claim of the statement vectors (PROTOCOL.md 13.5).
fn vector_claim() -> HardwareClaim {
    HardwareClaim {
        backend: "cuda".into(),
        kernel: "tensor".into(),
        devices: vec![DeviceInfo {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            memory_bytes: 80 << 30,
            sm_count: 132,
            compute_capability: (9, 0),
            pci_bus_id: "00000000:18:00.0".into(),
            driver_version: "570.86.15".into(),
        }],
    }
}

/// The challenge of the statement vectors, signed by the validator whose secret seed is
/// `80 81 .. 9f`.
fn vector_challenge() -> (Challenge, Identity) {
    let validator = Identity::from_seed(std::array::from_fn(|i| 0x80 + i as u8));
    let challenge = Challenge {
        params: params(),
        issued_at_ms: 1_700_000_000_000,
        deadline_ms: 1_700_000_060_000,
        validator_key: validator.public_key(),
        inventory_digest: vector_claim().digest(),
    };
    (challenge, validator)
}

const INVENTORY_DIGEST: &str = "c6e4efd4e0ed888751e3fe6860c16176de081873b88b35816426f01e35e0deca";
const VALIDATOR_KEY: &str = "cd14b37f956e953194ff7fb73b3d81dcc561d61a7538094b7c3e1a643ee5f3aa";
const CHALLENGE_BYTES_HASH: &str = "90cccc85f47f17a969c2aad2b2a9139257dad48e45ad20e427434d34a21a631e";
const CHALLENGE_SIGNATURE: &str = "d82e5512d1901aaec4b48273d362e999c3cfee7aabb8ab893ce5b8bfb1d1a58812d2cdc58a15cb6336c4136ed45b4c00e136173fc6351c851c54110d0770a60b";

#[test]
fn signed_statement_vectors() {
    let (challenge, validator) = vector_challenge();
    assert_eq!(vector_claim().digest().to_hex(), INVENTORY_DIGEST);
    assert_eq!(validator.public_key().to_hex(), VALIDATOR_KEY);
    let bytes = challenge.signing_bytes();
    assert_eq!(bytes.len(), 231);
    assert_eq!(Digest::hash(&bytes).to_hex(), CHALLENGE_BYTES_HASH);
    let signature = challenge.sign(&validator);
    assert_eq!(hex::encode(signature), CHALLENGE_SIGNATURE);
    challenge.verify(&signature).unwrap();
    let doc = include_str!("../../PROTOCOL.md");
    for hex in [
        INVENTORY_DIGEST,
        VALIDATOR_KEY,
        CHALLENGE_BYTES_HASH,
        CHALLENGE_SIGNATURE,
    ] {
        assert!(doc.contains(hex), "PROTOCOL.md does not quote {hex}");
    }
}

/// The section 12 challenge on one device (the portable kernel; every kernel gives the same, as
/// the test above checks): the Merkle proofs, the commitment statement and the opening of
/// PROTOCOL.md 12 and 13.7 are built from it.
fn vector_execution() -> engine::Execution {
    let work = Work::new(params()).unwrap();
    let backend = CpuBackend::new(1, Some(KernelKind::Portable)).unwrap();
    engine::execute(&backend, &work, &|_| {}, &CancelToken::new()).unwrap()
}

/// (chain, its proof's siblings bottom-up) in the d = 1 tree of section 12: chain 1 has a
/// sibling on every level, chain 4 (the odd one out) is promoted twice.
const PROOFS: [(u64, &[&str]); 2] = [
    (
        1,
        &[
            "1823e3ef8c0165dcd8dd0a80eaad317bccc8e3d59249e3de808a39afed7b9c2d",
            "9441f04a8525bafef523d54394849955fc3531cb8b2f03c81158cfe0e7ee341b",
            "03f09f2f866847e2756aa7460084ec30ece3089f7462467bfdf586894a55cb9f",
        ],
    ),
    (4, &["76309baf4070e81ac798213aa9dda272b450f5b3a5e4268384c27bc2388267c3"]),
];
/// Chain 1's checkpoint hashes; h_{1,1} is also the hash of the matrix its segment 1 opens.
const CHAIN1_CHECKPOINTS: [&str; 3] = [
    "40d2af108da90bc8ce93955076af6599e7df5174169bce71886fa80bf1cf6474",
    "7c38e62cc68e1b5ef403f627660e3778639c2599f4c10e1c7d479ee30d8b294e",
    "99cfaaffd055dca83e28e18fcd420f2de1337373e1d125d7fdd71a09d18be723",
];
/// (length, blake3) of the commitment statement (13.2): section 12's d = 1 commitment, the
/// 13.7 claim and validator, `compute_ms = 1234`.
const COMMITMENT_BYTES: (usize, &str) = (374, "7bf611873771e60310b555997c7763535f8924904e96e238eec93d94b1a7197d");
/// (length, blake3, the 13.7 validator's signature) of the open request (13.3) for chain 1
/// segment 1, then chain 4 segment 0.
const OPEN_REQUEST_BYTES: (usize, &str, &str) = (
    86,
    "80b6b65e0d141bec8e9660f647a2273b7d56aa5c5280dc0980ee0ae2bf3ef01e",
    "93c74b40d55e9433c61a289d12937e288416fdf0ebb15cecbcf990faa6ddcd08f509a76dbaca80aeb28946d44f26e43e7dfab98f840c319b012a14dd9e16610a",
);
/// (length, blake3) of the opening statement (13.4) for chain 1 segment 1.
const OPENING_BYTES: (usize, &str) = (297, "3dc798b35d261fb09f319ff197ee9a417d44974014fb425f2d032e7faa8e37de");

/// The vectors of the exchange's other statements: Merkle proofs, a commitment, an open request
/// and an opening, each computed here and quoted in PROTOCOL.md.
#[test]
fn proof_commitment_open_request_and_opening_vectors() {
    let exec = vector_execution();
    let leaves: Vec<Digest> = exec.chains.iter().map(|c| c.leaf()).collect();
    let tree = MerkleTree::new(&leaves);
    let hexes = |digests: &[Digest]| digests.iter().map(|d| d.to_hex()).collect::<Vec<_>>();
    for (chain, siblings) in PROOFS {
        assert_eq!(hexes(&tree.proof(chain).unwrap().siblings), siblings, "chain {chain}");
    }
    assert_eq!(hexes(&exec.chains[1].checkpoints), CHAIN1_CHECKPOINTS);

    let (_, validator) = vector_challenge();
    let commitment = Commitment {
        work: exec.commitment.clone(),
        miner_key: PublicKey(params().miner_key),
        validator_key: validator.public_key(),
        inventory: vector_claim().devices,
        backend: "cuda".into(),
        kernel: "tensor".into(),
        compute_ms: 1234,
    };
    let bytes = commitment.signing_bytes();
    assert_eq!((bytes.len(), Digest::hash(&bytes).to_hex().as_str()), COMMITMENT_BYTES);

    let samples = [
        SampleRequest { chain: 1, segment: 1 },
        SampleRequest { chain: 4, segment: 0 },
    ];
    let bytes = open_request_bytes(&params().nonce, &samples);
    let signature = hex::encode(validator.sign(&bytes));
    assert_eq!(
        (bytes.len(), Digest::hash(&bytes).to_hex().as_str(), signature.as_str()),
        OPEN_REQUEST_BYTES
    );

    let work = Work::new(params()).unwrap();
    let (mut x, b) = (generate_a(work.key(), 1, 64), generate_b(work.key(), 1, 64));
    for k in 0..2 {
        x = naive::step(&x, &b, k);
    }
    assert_eq!(
        x.digest().to_hex(),
        CHAIN1_CHECKPOINTS[1],
        "X_{{1,2}} hashes to h_{{1,1}}"
    );
    let opening = ChainOpening {
        chain: 1,
        segment: 1,
        checkpoints: exec.chains[1].checkpoints.clone(),
        proof: tree.proof(1).unwrap(),
        start: x,
    };
    let bytes = opening_bytes(&params().nonce, &opening);
    assert_eq!((bytes.len(), Digest::hash(&bytes).to_hex().as_str()), OPENING_BYTES);

    let doc = include_str!("../../PROTOCOL.md");
    let mut quoted: Vec<&str> = PROOFS.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    quoted.extend(CHAIN1_CHECKPOINTS);
    quoted.extend([
        COMMITMENT_BYTES.1,
        OPEN_REQUEST_BYTES.1,
        OPEN_REQUEST_BYTES.2,
        OPENING_BYTES.1,
    ]);
    for hex in quoted {
        assert!(doc.contains(hex), "PROTOCOL.md does not quote {hex}");
    }
}
