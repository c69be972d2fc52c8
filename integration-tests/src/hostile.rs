//! Hostile inputs, one entry point per kind of input the daemons take from outside: wire
//! messages, commitments, chain and walk openings, inventories, device evidence, key files, both
//! config files and the rate file. Each takes arbitrary bytes, reads them as that input and runs
//! every decoder and check the input reaches in the daemons. None may panic, whatever the bytes.
//!
//! The same entry points serve the coverage-guided fuzz targets (`fuzz/`, one target each), the
//! replay of their corpus and regressions under `cargo test`, and the proptest suite. The seeds
//! that start each corpus are genuine inputs, made by [`seeds`], so that the fuzzer begins past
//! the decoders' first refusals.

use gpu_attest_miner::MinerCore;
use gpu_attest_miner::backends::SelectedBackend;
use gpu_attest_miner::config::MinerConfig;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_proto::convert::{
    challenge_from_wire, challenge_to_wire, commitment_from_wire, commitment_to_wire, inventory_from_wire,
    inventory_to_wire, open_request_from_wire, opening_from_wire, opening_to_wire, sample_from_wire, sample_to_wire,
    walk_opening_from_wire, walk_opening_to_wire, walk_request_from_wire, walk_statement_from_wire,
};
use gpu_attest_proto::evidence::{evidence_from_wire, evidence_to_wire};
use gpu_attest_proto::memory_v4::{step_opening_from_wire, step_opening_to_wire};
use gpu_attest_proto::v1;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::engine::execute_with_pools;
use gpu_attest_shared::engine::{self, Execution};
use gpu_attest_shared::evidence::{
    AttestationReport, CcState, DeviceChain, DeviceEvidence, EvidenceTrust, check_device_evidence,
    evidence_statement_bytes,
};
use gpu_attest_shared::gemm::{CpuGemm, KernelKind};
use gpu_attest_shared::inventory::{HardwareClaim, Inventory, MinerLimits};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::check::{WalkCheckError, WalkOpening, check_segment, open_segment};
use gpu_attest_shared::memory::pool::{HostPool, entry_rows_match};
use gpu_attest_shared::memory::slice_walk::{DeviceCommitments, SliceWalk, StepOpening, check_step, open_step};
use gpu_attest_shared::memory::walk::{WalkSpec, walk_all};
use gpu_attest_shared::memory::{MemoryParams, PoolSpec};
use gpu_attest_shared::merkle::MerkleTree;
use gpu_attest_shared::opening::{ChainOpening, SampleRequest, open_chain};
use gpu_attest_shared::params::PROTOCOL_VERSION;
use gpu_attest_shared::statement::memory_v3::walk_opening_bytes;
use gpu_attest_shared::statement::memory_v4::step_opening_bytes;
use gpu_attest_shared::statement::{Challenge, Commitment, MemoryPhase, open_request_bytes, opening_bytes};
use gpu_attest_shared::verify::{check_commitment, verify_opening};
use gpu_attest_shared::{Backend, CancelToken, ChallengeParams, Work};
use gpu_attest_validator::attest::normalise_url;
use gpu_attest_validator::attest::outcome::Outcome;
use gpu_attest_validator::attest::verify::check_statement;
use gpu_attest_validator::attest::walk::check_pools;
use gpu_attest_validator::config::{Policy, ValidatorConfig};
use gpu_attest_validator::device_identity::check_commitment_evidence;
use gpu_attest_validator::planner::{Plan, classes, plan};
use gpu_attest_validator::rates::RateBook;
use gpu_attest_validator::rates::file::RateFile;
use gpu_attest_validator::service::{MAX_NAME_BYTES, MAX_REASON_BYTES};
use gpu_attest_validator::untrusted::caller_text_problem;
use prost::Message;
use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// An entry point: bytes in, every check they reach run, nothing returned.
pub type EntryPoint = fn(&[u8]);

