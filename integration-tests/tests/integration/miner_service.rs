//! The miner's gRPC service against a real client: every refusal is its own status code, one
//! challenge at a time, and a disconnect frees the devices.

use crate::common;

use common::*;
use gpu_attest_proto::convert::challenge_to_wire;
use gpu_attest_proto::v1::{self, miner_client::MinerClient};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::memory::chain_pool::ChainPoolParams;
use gpu_attest_shared::params::ChallengeParams;
use gpu_attest_shared::statement::{Challenge, MemoryPhase};
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

fn now() -> u64 {
    gpu_attest_miner::core::now_ms()
}

fn challenge(miner: PublicKey, nonce: u8, n: u32, chains: u64, iterations: u32, deadline_in_ms: i64) -> Challenge {
    Challenge {
        params: ChallengeParams {
            nonce: [nonce; 32],
            seed: [1; 32],
            miner_key: miner.0,
            n,
            num_chains: chains,
            iterations,
            checkpoint_every: 1,
        },
        issued_at_ms: now(),
        deadline_ms: (now() as i64 + deadline_in_ms) as u64,
        validator_key: validator_key(),
        inventory_digest: cpu_claim(1).digest(),
        memory: None,
        finish_by_ms: None,
    }
}

fn signed(c: &Challenge) -> v1::Challenge {
    challenge_to_wire(c, &c.sign(&KeyPair::from_seed([VALIDATOR_SEED; 32])))
}

async fn connect(miner: &Running) -> MinerClient<tonic::transport::Channel> {
    MinerClient::connect(miner.url()).await.unwrap()
}

async fn code_of(client: &mut MinerClient<tonic::transport::Channel>, c: v1::Challenge) -> Code {
    match client.run_challenge(c).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn each_refusal_has_its_own_status() {
    let core = miner_core(31, &[validator_key()], 1);
    let key = core.public_key();
    let miner = spawn_miner(core).await;
    let mut client = connect(&miner).await;

    let good = challenge(key, 1, 64, 1, 1, 10_000);
    let mut forged = signed(&good);
    forged.signature[0] ^= 1;
    assert_eq!(code_of(&mut client, forged).await, Code::Unauthenticated);

    let stranger = KeyPair::from_seed([0x77; 32]);
    let mut foreign = good.clone();
    foreign.validator_key = stranger.public_key();
    let wire = challenge_to_wire(&foreign, &foreign.sign(&stranger));
    assert_eq!(code_of(&mut client, wire).await, Code::PermissionDenied);

    let other_miner = challenge(PublicKey([9; 32]), 2, 64, 1, 1, 10_000);
    assert_eq!(
        code_of(&mut client, signed(&other_miner)).await,
        Code::FailedPrecondition
    );

    let expired = challenge(key, 3, 64, 1, 1, -1);
    assert_eq!(code_of(&mut client, signed(&expired)).await, Code::DeadlineExceeded);

    let bad_size = challenge(key, 4, 100, 1, 1, 10_000);
    assert_eq!(code_of(&mut client, signed(&bad_size)).await, Code::InvalidArgument);

    // The deadline window is refused in the unit the validator reads (the inventory's
    // max_duration_ms), and in the one the miner's operator sets.
    let too_long = challenge(key, 5, 64, 1, 1, 10 * 3600 * 1000);
    let refused = client.run_challenge(signed(&too_long)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_duration_ms=3600000") && refused.message().contains("max_duration_secs=3600"),
        "{refused:?}"
    );

    // A finish-by time must come after the deadline, is signed, and is what the limit bounds.
    let mut finish_first = good.clone();
    finish_first.finish_by_ms = Some(good.deadline_ms);
    let refused = client.run_challenge(signed(&finish_first)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("finish-by"), "{}", refused.message());
    let mut stretched = signed(&Challenge {
        finish_by_ms: Some(good.deadline_ms + 5_000),
        ..good.clone()
    });
    stretched.finish_by_unix_ms += 60_000;
    assert_eq!(code_of(&mut client, stretched).await, Code::Unauthenticated);
    let unsigned = v1::Challenge {
        finish_by_unix_ms: good.deadline_ms + 5_000,
        ..signed(&good)
    };
    assert_eq!(code_of(&mut client, unsigned).await, Code::Unauthenticated);
    let too_late = Challenge {
        finish_by_ms: Some(now() + 10 * 3600 * 1000),
        ..good.clone()
    };
    let refused = client.run_challenge(signed(&too_late)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("finish-by time") && refused.message().contains("max_duration_ms=3600000"),
        "{refused:?}"
    );

    // A challenge sized for hardware other than this miner's is refused before any work.
    let mut other_hardware = good.clone();
    other_hardware.inventory_digest = gpu_attest_shared::Digest([0x11; 32]);
    let refused = client.run_challenge(signed(&other_hardware)).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains("inventory"), "{}", refused.message());

    let mut garbage = signed(&good);
    garbage.validator_key.truncate(3);
    assert_eq!(code_of(&mut client, garbage).await, Code::InvalidArgument);

    // A challenge that carries both version 3's and version 4's memory phase is malformed
    // (version 4's refusals are in walk_v4.rs).
    let v4 = Challenge {
        memory: Some(MemoryPhase::V4(ChainPoolParams {
            walkers: 2,
            walk_steps: 8,
            pool_chains: vec![1],
        })),
        ..challenge(key, 6, 256, 1, 1, 10_000)
    };
    let mut both = signed(&v4);
    both.memory = Some(v1::MemoryParams::default());
    let refused = client.run_challenge(both).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("chain_pool"), "{}", refused.message());

    // Accepted once, then the same nonce again.
    let mut stream = client.run_challenge(signed(&good)).await.unwrap().into_inner();
    while stream.message().await.unwrap().is_some() {}
    assert_eq!(code_of(&mut client, signed(&good)).await, Code::AlreadyExists);

    // Version 4 walk steps asked of that version 2 commitment: refused, saying why, and the
    // round is not used up by it.
    let validator = KeyPair::from_seed([VALIDATOR_SEED; 32]);
    let mut with_steps = signed_open_request(good.params.nonce, &validator, &[]);
    with_steps.step_samples = vec![v1::StepSampleRequest {
        device: 0,
        walker: 0,
        step: 0,
    }];
    let refused = client.open_chains(with_steps).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("no version 4 challenge"),
        "{}",
        refused.message()
    );
    let sample = gpu_attest_shared::opening::SampleRequest { chain: 0, segment: 0 };
    let mut opened = client
        .open_chains(signed_open_request(good.params.nonce, &validator, &[sample]))
        .await
        .unwrap()
        .into_inner();
    assert!(opened.message().await.unwrap().is_some(), "the round was still there");
}

