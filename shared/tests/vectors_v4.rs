//! Known-answer vectors of version 4's memory proof (PROTOCOL.md 20.6 and 20.7): the pool chains' final
//! states, a slice's path, one state row, the walk and one opened step. The chains come from the
//! fast engine and are checked against the naive reference; every value is checked to appear
//! verbatim in PROTOCOL.md.

use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::engine;
use gpu_attest_shared::memory::chain_pool::{ChainPool, state_row};
use gpu_attest_shared::memory::slice::slice_path;
use gpu_attest_shared::memory::slice_walk::{
    DeviceCommitments, HeldStates, SliceSource, SliceWalk, check_step, open_step, walk_device, walker_states,
};
use gpu_attest_shared::merkle::MerkleTree;
use gpu_attest_shared::reference;
use gpu_attest_shared::{CancelToken, Digest, Work};

use gpu_attest_shared::vectors::{v4_vector_params as params, v4_walk_seed as walk_seed};

/// 20.6's chains, by the fast engine, and the walk over the reference's pool states: what
/// every vector here is computed from.
struct VectorWalk {
    work: Work,
    exec: engine::Execution,
    states: Vec<gpu_attest_shared::matrix::Matrix>,
    walk: SliceWalk,
    held: HeldStates,
}

fn vector_walk() -> VectorWalk {
    let work = Work::new(params()).unwrap();
    let backend = CpuBackend::new(1, None).unwrap();
    let exec = engine::execute(&backend, &work, &|_| {}, &CancelToken::new()).unwrap();
    let states: Vec<_> = (0..2).map(|i| reference::chain_state(work.key(), i, 512, 2)).collect();
    let walk = SliceWalk {
        nonce: params().nonce,
        walk_seed: walk_seed(),
        global: exec.commitment.global,
        walkers: 2,
        steps: 8,
    };
    let held = HeldStates::new(ChainPool::new(0, 0, 2, 512).unwrap(), states.clone()).unwrap();
    VectorWalk {
        work,
        exec,
        states,
        walk,
        held,
    }
}

/// (name, hex) as PROTOCOL.md 20.6 quotes them.
const VECTORS: [(&str, &str); 13] = [
    ("G", "61d3d19f1445438360a6d818bfd087ff3f4f95bb12c851196699e2927251713a"),
    (
        "h_{0,2}",
        "fc72cc51134898d1f8faf1cad7f99593328486fd76fcd2180b30c80234cfafd8",
    ),
    (
        "h_{1,2}",
        "5c1e1c0f411ab1ac6ffb0191fae13e874a6fa3b12ee00a9a6d1bbde921835837",
    ),
    (
        "slice 3 of X_{1,2}: path sibling 0",
        "7966f88088b6f8618cb057817245d359817870bd0db5f8a50e5c89b22afc10e6",
    ),
    (
        "slice 3 of X_{1,2}: path sibling 1",
        "e66b3a6033681b6c92facb00b3ffde7634a0626efd79572e75c581fac4f33a10",
    ),
    ("row 200 of X_{1,2}, bytes 0..16", "871018074048cc4b08e4a72530235ffa"),
    (
        "s_{0,0}",
        "9be9d4d4fbaa1dde56860e7734005e4cdecf3fe54cb791086954d38b6d1139ff",
    ),
    (
        "s_{0,1}",
        "dd4e098cf2e7307c1b24739e270fdaa8a16e265467e240abc2887d5d82a177e2",
    ),
    (
        "s_{0,8}",
        "443151e75a85a5d87c4c5b1fc3007624902565fae5d6fa4bae3e88e35785b721",
    ),
    (
        "walker root 0",
        "bdeac83a16e3a8f48520a88286865e17e9815a02b9b36c8d82b58d0d3ea4e1fa",
    ),
    (
        "walker root 1",
        "38698f51c74b267b52271242aa8ff957c31fd961dbe9c823cd85523e3527222e",
    ),
    (
        "walk_root_0",
        "36a2a25de267bf7f64b56911b53dcefe1de76b6a0bf944f8a395d0ee28a3de9a",
    ),
    ("step 5 of walker 1 reads slice", "5"),
];