/// Every entry point by its fuzz target's name (`fuzz/fuzz_targets/<name>.rs`).
pub const TARGETS: &[(&str, EntryPoint)] = &[
    ("wire_messages", wire_messages),
    ("commitment", commitment),
    ("chain_opening", chain_opening),
    ("walk_opening", walk_opening),
    ("inventory", inventory),
    ("device_evidence", device_evidence),
    ("key_file", key_file),
    ("config_file", config_file),
    ("rate_file", rate_file),
];

/// The validator's key in every challenge here, and the only one the miner accepts.
fn validator() -> &'static KeyPair {
    static V: OnceLock<KeyPair> = OnceLock::new();
    V.get_or_init(|| KeyPair::from_seed([60; 32]))
}

const MINER_SEED: [u8; 32] = [50; 32];

fn miner() -> &'static KeyPair {
    static M: OnceLock<KeyPair> = OnceLock::new();
    M.get_or_init(|| KeyPair::from_seed(MINER_SEED))
}

/// A small challenge (n = 64, 5 chains of 4 steps, 2 segments) over two logical CPU devices.
pub fn params() -> ChallengeParams {
    ChallengeParams {
        nonce: [1; 32],
        seed: [2; 32],
        miner_key: miner().public_key().0,
        n: 64,
        num_chains: 5,
        iterations: 4,
        checkpoint_every: 2,
    }
}

/// One thread presenting two logical devices: the honest run's backend, and every fresh
/// miner's.
fn shared_cpu() -> &'static Arc<CpuBackend> {
    static CPU: OnceLock<Arc<CpuBackend>> = OnceLock::new();
    CPU.get_or_init(|| {
        Arc::new(
            // The portable kernel and a fixed model name: the claim, and so the seeds made from
            // it, are the same bytes on every host.
            CpuBackend::new(1, Some(KernelKind::Portable))
                .expect("a one-thread CPU backend")
                .named("fuzz harness")
                .with_logical_devices(2),
        )
    })
}

pub fn backend() -> &'static CpuBackend {
    shared_cpu()
}

fn claim() -> HardwareClaim {
    HardwareClaim {
        devices: backend().devices(),
        backend: "cpu".into(),
        kernel: backend().kernel().to_string(),
    }
}

fn challenge() -> Challenge {
    Challenge {
        params: params(),
        issued_at_ms: 1_764_000_000_000,
        deadline_ms: 1_764_000_060_000,
        validator_key: validator().public_key(),
        inventory_digest: claim().digest(),
        memory: None,
        // As today's validators send to today's miners, so that the fuzzer starts on that path.
        finish_by_ms: Some(1_764_000_120_000),
    }
}

/// One honest execution of [`params`] and a genuine opening of chain 3, segment 1, computed once.
pub fn honest() -> &'static (Work, Execution, ChainOpening) {
    static H: OnceLock<(Work, Execution, ChainOpening)> = OnceLock::new();
    H.get_or_init(|| {
        let work = Work::new(params()).expect("the honest parameters are valid");
        let exec = engine::execute(backend(), &work, &|_| {}, &CancelToken::new()).expect("the honest run");
        let request = SampleRequest { chain: 3, segment: 1 };
        let opening = open_chain(
            backend(),
            &work,
            &exec.chains[3].checkpoints,
            &exec.trees,
            request,
            &CancelToken::new(),
        )
        .expect("the honest opening");
        (work, exec, opening)
    })
}

/// A fresh miner that accepts challenges signed by [`validator`], with an empty nonce log of
/// its own: made for each input, so that what one input does to the log (a nonce accepted)
/// cannot change what the next one reaches. The backend is shared.
fn fresh_miner_core() -> MinerCore {
    let cpu = shared_cpu().clone();
    let selected = SelectedBackend {
        kernel: cpu.kernel().to_string(),
        backend: cpu,
        name: "cpu".into(),
        notes: Vec::new(),
        self_checks: Vec::new(),
    };
    // Says version 3, so that the harness's version 3 challenge (its memory phase as the
    // harness validator plans it) is taken: version 3's decoding and checks stay in the code
    // while older miners are attested, and stay fuzzed.
    MinerCore::new(
        KeyPair::from_seed(MINER_SEED),
        HashSet::from([validator().public_key()]),
        crate::version_3_limits(),
        selected,
        Duration::from_secs(60),
        NonceLog::in_memory(),
    )
}