#[tokio::test(flavor = "multi_thread")]
async fn second_challenge_is_refused_while_busy_and_disconnect_frees_the_devices() {
    let core = miner_core(32, &[validator_key()], 1);
    let key = core.public_key();
    let miner = spawn_miner(core).await;
    let mut client = connect(&miner).await;

    // Minutes of work at n = 1024 on two cores.
    let long = challenge(key, 1, 1024, 64, 1024, 600_000);
    let mut stream = client.run_challenge(signed(&long)).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(v1::challenge_event::Event::Accepted(_))));

    let status = client
        .run_challenge(signed(&challenge(key, 2, 64, 1, 1, 10_000)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("busy"), "{}", status.message());

    // The validator goes away: the work is cancelled and the devices come free.
    drop(stream);
    let quick = signed(&challenge(key, 3, 64, 1, 1, 10_000));
    let mut accepted = false;
    for _ in 0..100 {
        match client.run_challenge(quick.clone()).await {
            Ok(_) => {
                accepted = true;
                break;
            }
            Err(s) if s.code() == Code::ResourceExhausted => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(s) => panic!("unexpected refusal: {s}"),
        }
    }
    assert!(accepted, "devices still busy 5 s after the validator disconnected");
}

#[tokio::test(flavor = "multi_thread")]
async fn work_past_its_deadline_is_cancelled_with_deadline_exceeded() {
    let core = miner_core(33, &[validator_key()], 1);
    let key = core.public_key();
    let miner = spawn_miner(core).await;
    let mut client = connect(&miner).await;
    let doomed = challenge(key, 1, 1024, 64, 1024, 300);
    let mut stream = client.run_challenge(signed(&doomed)).await.unwrap().into_inner();
    let status = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream ended without the deadline error"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), Code::DeadlineExceeded);
}