#[test]
fn version_4_engine_vectors() {
    let VectorWalk {
        work,
        exec,
        states,
        walk,
        held,
    } = vector_walk();
    let pool = *held.pool();
    for (i, state) in states.iter().enumerate() {
        assert_eq!(
            Some(&state.digest()),
            exec.chains[i].checkpoints.last(),
            "the engine's chain {i} ends in the reference's state"
        );
    }
    let walked = walk_device(&walk, &held);
    let trace = walker_states(&walk, &held, 0);
    let path = slice_path(states[1].as_bytes(), 3).unwrap();
    let row: Vec<u8> = state_row(&work, 1, 200).iter().map(|&v| v as u8).collect();
    assert_eq!(row, states[1].as_bytes()[200 * 512..201 * 512]);
    let step5 = gpu_attest_shared::memory::step::entry_index(&walker_states(&walk, &held, 1)[5], pool.slices());

    // The opened step checks, as a validator would, rows drawn from every part of the slice.
    let leaves: Vec<Digest> = exec.chains.iter().map(|c| c.leaf()).collect();
    let tree = MerkleTree::new(&leaves);
    let opening = open_step(&walk, &held, &walked.walker_roots, 1, 5, |i| {
        (exec.chains[i as usize].checkpoints.clone(), tree.proof(i).unwrap())
    })
    .unwrap();
    let committed = DeviceCommitments {
        device_root: exec.commitment.devices[0].root,
        device_chains: 3,
        walk_root: walked.root,
    };
    check_step(&work, &walk, &pool, &committed, &opening, &[0, 63, 127]).unwrap();
    assert_eq!(held.slice(step5), opening.slice.as_slice());

    let got: [(&str, String); 13] = [
        ("G", exec.commitment.global.to_hex()),
        ("h_{0,2}", states[0].digest().to_hex()),
        ("h_{1,2}", states[1].digest().to_hex()),
        ("slice 3 of X_{1,2}: path sibling 0", hex::encode(path.siblings[0])),
        ("slice 3 of X_{1,2}: path sibling 1", hex::encode(path.siblings[1])),
        ("row 200 of X_{1,2}, bytes 0..16", hex::encode(&row[..16])),
        ("s_{0,0}", trace[0].to_hex()),
        ("s_{0,1}", trace[1].to_hex()),
        ("s_{0,8}", trace[8].to_hex()),
        ("walker root 0", walked.walker_roots[0].to_hex()),
        ("walker root 1", walked.walker_roots[1].to_hex()),
        ("walk_root_0", walked.root.to_hex()),
        ("step 5 of walker 1 reads slice", step5.to_string()),
    ];
    let printed: String = got
        .iter()
        .map(|(name, value)| format!("| {name} | `{value}` |\n"))
        .collect();
    for ((name, want), (_, value)) in VECTORS.iter().zip(&got) {
        assert_eq!(want, value, "{name}; all of them:\n{printed}");
    }
    let doc = include_str!("../../PROTOCOL.md");
    for (name, value) in &got {
        assert!(
            doc.contains(&format!("| {name} | `{value}` |")),
            "PROTOCOL.md 20.6 lacks {name} = {value}"
        );
    }
}

/// PROTOCOL.md 20.7: the version 4 statements of 20.6's walk. The validator is 13.7's (secret
/// seed `80 81 .. 9f`), which signs its two; the miner key is section 12's, which has no secret,
/// so the miner's two are given as bytes alone.
#[test]
fn version_4_statement_vectors() {
    use gpu_attest_shared::keys::{KeyPair, PublicKey};
    use gpu_attest_shared::memory::chain_pool::ChainPoolParams;
    use gpu_attest_shared::opening::SampleRequest;
    use gpu_attest_shared::statement::memory_v4::{
        StepSample, WalkRoot, open_request_bytes, step_opening_bytes, walk_request_bytes,
    };
    use gpu_attest_shared::statement::{Challenge, MemoryPhase};

    let VectorWalk { exec, walk, held, .. } = vector_walk();
    let walked = walk_device(&walk, &held);
    let leaves: Vec<Digest> = exec.chains.iter().map(|c| c.leaf()).collect();
    let tree = MerkleTree::new(&leaves);
    let opening = open_step(&walk, &held, &walked.walker_roots, 1, 5, |i| {
        (exec.chains[i as usize].checkpoints.clone(), tree.proof(i).unwrap())
    })
    .unwrap();

    let validator = KeyPair::from_seed(std::array::from_fn(|i| 0x80 + i as u8));
    let nonce = params().nonce;
    let request = walk_request_bytes(&nonce, &walk_seed(), 1_700_000_090_000);
    let root = WalkRoot {
        nonce,
        miner_key: PublicKey(params().miner_key),
        validator_key: validator.public_key(),
        walk_seed: walk_seed(),
        device: 0,
        root: walked.root,
        device_us: 1234,
    }
    .signing_bytes();
    let open = open_request_bytes(
        &nonce,
        &[SampleRequest { chain: 1, segment: 1 }],
        &[StepSample {
            device: 0,
            walker: 1,
            step: 5,
        }],
    );
    let step = step_opening_bytes(&nonce, 0, &opening);
    let challenge = Challenge {
        params: params(),
        issued_at_ms: 1_700_000_000_000,
        deadline_ms: 1_700_000_060_000,
        validator_key: validator.public_key(),
        inventory_digest: Digest::from_hex("c6e4efd4e0ed888751e3fe6860c16176de081873b88b35816426f01e35e0deca").unwrap(),
        memory: Some(MemoryPhase::V4(ChainPoolParams {
            walkers: 2,
            walk_steps: 8,
            pool_chains: vec![2],
        })),
        finish_by_ms: None,
    };
    let challenge_bytes = challenge.signing_bytes();
    assert_eq!(
        hex::encode(challenge.sign(&validator)),
        hex::encode(validator.sign(&challenge_bytes))
    );
    let row = |name: &str, bytes: &[u8], signed: bool| {
        let signature = if signed {
            hex::encode(validator.sign(bytes))
        } else {
            String::new()
        };
        let signature = if signature.is_empty() {
            String::new()
        } else {
            format!("`{signature}`")
        };
        format!(
            "| {name} | {} | `{}` | {signature} |",
            bytes.len(),
            blake3::hash(bytes).to_hex()
        )
    };
    let rows = [
        row("challenge (20.7)", &challenge_bytes, true),
        row("walk request (20.7)", &request, true),
        row("walk root of device 0 (20.7)", &root, false),
        row("open request (20.7)", &open, true),
        row("step opening, step 5 of walker 1 (20.7)", &step, false),
    ];
    let doc = include_str!("../../PROTOCOL.md");
    for r in &rows {
        assert!(
            doc.contains(r.as_str()),
            "PROTOCOL.md 20.7 lacks the row\n{r}\n(all rows:\n{})",
            rows.join("\n")
        );
    }
}

