//! A verdict names only what was proven. Against real daemons on loopback: a miner that commits
//! hardware other than it showed, inventories outside the protocol, impossible progress, miner
//! limits the validator must plan within, and a nonce log whose directory is replaced.

use crate::common;

use common::cheats::{Cheat, claimed_h100s, spawn_cheater};
use common::*;
use gpu_attest_miner::config::Limits;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_shared::engine::DeviceProgress;
use gpu_attest_shared::inventory::InventoryError;
use gpu_attest_validator::attest::{AttestError, AttestEvent};
use gpu_attest_validator::config::Policy;
use gpu_attest_validator::planner::PlanError;
use gpu_attest_validator::store::VerdictFilter;
use gpu_attest_validator::verdict::reason::ReasonCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The plan error an attestation ended with; panics on any other outcome.
fn plan_error(result: Result<gpu_attest_validator::verdict::Verdict, AttestError>) -> PlanError {
    match result {
        Err(AttestError::Plan { source, .. }) => source,
        other => panic!("expected a refusal to plan, got {other:?}"),
    }
}

/// A miner on the CPU backend with one device, these limits and no nonce file.
async fn miner_with_limits(seed: u8, limits: Limits) -> Running {
    spawn_miner(miner_core_with(
        seed,
        &[validator_key()],
        1,
        limits,
        NonceLog::in_memory(),
    ))
    .await
}

/// Attests `url` with a fresh validator, returning the verdict and every progress event relayed.
async fn attest_watching_progress(
    url: &str,
    tag: &str,
) -> (gpu_attest_validator::verdict::Verdict, Vec<DeviceProgress>) {
    let dir = TempDir::new(tag);
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let relayed = Mutex::new(Vec::new());
    let verdict = attestor
        .attest(url, &|e| {
            if let AttestEvent::Progress(p) = e {
                relayed.lock().unwrap().push(p);
            }
        })
        .await
        .unwrap();
    (verdict, relayed.into_inner().unwrap())
}