/// A miner that has run and committed to a small challenge (2 chains, 2 steps) for the test
/// validator, with a client; `also_allowed` are further validators on its allow-list.
async fn miner_that_committed(
    seed: u8,
    also_allowed: &[PublicKey],
) -> (Running, MinerClient<tonic::transport::Channel>, Challenge) {
    let core = miner_core(seed, &[&[validator_key()], also_allowed].concat(), 1);
    let key = core.public_key();
    let miner = spawn_miner(core).await;
    let mut client = connect(&miner).await;
    let c = challenge(key, 1, 64, 2, 2, 10_000);
    let mut stream = client.run_challenge(signed(&c)).await.unwrap().into_inner();
    while stream.message().await.unwrap().is_some() {}
    (miner, client, c)
}

#[tokio::test(flavor = "multi_thread")]
async fn openings_only_for_the_issuing_validator_and_known_commitments() {
    let (_miner, mut client, c) = miner_that_committed(34, &[]).await;
    let validator = KeyPair::from_seed([VALIDATOR_SEED; 32]);
    let samples = vec![gpu_attest_shared::opening::SampleRequest { chain: 1, segment: 1 }];
    let request = signed_open_request;
    let mut ok = client
        .open_chains(request(c.params.nonce, &validator, &samples))
        .await
        .unwrap()
        .into_inner();
    let opening = ok.message().await.unwrap().unwrap();
    assert_eq!((opening.chain, opening.segment), (1, 1));
    assert_eq!(opening.start_matrix.len(), 64 * 64);

    let stranger = KeyPair::from_seed([0x55; 32]);
    let err = client
        .open_chains(request(c.params.nonce, &stranger, &samples))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = client
        .open_chains(request([0xab; 32], &validator, &samples))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let too_many = vec![samples[0]; 65];
    let err = client
        .open_chains(request(c.params.nonce, &validator, &too_many))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    let out_of_range = [gpu_attest_shared::opening::SampleRequest { chain: 9, segment: 0 }];
    let err = client
        .open_chains(request(c.params.nonce, &validator, &out_of_range))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange);
    let err = client
        .open_chains(request(c.params.nonce, &validator, &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let mut forged = request(c.params.nonce, &validator, &samples);
    forged.signature[0] ^= 1;
    assert_eq!(
        client.open_chains(forged).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    // A key or signature of the wrong length is a malformed request, as in a challenge, and
    // the message names the field: not a stranger's key, not a bad signature.
    let mut short_key = request(c.params.nonce, &validator, &samples);
    short_key.validator_key.truncate(1);
    let mut no_signature = request(c.params.nonce, &validator, &samples);
    no_signature.signature.clear();
    for (malformed, field) in [(short_key, "validator_key"), (no_signature, "signature")] {
        let err = client.open_chains(malformed).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(field), "{err:?}");
    }
}

/// A captured open request cannot make the miner recompute again: the first request that
/// passes every check uses up the commitment's one opening round, and the refusal of any later
/// one has its own status.
#[tokio::test(flavor = "multi_thread")]
async fn an_open_request_is_single_use() {
    let (_miner, mut client, c) = miner_that_committed(35, &[]).await;
    let validator = KeyPair::from_seed([VALIDATOR_SEED; 32]);
    let signed_request = |samples: &[_]| signed_open_request(c.params.nonce, &validator, samples);
    let samples = [gpu_attest_shared::opening::SampleRequest { chain: 0, segment: 1 }];
    let captured = signed_request(&samples);
    let mut first = client.open_chains(captured.clone()).await.unwrap().into_inner();
    assert_eq!(first.message().await.unwrap().unwrap().chain, 0);
    assert!(first.message().await.unwrap().is_none());

    for replay in 0..3 {
        let err = client.open_chains(captured.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "replay {replay}: {err:?}");
        assert!(err.message().contains("single-use"), "{}", err.message());
    }
    // Not even the issuing validator gets a second round with other samples.
    let other = signed_request(&[gpu_attest_shared::opening::SampleRequest { chain: 1, segment: 0 }]);
    assert_eq!(client.open_chains(other).await.unwrap_err().code(), Code::AlreadyExists);
}

/// `core` runs and commits a small challenge with `nonce` and a deadline `deadline_in_ms` away,
/// and takes the test validator's open request for `samples` of it: what an opening round
/// starts from.
fn committed_and_asked(
    core: &Arc<gpu_attest_miner::MinerCore>,
    nonce: u8,
    deadline_in_ms: i64,
    samples: &[gpu_attest_shared::opening::SampleRequest],
) -> (
    Arc<gpu_attest_miner::core::RecentCommitment>,
    Vec<gpu_attest_miner::openings::Sample>,
) {
    let c = challenge(core.public_key(), nonce, 64, 2, 2, deadline_in_ms);
    let signature = c.sign(&KeyPair::from_seed([VALIDATOR_SEED; 32]));
    let mut accepted = core
        .accept(c.clone(), &signature, gpu_attest_miner::core::now_ms())
        .unwrap();
    let execution = core
        .execute(&mut accepted, &|_| {}, &gpu_attest_shared::CancelToken::new())
        .unwrap();
    core.commit(accepted, execution, 1);
    let validator = KeyPair::from_seed([VALIDATOR_SEED; 32]);
    let request = signed_open_request(c.params.nonce, &validator, samples);
    let round = core
        .check_open_request(gpu_attest_proto::convert::open_request_from_wire(&request).unwrap())
        .unwrap();
    let samples = round
        .chains
        .into_iter()
        .map(gpu_attest_miner::openings::Sample::Chain)
        .collect();
    (round.recent, samples)
}

/// A validator that stops reading its openings fills the stream's buffer, and the hand-over of
/// the next one blocks. The devices are released while it is waited on, so that it cannot keep
/// every other validator out, and the round ends at its limit.
#[tokio::test(flavor = "multi_thread")]
async fn a_validator_that_stops_reading_openings_does_not_keep_the_devices() {
    use gpu_attest_miner::openings::{RoundLimits, run_round};
    let core = miner_core(37, &[validator_key()], 1);
    let sample = gpu_attest_shared::opening::SampleRequest { chain: 0, segment: 1 };
    let (recent, samples) = committed_and_asked(&core, 1, 10_000, &[sample; 4]);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let limits = RoundLimits {
        handover: Duration::from_millis(200),
        round: Duration::from_millis(1500),
    };
    let started = std::time::Instant::now();
    let round = tokio::spawn(run_round(core.clone(), recent, samples, tx, limits));
    // The first opening fills the buffer nobody reads; the round holds the devices meanwhile.
    while rx.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let devices = tokio::time::timeout(Duration::from_secs(5), core.running().lock_devices())
        .await
        .expect("a stalled opening round kept the devices");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "released before the hand-over time"
    );
    drop(devices);
    tokio::time::timeout(Duration::from_secs(5), round)
        .await
        .expect("the round outlived its limit")
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!(rx.len(), 1, "only the opening handed over before the stall");

    // A round that cannot even get the devices (a challenge holds them) ends at its limit too.
    let sample = gpu_attest_shared::opening::SampleRequest { chain: 0, segment: 0 };
    let (recent, samples) = committed_and_asked(&core, 2, 10_000, &[sample]);
    let held = core.running().lock_devices().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let round = tokio::spawn(run_round(core.clone(), recent, samples, tx, limits));
    tokio::time::timeout(Duration::from_secs(5), round)
        .await
        .expect("a round waiting for the devices outlived its limit")
        .unwrap();
    assert!(rx.recv().await.is_none(), "an opening was made without the devices");
    drop(held);
}

