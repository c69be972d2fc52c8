//! Hostile peers against real daemons: forged, unsigned, expired, replayed and oversized
//! challenges; foreign validators and revoked ones; commitments under another key; openings that
//! do not verify; raw garbage on the socket; request floods. Each is refused with its reason, and
//! the same daemons still serve an honest attestation afterwards.

use crate::common;

use common::cheats::{Cheat, spawn_cheater};
use common::mangled::{Mangle, spawn_mangled};
use common::pki::Pki;
use common::*;
use gpu_attest_daemon::PeerRateLimiter;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_miner::server::ServeOptions;
use gpu_attest_proto::convert::challenge_to_wire;
use gpu_attest_proto::v1::{self, miner_client::MinerClient};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::params::ChallengeParams;
use gpu_attest_shared::statement::Challenge;
use gpu_attest_validator::attest::AttestError;
use gpu_attest_validator::config::Policy;
use gpu_attest_validator::verdict::reason::ReasonCode;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

fn now() -> u64 {
    gpu_attest_miner::core::now_ms()
}

fn challenge_for(miner: PublicKey, nonce: u8) -> Challenge {
    Challenge {
        finish_by_ms: None,
        params: ChallengeParams {
            nonce: [nonce; 32],
            seed: [3; 32],
            miner_key: miner.0,
            n: 64,
            num_chains: 1,
            iterations: 1,
            checkpoint_every: 1,
        },
        issued_at_ms: now(),
        deadline_ms: now() + 10_000,
        validator_key: validator_key(),
        inventory_digest: cpu_claim(1).digest(),
        memory: None,
    }
}

fn signed(c: &Challenge) -> v1::Challenge {
    challenge_to_wire(c, &c.sign(&KeyPair::from_seed([VALIDATOR_SEED; 32])))
}

/// An honest attestation against `url` with a fresh validator database.
async fn honest_attestation_passes(url: &str) {
    let dir = TempDir::new("still-serving");
    let verdict = attestor(&validator_config(&dir, Policy::Sampled))
        .await
        .attest(url, &|_| {})
        .await
        .unwrap();
    assert!(
        verdict.passed,
        "honest attestation failed after hostile traffic: {:?}",
        verdict.reasons
    );
}