/// The validator's plan for the seed inventory (a version 3 miner) under the default
/// configuration with version 3 allowed: what a commitment's statement and pools are checked
/// against.
fn planned() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| {
        let config = default_config();
        let rates = RateBook::of_config(config);
        plan(&seed_inventory(), config, &rates, true, [1; 32], [2; 32]).expect("the seed inventory is planned for")
    })
}

/// The default configuration with `[memory] refuse_version_3 = false`, as a validator that still
/// attests miners of a release before version 4 runs.
fn default_config() -> &'static ValidatorConfig {
    static CONFIG: OnceLock<ValidatorConfig> = OnceLock::new();
    CONFIG.get_or_init(crate::version_3_validator_config)
}

/// Splits off the first byte, which picks among an entry point's variants.
fn selector(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((first, rest)) => (*first, rest),
        None => (0, data),
    }
}

/// Any wire message of either service, chosen by the first byte's low four bits (its high four
/// are flags for the message), decoded as the receiving side decodes it and checked as far as
/// it reaches without a network: the miner's acceptance of a challenge, the conversions of
/// every message that carries protocol values, and the validator API's checks of caller text.
pub fn wire_messages(data: &[u8]) {
    let (kind, bytes) = selector(data);
    match (kind & 0x0f) % 12 {
        0 => {
            let _ = challenge_received(kind, bytes);
        }
        1 => commitment(bytes),
        2 => chain_opening(bytes),
        3 => walk_opening(bytes),
        4 => inventory(bytes),
        5 => {
            if let Ok(request) = v1::OpenChainsRequest::decode(bytes) {
                let _ = open_request_from_wire(&request);
            }
        }
        6 => {
            if let Ok(request) = v1::WalkRequest::decode(bytes) {
                let _ = walk_request_from_wire(&request);
            }
        }
        7 => {
            if let Ok(wire) = v1::WalkStatement::decode(bytes)
                && let Ok((statement, signature)) = walk_statement_from_wire(&wire)
            {
                let _ = statement.miner_key.verify(&statement.signing_bytes(), &signature);
            }
        }
        8 => {
            // What the validator reads from a miner's challenge stream, event by event.
            if let Ok(event) = v1::ChallengeEvent::decode(bytes)
                && let Some(v1::challenge_event::Event::Commitment(wire)) = event.event
            {
                commitment_received(kind >> 4, wire);
            }
        }
        9 => {
            if let Ok(sample) = v1::SampleRequest::decode(bytes) {
                let _ = sample_from_wire(&sample);
            }
        }
        10 => validator_request(bytes),
        _ => {
            // What `validator attest` and `verdicts` print: a verdict from the API.
            let _ = v1::ListVerdictsResponse::decode(bytes);
            let _ = v1::AttestEvent::decode(bytes);
        }
    }
}

/// A challenge as the miner receives it, through every acceptance check (PROTOCOL.md 14.3).
/// With bit 4 of `flags` set it is first bound to the test miner and re-signed by its validator,
/// since a fuzzer cannot forge a signature and would otherwise stop at the first check.
/// Whether the miner accepted it.
pub fn challenge_received(flags: u8, bytes: &[u8]) -> bool {
    let Ok(wire) = v1::Challenge::decode(bytes) else {
        return false;
    };
    let Ok((mut challenge, mut signature)) = challenge_from_wire(&wire) else {
        return false;
    };
    if flags & 0x10 != 0 {
        challenge.params.miner_key = miner().public_key().0;
        challenge.validator_key = validator().public_key();
        signature = challenge.sign(validator());
    }
    let _ = challenge.verify(&signature);
    let _ = Work::new(challenge.params);
    fresh_miner_core()
        .accept(challenge, &signature, challenge_time())
        .is_ok()
}