/// The hand-over is scaled by the work the challenge took, not by its deadline: a validator
/// picks the deadline, and a tiny challenge with a distant one would hold the devices again.
#[tokio::test(flavor = "multi_thread")]
async fn the_hand_over_follows_the_work_not_the_deadline() {
    use gpu_attest_miner::openings::RoundLimits;
    let core = miner_core(39, &[validator_key()], 1);
    let sample = gpu_attest_shared::opening::SampleRequest { chain: 0, segment: 0 };
    let an_hour_less_a_minute = 59 * 60 * 1000;
    let (recent, _) = committed_and_asked(&core, 1, an_hour_less_a_minute, &[sample]);
    let limits = RoundLimits::for_commitment(&core, &recent);
    assert_eq!(limits.handover, Duration::from_secs(10), "{limits:?}");
}

/// The test validator opens chain 0's first segment of its commitment `nonce`, to the end.
async fn open_one_segment(client: &mut MinerClient<tonic::transport::Channel>, nonce: [u8; 32]) {
    let validator = KeyPair::from_seed([VALIDATOR_SEED; 32]);
    let sample = [gpu_attest_shared::opening::SampleRequest { chain: 0, segment: 0 }];
    let mut opened = client
        .open_chains(signed_open_request(nonce, &validator, &sample))
        .await
        .unwrap()
        .into_inner();
    while opened.message().await.unwrap().is_some() {}
}