async fn stored_verdicts(attestor: &gpu_attest_validator::Attestor) -> usize {
    attestor
        .store()
        .verdicts(&VerdictFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commitment_naming_other_hardware_fails_and_the_verdict_names_what_was_sized() {
    let miner = spawn_cheater(miner_core(71, &[validator_key()], 1), Cheat::CommitsOtherHardware).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    let mismatch = failed_with(&verdict, ReasonCode::HardwareMismatch);
    assert!(
        mismatch.message.contains("sized for 1") && mismatch.message.contains("names 8"),
        "{}",
        mismatch.message
    );
    // The work itself was done (sampling finds nothing else wrong): the claim alone fails it.
    assert!(
        verdict.reasons.iter().all(|r| r.code == ReasonCode::HardwareMismatch),
        "{:?}",
        verdict.reasons
    );
    // What is stored is the one CPU the challenge was sized for, not the eight H100s.
    let sized = cpu_claim(1);
    assert_eq!(verdict.inventory, sized.devices);
    assert_eq!(
        (verdict.backend.as_str(), verdict.kernel.as_str()),
        (sized.backend.as_str(), sized.kernel.as_str())
    );
    assert!(verdict.inventory.iter().all(|d| !claimed_h100s().contains(d)));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_flow_passes_when_the_claim_is_kept() {
    // The control for the test above: an honest multi-device miner names what it showed.
    let miner = spawn_miner(miner_core(72, &[validator_key()], 2)).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert_eq!(verdict.inventory, cpu_claim(2).devices);
}

#[tokio::test(flavor = "multi_thread")]
async fn inventories_outside_the_protocol_are_refused_without_a_verdict() {
    for (cheat, expected) in [
        (Cheat::TooManyDevices, InventoryError::TooManyDevices(65)),
        (
            Cheat::ProtocolVersion1,
            InventoryError::ProtocolVersion {
                theirs: 1,
                oldest: 2,
                ours: 4,
            },
        ),
        (
            Cheat::SameDeviceTwice,
            InventoryError::DuplicateDevice("GPU-11111111".into()),
        ),
        (
            Cheat::NameWithALineBreak,
            InventoryError::Text {
                field: "device 0 name".into(),
                problem: format!(
                    "has a byte outside printable ASCII at byte {}; the protocol allows printable ASCII only",
                    cpu_claim(1).devices[0].name.len()
                ),
            },
        ),
        (Cheat::UnknownBackend, InventoryError::UnknownBackend("rocm".into())),
    ] {
        let miner = spawn_cheater(miner_core(73, &[validator_key()], 1), cheat).await;
        let dir = TempDir::new("inventory");
        let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
        let err = attestor.attest(&miner.url(), &|_| {}).await.unwrap_err();
        match &err {
            AttestError::Inventory { source, .. } => assert_eq!(source, &expected, "{cheat:?}"),
            other => panic!("{cheat:?}: {other:?}"),
        }
        if cheat == Cheat::ProtocolVersion1 {
            let text = err.to_string();
            assert!(text.contains("versions 2 to 4") && text.contains("version 1"), "{text}");
        }
        assert_eq!(stored_verdicts(&attestor).await, 0, "{cheat:?}");
        // Registration refuses the same inventory.
        assert!(attestor.inventory(&miner.url()).await.is_err(), "{cheat:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn impossible_progress_fails_and_is_never_relayed() {
    let miner = spawn_cheater(miner_core(74, &[validator_key()], 1), Cheat::ImpossibleProgress).await;
    let dir = TempDir::new("progress");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let relayed = Mutex::new(Vec::new());
    let verdict = attestor
        .attest(&miner.url(), &|e| {
            if let AttestEvent::Progress(p) = e {
                relayed.lock().unwrap().push(p);
            }
        })
        .await
        .unwrap();
    assert_failed_with(&verdict, ReasonCode::ImpossibleProgress);
    assert!(
        relayed.lock().unwrap().is_empty(),
        "relayed: {:?}",
        relayed.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn honest_progress_is_relayed() {
    let miner = spawn_miner(miner_core(75, &[validator_key()], 2)).await;
    let (verdict, relayed) = attest_watching_progress(&miner.url(), "honest-progress").await;
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert!(!relayed.is_empty());
    assert!(relayed.iter().all(|p| p.device < 2 && p.done <= p.total && p.total > 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_plan_takes_fewer_samples_when_the_miner_allows_fewer() {
    let limits = Limits {
        max_samples: 4,
        ..Limits::default()
    };
    let miner = miner_with_limits(76, limits).await;
    let dir = TempDir::new("samples");
    // The validator wants 8 and accepts as few as 2: it asks for the miner's 4, and passes.
    let mut config = validator_config(&dir, Policy::Sampled);
    config.min_samples = 2;
    let verdict = attestor(&config).await.attest(&miner.url(), &|_| {}).await.unwrap();
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert_eq!(verdict.samples, 4);
    // Below its floor it refuses to plan: an error, never a FAIL for an honest miner.
    config.min_samples = 5;
    let strict = attestor(&config).await;
    assert_eq!(
        plan_error(strict.attest(&miner.url(), &|_| {}).await),
        PlanError::TooFewSamples {
            max_samples: 4,
            floor: 5
        }
    );
    assert_eq!(stored_verdicts(&strict).await, 1, "only the passing verdict is stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_plan_fits_the_miners_max_duration() {
    // The validator would like 30 s of work (deadline 60 s); the miner accepts 4 s windows.
    let limits = Limits {
        max_duration_secs: 4,
        ..Limits::default()
    };
    let miner = miner_with_limits(77, limits).await;
    let dir = TempDir::new("duration");
    let mut config = validator_config(&dir, Policy::Sampled);
    config.challenge.target_seconds = 30.0;
    let verdict = attestor(&config).await.attest(&miner.url(), &|_| {}).await.unwrap();
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert!(verdict.deadline_ms <= 2_000, "deadline {} ms", verdict.deadline_ms);
    // A miner whose window cannot hold even the deadline floor is not challenged at all: the
    // floor (1.5 s) takes 5 chains, whose deadline is 1614 ms, and 3 s less the clock allowance
    // leaves 1 s.
    let tight = Limits {
        max_duration_secs: 3,
        ..Limits::default()
    };
    let miner = miner_with_limits(78, tight).await;
    assert_eq!(
        plan_error(attestor(&config).await.attest(&miner.url(), &|_| {}).await),
        PlanError::DurationOverLimit {
            max_duration_ms: 3_000,
            needed_ms: 1_614
        }
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_nonce_log_directory_stops_challenges_until_it_is_writable() {
    let root = TempDir::new("nonce-dir");
    let state = root.path("state");
    std::fs::create_dir(&state).unwrap();
    let log_path = state.join("nonces.log");
    let nonces = NonceLog::open(&log_path, gpu_attest_miner::core::now_ms()).unwrap();
    let miner = spawn_miner(miner_core_with(79, &[validator_key()], 1, Limits::default(), nonces)).await;
    let dir = TempDir::new("nonce-validator");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;

    let first = attestor.attest(&miner.url(), &|_| {}).await.unwrap();
    assert!(first.passed, "{:?}", first.reasons);
    // The state directory is moved away and a file takes its place.
    std::fs::rename(&state, root.path("moved")).unwrap();
    std::fs::write(&state, b"not a directory").unwrap();
    let err = attestor.attest(&miner.url(), &|_| {}).await.unwrap_err();
    assert!(err.to_string().contains("nonce log"), "{err}");
    assert!(err.to_string().contains("refused until"), "{err}");
    // Writable again: the miner serves, and the log at the path holds every accepted nonce.
    std::fs::remove_file(&state).unwrap();
    std::fs::create_dir(&state).unwrap();
    let second = attestor.attest(&miner.url(), &|_| {}).await.unwrap();
    assert!(second.passed, "{:?}", second.reasons);
    let text = std::fs::read_to_string(&log_path).unwrap();
    for verdict in [&first, &second] {
        assert!(
            text.contains(&verdict.nonce),
            "nonce {} lost from {text:?}",
            verdict.nonce
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_request_is_not_held_to_a_rate_a_stranger_at_the_address_spent() {
    // One request a second, two at once: the inventory and the challenge use the burst. A
    // stranger at the validator's address (a shared host, NAT or /64) then asks the miner's
    // inventory over and over on connections of its own, keeping the address's bucket empty
    // for the whole attestation. The open request comes on the connection that carried the
    // validator's signed challenge, which the address's rate does not hold: the honest miner
    // passes. (Held to it, the open request was refused three times and the miner failed with
    // `open-refused`.)
    let options = gpu_attest_miner::server::ServeOptions {
        limiter: gpu_attest_daemon::PeerRateLimiter::new(60, 2),
        ..miner_options()
    };
    let miner = spawn_miner_with(miner_core(80, &[validator_key()], 1), options).await;
    // The stranger starts once the challenge runs (the first progress event), as one timing
    // the validator would, and stops when the verdict is in.
    let (started, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let stranger = {
        let (url, started, done) = (miner.url(), started.clone(), done.clone());
        tokio::spawn(async move {
            // Bounded: at most 20 s, a request (on a new connection) every 20 ms.
            for _ in 0..1000 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                if started.load(Ordering::Relaxed)
                    && let Ok(mut client) = gpu_attest_proto::v1::miner_client::MinerClient::connect(url.clone()).await
                {
                    let _ = client
                        .get_inventory(gpu_attest_proto::v1::GetInventoryRequest::default())
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let dir = TempDir::new("drained");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let verdict = attestor
        .attest(&miner.url(), &|e| {
            if let AttestEvent::Progress(_) = e {
                started.store(true, Ordering::Relaxed);
            }
        })
        .await
        .unwrap();
    done.store(true, Ordering::Relaxed);
    stranger.await.unwrap();
    // The open request went through while the address's rate was spent: a new connection
    // from it is refused still.
    let mut client = gpu_attest_proto::v1::miner_client::MinerClient::connect(miner.url())
        .await
        .unwrap();
    let refused = client
        .get_inventory(gpu_attest_proto::v1::GetInventoryRequest::default())
        .await
        .expect_err("the address still had budget: the test proves nothing");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(verdict.passed, "{:?}", verdict.reasons);
}