/// The validator API's requests, through the checks its handlers make before the store.
fn validator_request(data: &[u8]) {
    let (kind, bytes) = selector(data);
    match kind % 4 {
        0 => {
            if let Ok(request) = v1::RegisterMinerRequest::decode(bytes) {
                let _ = caller_text_problem("name", &request.name, MAX_NAME_BYTES);
                let _ = normalise_url(&request.url);
            }
        }
        1 => {
            if let Ok(request) = v1::RevokeMinerKeyRequest::decode(bytes) {
                let _ = PublicKey::from_slice(&request.miner_key);
                let _ = caller_text_problem("reason", &request.reason, MAX_REASON_BYTES);
            }
        }
        2 => {
            if let Ok(request) = v1::ListVerdictsRequest::decode(bytes) {
                let _ = request.page_token.parse::<u64>();
                let _ = normalise_url(&request.miner_url);
            }
        }
        _ => {
            if let Ok(request) = v1::AttestMinerRequest::decode(bytes) {
                let _ = normalise_url(&request.url);
            }
            if let Ok(request) = v1::WatchVerdictsRequest::decode(bytes) {
                let _ = normalise_url(&request.miner_url);
            }
        }
    }
}

/// A commitment as the validator receives it: decoded, its statement checked against the
/// honest challenge and the validator's plan (signature, miner, inventory, then the pools of
/// the memory phase), its work against the honest work, and the device evidence beside it under
/// the default identity policy. The first byte's bit 0 re-signs the commitment, bit 1 its
/// evidence, with the challenged miner's key: a fuzzer cannot forge either signature, and
/// would otherwise never reach the checks behind them.
pub fn commitment(data: &[u8]) {
    let (flags, bytes) = selector(data);
    if let Ok(wire) = v1::Commitment::decode(bytes) {
        commitment_received(flags, wire);
    }
}

fn commitment_received(flags: u8, mut wire: v1::Commitment) {
    let Ok((commitment, mut signature)) = commitment_from_wire(&wire) else {
        return;
    };
    if flags & 1 != 0 {
        signature = miner().sign(&commitment.signing_bytes());
    }
    let challenge = challenge();
    let work = &honest().0;
    let mut outcome = Outcome::new("http://fuzz.invalid", planned(), Policy::Sampled);
    if check_statement(&challenge, work, &commitment, &signature, &mut outcome)
        && let Some(memory) = planned().memory.v3()
    {
        let _ = check_pools(&commitment, memory, &mut outcome);
    }
    let _ = check_commitment(work, &commitment.work);
    if flags & 2 != 0
        && let Ok(Some(decoded)) = evidence_from_wire(&wire.evidence, &[0; 64])
    {
        let statement = evidence_statement_bytes(
            &challenge.params.nonce,
            &miner().public_key().0,
            &challenge.validator_key.0,
            &decoded.devices,
        );
        wire.evidence_signature = miner().sign(&statement).to_vec();
    }
    let evidence = evidence_from_wire(&wire.evidence, &wire.evidence_signature);
    let _ = check_commitment_evidence(
        &default_config().identity,
        evidence_trust(),
        &challenge,
        &commitment,
        &claim().devices,
        &evidence,
        crate::test_pki::NOW,
    );
}

/// A chain opening, decoded and verified against the honest commitment for the sample it names.
pub fn chain_opening(bytes: &[u8]) {
    let Ok(wire) = v1::ChainOpening::decode(bytes) else {
        return;
    };
    if let Some(walk) = &wire.walk
        && let Ok((_, opening, _)) = walk_opening_from_wire(walk)
    {
        let _ = check_any_walk_opening(&opening);
    }
    if let Some(step) = &wire.step
        && let Ok((_, opening, _)) = step_opening_from_wire(step)
    {
        let v4 = honest_v4();
        let _ = check_step(&v4.work, &v4.walk, &v4.pool, &v4.committed, &opening, &[0, 1, 127]);
    }
    let Ok((_, opening, _)) = opening_from_wire(&wire, 64) else {
        return;
    };
    let (work, exec, _) = honest();
    // A validator asks only for samples within its challenge: the one this opening names,
    // brought within it.
    let request = SampleRequest {
        chain: opening.chain % work.num_chains(),
        segment: opening.segment % work.segments(),
    };
    // Verification re-executes one segment: bounded, since the opening's shape is checked
    // against the challenge first.
    let _ = verify_opening(
        backend(),
        work,
        &exec.commitment,
        request,
        &opening,
        &CancelToken::new(),
    );
}