/// Between a commitment and its validator's open request, another validator's challenge could
/// take the devices and make those openings wait past their budget: an honest miner failed.
/// So for a few seconds, until the commitment is opened, other validators are asked to retry.
#[tokio::test(flavor = "multi_thread")]
async fn another_validator_waits_while_a_fresh_commitment_is_unopened() {
    let other = KeyPair::from_seed([0x66; 32]);
    let (_miner, mut client, c) = miner_that_committed(36, &[other.public_key()]).await;
    let mut theirs = challenge(PublicKey(c.params.miner_key), 2, 64, 1, 1, 10_000);
    theirs.validator_key = other.public_key();
    let wire = challenge_to_wire(&theirs, &theirs.sign(&other));
    let refused = client.run_challenge(wire.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("not yet opened"), "{}", refused.message());

    open_one_segment(&mut client, c.params.nonce).await;
    let mut accepted = client.run_challenge(wire).await.unwrap().into_inner();
    while accepted.message().await.unwrap().is_some() {}
}

/// The hold protects a commitment its validator is about to open. A validator that committed
/// here within the last minute gets no hold for the next, or tiny challenges one every few
/// seconds, opened just inside the hold or never, would keep every other validator out.
#[tokio::test(flavor = "multi_thread")]
async fn a_validator_that_challenges_in_a_loop_gets_no_hold() {
    let other = KeyPair::from_seed([0x67; 32]);
    let (_miner, mut client, first) = miner_that_committed(38, &[other.public_key()]).await;
    let key = PublicKey(first.params.miner_key);
    // The first commitment is opened, as late in its hold as a looping validator would.
    open_one_segment(&mut client, first.params.nonce).await;
    // The same validator again at once.
    let second = challenge(key, 2, 64, 2, 2, 10_000);
    let mut stream = client.run_challenge(signed(&second)).await.unwrap().into_inner();
    while stream.message().await.unwrap().is_some() {}
    let mut theirs = challenge(key, 3, 64, 1, 1, 10_000);
    theirs.validator_key = other.public_key();
    let wire = challenge_to_wire(&theirs, &theirs.sign(&other));
    let mut accepted = client
        .run_challenge(wire)
        .await
        .expect("held off by a commitment whose validator does not open its commitments")
        .into_inner();
    while accepted.message().await.unwrap().is_some() {}
}