/// Sends `body` as the request message of `path`, bypassing protobuf encoding.
async fn raw_call(url: &str, path: &'static str, body: Vec<u8>) -> tonic::Status {
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    struct Raw;
    struct RawEnc;
    struct RawDec;
    impl Encoder for RawEnc {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
            bytes::BufMut::put_slice(dst, &item);
            Ok(())
        }
    }
    impl Decoder for RawDec {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
            let n = bytes::Buf::remaining(src);
            Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
        }
    }
    impl Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = RawEnc;
        type Decoder = RawDec;
        fn encoder(&mut self) -> RawEnc {
            RawEnc
        }
        fn decoder(&mut self) -> RawDec {
            RawDec
        }
    }
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(64 << 20);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    match grpc.server_streaming(tonic::Request::new(body), path, Raw).await {
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return tonic::Status::ok("stream ended"),
                    Err(status) => return status,
                }
            }
        }
        Err(status) => status,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_challenges_are_refused_and_the_miner_keeps_serving() {
    let core = miner_core(41, &[validator_key()], 1);
    let key = core.public_key();
    let miner = spawn_miner(core).await;
    let mut client = MinerClient::connect(miner.url()).await.unwrap();
    let code = |r: Result<tonic::Response<tonic::Streaming<v1::ChallengeEvent>>, tonic::Status>| match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };

    // Unsigned.
    let mut unsigned = signed(&challenge_for(key, 1));
    unsigned.signature.clear();
    assert_eq!(code(client.run_challenge(unsigned).await), Code::InvalidArgument);
    // Signed by a key other than the one it names.
    let c = challenge_for(key, 2);
    let forged = challenge_to_wire(&c, &c.sign(&KeyPair::from_seed([0x12; 32])));
    assert_eq!(code(client.run_challenge(forged).await), Code::Unauthenticated);
    // Expired.
    let mut expired = challenge_for(key, 3);
    expired.deadline_ms = now() - 1;
    assert_eq!(
        code(client.run_challenge(signed(&expired)).await),
        Code::DeadlineExceeded
    );
    // Work beyond every protocol limit.
    let mut huge = challenge_for(key, 4);
    huge.params.n = 1 << 20;
    huge.params.num_chains = u64::MAX;
    assert_eq!(code(client.run_challenge(signed(&huge)).await), Code::InvalidArgument);
    // Oversized message (3 MiB against a 1 MiB limit).
    let mut oversized = signed(&challenge_for(key, 5));
    oversized.validator_key = vec![7; 3 << 20];
    // PROTOCOL.md 14.1 pins these transport-level codes.
    let status = client.run_challenge(oversized).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // Garbage and truncated protobuf bodies.
    let garbage = raw_call(&miner.url(), "/gpu_attest.v1.Miner/RunChallenge", vec![0xff; 100]).await;
    assert_eq!(garbage.code(), Code::Internal, "{garbage:?}");
    let mut bytes = prost::Message::encode_to_vec(&signed(&challenge_for(key, 6)));
    bytes.truncate(bytes.len() / 2);
    let truncated = raw_call(&miner.url(), "/gpu_attest.v1.Miner/RunChallenge", bytes).await;
    assert_eq!(truncated.code(), Code::Internal, "{truncated:?}");
    // Not HTTP/2 at all, and an HTTP/2 preface followed by nonsense.
    for junk in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".as_slice(), &[0xde; 64]].concat(),
    ] {
        let mut socket = tokio::net::TcpStream::connect(miner.address).await.unwrap();
        socket.write_all(&junk).await.unwrap();
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), socket.read_to_end(&mut sink)).await;
    }
    // Replayed: accepted once, refused the second time.
    let once = signed(&challenge_for(key, 7));
    let mut stream = client.run_challenge(once.clone()).await.unwrap().into_inner();
    while stream.message().await.unwrap().is_some() {}
    assert_eq!(code(client.run_challenge(once).await), Code::AlreadyExists);

    honest_attestation_passes(&miner.url()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_is_refused_across_a_miner_restart() {
    let dir = TempDir::new("nonce-restart");
    let log = dir.path("nonces.log");
    let make = || {
        gpu_attest_miner::MinerCore::new(
            KeyPair::from_seed([42; 32]),
            [validator_key()].into_iter().collect(),
            gpu_attest_miner::config::Limits::default(),
            cpu_backend(1),
            Duration::from_secs(60),
            NonceLog::open(&log, now()).unwrap(),
        )
    };
    let challenge = challenge_for(KeyPair::from_seed([42; 32]).public_key(), 9);
    let signature = challenge.sign(&KeyPair::from_seed([VALIDATOR_SEED; 32]));
    drop(make().accept(challenge.clone(), &signature, now()).unwrap());
    // A new process on the same state file.
    let err = make()
        .accept(challenge, &signature, now())
        .err()
        .expect("replay accepted after restart");
    assert_eq!(tonic::Status::from(err).code(), Code::AlreadyExists);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_validator_can_neither_challenge_nor_open() {
    let core = miner_core(43, &[validator_key()], 1);
    let miner = spawn_miner(core.clone()).await;
    let dir = TempDir::new("revoked");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    assert!(attestor.attest(&miner.url(), &|_| {}).await.unwrap().passed);
    // The operator removes the validator from the allow-list (what SIGHUP reload does).
    core.set_allowed(Default::default());
    match attestor.attest(&miner.url(), &|_| {}).await {
        Err(AttestError::Refused {
            code: Code::PermissionDenied,
            ..
        }) => {}
        other => panic!("revoked validator was served: {other:?}"),
    }
    // Openings of its earlier (passed) commitment, which the miner still keeps, are refused too.
    let verdicts = attestor
        .store()
        .verdicts(&gpu_attest_validator::store::VerdictFilter {
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let nonce: [u8; 32] = hex::decode(&verdicts[0].nonce).unwrap().try_into().unwrap();
    let validator = KeyPair::from_seed([VALIDATOR_SEED; 32]);
    let samples = [gpu_attest_shared::opening::SampleRequest { chain: 0, segment: 0 }];
    let request = signed_open_request(nonce, &validator, &samples);
    let mut client = MinerClient::connect(miner.url()).await.unwrap();
    let status = client.open_chains(request.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    // Allowed again, the same request gets past the permission check and meets the next one:
    // this commitment was opened by the passing attestation, and an open request is single-use.
    // So the refusal above was the revocation.
    core.set_allowed([validator_key()].into_iter().collect());
    let status = client.open_chains(request).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn commitment_under_another_miners_key_fails() {
    let miner = spawn_cheater(miner_core(44, &[validator_key()], 1), Cheat::ForeignKey).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert_failed_with(&verdict, ReasonCode::CommitmentWrongMiner);
}

#[tokio::test(flavor = "multi_thread")]
async fn openings_with_bad_signatures_fail() {
    let miner = spawn_cheater(miner_core(45, &[validator_key()], 1), Cheat::BadOpeningSignatures).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert!(!verdict.passed);
    assert!(
        verdict.reasons.iter().all(|r| r.code == ReasonCode::OpeningSignature),
        "{:?}",
        verdict.reasons
    );
}

/// An opening is decoded only up to what the challenge's n calls for: one padded by 2 MiB at
/// n = 64 is refused while decoding, before the validator holds it.
#[tokio::test(flavor = "multi_thread")]
async fn openings_larger_than_the_challenge_needs_are_refused_while_decoding() {
    let miner = spawn_cheater(miner_core(50, &[validator_key()], 1), Cheat::OversizedOpenings).await;
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    let reason = failed_with(&verdict, ReasonCode::MalformedOpening);
    assert!(reason.message.contains("length too large"), "{reason:?}");
}

/// What a validator cannot decode (a length prefix past its limit, one that promises more than
/// follows, bytes that are no message) was sent, not refused or failed (PROTOCOL.md 14.1): a
/// challenge-stream event is a malformed commitment, whenever it comes; an opening a malformed
/// opening; an inventory makes the host no miner, with no verdict stored. A stream that ends
/// inside a message its length prefix promised reads, through tonic, as a stream that ended: for
/// the challenge stream before `Accepted`, no miner; for the openings, an opening missing.
#[tokio::test(flavor = "multi_thread")]
async fn undecodable_messages_are_malformed_never_refused() {
    let decoded = |message: &str| message.contains("could not be decoded");
    for (seed, mangle) in (70..).step_by(3).zip(Mangle::ALL) {
        let stream = spawn_mangled(
            miner_core(seed, &[validator_key()], 1),
            "/gpu_attest.v1.Miner/RunChallenge",
            mangle,
        )
        .await;
        let dir = TempDir::new("mangled-stream");
        let config = validator_config(&dir, Policy::Sampled);
        let result = attestor(&config).await.attest(&stream.url(), &|_| {}).await;
        match (mangle, result) {
            (Mangle::LyingLength, Err(AttestError::NotAMiner { detail, .. })) => {
                assert!(detail.contains("ended the challenge stream"), "{detail}");
            }
            (Mangle::LyingLength, other) => panic!("a stream ended inside its first event: {other:?}"),
            (_, Ok(verdict)) => {
                let reason = failed_with(&verdict, ReasonCode::MalformedCommitment);
                assert!(decoded(&reason.message), "{mangle:?}: {reason:?}");
            }
            (_, Err(e)) => panic!("{mangle:?}: no verdict: {e}"),
        }

        let openings = spawn_mangled(
            miner_core(seed + 1, &[validator_key()], 1),
            "/gpu_attest.v1.Miner/OpenChains",
            mangle,
        )
        .await;
        let (verdict, _dir) = attest(&openings.url(), Policy::Sampled).await;
        match mangle {
            Mangle::LyingLength => assert_failed_with(&verdict, ReasonCode::OpeningMissing),
            _ => {
                let reason = failed_with(&verdict, ReasonCode::MalformedOpening);
                assert!(decoded(&reason.message), "{mangle:?}: {reason:?}");
            }
        }
        assert!(
            !verdict.reasons.iter().any(|r| r.code == ReasonCode::OpeningFailed),
            "{mangle:?}: {:?}",
            verdict.reasons
        );

        let inventory = spawn_mangled(
            miner_core(seed + 2, &[validator_key()], 1),
            "/gpu_attest.v1.Miner/GetInventory",
            mangle,
        )
        .await;
        let dir = TempDir::new("mangled-inventory");
        let config = validator_config(&dir, Policy::Sampled);
        let result = attestor(&config).await.attest(&inventory.url(), &|_| {}).await;
        assert!(
            matches!(&result, Err(AttestError::NotAMiner { detail, .. }) if decoded(detail)),
            "{mangle:?}: {result:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_miner_that_stalls_its_openings_fails_within_a_bound() {
    let miner = spawn_cheater(miner_core(49, &[validator_key()], 1), Cheat::StallOpenings).await;
    let started = std::time::Instant::now();
    let (verdict, _dir) = attest(&miner.url(), Policy::Sampled).await;
    assert_failed_with(&verdict, ReasonCode::OpeningsTimedOut);
    // The opening budget is twice the deadline with a 10 s floor; the challenge itself takes well
    // under a second here. Without the budget this would wait forever.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "stalled for {:?}",
        started.elapsed()
    );
}

/// Connections that send nothing are never rate limited (they make no call), yet each holds a
/// file descriptor. An address gets a few at a time, silent ones give way to a newcomer (one
/// still in its handshake holds nothing yet) and are cut off, so a peer with idle sockets
/// cannot take the miner off the network, not even for a peer at its own address.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_cannot_take_the_miner_off_the_network() {
    let core = miner_core(49, &[validator_key()], 1);
    let options = ServeOptions {
        connections: gpu_attest_daemon::connections::ConnectionLimits {
            per_address: 4,
            total: 6,
            handshake_within: Duration::from_secs(3),
            silent_for: Duration::from_secs(2),
            evictable_after: Duration::from_secs(60),
        },
        ..miner_options()
    };
    let miner = spawn_miner_with(core, options).await;
    let inventory_from = |ip: &str| {
        let endpoint = tonic::transport::Endpoint::from_shared(miner.url())
            .unwrap()
            .local_address(Some(ip.parse().unwrap()))
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(2));
        async move {
            let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
            MinerClient::new(channel)
                .get_inventory(v1::GetInventoryRequest::default())
                .await
                .map_err(|s| s.to_string())
        }
    };
    let mut idle = Vec::new();
    for _ in 0..4 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        idle.push(socket.connect(miner.address).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The address holds its most, none of them quiet by the grace, yet a fifth connection from
    // it is served: it takes the place of an idle socket, still in its handshake.
    inventory_from("127.0.0.1")
        .await
        .expect("a newcomer at the idle sockets' address was kept out");
    inventory_from("127.0.0.2")
        .await
        .expect("another address is served meanwhile");
    // The idle sockets sent nothing: the miner closed them (one to make room, the others at the
    // handshake deadline, after its own SETTINGS frame), and their address is served again.
    for socket in &mut idle {
        let mut sent = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut sent)).await;
        assert!(read.is_ok(), "an idle connection was kept open");
    }
    inventory_from("127.0.0.1")
        .await
        .expect("the address is served once its idle sockets are gone");
}

/// A connection carrying an allowed validator's challenge keeps its place however many
/// strangers want it: on a full miner, a stranger at a new address every 100 ms takes the place
/// of an idle connection, never that of an attestation whose challenge runs longer than the
/// idle grace.
#[tokio::test(flavor = "multi_thread")]
async fn an_attestation_keeps_its_connection_while_strangers_crowd_the_miner() {
    let core = slow::slow_miner(48, Duration::from_secs(2));
    let options = ServeOptions {
        connections: gpu_attest_daemon::connections::ConnectionLimits {
            per_address: 4,
            total: 3,
            evictable_after: Duration::from_millis(500),
            ..Default::default()
        },
        ..miner_options()
    };
    let miner = spawn_miner_with(core, options).await;
    let address = miner.address;
    let crowd = tokio::spawn(async move {
        let mut strangers = Vec::new();
        for i in 0..40u8 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("127.0.0.{}:0", 10 + i).parse().unwrap()).unwrap();
            let Ok(mut stranger) = socket.connect(address).await else {
                continue;
            };
            let _ = stranger.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
            strangers.push(stranger);
        }
        strangers
    });
    let dir = TempDir::new("crowded");
    let mut config = validator_config(&dir, Policy::Sampled);
    config.deadline.min_ms = 10_000;
    let verdict = attestor(&config)
        .await
        .attest(&miner.url(), &|_| {})
        .await
        .expect("the attestation's connection was taken");
    assert!(verdict.passed, "{verdict:?}");
    // Strangers did get in, by taking one another's places: a stranger the miner admitted got
    // its SETTINGS frame; one closed at once got nothing. Two places were free for them.
    let mut admitted = 0;
    for mut stranger in crowd.await.unwrap() {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_millis(100), stranger.read_to_end(&mut got)).await;
        admitted += usize::from(!got.is_empty());
    }
    assert!(admitted > 2, "{admitted} strangers admitted");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_peer_is_limited_while_others_are_served() {
    let core = miner_core(46, &[validator_key()], 1);
    let options = ServeOptions {
        limiter: PeerRateLimiter::new(60, 5),
        ..gpu_attest_miner::server::plaintext_options(&gpu_attest_miner::config::Limits::default())
    };
    let miner = spawn_miner_with(core, options).await;
    let connect_from = |ip: &str| {
        let endpoint = tonic::transport::Endpoint::from_shared(miner.url())
            .unwrap()
            .local_address(Some(ip.parse().unwrap()));
        async move { MinerClient::new(endpoint.connect().await.unwrap()) }
    };
    let mut flooder = connect_from("127.0.0.1").await;
    let mut refused = 0;
    for _ in 0..20 {
        if let Err(s) = flooder.get_inventory(v1::GetInventoryRequest::default()).await {
            assert_eq!(s.code(), Code::ResourceExhausted);
            assert!(s.message().contains("rate limit"), "{}", s.message());
            refused += 1;
        }
    }
    assert_eq!(refused, 15, "burst of 5 then refusals");
    // The limit is one layer over every service: health and reflection cost the same budget,
    // so a flood of cheap health checks cannot get around it.
    let health_channel = tonic::transport::Endpoint::from_shared(miner.url())
        .unwrap()
        .local_address(Some("127.0.0.1".parse().unwrap()))
        .connect()
        .await
        .unwrap();
    let check = HealthClient::new(health_channel)
        .check(HealthCheckRequest { service: String::new() })
        .await
        .expect_err("the flooding address has spent its budget on the Miner service");
    assert_eq!(check.code(), Code::ResourceExhausted, "{check:?}");
    // Another address is unaffected.
    let mut other = connect_from("127.0.0.2").await;
    other
        .get_inventory(v1::GetInventoryRequest::default())
        .await
        .expect("second peer served");
}

#[tokio::test(flavor = "multi_thread")]
async fn honest_attestation_passes_over_tls_and_mutual_tls() {
    let pki = Pki::new();
    for mutual in [false, true] {
        let core = miner_core(47, &[validator_key()], 1);
        let tls = pki.server(mutual).server_config().unwrap();
        let options = ServeOptions { tls, ..miner_options() };
        let miner = spawn_miner_with(core, options).await;
        let url = format!("https://localhost:{}", miner.address.port());
        let dir = TempDir::new("tls");
        let mut config = validator_config(&dir, Policy::Sampled);
        config.miner_tls = pki.client(true);
        let verdict = attestor(&config).await.attest(&url, &|_| {}).await.unwrap();
        assert!(verdict.passed, "over TLS (mutual: {mutual}): {:?}", verdict.reasons);

        // Without a client certificate, a mutual-TLS miner does not even answer.
        config.miner_tls = pki.client(false);
        config.database = dir.path("second.db");
        let result = attestor(&config).await.attest(&url, &|_| {}).await;
        if mutual {
            assert!(
                matches!(
                    result,
                    Err(AttestError::Unreachable { .. } | AttestError::NotAMiner { .. })
                ),
                "{result:?}"
            );
        } else {
            assert!(result.unwrap().passed);
        }
    }
    // Plain http:// to a TLS miner fails to connect; no verdict.
    let core = miner_core(48, &[validator_key()], 1);
    let miner = spawn_miner_with(
        core,
        ServeOptions {
            tls: pki.server(false).server_config().unwrap(),
            ..miner_options()
        },
    )
    .await;
    let dir = TempDir::new("tls-plain");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    assert!(attestor.attest(&miner.url(), &|_| {}).await.is_err());
    assert!(attestor.store().verdicts(&Default::default()).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn validator_refuses_plaintext_to_remote_miners_unless_allowed() {
    let dir = TempDir::new("plaintext");
    let config = validator_config(&dir, Policy::Sampled);
    // .invalid never resolves: the refusal comes before any connection is attempted.
    let err = attestor(&config)
        .await
        .attest("http://gpu-host.invalid:7070", &|_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, AttestError::Transport(_)), "{err:?}");
    assert!(err.to_string().contains("allow_plaintext_miners"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn validator_api_over_mutual_tls_survives_garbage() {
    let pki = Pki::new();
    let dir = TempDir::new("api-tls");
    let attestor = attestor(&validator_config(&dir, Policy::Sampled)).await;
    let (listener, address) = listener().await;
    let options = gpu_attest_validator::server::ServeOptions {
        tls: pki.server(true).server_config().unwrap(),
        ..validator_options()
    };
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(gpu_attest_validator::server::serve(
        attestor,
        listener,
        None,
        options,
        async {
            let _ = stopped.await;
        },
    ));
    // Garbage first: plaintext HTTP/1 and random bytes on the TLS port.
    for junk in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        vec![0x16, 0x03, 0x01, 0xff, 0xff, 0x00],
    ] {
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        socket.write_all(&junk).await.unwrap();
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), socket.read_to_end(&mut sink)).await;
    }
    let url = format!("https://localhost:{}", address.port());
    let connect = |with_cert: bool| {
        let tls = pki.client(with_cert).client_config(&url).unwrap();
        let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
            .unwrap()
            .tls_config(tls)
            .unwrap();
        async move { endpoint.connect().await }
    };
    // Without a client certificate the call fails; with one it is served.
    let refused = match connect(false).await {
        Err(_) => true,
        Ok(channel) => v1::validator_client::ValidatorClient::new(channel)
            .list_verdicts(v1::ListVerdictsRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");
    let mut api = v1::validator_client::ValidatorClient::new(connect(true).await.unwrap());
    let listed = api
        .list_verdicts(v1::ListVerdictsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.verdicts.is_empty());
}
