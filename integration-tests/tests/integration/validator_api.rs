//! The validator's gRPC API over a real socket: registration and key binding, attestation as a
//! stream, verdict listing with filters and paging, persistence across a restart, health.

use crate::common;

use common::*;
use gpu_attest_proto::v1::{self, attest_event::Event, validator_client::ValidatorClient};
use gpu_attest_validator::config::Policy;
use std::sync::Arc;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

async fn client(validator: &Running) -> ValidatorClient<tonic::transport::Channel> {
    ValidatorClient::connect(validator.url())
        .await
        .expect("validator reachable")
}

/// Runs AttestMiner to its end: (phases seen, progress events, verdict or final status).
async fn attest_via_api(
    client: &mut ValidatorClient<tonic::transport::Channel>,
    url: &str,
) -> (Vec<String>, usize, Result<v1::Verdict, tonic::Status>) {
    let mut stream = match client.attest_miner(v1::AttestMinerRequest { url: url.into() }).await {
        Ok(r) => r.into_inner(),
        Err(s) => return (vec![], 0, Err(s)),
    };
    let (mut phases, mut progress) = (vec![], 0);
    loop {
        match stream.message().await {
            Ok(Some(v1::AttestEvent {
                event: Some(Event::Phase(p)),
            })) => phases.push(p.name),
            Ok(Some(v1::AttestEvent {
                event: Some(Event::Progress(_)),
            })) => progress += 1,
            Ok(Some(v1::AttestEvent {
                event: Some(Event::Verdict(v)),
            })) => return (phases, progress, Ok(v)),
            Ok(_) => {
                return (
                    phases,
                    progress,
                    Err(tonic::Status::internal("stream ended without a verdict")),
                );
            }
            Err(s) => return (phases, progress, Err(s)),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn register_attest_list_and_page() {
    let dir = TempDir::new("api");
    let validator = spawn_validator(attestor(&validator_config(&dir, Policy::Sampled)).await).await;
    let miner = spawn_miner(miner_core(21, &[validator_key()], 1)).await;
    let mut api = client(&validator).await;

    let record = api
        .register_miner(v1::RegisterMinerRequest {
            url: miner.url(),
            name: "rig-1".into(),
            replace_key: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.name, "rig-1");
    assert_eq!(record.miner_key, miner_core(21, &[], 1).public_key().0.to_vec());
    let miners = api
        .list_miners(v1::ListMinersRequest {})
        .await
        .unwrap()
        .into_inner()
        .miners;
    assert_eq!(miners.len(), 1);

    for _ in 0..3 {
        let (phases, progress, verdict) = attest_via_api(&mut api, &miner.url()).await;
        let verdict = verdict.unwrap();
        assert!(verdict.passed, "{:?}", verdict.reasons);
        // The API states what the pass proved: the required operations over the measured time.
        let params = verdict.params.clone().unwrap();
        let operations = 2.0 * f64::from(params.n).powi(3) * params.num_chains as f64 * f64::from(params.iterations);
        assert_eq!(verdict.operations, operations);
        let proven = operations / (verdict.measured_ms.max(1) as f64 / 1000.0);
        assert!((verdict.proven_ops_per_sec - proven).abs() <= proven * 1e-12);
        assert_eq!(verdict.proven_ops_per_sec_per_device, verdict.proven_ops_per_sec);
        let expected = 2.0 * TEST_CPU_RATE_PER_CORE;
        assert_eq!(verdict.expected_ops_per_sec, expected);
        assert!((verdict.proven_to_expected - proven / expected).abs() < 1e-9);
        // One miner never calibrates a class: every verdict is at first contact.
        assert_eq!((verdict.rate_source.as_str(), verdict.rate_miners), ("shipped", 0));
        assert_eq!(verdict.slack, 2.0);
        // Without the memory phase (this config's), version 2's rules judged it.
        assert_eq!(verdict.protocol_version, 2);
        assert_eq!(phases.first().map(String::as_str), Some("challenge-sent"));
        assert!(phases.iter().any(|p| p == "verifying"), "{phases:?}");
        assert!(progress > 0, "no progress events");
    }

    // Two per page: 3 verdicts, newest first, over two pages.
    let page = |token: String| v1::ListVerdictsRequest {
        page_size: 2,
        page_token: token,
        ..Default::default()
    };
    let first = api.list_verdicts(page(String::new())).await.unwrap().into_inner();
    assert_eq!(first.verdicts.len(), 2);
    assert!(first.verdicts[0].id > first.verdicts[1].id);
    assert!(!first.next_page_token.is_empty());
    let second = api
        .list_verdicts(page(first.next_page_token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.verdicts.len(), 1);
    assert!(second.next_page_token.is_empty());
    let failed = v1::ListVerdictsRequest {
        passed: Some(false),
        ..Default::default()
    };
    assert!(
        api.list_verdicts(failed)
            .await
            .unwrap()
            .into_inner()
            .verdicts
            .is_empty()
    );
    let other = v1::ListVerdictsRequest {
        miner_url: "http://127.0.0.1:1".into(),
        ..Default::default()
    };
    assert!(api.list_verdicts(other).await.unwrap().into_inner().verdicts.is_empty());
    let bad_token = v1::ListVerdictsRequest {
        page_token: "not-a-token".into(),
        ..Default::default()
    };
    assert_eq!(
        api.list_verdicts(bad_token).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    let removed = api
        .remove_miner(v1::RemoveMinerRequest { url: miner.url() })
        .await
        .unwrap()
        .into_inner();
    assert!(removed.removed);
}

#[tokio::test(flavor = "multi_thread")]
async fn verdicts_and_nonces_survive_a_restart() {
    let dir = TempDir::new("restart");
    let config = validator_config(&dir, Policy::Sampled);
    let miner = spawn_miner(miner_core(22, &[validator_key()], 1)).await;
    let first = {
        let validator = spawn_validator(attestor(&config).await).await;
        attest_via_api(&mut client(&validator).await, &miner.url())
            .await
            .2
            .unwrap()
    };
    // A new validator process on the same database file.
    let attestor = attestor(&config).await;
    let validator = spawn_validator(attestor.clone()).await;
    let listed = client(&validator)
        .await
        .list_verdicts(v1::ListVerdictsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.verdicts.len(), 1);
    assert_eq!(listed.verdicts[0].nonce, first.nonce);
    assert_eq!(listed.verdicts[0].reasons, first.reasons);
    assert_eq!(attestor.store().nonce_count().await.unwrap(), 1);
    let nonce: [u8; 32] = first.nonce.as_slice().try_into().unwrap();
    assert!(
        !attestor.store().claim_nonce(&nonce, "any", 0).await.unwrap(),
        "an issued nonce could be issued again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registered_miner_that_changes_key_is_refused() {
    let dir = TempDir::new("rekey");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let validator = spawn_validator(attestor.clone()).await;
    let mut api = client(&validator).await;
    let url = {
        let miner = spawn_miner(miner_core(23, &[validator_key()], 1)).await;
        api.register_miner(v1::RegisterMinerRequest {
            url: miner.url(),
            name: String::new(),
            replace_key: false,
        })
        .await
        .unwrap();
        miner.url()
    };
    // Same address, another key.
    let address: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let listener = loop {
        match tokio::net::TcpListener::bind(address).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    };
    let core = miner_core(24, &[validator_key()], 1);
    tokio::spawn(gpu_attest_miner::server::serve(
        core,
        listener,
        miner_options(),
        std::future::pending(),
    ));
    let err = api
        .register_miner(v1::RegisterMinerRequest {
            url: url.clone(),
            name: String::new(),
            replace_key: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("replace_key"), "{}", err.message());
    let (_, _, attested) = attest_via_api(&mut api, &url).await;
    assert_eq!(attested.unwrap_err().code(), Code::FailedPrecondition);
    assert_eq!(
        attestor.store().nonce_count().await.unwrap(),
        0,
        "a challenge was issued to a re-keyed miner"
    );

    // The operator accepts the rotation explicitly; then attestation works again.
    let rotate = v1::RegisterMinerRequest {
        url: url.clone(),
        name: String::new(),
        replace_key: true,
    };
    let rotated = api.register_miner(rotate).await.unwrap().into_inner();
    assert_eq!(rotated.miner_key, miner_core(24, &[], 1).public_key().0.to_vec());
    let (_, _, attested) = attest_via_api(&mut api, &url).await;
    assert!(attested.unwrap().passed);

    // A revoked key is never challenged again, whatever the operator registers.
    let revoke = v1::RevokeMinerKeyRequest {
        miner_key: rotated.miner_key.clone(),
        reason: "key leaked".into(),
    };
    assert!(
        api.revoke_miner_key(revoke.clone())
            .await
            .unwrap()
            .into_inner()
            .newly_revoked
    );
    assert!(!api.revoke_miner_key(revoke).await.unwrap().into_inner().newly_revoked);
    let nonces_before = attestor.store().nonce_count().await.unwrap();
    let (_, _, attested) = attest_via_api(&mut api, &url).await;
    let err = attested.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("revoked"), "{}", err.message());
    assert_eq!(
        attestor.store().nonce_count().await.unwrap(),
        nonces_before,
        "a revoked key was challenged"
    );
    let again = v1::RegisterMinerRequest {
        url,
        name: String::new(),
        replace_key: true,
    };
    assert_eq!(
        api.register_miner(again).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
}

/// A validator serving its API, a client of it, and an honest miner (not yet registered).
async fn api_and_miner(
    name: &str,
    seed: u8,
) -> (TempDir, Running, ValidatorClient<tonic::transport::Channel>, Running) {
    let dir = TempDir::new(name);
    let validator = spawn_validator(attestor(&validator_config(&dir, Policy::Sampled)).await).await;
    let api = client(&validator).await;
    let miner = spawn_miner(miner_core(seed, &[validator_key()], 1)).await;
    (dir, validator, api, miner)
}

fn register(url: String, name: String) -> v1::RegisterMinerRequest {
    v1::RegisterMinerRequest {
        url,
        name,
        replace_key: false,
    }
}

/// A second URL for a registered key is either the same miner spelt another way (it would be
/// attested twice at once) or a relay that would be credited with that miner's verdicts.
#[tokio::test(flavor = "multi_thread")]
async fn one_key_is_registered_at_one_url() {
    let (_dir, _validator, mut api, miner) = api_and_miner("one-key", 26).await;
    let register = |url: String, name: &str| register(url, name.into());
    api.register_miner(register(miner.url(), "rig-1")).await.unwrap();
    let other_spelling = format!("http://localhost:{}", miner.address.port());
    for replace_key in [false, true] {
        let request = v1::RegisterMinerRequest {
            replace_key,
            ..register(other_spelling.clone(), "mallory")
        };
        let err = api.register_miner(request).await.unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
        for needle in ["already registered as \"rig-1\"", &miner.url(), "miners remove"] {
            assert!(err.message().contains(needle), "{needle}: {}", err.message());
        }
    }
    let listed = api.list_miners(v1::ListMinersRequest {}).await.unwrap().into_inner();
    assert_eq!(listed.miners.len(), 1);
    assert_eq!(listed.miners[0].name, "rig-1");
    // The same URL again only renames; a miner that moved is registered once the old URL is gone.
    api.register_miner(register(miner.url(), "rig-one")).await.unwrap();
    let removed = api
        .remove_miner(v1::RemoveMinerRequest { url: miner.url() })
        .await
        .unwrap();
    assert!(removed.into_inner().removed);
    let moved = api
        .register_miner(register(other_spelling.clone(), "rig-1"))
        .await
        .unwrap();
    assert_eq!(moved.into_inner().url, other_spelling);
}

/// What an API caller sends is shown to operators and stored: names and reasons that would
/// rewrite a terminal or outgrow a reply are refused, and so is a URL with anything beyond a
/// host and port. The refusal is short, whatever was sent, and never repeats a password.
#[tokio::test(flavor = "multi_thread")]
async fn registration_refuses_names_reasons_and_urls_it_could_not_show_plainly() {
    let (_dir, _validator, mut api, miner) = api_and_miner("caller-text", 27).await;
    for (url, name, needle) in [
        (miner.url(), "rig\u{1b}[2J".to_string(), "U+001B"),
        (miner.url(), "a\u{202E}b".to_string(), "U+202E"),
        (miner.url(), "x".repeat(900_000), "at most 128"),
        (format!("{}/", miner.url()), String::new(), "no trailing /"),
        (miner.url().replace("http", "ftp"), String::new(), "http:// or https://"),
        (
            miner.url().replace("http://", "http://admin:hunter2@"),
            String::new(),
            "user name or password",
        ),
        (format!("http://{}", "h".repeat(500_000)), String::new(), "longer than"),
    ] {
        let err = api.register_miner(register(url.clone(), name)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{url:.60}: {err:?}");
        assert!(err.message().contains(needle), "{needle}: {}", err.message());
        assert!(err.message().len() < 400, "{} bytes", err.message().len());
        assert!(!err.message().contains("hunter2"));
    }
    let revoke = v1::RevokeMinerKeyRequest {
        miner_key: vec![7; 32],
        reason: "r".repeat(513),
    };
    assert_eq!(
        api.revoke_miner_key(revoke).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let listed = api.list_miners(v1::ListMinersRequest {}).await.unwrap().into_inner();
    assert!(listed.miners.is_empty(), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_and_refusing_miners_store_no_verdict() {
    let dir = TempDir::new("refuse");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let validator = spawn_validator(attestor.clone()).await;
    let mut api = client(&validator).await;

    let (_, _, down) = attest_via_api(&mut api, "http://127.0.0.1:1").await;
    assert_eq!(down.unwrap_err().code(), Code::Unavailable);

    let (_, _, not_miner) = attest_via_api(&mut api, &validator.url()).await;
    let err = not_miner.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("not a gpu-attest miner"), "{}", err.message());

    // A miner that does not allow this validator.
    let miner = spawn_miner(miner_core(25, &[], 1)).await;
    let (_, _, refused) = attest_via_api(&mut api, &miner.url()).await;
    let err = refused.unwrap_err();
    assert!(err.message().contains("allow-list"), "{}", err.message());

    let all = api
        .list_verdicts(v1::ListVerdictsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(all.verdicts.is_empty(), "an error left a verdict behind");
}

#[tokio::test(flavor = "multi_thread")]
async fn both_daemons_serve_the_standard_health_service() {
    let dir = TempDir::new("health");
    let validator = spawn_validator(attestor(&validator_config(&dir, Policy::Sampled)).await).await;
    let miner = spawn_miner(miner_core(26, &[], 1)).await;
    for (server, service) in [(&miner, "gpu_attest.v1.Miner"), (&validator, "gpu_attest.v1.Validator")] {
        let status = health_status(&server.url(), service).await;
        assert_eq!(status, ServingStatus::Serving as i32, "{service}");
    }
}

/// The services a daemon lists through gRPC server reflection of one version (`v1`, `v1alpha`):
/// the two versions' messages are the same but live in separate modules.
macro_rules! reflected_services {
    ($version:ident, $url:expr) => {{
        use tonic_reflection::pb::$version::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let channel = tonic::transport::Endpoint::from_shared($url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = ServerReflectionClient::new(channel)
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        match answers.message().await.unwrap().unwrap().message_response {
            Some(MessageResponse::ListServicesResponse(list)) => {
                list.service.into_iter().map(|s| s.name).collect::<Vec<String>>()
            }
            other => panic!("unexpected reflection answer {other:?}"),
        }
    }};
}

#[tokio::test(flavor = "multi_thread")]
async fn both_daemons_list_their_services_through_reflection() {
    let dir = TempDir::new("reflection");
    let validator = spawn_validator(attestor(&validator_config(&dir, Policy::Sampled)).await).await;
    let miner = spawn_miner(miner_core(28, &[], 1)).await;
    for (server, service, other) in [
        (&miner, "gpu_attest.v1.Miner", "gpu_attest.v1.Validator"),
        (&validator, "gpu_attest.v1.Validator", "gpu_attest.v1.Miner"),
    ] {
        let listed = [
            ("v1", reflected_services!(v1, server.url())),
            ("v1alpha", reflected_services!(v1alpha, server.url())),
        ];
        for (version, services) in listed {
            for expected in [service, "grpc.health.v1.Health"] {
                assert!(
                    services.iter().any(|s| s == expected),
                    "{version}: {expected} not in {services:?}"
                );
            }
            // The descriptors hold both daemons' services; each lists only its own.
            assert!(
                !services.iter().any(|s| s == other),
                "{version}: {service}'s daemon lists {other}: {services:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn scheduler_attests_registered_miners_on_its_interval() {
    let dir = TempDir::new("schedule");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let miner = spawn_miner(miner_core(27, &[validator_key()], 1)).await;
    let (listener, address) = listener().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gpu_attest_validator::server::serve(
        attestor.clone(),
        listener,
        Some(gpu_attest_validator::scheduler::Schedule {
            interval: std::time::Duration::from_millis(200),
            concurrency: 2,
            jitter: 0.1,
            backoff_initial: std::time::Duration::from_secs(1),
            backoff_max: std::time::Duration::from_secs(2),
            lease: std::time::Duration::from_secs(10),
        }),
        validator_options(),
        async {
            let _ = stopped.await;
        },
    ));
    let mut api = ValidatorClient::connect(format!("http://{address}")).await.unwrap();
    api.register_miner(v1::RegisterMinerRequest {
        url: miner.url(),
        name: "scheduled".into(),
        replace_key: false,
    })
    .await
    .unwrap();
    let mut verdicts = Vec::new();
    for _ in 0..100 {
        verdicts = api
            .list_verdicts(v1::ListVerdictsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .verdicts;
        if verdicts.len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        verdicts.len() >= 2,
        "scheduler made {} attestations in 10 s",
        verdicts.len()
    );
    assert!(verdicts.iter().all(|v| v.passed && v.miner_url == miner.url()));
    // Shutdown stops the scheduler too: the server task ends.
    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}

/// A verification device out of service (a GPU that faulted and could not be reset): the
/// validator's server stops by itself, since no verification on it can succeed until a fresh
/// process gets it back (the daemon then exits with its own status for the supervisor).
#[tokio::test(flavor = "multi_thread")]
async fn a_verification_device_out_of_service_stops_the_validator() {
    let dir = TempDir::new("device-lost");
    let config = validator_config(&dir, Policy::Sampled);
    let backend = Arc::new(breakable::BreakableBackend {
        cpu: gpu_attest_shared::cpu::CpuBackend::new(2, None).unwrap(),
        broken: false.into(),
    });
    let attestor = Arc::new(gpu_attest_validator::Attestor::new(
        gpu_attest_shared::keys::KeyPair::from_seed([VALIDATOR_SEED; 32]),
        config.clone(),
        backend.clone(),
        true,
        Arc::new(
            gpu_attest_validator::store::Store::open(&config.database)
                .await
                .unwrap(),
        ),
    ));
    let (listener, address) = listener().await;
    let url = format!("http://{address}");
    let server = tokio::spawn(gpu_attest_validator::server::serve(
        attestor.clone(),
        listener,
        None,
        validator_options(),
        std::future::pending(),
    ));
    assert_eq!(
        health_status(&url, "gpu_attest.v1.Validator").await,
        ServingStatus::Serving as i32
    );
    assert!(attestor.out_of_service().is_empty());

    backend.broken.store(true, std::sync::atomic::Ordering::SeqCst);
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(15), server)
        .await
        .expect("the validator still serves 15 s after its device went out of service")
        .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
    assert_eq!(attestor.out_of_service()[0].0, 0);
    assert!(
        ValidatorClient::connect(url).await.is_err(),
        "the listener is still open"
    );
}

/// An API that answers every page of verdicts with no verdicts and a next page: what a server
/// that misbehaves (or one an attacker stands up) might send an operator's CLI.
struct EndlessEmptyPages {
    asked: Arc<std::sync::atomic::AtomicU32>,
}

#[tonic::async_trait]
impl v1::validator_server::Validator for EndlessEmptyPages {
    type AttestMinerStream = tokio_stream::Empty<Result<v1::AttestEvent, tonic::Status>>;
    type WatchVerdictsStream = tokio_stream::Empty<Result<v1::Verdict, tonic::Status>>;
    type GetTranscriptStream = tokio_stream::Empty<Result<v1::TranscriptChunk, tonic::Status>>;

    async fn get_transcript(
        &self,
        _: tonic::Request<v1::GetTranscriptRequest>,
    ) -> Result<tonic::Response<Self::GetTranscriptStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }

    async fn watch_verdicts(
        &self,
        _: tonic::Request<v1::WatchVerdictsRequest>,
    ) -> Result<tonic::Response<Self::WatchVerdictsStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }

    async fn register_miner(
        &self,
        _: tonic::Request<v1::RegisterMinerRequest>,
    ) -> Result<tonic::Response<v1::MinerRecord>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }
    async fn list_miners(
        &self,
        _: tonic::Request<v1::ListMinersRequest>,
    ) -> Result<tonic::Response<v1::ListMinersResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }
    async fn remove_miner(
        &self,
        _: tonic::Request<v1::RemoveMinerRequest>,
    ) -> Result<tonic::Response<v1::RemoveMinerResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }
    async fn list_revoked_keys(
        &self,
        _: tonic::Request<v1::ListRevokedKeysRequest>,
    ) -> Result<tonic::Response<v1::ListRevokedKeysResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }
    async fn list_rates(
        &self,
        _: tonic::Request<v1::ListRatesRequest>,
    ) -> Result<tonic::Response<v1::ListRatesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }
    async fn revoke_miner_key(
        &self,
        _: tonic::Request<v1::RevokeMinerKeyRequest>,
    ) -> Result<tonic::Response<v1::RevokeMinerKeyResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }
    async fn attest_miner(
        &self,
        _: tonic::Request<v1::AttestMinerRequest>,
    ) -> Result<tonic::Response<Self::AttestMinerStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }
    async fn list_verdicts(
        &self,
        _: tonic::Request<v1::ListVerdictsRequest>,
    ) -> Result<tonic::Response<v1::ListVerdictsResponse>, tonic::Status> {
        let asked = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        Ok(tonic::Response::new(v1::ListVerdictsResponse {
            verdicts: Vec::new(),
            next_page_token: format!("page-{asked}"),
        }))
    }
}

/// The operator's client follows the API's pages only while they hold verdicts: an empty page
/// that names a next one ends the listing instead of looping for ever.
#[tokio::test(flavor = "multi_thread")]
async fn the_operator_stops_at_an_empty_page_that_names_a_next_one() {
    let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (listener, address) = listener().await;
    let service = v1::validator_server::ValidatorServer::new(EndlessEmptyPages { asked: asked.clone() });
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut operator = gpu_attest_validator::operator::Operator::connect(
        &format!("http://{address}"),
        &gpu_attest_daemon::tls::TlsFiles::default(),
    )
    .await
    .unwrap();
    let query = gpu_attest_validator::store::VerdictFilter {
        miner_url: None,
        passed: None,
        since_ms: 0,
        before_id: None,
        limit: 100,
    };
    let verdicts = tokio::time::timeout(std::time::Duration::from_secs(10), operator.verdicts(&query))
        .await
        .expect("the listing ends")
        .unwrap();
    assert!(verdicts.is_empty());
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "asked once, not again"
    );
    server.abort();
}

/// The next verdict on a watch, within 15 s.
async fn next_watched(watch: &mut tonic::Streaming<v1::Verdict>) -> v1::Verdict {
    tokio::time::timeout(std::time::Duration::from_secs(15), watch.message())
        .await
        .expect("a verdict within 15 s")
        .expect("the watch goes on")
        .expect("the watch has not ended")
}

/// WatchVerdicts sends each verdict as it is stored, in order and once; a client that comes
/// back, after the validator restarted, with the last id it saw gets everything stored meanwhile,
/// by any validator on the database, and then the new ones.
#[tokio::test(flavor = "multi_thread")]
async fn a_verdict_watch_misses_nothing_across_a_validator_restart() {
    let dir = TempDir::new("watch");
    let config = validator_config(&dir, Policy::Sampled);
    let miner = spawn_miner(miner_core(23, &[validator_key()], 1)).await;
    let mut validator = spawn_validator(attestor(&config).await).await;
    let mut api = client(&validator).await;
    let mut watch = api
        .watch_verdicts(v1::WatchVerdictsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = attest_via_api(&mut api, &miner.url()).await.2.unwrap();
    let seen = next_watched(&mut watch).await;
    assert_eq!((seen.id, &seen.nonce), (first.id, &first.nonce));

    // The validator stops: the watch ends rather than hold the stop, and while no validator
    // serves the API another one on the same database stores two verdicts.
    validator.stop();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), watch.message()).await;
    assert!(
        matches!(ended, Ok(Ok(None)) | Ok(Err(_))),
        "the watch ended with the server: {ended:?}"
    );
    drop((watch, api));
    let other = attestor(&config).await;
    let missed = [
        other.attest(&miner.url(), &|_| {}).await.unwrap(),
        other.attest(&miner.url(), &|_| {}).await.unwrap(),
    ];

    let validator = spawn_validator(attestor(&config).await).await;
    let mut api = client(&validator).await;
    let mut watch = api
        .watch_verdicts(v1::WatchVerdictsRequest {
            after_id: Some(seen.id),
            miner_url: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    for stored in &missed {
        let got = next_watched(&mut watch).await;
        assert_eq!((got.id, hex::encode(&got.nonce)), (stored.id, stored.nonce.clone()));
    }
    // Then new ones, and only those: nothing is sent twice.
    let fourth = attest_via_api(&mut api, &miner.url()).await.2.unwrap();
    assert_eq!(next_watched(&mut watch).await.id, fourth.id);
}

/// A watch of one miner sends only its verdicts; a watch from an id replays from there.
#[tokio::test(flavor = "multi_thread")]
async fn a_verdict_watch_keeps_to_its_miner_and_replays_from_an_id() {
    let dir = TempDir::new("watch-filter");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let validator = spawn_validator(attestor.clone()).await;
    let (one, two) = (
        spawn_miner(miner_core(25, &[validator_key()], 1)).await,
        spawn_miner(miner_core(26, &[validator_key()], 1)).await,
    );
    let mut stored = Vec::new();
    for miner in [&one, &two, &one] {
        stored.push(attestor.attest(&miner.url(), &|_| {}).await.unwrap());
    }
    let mut api = client(&validator).await;
    let mut watch = api
        .watch_verdicts(v1::WatchVerdictsRequest {
            after_id: Some(0),
            miner_url: one.url(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_watched(&mut watch).await.id, stored[0].id);
    assert_eq!(next_watched(&mut watch).await.id, stored[2].id);
    let later = attestor.attest(&two.url(), &|_| {}).await.unwrap();
    let last = attestor.attest(&one.url(), &|_| {}).await.unwrap();
    let got = next_watched(&mut watch).await;
    assert_eq!(
        got.id, last.id,
        "miner two's verdict #{} was not for this watch",
        later.id
    );
    // An id this database never gave is refused, not followed silently past every verdict.
    let refused = api
        .watch_verdicts(v1::WatchVerdictsRequest {
            after_id: Some(last.id + 1_000),
            miner_url: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
}

/// One client (one address) holds at most 8 watches: the ninth is refused with a message that
/// says why, and a watch it closes gives its place back.
#[tokio::test(flavor = "multi_thread")]
async fn one_client_holds_at_most_eight_verdict_watches() {
    use gpu_attest_validator::service::MAX_WATCHERS_PER_CLIENT;
    let dir = TempDir::new("watch-bound");
    let validator = spawn_validator(attestor(&validator_config(&dir, Policy::Sampled)).await).await;
    let api = client(&validator).await;
    let watch = |mut api: ValidatorClient<tonic::transport::Channel>| async move {
        api.watch_verdicts(v1::WatchVerdictsRequest {
            after_id: None,
            miner_url: String::new(),
        })
        .await
    };
    let mut held = Vec::new();
    for _ in 0..MAX_WATCHERS_PER_CLIENT {
        held.push(watch(api.clone()).await.expect("a watch within the bound").into_inner());
    }
    let refused = watch(api.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("this client already holds 8 verdict watches"),
        "{refused:?}"
    );
    // A closed watch gives its place back as soon as its (idle) watcher sees the stream gone.
    drop(held.pop());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match watch(api.clone()).await {
            Ok(_) => break,
            Err(e) if e.code() == Code::ResourceExhausted && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(e) => panic!("the closed watch's place was not given back: {e:?}"),
        }
    }
}

/// The next verdict id the operator followed, within 20 s.
async fn next_followed(followed: &mut tokio::sync::mpsc::UnboundedReceiver<u64>) -> u64 {
    tokio::time::timeout(std::time::Duration::from_secs(20), followed.recv())
        .await
        .expect("followed within 20 s")
        .expect("still following")
}

/// `validator miners verdicts --follow`'s client: it follows the validator, and when the
/// validator restarts at its address it follows again from the last verdict it saw.
#[tokio::test(flavor = "multi_thread")]
async fn the_operator_follows_verdicts_across_a_validator_restart() {
    let dir = TempDir::new("follow");
    let config = validator_config(&dir, Policy::Sampled);
    let miner = spawn_miner(miner_core(27, &[validator_key()], 1)).await;
    let serving = attestor(&config).await;
    let (listener, address) = listener().await;
    let mut validator = spawn_validator_on(serving.clone(), listener);
    let (tx, mut followed) = tokio::sync::mpsc::unbounded_channel();
    let follow = tokio::spawn(async move {
        let mut operator = gpu_attest_validator::operator::Operator::connect(
            &format!("http://{address}"),
            &gpu_attest_daemon::tls::TlsFiles::default(),
        )
        .await
        .unwrap();
        operator.follow(Some(0), None, |v| tx.send(v.id).is_ok()).await
    });
    let first = serving.attest(&miner.url(), &|_| {}).await.unwrap();
    assert_eq!(next_followed(&mut followed).await, first.id);

    validator.stop();
    let meanwhile = attestor(&config).await.attest(&miner.url(), &|_| {}).await.unwrap();
    // Back at the same address, as a restarted daemon is.
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let _validator = spawn_validator_on(attestor(&config).await, listener);
    assert_eq!(next_followed(&mut followed).await, meanwhile.id);
    follow.abort();
}

/// A client that goes away does not stop its attestation (it runs on to its stored verdict), and
/// the next request for that miner follows it to that verdict instead of challenging the miner
/// again, which would be refused as busy.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_for_a_miner_being_attested_follows_that_attestation() {
    let dir = TempDir::new("api-follow");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let validator = spawn_validator(attestor.clone()).await;
    // Slow: it commits after the deadline, so the attestation lasts seconds.
    let miner = common::cheats::spawn_cheater(miner_core(61, &[validator_key()], 1), common::cheats::Cheat::Slow).await;

    let mut first = client(&validator).await;
    let mut abandoned = first
        .attest_miner(v1::AttestMinerRequest { url: miner.url() })
        .await
        .unwrap()
        .into_inner();
    abandoned.message().await.unwrap().expect("a first event");
    drop(abandoned);
    drop(first);

    let (phases, _, verdict) = attest_via_api(&mut client(&validator).await, &miner.url()).await;
    let verdict = verdict.unwrap_or_else(|s| panic!("the second request got {s:?} after {phases:?}"));
    assert_eq!(phases.first().map(String::as_str), Some("following"), "{phases:?}");
    let stored = stored_verdicts(&attestor).await;
    assert_eq!(stored.len(), 1, "one attestation, one verdict");
    assert_eq!(stored[0].id, verdict.id);
}