/// A small honest version 4 walk: PROTOCOL.md 20.6's challenge, pool and walk, which a hostile
/// step opening is checked against (every check of 20.5, rows too).
pub struct HonestV4 {
    pub work: Work,
    pub walk: SliceWalk,
    pub pool: ChainPool,
    pub committed: DeviceCommitments,
    /// The genuine opening of step 5 of walker 1, as 20.6 opens it.
    pub opening: StepOpening,
}

pub fn honest_v4() -> &'static HonestV4 {
    static V4: OnceLock<HonestV4> = OnceLock::new();
    V4.get_or_init(|| {
        let params = gpu_attest_shared::vectors::v4_vector_params();
        let work = Work::new(params).expect("20.6's challenge");
        // One device, as 20.6 has it (the shared backend has two).
        let one_device = CpuBackend::new(2, None).expect("a CPU backend");
        let kept = execute_with_pools(&one_device, &work, &[2], &|_| {}, &CancelToken::new()).expect("20.6's pool");
        let walk = SliceWalk {
            nonce: params.nonce,
            walk_seed: gpu_attest_shared::vectors::v4_walk_seed(),
            global: kept.execution.commitment.global,
            walkers: 2,
            steps: 8,
        };
        let walked = kept.pools[0]
            .walk(&walk, &CancelToken::new(), &|_| {})
            .expect("nothing cancels it");
        let committed = DeviceCommitments {
            device_root: kept.execution.commitment.devices[0].root,
            device_chains: 3,
            walk_root: walked.root,
        };
        let chains = &kept.execution.chains;
        let leaves: Vec<Digest> = chains.iter().map(|c| c.leaf()).collect();
        let tree = MerkleTree::new(&leaves);
        let source = kept.pools[0]
            .host_states()
            .expect("the CPU backend's states are in host memory");
        let opening = open_step(&walk, source, &walked.walker_roots, 1, 5, |i| {
            (
                chains[i as usize].checkpoints.clone(),
                tree.proof(i).expect("a pool chain"),
            )
        })
        .expect("step 5 of walker 1");
        HonestV4 {
            work,
            walk,
            pool: *kept.pools[0].pool(),
            committed,
            opening,
        }
    })
}

/// A walk opening, decoded and checked against a small walk (PROTOCOL.md 18.7's sizes).
pub fn walk_opening(bytes: &[u8]) {
    let Ok(wire) = v1::WalkOpening::decode(bytes) else {
        return;
    };
    if let Ok((_, opening, _)) = walk_opening_from_wire(&wire) {
        let _ = check_any_walk_opening(&opening);
    }
}

/// A small honest walk (PROTOCOL.md 18.7's sizes: a pool of 4 entries over the honest work,
/// 3 walkers of 16 steps, a checkpoint every 4) and its genuine opening of walker 1, segment 2.
pub struct HonestWalk {
    pub pool: PoolSpec,
    pub walk: WalkSpec,
    pub root: Digest,
    pub opening: WalkOpening,
}