/// A device out of service (it faulted and could not be reset): challenges are refused with
/// the reason, and the server stops by itself, since only a fresh process gets the device back
/// (the daemon then exits with its own status for the supervisor to restart it).
#[tokio::test(flavor = "multi_thread")]
async fn a_device_out_of_service_refuses_work_and_stops_the_miner() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let backend = Arc::new(breakable::BreakableBackend {
        cpu: test_cpu(TEST_CORES as usize),
        broken: false.into(),
    });
    let mut selected = cpu_backend(1);
    selected.backend = backend.clone();
    let core = miner_on(
        41,
        &[validator_key()],
        selected,
        gpu_attest_miner::config::Limits::default(),
        gpu_attest_miner::nonces::NonceLog::in_memory(),
    );
    let key = core.public_key();
    let (listener, address) = listener().await;
    let url = format!("http://{address}");
    // The watcher asks once at the start and then not for an hour, so that only the refusal's
    // alarm can stop the server: with a short interval its tick could stop the server before
    // the refusal it is about to be asked for.
    let options = gpu_attest_miner::server::ServeOptions {
        device_watch: Duration::from_secs(3600),
        ..miner_options()
    };
    let server = tokio::spawn(gpu_attest_miner::server::serve(
        core,
        listener,
        options,
        std::future::pending(),
    ));
    let mut client = MinerClient::connect(url.clone()).await.unwrap();
    assert_eq!(
        health_status(&url, "gpu_attest.v1.Miner").await,
        ServingStatus::Serving as i32
    );
    assert_eq!(
        code_of(&mut client, signed(&challenge(key, 1, 64, 1, 1, 10_000))).await,
        Code::Ok
    );

    backend.broken.store(true, std::sync::atomic::Ordering::SeqCst);
    let refused = client
        .run_challenge(signed(&challenge(key, 2, 64, 1, 1, 10_000)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("device 0 is out of service (CUDA_ERROR_ILLEGAL_ADDRESS")
            && refused.message().contains("restart the miner"),
        "{}",
        refused.message()
    );
    // The refusal rang the alarm: the server stops, and takes no new connection.
    let stopped = tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("the miner still serves 15 s after a device went out of service")
        .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
    assert!(MinerClient::connect(url).await.is_err(), "the listener is still open");
}

/// GetInventory carries what the self-check found, for operators, outside the hardware claim:
/// the claim a validator plans against is the same with or without it.
#[tokio::test(flavor = "multi_thread")]
async fn the_inventory_reports_the_self_check_outside_the_claim() {
    use gpu_attest_miner::selftest::{KernelCheck, Outcome};
    let mut selected = cpu_backend(1);
    selected.self_checks = vec![
        KernelCheck {
            backend: "cuda".into(),
            index: 0,
            device: "gpu 0 (a GPU)".into(),
            kernel: "tensor".into(),
            outcome: Outcome::Passed { ops_per_sec: 4.0e14 },
            cached: true,
            faulted_device: false,
            fault_not_remembered: None,
        },
        KernelCheck {
            backend: "cuda".into(),
            index: 0,
            device: "gpu 0 (a GPU)".into(),
            kernel: "wgmma".into(),
            outcome: Outcome::Failed {
                reason: "the mid-sized case differs at chain 1, checkpoint 2".into(),
            },
            cached: false,
            faulted_device: false,
            fault_not_remembered: None,
        },
    ];
    let core = miner_on(
        42,
        &[validator_key()],
        selected,
        gpu_attest_miner::config::Limits::default(),
        gpu_attest_miner::nonces::NonceLog::in_memory(),
    );
    let claim = core.claim().digest();
    let miner = spawn_miner(core).await;
    let wire = connect(&miner)
        .await
        .get_inventory(v1::GetInventoryRequest::default())
        .await
        .unwrap()
        .into_inner();
    let checks: Vec<(&str, bool, f64, &str)> = wire
        .self_checks
        .iter()
        .map(|c| (c.kernel.as_str(), c.passed, c.ops_per_sec, c.detail.as_str()))
        .collect();
    assert_eq!(
        checks,
        [
            ("tensor", true, 4.0e14, ""),
            (
                "wgmma",
                false,
                0.0,
                "the mid-sized case differs at chain 1, checkpoint 2"
            )
        ]
    );
    let parsed = gpu_attest_proto::convert::inventory_from_wire(&wire).unwrap();
    assert_eq!(parsed.claim.digest(), claim, "the self-check is not part of the claim");
    assert_eq!(claim, cpu_claim(1).digest());
}

/// Shutdown lets in-flight calls finish, but not forever: a peer holding a health `Watch`
/// stream open (it never ends by itself) cannot keep a daemon that must stop, after a device
/// fault say, from stopping once the drain limit has passed.
#[tokio::test(flavor = "multi_thread")]
async fn an_open_stream_cannot_hold_a_stopping_miner_past_the_drain_limit() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let core = miner_on(
        42,
        &[validator_key()],
        cpu_backend(1),
        gpu_attest_miner::config::Limits::default(),
        gpu_attest_miner::nonces::NonceLog::in_memory(),
    );
    let (listener, address) = listener().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = gpu_attest_miner::server::ServeOptions {
        drain_limit: Duration::from_secs(1),
        ..miner_options()
    };
    let server = tokio::spawn(gpu_attest_miner::server::serve(core, listener, options, async {
        let _ = stopped.await;
    }));
    let mut health = HealthClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "gpu_attest.v1.Miner".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(watch.message().await.unwrap().is_some(), "the first status arrives");

    let _ = stop.send(());
    let stopped = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("an open Watch stream held the miner past its 1 s drain limit")
        .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
}

