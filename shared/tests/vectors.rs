//! Known-answer vectors (PROTOCOL.md section 12), computed by the fast engine on every CPU kernel
//! and device count, and checked to appear verbatim in PROTOCOL.md.

use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::engine;
use gpu_attest_shared::gemm::{CpuGemm, KernelKind};
use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::keys::KeyPair;
use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::matrix::{generate_a, generate_b};
use gpu_attest_shared::memory::check::open_segment;
use gpu_attest_shared::memory::pool::HostPool;
use gpu_attest_shared::memory::walk::{DeviceWalk, WalkSpec, walk_all};
use gpu_attest_shared::memory::{MemoryParams, PoolSpec};
use gpu_attest_shared::merkle::{MerkleTree, empty_root};
use gpu_attest_shared::mix::mix;
use gpu_attest_shared::opening::{ChainOpening, SampleRequest};
use gpu_attest_shared::reference;
use gpu_attest_shared::statement::memory_v3::{
    PoolCommitment, WalkSample, WalkStatement, open_request_bytes_v3, walk_opening_bytes, walk_request_bytes,
};
use gpu_attest_shared::statement::{Challenge, Commitment, DeviceInfo, MemoryPhase, open_request_bytes, opening_bytes};
use gpu_attest_shared::vectors;
use gpu_attest_shared::{CancelToken, ChallengeParams, Digest, Work};

const KEY: &str = "a71536a24a879fe95e09d580e7547ace15ba2ae8c1710d4b078abcceb30a4e36";
const A0_PREFIX: &str = "d6871ea5cae741e2bd086274e10518fb";
const B0_PREFIX: &str = "a80c344530341c939963c5744824eedf";
const A4_PREFIX: &str = "6dec128db9a05a5cf098a40c4990f0ef";
/// The vector's chain-0 checkpoints: the constant `miner selftest` checks its reference against,
/// so this test also proves that constant is PROTOCOL.md's and what every kernel computes.
const CHAIN0_CHECKPOINTS: [&str; 3] = vectors::VECTOR_CHAIN0_CHECKPOINTS;
const LEAVES: [&str; 5] = [
    "6fceac3428e7b5076287c8d4663f3e52ce037c63f4212bae8430afef362a3a5b",
    "617fd794976182f2ddc8db2130154b6e04973683d921586090167cfd45177b9e",
    "53a8833fc34b61dcd599d1b2bf0f2d78b3139030d6bf835052c03bce47c65d60",
    "6dea098206928f1eb9786606c6b9e49b031b8609fd41b6a835082c4b359f06fc",
    "eeb2309a9ce2fbc5885d1ad8ee23f5d3cd4583edd1a8e2f4c5c7b25167374a95",
];
const EMPTY_ROOT: &str = "eb621929841d54d735e41bbdba1d8a377c7c734aec92ed68580c7873848f10fc";
/// (devices, device roots, G)
const COMMITMENTS: [(u32, &[&str], &str); 4] = [
    (
        1,
        &["bcd2ca31d3befd688a8c77de2ac4e3ed785245f3e77956ea562ffcd947b03682"],
        "b284bb585883050dfdaae0e26e6a53799feb31861d717ea52e49872bffcb1799",
    ),
    (
        2,
        &[
            "a9c8870be6a9ddaa97fecb4f162fdfe0078d151a840d66a259a0de9c942c227e",
            "6d6b5bdc12f0f3d7f0396103643cd00d039a3c41e7a67813a9f6075a5d922f20",
        ],
        "18f70abe478ae5a62e5604a35a13dab467d443e73a1802764601bfef7d103e3b",
    ),
    (
        3,
        &[],
        "15152058f365ef5aa88d51b439b512f90c04877a3543e7197a3a4b01ca0e8ca0",
    ),
    (
        8,
        &[],
        "cadd8def488f0e93c72a5fc342d1f5947581eb9cd4997a7bf7fbe66f4e51ae74",
    ),
];
/// (y, k, row, col, mix(y, k, row, col)): the same product value at neighbouring places mixes
/// to unrelated bytes.
const MIX: [(i32, u32, u32, u32, i8); 7] = [
    (0, 0, 0, 0, 0),
    (1, 0, 0, 0, 127),
    (-1, 7, 0, 0, -85),
    (-1, 7, 0, 1, -60),
    (-1, 7, 1, 0, -120),
    (123_456_789, 3, 5, 9, -16),
    (i32::MIN, u32::MAX, 8191, 8191, 90),
];

