//! Known-answer vectors (PROTOCOL.md section 12), computed by the fast engine on every CPU kernel
//! and device count, and checked to appear verbatim in PROTOCOL.md.

use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::engine;
use gpu_attest_shared::gemm::KernelKind;
use gpu_attest_shared::identity::Identity;
use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::matrix::{generate_a, generate_b};
use gpu_attest_shared::merkle::empty_root;
use gpu_attest_shared::mix::mix;
use gpu_attest_shared::selftest;
use gpu_attest_shared::statement::{Challenge, DeviceInfo};
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