/// A miner told to stop in the middle of a challenge refuses new challenges, finishes the one
/// in flight and serves its openings before it stops: a restart does not cost an honest miner
/// the verdict it has done the work for.
#[tokio::test(flavor = "multi_thread")]
async fn a_miner_stopping_mid_challenge_finishes_it_and_its_openings_first() {
    use gpu_attest_validator::config::Policy;

    let core = slow::slow_miner(57, Duration::from_millis(1500));
    let key = core.public_key();
    let mut miner = spawn_miner_with(core, miner_options()).await;
    let dir = TempDir::new("stopping");
    let mut config = validator_config(&dir, Policy::Sampled);
    config.deadline.min_ms = 10_000;
    let attestor = attestor(&config).await;
    let url = miner.url();
    let attestation = tokio::spawn(async move { attestor.attest(&url, &|_| {}).await });
    // Accepted by now, and computing for a while yet.
    tokio::time::sleep(Duration::from_millis(700)).await;
    miner.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = MinerClient::connect(miner.url())
        .await
        .unwrap()
        .run_challenge(signed(&challenge(key, 9, 64, 1, 1, 10_000)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("stopping"), "{}", refused.message());
    let verdict = attestation.await.unwrap().expect("a verdict");
    assert!(verdict.passed, "{verdict:?}");
}

/// With a finish-by time, a miner that cannot make the deadline goes on and commits late (the
/// validator can still measure the rate it proves); without one it stops at the deadline. And
/// it says it takes one.
#[tokio::test(flavor = "multi_thread")]
async fn a_miner_works_past_the_deadline_until_the_finish_by_time() {
    let core = slow::slow_miner(58, Duration::from_millis(1_200));
    assert!(core.inventory().takes_finish_by);
    let key = core.public_key();
    let miner = spawn_miner(core).await;
    let mut client = connect(&miner).await;
    let ends = |mut stream: tonic::Streaming<v1::ChallengeEvent>| async move {
        loop {
            match stream.message().await {
                Ok(Some(v1::ChallengeEvent {
                    event: Some(v1::challenge_event::Event::Commitment(_)),
                })) => return Ok(now()),
                Ok(Some(_)) => continue,
                Ok(None) => return Err(Code::Ok),
                Err(status) => return Err(status.code()),
            }
        }
    };

    let stopped = challenge(key, 1, 64, 1, 1, 600);
    let stream = client.run_challenge(signed(&stopped)).await.unwrap().into_inner();
    assert_eq!(ends(stream).await, Err(Code::DeadlineExceeded));

    let late = Challenge {
        finish_by_ms: Some(now() + 20_000),
        ..challenge(key, 2, 64, 1, 1, 600)
    };
    let stream = client.run_challenge(signed(&late)).await.unwrap().into_inner();
    let committed_at = ends(stream).await.expect("a commitment after the deadline");
    assert!(
        committed_at > late.deadline_ms,
        "the slow miner was expected to be late"
    );

    // Its operator may decline: the inventory says so, and the work stops at the deadline even
    // when a finish-by time comes anyway.
    let limits = gpu_attest_miner::config::Limits {
        work_past_deadline: false,
        ..Default::default()
    };
    let core = slow::slow_miner_with(59, Duration::from_millis(1_200), limits);
    assert!(!core.inventory().takes_finish_by);
    let key = core.public_key();
    let declining = spawn_miner(core).await;
    let mut client = connect(&declining).await;
    let late = Challenge {
        finish_by_ms: Some(now() + 20_000),
        ..challenge(key, 3, 64, 1, 1, 600)
    };
    let stream = client.run_challenge(signed(&late)).await.unwrap().into_inner();
    assert_eq!(ends(stream).await, Err(Code::DeadlineExceeded));
}