pub fn honest_walk() -> &'static HonestWalk {
    static W: OnceLock<HonestWalk> = OnceLock::new();
    W.get_or_init(|| {
        let spec = PoolSpec::with_entries(&honest().0, 0, 4);
        let gemm = CpuGemm::new(1, None).expect("a one-thread CPU GEMM");
        let pool = HostPool::fill(&gemm, &spec, &|_| {}, &CancelToken::new()).expect("the honest pool");
        let walk = WalkSpec {
            nonce: params().nonce,
            walk_seed: [2; 32],
            device: 0,
            pool_root: pool.root(),
            entries: spec.entries(),
            params: MemoryParams {
                pool_permille: 1000,
                walkers: 3,
                walk_steps: 16,
                walk_checkpoint_every: 4,
            },
        };
        let walked = walk_all(&pool, &walk, &CancelToken::new()).expect("the honest walk");
        let opening = open_segment(&pool, &walked, &walk, 1, 2)
            .expect("the pool answers")
            .expect("walker 1 has a segment 2");
        HonestWalk {
            pool: spec,
            walk,
            root: walked.root(),
            opening,
        }
    })
}

/// Checks a walk opening of any shape against the honest walk, for the walker and segment it
/// names: whatever it holds, the check answers without panicking. Entries are compared row by
/// row, as a validator compares them.
pub fn check_any_walk_opening(opening: &WalkOpening) -> Result<(), WalkCheckError> {
    let honest = honest_walk();
    let is_made = |entry: u64, bytes: &[u8]| entry_rows_match(&honest.pool, entry, bytes, &[0, 7, 255]);
    check_segment(
        &honest.walk,
        &honest.pool,
        &honest.root,
        (opening.walker, opening.segment),
        opening,
        &is_made,
    )
}

/// A miner's inventory, decoded, checked and planned for as the validator plans a challenge.
pub fn inventory(bytes: &[u8]) {
    let Ok(wire) = v1::Inventory::decode(bytes) else { return };
    let Ok(inventory) = inventory_from_wire(&wire) else {
        return;
    };
    // The validator's connection checks an inventory before anything plans with it.
    if inventory.check().is_err() {
        return;
    }
    let config = default_config();
    let _ = classes(&inventory.claim, config);
    let rates = RateBook::of_config(config);
    let _ = plan(&inventory, config, &rates, true, [1; 32], [2; 32]);
    let _ = plan(&inventory, config, &rates, false, [1; 32], [2; 32]);
}

/// The trust the validator places in NVIDIA's evidence, with the default SKU table.
fn evidence_trust() -> &'static EvidenceTrust {
    static TRUST: OnceLock<EvidenceTrust> = OnceLock::new();
    TRUST.get_or_init(|| default_config().identity.trust())
}

/// One device's evidence as it travels (`DeviceEvidence`), checked against the nonce of
/// NVIDIA's published sample, so that the sample, as a seed, reaches every check.
pub fn device_evidence(bytes: &[u8]) {
    let Ok(wire) = v1::DeviceEvidence::decode(bytes) else {
        return;
    };
    let Ok(Some(signed)) = evidence_from_wire(std::slice::from_ref(&wire), &[0; 64]) else {
        return;
    };
    for device in &signed.devices {
        let _ = check_device_evidence(
            device,
            &nvidia_sample().1,
            SAMPLE_MODEL,
            evidence_trust(),
            crate::test_pki::NOW,
        );
    }
}

/// The model NVIDIA's sample is checked as: the GPU its report and certificates are from.
pub const SAMPLE_MODEL: &str = "NVIDIA H100 80GB HBM3";

/// NVIDIA's published Hopper evidence (shared/tests/data/nvidia) as one device's evidence, and
/// the requester nonce its report answers.
pub fn nvidia_sample() -> &'static (DeviceEvidence, [u8; 32]) {
    static SAMPLE: OnceLock<(DeviceEvidence, [u8; 32])> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let report = hex::decode(include_str!("../../shared/tests/data/nvidia/hopper-attestation-report.hex").trim())
            .expect("the sample report is hex");
        let certificates =
            DeviceChain::pem_to_der(include_bytes!("../../shared/tests/data/nvidia/hopper-cert-chain.pem"))
                .expect("the sample chain is PEM");
        let nonce = AttestationReport::parse(&report)
            .expect("the sample report parses")
            .request_nonce;
        let evidence = DeviceEvidence {
            index: 0,
            cc_state: CcState::On,
            report,
            certificates,
        };
        (evidence, nonce)
    })
}

