//! The validator's side of a version 4 exchange, driven against a real miner over gRPC: what
//! `walk_v4.rs` and the placed-fakes benchmark share. It is validator/src/attest/walk_v4.rs,
//! called as an attestation will call it, with a plan built by hand.

use super::{Running, TempDir, VALIDATOR_SEED, cpu_claim, validator_config};
use gpu_attest_proto::convert::{challenge_to_wire, commitment_from_wire, sample_to_wire};
use gpu_attest_proto::memory_v4::step_sample_to_wire;
use gpu_attest_proto::v1::{self, miner_client::MinerClient};
use gpu_attest_shared::Work;
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::memory::chain_pool::ChainPoolParams;
use gpu_attest_shared::opening::SampleRequest;
use gpu_attest_shared::params::ChallengeParams;
use gpu_attest_shared::statement::memory_v4::{StepSample, open_request_bytes};
use gpu_attest_shared::statement::{Challenge, Commitment, MemoryPhase};
use gpu_attest_validator::attest::client::MinerConnection;
use gpu_attest_validator::attest::walk_v4::{StepChecks, walk_states};
use gpu_attest_validator::config::Policy;
use gpu_attest_validator::memory::plan_v4::ChainPoolPlan;
use gpu_attest_validator::transcript::Recorder;
use gpu_attest_validator::verdict::reason::Reason;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;
use tonic::transport::Channel;

pub fn validator() -> KeyPair {
    KeyPair::from_seed([VALIDATOR_SEED; 32])
}

/// A version 4 challenge from [`validator`] to `miner`, a CPU miner of `devices` devices: `chains`
/// chains of 2 steps at `n`, with the memory phase `pool`, and a minute to commit.
pub fn v4_challenge(
    miner: PublicKey,
    nonce: [u8; 32],
    devices: u32,
    n: u32,
    chains: u64,
    pool: ChainPoolParams,
) -> Challenge {
    let now = gpu_attest_miner::core::now_ms();
    Challenge {
        params: ChallengeParams {
            nonce,
            seed: [5; 32],
            miner_key: miner.0,
            n,
            num_chains: chains,
            iterations: 2,
            checkpoint_every: 1,
        },
        issued_at_ms: now,
        deadline_ms: now + 60_000,
        validator_key: validator().public_key(),
        inventory_digest: cpu_claim(devices).digest(),
        memory: Some(MemoryPhase::V4(pool)),
        finish_by_ms: None,
    }
}

/// Sends `c` (signed by [`validator`]) and returns the commitment.
pub async fn commit(client: &mut MinerClient<Channel>, c: &Challenge) -> Commitment {
    let wire = challenge_to_wire(c, &c.sign(&validator()));
    let mut events = client.run_challenge(wire).await.unwrap().into_inner();
    while let Some(event) = events.message().await.unwrap() {
        if let Some(v1::challenge_event::Event::Commitment(commitment)) = event.event {
            return commitment_from_wire(&commitment).unwrap().0;
        }
    }
    panic!("no commitment");
}

/// A version 4 open request for `chains` and `steps`, signed by [`validator`].
pub fn open_request(nonce: [u8; 32], chains: &[SampleRequest], steps: &[StepSample]) -> v1::OpenChainsRequest {
    v1::OpenChainsRequest {
        nonce: nonce.to_vec(),
        samples: chains.iter().map(sample_to_wire).collect(),
        validator_key: validator().public_key().0.to_vec(),
        signature: validator().sign(&open_request_bytes(&nonce, chains, steps)).to_vec(),
        walk_samples: Vec::new(),
        step_samples: steps.iter().map(step_sample_to_wire).collect(),
    }
}

/// Commits `c` on `miner`, then runs the validator's exchange: the walk, the steps (`chosen`,
/// or drawn from `seed` as the plan says), each opening checked as it arrives after `tamper`.
/// Returns every reason found; none is a pass of the memory phase.
pub async fn validator_exchange(
    miner: &Running,
    c: &Challenge,
    plan: &ChainPoolPlan,
    tamper: impl Fn(&mut v1::ChainOpening),
    chosen: Option<Vec<StepSample>>,
    seed: [u8; 32],
) -> Vec<Reason> {
    let dir = TempDir::new("walk-v4");
    let config = validator_config(&dir, Policy::Sampled);
    let mut raw = MinerClient::connect(miner.url()).await.unwrap();
    let commitment = commit(&mut raw, c).await;
    let work = Work::new(c.params).unwrap();
    let miner_key = commitment.miner_key;

    let mut connection = MinerConnection::connect(&miner.url(), &config).await.unwrap();
    let mut reasons = Vec::new();
    let walked = walk_states(
        &mut connection,
        &validator(),
        &work,
        &commitment,
        plan,
        &mut reasons,
        &mut Recorder::default(),
        &|_| {},
    )
    .await
    .unwrap();
    let Some(mut walked) = walked else {
        return reasons;
    };
    let steps = chosen.unwrap_or_else(|| walked.draw_steps(plan, &mut ChaCha20Rng::from_seed(seed)));
    let mut openings = connection
        .open_chains(open_request(c.params.nonce, &[], &steps), work.n())
        .await
        .unwrap();
    // Checked as the validator checks them: several at once, each waited for in order.
    let mut checks = StepChecks::default();
    for &step in &steps {
        let mut wire = openings.message().await.unwrap().expect("one opening per step");
        tamper(&mut wire);
        let row = walked.draw_row(step, &mut Recorder::default()).unwrap();
        if let Some(check) = walked.begin_check(&work, &miner_key, step, &wire, row, &mut reasons) {
            checks.push(check, &mut reasons).await.unwrap();
        }
    }
    checks.finish(&mut reasons).await.unwrap();
    reasons
}

/// A validator at n = 256 with version 4's memory phase, as the version 4 and transcript tests
/// attest: the chains at a rate far below any CPU's at n = 256 (256 steps each, for kappa), so
/// that they never make an honest miner late; the walk at the shipped CPU row, also low.
pub fn v4_validator_config(dir: &TempDir, policy: Policy) -> gpu_attest_validator::config::ValidatorConfig {
    let mut config = validator_config(dir, policy);
    config.challenge.cpu_n = 256;
    config.rates[0].ops_per_sec = 1.0e9;
    config.memory = gpu_attest_validator::config::memory::MemoryConfig {
        enabled: true,
        walk_target_ms: 1_000,
        ..Default::default()
    };
    config
}

/// Limits that say version 4 (the default, spelled out where a test depends on it).
pub fn speaks_4() -> gpu_attest_miner::config::Limits {
    gpu_attest_miner::config::Limits {
        protocol_4: true,
        ..Default::default()
    }
}

/// A CPU miner claiming 256 KiB (a pool of 3 states of 64 KiB at n = 256) on `backend`, saying
/// version 4.
pub fn v4_miner(
    seed: u8,
    kernel: gpu_attest_shared::gemm::KernelKind,
    backend: std::sync::Arc<dyn gpu_attest_shared::Backend>,
) -> std::sync::Arc<gpu_attest_miner::MinerCore> {
    super::miner_on(
        seed,
        &[super::validator_key()],
        super::selected(kernel, backend),
        speaks_4(),
        gpu_attest_miner::nonces::NonceLog::in_memory(),
    )
}