/// PROTOCOL.md 20.10: the locality walk over 20.6's pool with the same walk seed as its seed,
/// `W = 2`, `G = 3`, `C = 8`, the parents of generations 1 and 2 (a leaf node and an inner
/// node), and one opened segment that checks; and the request's bytes at
/// deadline 1 700 000 095 000 signed by 13.7's validator.
#[test]
fn locality_vectors() {
    use gpu_attest_shared::keys::KeyPair;
    use gpu_attest_shared::memory::locality::{
        ChunkPaths, LocalityCommitments, LocalityWalk, State, check_segment, open_segment, step, walk_lines,
    };
    use gpu_attest_shared::statement::locality::request_bytes;

    use gpu_attest_shared::merkle::{leaf_node, root_of};

    let VectorWalk { work, exec, held, .. } = vector_walk();
    let walk = LocalityWalk {
        nonce: params().nonce,
        seed: walk_seed(),
        global: exec.commitment.global,
        walkers: 2,
        generations: 3,
        steps: 8,
    };
    let walked = walk_lines(&walk, &held, &CancelToken::new()).unwrap();
    let start = walk.start(0, 0, 0, &[]);
    let line = start.names(held.pool().slices());
    let first = step(&start, line.of(held.slice(line.slice)));
    let leaves: Vec<Digest> = exec.chains.iter().map(|c| c.leaf()).collect();
    let tree = MerkleTree::new(&leaves);
    let chain = |i: u64| (exec.chains[i as usize].checkpoints.clone(), tree.proof(i).unwrap());
    let opening = open_segment(&walk, &held, &walked, (1, 1), &chain, &ChunkPaths::default())
        .unwrap()
        .unwrap();
    let committed = LocalityCommitments {
        device_root: exec.commitment.devices[0].root,
        device_chains: 3,
        locality_root: walked.root,
    };
    check_segment(&work, &walk, held.pool(), &committed, &opening).expect("the opened segment checks");
    let validator = KeyPair::from_seed(std::array::from_fn(|i| 0x80 + i as u8));
    let request = request_bytes(&walk, 1_700_000_095_000);
    let hex_state = |s: &State| hex::encode(s.to_bytes());
    let got = [
        ("locality s_{0,0} (generation 0)", hex_state(&start)),
        ("its line", format!("slice {}, line {}", line.slice, line.line)),
        ("after one step", hex_state(&first)),
        ("e_{0,0}", hex_state(&walked.ends[0])),
        ("e_{0,1}", hex_state(&walked.ends[1])),
        ("D_0", walked.digests[0].to_hex()),
        ("D_1", walked.digests[1].to_hex()),
        (
            "generation 1's parent (leaf node of D_0)",
            leaf_node(&walked.digests[0]).to_hex(),
        ),
        (
            "generation 1's walker 1 starts at",
            hex_state(&walk.start(0, 1, 1, &[leaf_node(&walked.digests[0])])),
        ),
        (
            "generation 2's parent (the node over D_0, D_1)",
            root_of(&walked.digests[..2]).to_hex(),
        ),
        (
            "generation 2's walker 0 starts at",
            hex_state(&walk.start(0, 2, 0, &[root_of(&walked.digests[..2])])),
        ),
        ("locality root", walked.root.to_hex()),
        ("locality request (bytes)", hex::encode(&request)),
        ("locality request (signature)", hex::encode(validator.sign(&request))),
    ];
    let printed: String = got
        .iter()
        .map(|(name, value)| format!("| {name} | `{value}` |\n"))
        .collect();
    let doc = include_str!("../../PROTOCOL.md");
    for (name, value) in &got {
        assert!(
            doc.contains(&format!("| {name} | `{value}` |")),
            "PROTOCOL.md 20.10 lacks {name} = {value}; all of them:\n{printed}"
        );
    }
}