/// A key file's text (a miner's or validator's secret key), and the same text read as a public
/// key, as `allowed_validators` and the CLI's key arguments read it.
pub fn key_file(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    if let Some(identity) = KeyPair::from_key_text(text) {
        let _ = identity.public_key().check_usable();
    }
    if let Some(key) = PublicKey::from_hex(text) {
        let _ = key.check_usable();
    }
    let _ = gpu_attest_miner::daemon::parse_allowed(&text.lines().map(str::to_owned).collect::<Vec<_>>());
}

/// A config file: the miner's (first byte even) or the validator's, parsed and validated as
/// `serve` does before it starts.
pub fn config_file(data: &[u8]) {
    let (kind, bytes) = selector(data);
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    if kind % 2 == 0 {
        if let Ok(config) = gpu_attest_daemon::config::parse_config::<MinerConfig>(text, "miner.toml")
            && config.validate().is_ok()
        {
            let _ = gpu_attest_miner::daemon::parse_allowed(&config.allowed_validators);
        }
    } else if let Ok(config) = gpu_attest_daemon::config::parse_config::<ValidatorConfig>(text, "validator.toml")
        && config.validate().is_ok()
    {
        // What serve does with a valid file: plan with its rates, challenge and memory
        // settings, and judge evidence with its chips and SKUs.
        let rates = RateBook::of_config(&config);
        let _ = plan(&seed_inventory(), &config, &rates, true, [1; 32], [2; 32]);
        let (sample, nonce) = nvidia_sample();
        let _ = check_device_evidence(
            sample,
            nonce,
            SAMPLE_MODEL,
            &config.identity.trust(),
            crate::test_pki::NOW,
        );
    }
}

/// A rate file as `validator rates import` reads it, its rows then planned with.
pub fn rate_file(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    let Ok(file) = RateFile::parse(text) else { return };
    let config = default_config();
    let mut rates = RateBook::of_config(config);
    for row in file.classes.iter().filter(|row| row.is_importable()) {
        rates.share(row.class(), row.rate());
    }
    for row in &file.classes {
        let _ = rates.expected(&row.class());
    }
    let _ = plan(&seed_inventory(), config, &rates, true, [1; 32], [2; 32]);
}

/// The test miner's inventory: two logical CPU devices, this protocol version.
fn seed_inventory() -> Inventory {
    Inventory {
        miner_key: miner().public_key(),
        claim: claim(),
        protocol_version: PROTOCOL_VERSION,
        software_version: "fuzz seed".into(),
        limits: MinerLimits::default(),
        takes_finish_by: true,
    }
}

/// When the test miner receives its challenges: between their issue and their deadline.
fn challenge_time() -> u64 {
    challenge().issued_at_ms + 1000
}