/// PROTOCOL.md section 12's challenge, as `miner selftest` runs it.
fn params() -> ChallengeParams {
    vectors::vector_params()
}

#[test]
fn key_and_matrices() {
    let work = Work::new(params()).unwrap();
    assert_eq!(hex::encode(work.key()), KEY);
    assert_eq!(hex::encode(&generate_a(work.key(), 0, 64).as_bytes()[..16]), A0_PREFIX);
    assert_eq!(hex::encode(&generate_b(work.key(), 0, 64).as_bytes()[..16]), B0_PREFIX);
    assert_eq!(hex::encode(&generate_a(work.key(), 4, 64).as_bytes()[..16]), A4_PREFIX);
    assert_eq!(empty_root().to_hex(), EMPTY_ROOT);
    for (y, k, row, col, want) in MIX {
        assert_eq!(mix(y, k, row, col), want, "mix({y}, {k}, {row}, {col})");
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
    for (y, k, row, col, want) in MIX {
        assert!(
            doc.contains(&format!("mix({y}, {k}, {row}, {col}) = {want}")),
            "PROTOCOL.md lacks mix({y}, {k}, {row}, {col})"
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
fn vector_challenge() -> (Challenge, KeyPair) {
    let validator = KeyPair::from_seed(std::array::from_fn(|i| 0x80 + i as u8));
    let challenge = Challenge {
        params: params(),
        issued_at_ms: 1_700_000_000_000,
        deadline_ms: 1_700_000_060_000,
        validator_key: validator.public_key(),
        inventory_digest: vector_claim().digest(),
        memory: None,
        finish_by_ms: None,
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

/// The challenge of 13.7 with a finish-by time (PROTOCOL.md 13.1), as version 2 and as version 3:
/// its statement is the one without, under the domain with " with finish-by", then the time.
#[test]
fn finish_by_statement_vectors() {
    let (challenge, validator) = vector_challenge();
    let signed = |c: &Challenge| {
        let bytes = c.signing_bytes();
        let signature = c.sign(&validator);
        c.verify(&signature).unwrap();
        (bytes.len(), Digest::hash(&bytes).to_hex(), hex::encode(signature))
    };
    let v2 = Challenge {
        finish_by_ms: Some(1_700_000_120_000),
        ..challenge.clone()
    };
    let v3 = Challenge {
        memory: Some(MemoryPhase::V3(vector_memory_params())),
        ..v2.clone()
    };
    let owned = |(len, hash, sig): (usize, &str, &str)| (len, hash.to_string(), sig.to_string());
    assert_eq!(signed(&v2), owned(FINISH_BY_CHALLENGE));
    assert_eq!(signed(&v3), owned(FINISH_BY_V3_CHALLENGE));
    // The same fields, another domain, the time last.
    let bytes = v2.signing_bytes();
    let without = challenge.signing_bytes();
    assert!(bytes.starts_with(b"gpu-attest v1 challenge with finish-by"));
    assert_eq!(&bytes[bytes.len() - 8..], &1_700_000_120_000u64.to_le_bytes());
    assert_eq!(&bytes[38..bytes.len() - 8], &without[23..]);
    let bytes = v3.signing_bytes();
    let without = Challenge {
        finish_by_ms: None,
        ..v3.clone()
    }
    .signing_bytes();
    assert!(bytes.starts_with(b"gpu-attest v3 challenge with finish-by"));
    assert_eq!(&bytes[bytes.len() - 8..], &1_700_000_120_000u64.to_le_bytes());
    assert_eq!(&bytes[38..bytes.len() - 8], &without[23..]);
    // A signature over one time does not verify over another, nor without one.
    let signature = v2.sign(&validator);
    let moved = Challenge {
        finish_by_ms: Some(1_700_000_180_000),
        ..v2.clone()
    };
    assert!(moved.verify(&signature).is_err());
    assert!(challenge.verify(&signature).is_err());
    let doc = include_str!("../../PROTOCOL.md");
    for hex in [
        FINISH_BY_CHALLENGE.1,
        FINISH_BY_CHALLENGE.2,
        FINISH_BY_V3_CHALLENGE.1,
        FINISH_BY_V3_CHALLENGE.2,
    ] {
        assert!(doc.contains(hex), "PROTOCOL.md section 13.7 does not quote {hex}");
    }
}

/// (length, blake3, the 13.7 validator's signature) of 13.7's challenge with
/// `finish_by_unix_ms = 1700000120000`, without and with 18.7's memory phase.
const FINISH_BY_CHALLENGE: (usize, &str, &str) = (
    254,
    "57d66c9f57a4f0c6d738cb6772bbaa01e005f4d182515e3acf26cb81f1d3739d",
    "ea7e88b919f618c8275ae3debf96200621acafffad20447af3ecbbd39aa7c36ed3a24bf9ef13aa68d0a539eec91d3033501dc42422da109b85c55600a7855902",
);
const FINISH_BY_V3_CHALLENGE: (usize, &str, &str) = (
    270,
    "a93cc16402f335a0ff66f0028fbaffc6e00fccb0b1814cbf43670d23083810d8",
    "6dfd3c170a810d14423657df7aca427edd529bd1133949a9ce2cdfdb6a2299c6bae55b4e80318b2daa8d61d7f6ff2873feefc01d2bfed850a775987dd9bafc0d",
);

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
            "c72606f95e37a50eb234848d8f6bf0c3669b66345ae380d8bfde7357b59a913e",
            "aeb2d1d81d42bae7b01f77c905db37357c76a3e1c79922815bc7be3d1ccafdd7",
            "10fc0a34e4e9d1acf5afb95606e7cf376271dc592e493e2f6e4a5bca9641907b",
        ],
    ),
    (4, &["6e64192ccc9801bef9145cb20c3382e9e9c49c05dc7de9c08f40ab0e08382dd4"]),
];
/// Chain 1's checkpoint hashes; h_{1,1} is also the hash of the matrix its segment 1 opens.
const CHAIN1_CHECKPOINTS: [&str; 3] = [
    "40d2af108da90bc8ce93955076af6599e7df5174169bce71886fa80bf1cf6474",
    "95bcc234284947d24248d21497e7ae736396b5a5e346e4e8b930137d4e71e7ca",
    "5c778504af278d930d583588b3d5545b969b178c5af891c7c3a8b3617d0d18f4",
];
/// (length, blake3) of the commitment statement (13.2): section 12's d = 1 commitment, the
/// 13.7 claim and validator, `compute_ms = 1234`.
const COMMITMENT_BYTES: (usize, &str) = (374, "8e1e182b58ff55b84faa9a67892e4e0d1d0714c858099cf6b1849c7c8b0f7f60");
/// (length, blake3, the 13.7 validator's signature) of the open request (13.3) for chain 1
/// segment 1, then chain 4 segment 0.
const OPEN_REQUEST_BYTES: (usize, &str, &str) = (
    86,
    "80b6b65e0d141bec8e9660f647a2273b7d56aa5c5280dc0980ee0ae2bf3ef01e",
    "93c74b40d55e9433c61a289d12937e288416fdf0ebb15cecbcf990faa6ddcd08f509a76dbaca80aeb28946d44f26e43e7dfab98f840c319b012a14dd9e16610a",
);
/// (length, blake3) of the opening statement (13.4) for chain 1 segment 1.
const OPENING_BYTES: (usize, &str) = (297, "ef0cd55458b2b1e8b478eb4e3b52b56e133636f45eefea794a426faa82539386");

/// The commitment statement of 13.7: section 12's d = 1 commitment, the 13.7 claim and
/// validator, `compute_ms = 1234`.
fn vector_commitment(exec: &engine::Execution) -> Commitment {
    Commitment {
        work: exec.commitment.clone(),
        miner_key: PublicKey(params().miner_key),
        validator_key: vector_challenge().1.public_key(),
        inventory: vector_claim().devices,
        backend: "cuda".into(),
        kernel: "tensor".into(),
        compute_ms: 1234,
        pools: None,
    }
}

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
    let commitment = vector_commitment(&exec);
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
    let x = reference::chain_state(work.key(), 1, 64, 2);
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

/// The pool of PROTOCOL.md 18.7: device 0 of section 12's challenge, 4 entries.
fn vector_pool_spec() -> PoolSpec {
    PoolSpec::new(&Work::new(params()).unwrap(), 0, 4 * 65536, 1000).unwrap()
}

/// The memory parameters of PROTOCOL.md 18.7.
fn vector_memory_params() -> MemoryParams {
    MemoryParams {
        pool_permille: 1000,
        walkers: 3,
        walk_steps: 16,
        walk_checkpoint_every: 4,
    }
}

/// 18.7's pool filled on `kernel`, its walk spec (walk seed `60 61 .. 7f`) and its walk.
fn vector_memory(kernel: Option<KernelKind>) -> (HostPool, WalkSpec, DeviceWalk) {
    let spec = vector_pool_spec();
    let gemm = CpuGemm::new(2, kernel).unwrap();
    let pool = HostPool::fill(&gemm, &spec, &|_| {}, &CancelToken::new()).unwrap();
    let walk_spec = WalkSpec {
        nonce: params().nonce,
        walk_seed: core::array::from_fn(|i| 0x60 + i as u8),
        device: 0,
        pool_root: pool.root(),
        entries: spec.entries(),
        params: vector_memory_params(),
    };
    let walk = walk_all(&pool, &walk_spec, &CancelToken::new()).unwrap();
    (pool, walk_spec, walk)
}

/// PROTOCOL.md 18.7, from the fast engine (every CPU kernel fills the pool) and quoted by the
/// document. The naive oracle's agreement is `tests/memory.rs`'s.
#[test]
fn memory_phase_vectors() {
    const POOL_KEY: &str = "22e57c94e827e544ef4561787f6ba5bd766ca1b73d1c2cadf939ca37c8501d22";
    const ENTRY0_PREFIX: &str = "f9e012033f4943635a20235f9d831a30";
    const POOL_ROOT: &str = "8d843dcfc38ab08aca3091330bea95095b4b72e2abcbfe911e06c8090e644338";
    const WALKER0: [&str; 5] = [
        "c6a9c0e0d09b09b3fb6fd9a21207bd71e6890899e868418a09d2ebe3f5c68d2d",
        "3a27f35332d95218d43841b8832d0370aabb744aa77168b7528db060998e751a",
        "f3735a041258bd614b760466fb0dfbe175b3987c05a573d79b42aff65ded7ceb",
        "fe53444cf0eff42d93de04385dacd93a47e4c64bbdda3cc08536eca714064e65",
        "8eb3f97624b39a47d28644dcd9a4a4726f18073a9f5c32e259651f56f41514be",
    ];
    const WALK_LEAVES: [&str; 3] = [
        "e71309d85edd3a454402a5df3be04439eeebb4e5ce0f70a21bb0027fe5bb35cd",
        "cf6ecd7e2a837aa74e83cfeda57710daabc34328b41d9237edd5a8098b6dd256",
        "4813d955befff25f29ef5b530305ac77d3c4eff1d2aae3c4838b3c4c04d00fca",
    ];
    const WALK_ROOT: &str = "ba1a63cf0d9980cc343a5bfe803cca6a98cfacc921680b96d7cf6d978a8584f9";

    let spec = vector_pool_spec();
    assert_eq!(hex::encode(spec.key()), POOL_KEY);
    for kernel in KernelKind::ALL.into_iter().filter(|k| k.is_available()) {
        let (pool, walk_spec, walk) = vector_memory(Some(kernel));
        assert_eq!(hex::encode(&pool.entry_bytes(0)[..16]), ENTRY0_PREFIX, "{kernel}");
        assert_eq!(pool.root().to_hex(), POOL_ROOT, "{kernel}");
        assert_eq!(walk_spec.pool_root, pool.root());
        let walker0: Vec<String> = walk.traces[0].checkpoints.iter().map(Digest::to_hex).collect();
        assert_eq!(walker0, WALKER0, "{kernel}");
        let leaves: Vec<String> = walk.traces.iter().map(|t| t.leaf().to_hex()).collect();
        assert_eq!(leaves, WALK_LEAVES, "{kernel}");
        assert_eq!(walk.root().to_hex(), WALK_ROOT, "{kernel}");
    }
    let doc = include_str!("../../PROTOCOL.md");
    for hex in [POOL_KEY, ENTRY0_PREFIX, POOL_ROOT, WALK_ROOT]
        .into_iter()
        .chain(WALKER0)
        .chain(WALK_LEAVES)
    {
        assert!(doc.contains(hex), "PROTOCOL.md section 18.7 does not quote {hex}");
    }
}

/// The memory phase's statements (PROTOCOL.md 18.4), from 13.7's and 18.7's values: the
/// version 3 challenge, commitment and open request, the walk request and statement, and the
/// walk opening of walker 1, segment 2.
#[test]
fn memory_statement_vectors() {
    let (challenge, validator) = vector_challenge();
    let (pool, walk_spec, walk) = vector_memory(None);
    let hash = |bytes: &[u8]| (bytes.len(), Digest::hash(bytes).to_hex());
    let signed = |bytes: &[u8]| {
        (
            bytes.len(),
            Digest::hash(bytes).to_hex(),
            hex::encode(validator.sign(bytes)),
        )
    };

    let v3_challenge = Challenge {
        memory: Some(MemoryPhase::V3(vector_memory_params())),
        ..challenge.clone()
    };
    let got_challenge = signed(&v3_challenge.signing_bytes());
    let pools = [PoolCommitment {
        device: 0,
        entries: 4,
        root: pool.root(),
    }];
    let v3_commitment = Commitment {
        pools: Some(pools.to_vec()),
        ..vector_commitment(&vector_execution())
    };
    let got_commitment = hash(&v3_commitment.signing_bytes());
    let got_walk_request = signed(&walk_request_bytes(
        &params().nonce,
        &walk_spec.walk_seed,
        1_700_000_062_000,
    ));
    let statement = WalkStatement {
        nonce: params().nonce,
        miner_key: PublicKey(params().miner_key),
        validator_key: validator.public_key(),
        walk_seed: walk_spec.walk_seed,
        roots: vec![(0, walk.root())],
        walk_ms: 56,
    };
    let got_walk_statement = hash(&statement.signing_bytes());
    let chains = [
        SampleRequest { chain: 1, segment: 1 },
        SampleRequest { chain: 4, segment: 0 },
    ];
    let walks = [WalkSample {
        device: 0,
        walker: 1,
        segment: 2,
    }];
    let got_open_request = signed(&open_request_bytes_v3(&params().nonce, &chains, &walks));
    let opening = open_segment(&pool, &walk, &walk_spec, 1, 2).unwrap().unwrap();
    let got_walk_opening = hash(&walk_opening_bytes(&params().nonce, &opening));
    let owned = |(len, hash): (usize, &str)| (len, hash.to_string());
    let owned_signed = |(len, hash, sig): (usize, &str, &str)| (len, hash.to_string(), sig.to_string());
    assert_eq!(got_challenge, owned_signed(V3_CHALLENGE));
    assert_eq!(got_commitment, owned(V3_COMMITMENT));
    assert_eq!(got_walk_request, owned_signed(WALK_REQUEST));
    assert_eq!(got_walk_statement, owned(WALK_STATEMENT));
    assert_eq!(got_open_request, owned_signed(V3_OPEN_REQUEST));
    assert_eq!(got_walk_opening, owned(WALK_OPENING));
    let doc = include_str!("../../PROTOCOL.md");
    for hex in [
        V3_CHALLENGE.1,
        V3_CHALLENGE.2,
        V3_COMMITMENT.1,
        WALK_REQUEST.1,
        WALK_REQUEST.2,
        WALK_STATEMENT.1,
        V3_OPEN_REQUEST.1,
        V3_OPEN_REQUEST.2,
        WALK_OPENING.1,
    ] {
        assert!(doc.contains(hex), "PROTOCOL.md section 18.7 does not quote {hex}");
    }
}

/// (length, blake3[, the 13.7 validator's signature]) of the memory phase's statements.
const V3_CHALLENGE: (usize, &str, &str) = (
    247,
    "3797aa1b04ee294e4ec3ba4be3b6e199672cd993d83f658aee21e7d2f61dd4f8",
    "e4df94c1a5cdb0de735c95ec51d5601df35e7c2292cb23006c0494db5508d89fa94c2642e49d087aed542f81c3cfc43814f88cb79093d6ff366ce45aeae09807",
);
const V3_COMMITMENT: (usize, &str) = (422, "2173131486762ec98b6c5abcfa16290bce08b92cb245631a4181131ceaffa080");
const WALK_REQUEST: (usize, &str, &str) = (
    98,
    "88a65647a8d36bf24cac10f2ca5b65e5699193831e156e5241bbbabd5e19b9cf",
    "4f4b7444e6193de505547df7ef44fc6c4c123f8e2fc0e40c84994261541443a813a47e6817d48ce85551f848c141c23b435bf11d6fe61bb6359d35041cdd7906",
);
const WALK_STATEMENT: (usize, &str) = (204, "4c1af8828aab847dc9f1ce57d5cc5012e464583d54325b333ee434e9e42835ef");
const V3_OPEN_REQUEST: (usize, &str, &str) = (
    102,
    "77f73b40373fd9cbbe1e3a4fc2e4938c5c7ba75ea332bb16c008cda64dedab6b",
    "6daa9174050cf92b5b8be244e17e4afa2b11c0b98bd1af62f40b2bf849e3b47e07fa5619d733f0900fbe892a0a4c948bb03a25edf4ae55fd8c4fd1d234fbb508",
);
const WALK_OPENING: (usize, &str) = (706, "9e8a6ec4b281008705c9a454926cd4eb761c14d2dec40e7037c82e36174a9fe2");