/// Genuine inputs for each target, by target name and file name: what its corpus starts from.
pub fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let (work, exec, opening) = honest();
    let challenge = challenge();
    let challenge_signature = validator().sign(&challenge.signing_bytes());
    let commitment = Commitment {
        work: exec.commitment.clone(),
        miner_key: miner().public_key(),
        validator_key: challenge.validator_key,
        inventory: claim().devices,
        backend: claim().backend,
        kernel: claim().kernel,
        compute_ms: 1000,
        pools: None,
    };
    let commitment_wire = commitment_to_wire(&commitment, &miner().sign(&commitment.signing_bytes()));
    let inventory_wire = inventory_to_wire(&seed_inventory());
    let nonce = work.params().nonce;
    let opening_wire = opening_to_wire(&nonce, opening, &miner().sign(&opening_bytes(&nonce, opening)));
    let walk = &honest_walk().opening;
    let walk_wire = walk_opening_to_wire(&nonce, walk, &miner().sign(&walk_opening_bytes(&nonce, walk)));
    let step = &honest_v4().opening;
    let step_signature = miner().sign(&step_opening_bytes(&honest_v4().walk.nonce, 0, step));
    let step_wire = v1::ChainOpening {
        step: Some(step_opening_to_wire(0, step, &step_signature)),
        ..Default::default()
    };
    let evidence_wire = evidence_to_wire(std::slice::from_ref(&nvidia_sample().0)).remove(0);
    let with_selector = |kind: u8, message: &[u8]| [&[kind][..], message].concat();
    let samples = [SampleRequest { chain: 3, segment: 1 }];
    let open_request = v1::OpenChainsRequest {
        nonce: nonce.to_vec(),
        samples: samples.iter().map(sample_to_wire).collect(),
        validator_key: validator().public_key().0.to_vec(),
        signature: validator().sign(&open_request_bytes(&nonce, &samples)).to_vec(),
        walk_samples: Vec::new(),
        step_samples: Vec::new(),
    };
    let commitment_event = v1::ChallengeEvent {
        event: Some(v1::challenge_event::Event::Commitment(commitment_wire.clone())),
    };
    // A version 3 challenge, the memory phase as the validator plans it; signed by the harness
    // (selector bit 4).
    let memory_challenge = Challenge {
        memory: planned().memory.v3().map(|m| MemoryPhase::V3(m.params)),
        ..challenge.clone()
    };
    let miner_config = MinerConfig::default().to_toml();
    let validator_config = ValidatorConfig::default().to_toml();
    vec![
        (
            "wire_messages",
            "challenge",
            with_selector(0, &challenge_to_wire(&challenge, &challenge_signature).encode_to_vec()),
        ),
        (
            "wire_messages",
            "challenge-with-memory",
            with_selector(0x10, &challenge_to_wire(&memory_challenge, &[0; 64]).encode_to_vec()),
        ),
        (
            "wire_messages",
            "commitment",
            with_selector(1, &with_selector(0, &commitment_wire.encode_to_vec())),
        ),
        (
            "wire_messages",
            "inventory",
            with_selector(4, &inventory_wire.encode_to_vec()),
        ),
        (
            "wire_messages",
            "open-chains-request",
            with_selector(5, &open_request.encode_to_vec()),
        ),
        (
            "wire_messages",
            "challenge-event-commitment",
            with_selector(8, &commitment_event.encode_to_vec()),
        ),
        (
            "wire_messages",
            "register-miner",
            with_selector(
                10,
                &with_selector(
                    0,
                    &v1::RegisterMinerRequest {
                        url: "http://10.0.0.7:50051".into(),
                        name: "rack 4, host 2".into(),
                        replace_key: false,
                    }
                    .encode_to_vec(),
                ),
            ),
        ),
        (
            "commitment",
            "honest",
            with_selector(0, &commitment_wire.encode_to_vec()),
        ),
        ("chain_opening", "honest", opening_wire.encode_to_vec()),
        ("walk_opening", "honest", walk_wire.encode_to_vec()),
        ("chain_opening", "honest-step", step_wire.encode_to_vec()),
        ("inventory", "cpu-two-devices", inventory_wire.encode_to_vec()),
        ("device_evidence", "nvidia-hopper-sample", evidence_wire.encode_to_vec()),
        (
            "key_file",
            "secret-key",
            format!("{}\n", hex::encode([7u8; 32])).into_bytes(),
        ),
        (
            "key_file",
            "public-key",
            format!("{}\n", miner().public_key().to_hex()).into_bytes(),
        ),
        (
            "config_file",
            "miner-defaults",
            with_selector(0, miner_config.as_bytes()),
        ),
        (
            "config_file",
            "validator-defaults",
            with_selector(1, validator_config.as_bytes()),
        ),
        ("rate_file", "example", RATE_FILE_EXAMPLE.as_bytes().to_vec()),
    ]
}

const RATE_FILE_EXAMPLE: &str = "format = 1\n\n[[class]]\nbackend = \"cuda\"\nkernel = \"tensor\"\n\
model = \"nvidia h100 80gb hbm3\"\nn = 2048\nunit = \"device\"\nops_per_sec = 1.1e15\nminers = 12\n\
observations = 170\n";
