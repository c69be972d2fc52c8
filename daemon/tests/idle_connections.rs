//! Idle connections give way to newcomers on a real server, while busy ones keep their place.
//!
//! The service here is a stand-in for the miner's: its challenge stream holds its connection,
//! as the miner's does for an allowed validator, and stays open until the client drops it, which
//! is a call running for as long as a test needs one.

use gpu_attest_daemon::connections::{ConnectionLimits, hold_connection_while_handling, holds_connection};
use gpu_attest_daemon::rate_limit::PeerRateLimiter;
use gpu_attest_daemon::requests::RequestIntake;
use gpu_attest_daemon::stack::{self, ServeOptions};
use gpu_attest_proto::v1;
use gpu_attest_proto::v1::miner_client::MinerClient;
use gpu_attest_proto::v1::miner_server::{Miner, MinerServer};
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_stream::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

type Events<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

struct StandIn;

#[tonic::async_trait]
impl Miner for StandIn {
    type RunChallengeStream = Events<v1::ChallengeEvent>;
    type OpenChainsStream = Events<v1::ChainOpening>;
    type WalkStatesStream = Events<v1::DeviceWalkRoot>;
    type WalkLinesStream = Events<v1::DeviceWalkRoot>;
    type OpenLinesStream = Events<v1::LocalityOpening>;

    /// Answers at once, or, for a request marked `slow` (a registration probing a slow miner),
    /// after SLOW_CALL: holding its connection meanwhile if it is also marked `held`.
    async fn get_inventory(
        &self,
        request: Request<v1::GetInventoryRequest>,
    ) -> Result<Response<v1::Inventory>, Status> {
        let marked = |key: &str| request.metadata().contains_key(key);
        if marked("slow") {
            let _held = marked("held")
                .then(|| hold_connection_while_handling(request.extensions()))
                .flatten();
            tokio::time::sleep(SLOW_CALL).await;
        }
        Ok(Response::new(v1::Inventory::default()))
    }

    async fn run_challenge(&self, _: Request<v1::Challenge>) -> Result<Response<Self::RunChallengeStream>, Status> {
        Ok(holds_connection(Response::new(Box::pin(tokio_stream::pending()))))
    }

    async fn open_chains(&self, _: Request<v1::OpenChainsRequest>) -> Result<Response<Self::OpenChainsStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn walk_pool(&self, _: Request<v1::WalkRequest>) -> Result<Response<v1::WalkStatement>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn walk_states(&self, _: Request<v1::WalkRequest>) -> Result<Response<Self::WalkStatesStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn walk_lines(&self, _: Request<v1::LocalityRequest>) -> Result<Response<Self::WalkLinesStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn open_lines(&self, _: Request<v1::OpenLinesRequest>) -> Result<Response<Self::OpenLinesStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

const GRACE: Duration = Duration::from_millis(400);
/// A unary call that outlasts the grace by far, yet answers within the client's timeout.
const SLOW_CALL: Duration = Duration::from_millis(1_500);

/// Serves the stand-in on a port-0 listener with room for `total` connections in all.
async fn serve(total: usize) -> SocketAddr {
    serve_with(total, RequestIntake::default()).await
}

/// [`serve`], holding requests to `requests`.
async fn serve_with(total: usize, requests: RequestIntake) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let options = ServeOptions {
        connections: ConnectionLimits {
            per_address: 16,
            total,
            handshake_within: Duration::from_secs(10),
            silent_for: Duration::from_secs(60),
            evictable_after: GRACE,
        },
        requests,
        ..ServeOptions::plaintext(PeerRateLimiter::new(60_000, 1_000), 16)
    };
    let (_reporter, health) = tonic_health::server::health_reporter();
    let api = ("gpu_attest.v1.Miner", Routes::new(MinerServer::new(StandIn)));
    tokio::spawn(stack::serve(options, health, api, listener, std::future::pending()));
    address
}

async fn client(address: SocketAddr) -> Result<MinerClient<tonic::transport::Channel>, tonic::transport::Error> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .timeout(Duration::from_secs(2))
        .connect()
        .await?;
    Ok(MinerClient::new(channel))
}

/// A new client's inventory call, and the client, kept connected.
async fn inventory(address: SocketAddr) -> Result<MinerClient<tonic::transport::Channel>, String> {
    let mut miner = client(address).await.map_err(|e| e.to_string())?;
    miner
        .get_inventory(v1::GetInventoryRequest::default())
        .await
        .map_err(|s| s.to_string())?;
    Ok(miner)
}

/// A peer that completes the HTTP/2 preface and then never calls.
async fn idle_peer(address: SocketAddr) -> TcpStream {
    let mut peer = TcpStream::connect(address).await.unwrap();
    peer.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    peer.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap(); // an empty SETTINGS frame
    peer
}

/// Whether the server has closed `peer`'s connection, reading what it sent until then.
async fn closed_by_server(peer: &mut TcpStream) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), peer.read_to_end(&mut sink))
        .await
        .is_ok()
}

#[tokio::test]
async fn a_newcomer_takes_the_place_of_an_idle_connection_never_a_busy_one() {
    let address = serve(2).await;
    let mut busy = client(address).await.unwrap();
    let mut challenge = busy.run_challenge(v1::Challenge::default()).await.unwrap().into_inner();
    let mut idle = idle_peer(address).await;

    // Both connections are fresh: the table is full and nothing may give way yet.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(inventory(address).await.is_err(), "a third connection got in");

    tokio::time::sleep(GRACE + Duration::from_millis(200)).await;
    let _newcomer = inventory(address)
        .await
        .expect("the newcomer did not get the idle connection's place");
    assert!(closed_by_server(&mut idle).await, "the idle connection is still open");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), challenge.message())
            .await
            .is_err(),
        "the busy connection's stream ended"
    );

    // The newcomer's connection has just been used, the other is busy: no room.
    assert!(inventory(address).await.is_err(), "a recently used connection gave way");
    // Once it has been quiet for the grace, it gives way in turn.
    tokio::time::sleep(GRACE + Duration::from_millis(200)).await;
    let _next = inventory(address).await.expect("the quiet connection did not give way");
    drop(challenge);
}

/// A slow unary call, whose response (and so any mark on it) comes only at its end, keeps its
/// connection only if its handler holds it: unheld, the connection is quiet meanwhile and
/// gives way, and the call is lost.
#[tokio::test]
async fn a_slow_unary_call_keeps_its_connection_only_if_its_handler_holds_it() {
    for held in [true, false] {
        let address = serve(1).await;
        let mut caller = client(address).await.unwrap();
        let call = tokio::spawn(async move {
            let mut request = Request::new(v1::GetInventoryRequest::default());
            request.metadata_mut().insert("slow", "1".parse().unwrap());
            if held {
                request.metadata_mut().insert("held", "1".parse().unwrap());
            }
            caller.get_inventory(request).await.map(|_| ())
        });
        tokio::time::sleep(GRACE + Duration::from_millis(300)).await;
        let newcomer = inventory(address).await;
        let outcome = call.await.unwrap();
        if held {
            assert!(newcomer.is_err(), "a held call's connection gave way");
            outcome.expect("the held call failed");
        } else {
            assert!(newcomer.is_ok(), "an unheld, quiet connection kept its place");
            assert!(outcome.is_err(), "the call survived its connection being closed");
        }
    }
}

/// A health `Watch` never ends, so it does not hold its connection's place: otherwise a peer
/// could keep connections for good with one watch each.
#[tokio::test]
async fn a_health_watch_does_not_hold_its_connection() {
    let address = serve(1).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest { service: String::new() })
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().expect("the first status");
    tokio::time::sleep(GRACE + Duration::from_millis(200)).await;
    let _newcomer = inventory(address)
        .await
        .expect("the watching connection kept its place");
    let ended = tokio::time::timeout(Duration::from_secs(3), watch.message())
        .await
        .expect("the watch was not ended");
    assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
}

/// A call whose headers came but whose message never does has not started running: it does
/// not hold the connection's place, though its method's response would.
#[tokio::test]
async fn a_call_whose_message_never_comes_does_not_hold_its_connection() {
    let address = serve(1).await;
    let tcp = TcpStream::connect(address).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = tonic::codegen::http::Request::post(format!("http://{address}/gpu_attest.v1.Miner/RunChallenge"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, _stalled_body) = h2.send_request(request, false).unwrap();
    tokio::time::sleep(GRACE + Duration::from_millis(200)).await;
    let _newcomer = inventory(address)
        .await
        .expect("the stalled call kept its connection's place");
    let answered = tokio::time::timeout(Duration::from_secs(3), response)
        .await
        .expect("the stalled connection was not closed");
    assert!(answered.is_err(), "{answered:?}");
}

/// A request whose message stops one byte short is not held for as long as its peer likes: at
/// the intake's deadline its call ends with DEADLINE_EXCEEDED, and the memory it held is given
/// back. (Before, a peer pinned 1 MiB per stream this way for as long as it answered pings.)
#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_never_arrives_whole_ends_at_the_deadline() {
    let intake = RequestIntake::new(Duration::from_millis(500), 64 << 20);
    let address = serve_with(4, intake.clone()).await;
    let tcp = TcpStream::connect(address).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = tonic::codegen::http::Request::post(format!("http://{address}/gpu_attest.v1.Miner/GetInventory"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = h2.send_request(request, false).unwrap();
    // A gRPC frame that promises 64 KiB, and 64 KiB less one byte of it.
    let mut frame = vec![0u8, 0, 1, 0, 0];
    frame.resize(5 + (64 << 10) - 1, 7);
    body.reserve_capacity(frame.len());
    body.send_data(frame.into(), false).unwrap();
    let started = std::time::Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("the unfinished request was held past its deadline")
        .unwrap();
    // tonic answers with the status in the headers (a trailers-only response) or the trailers.
    let status = match response.headers().get("grpc-status") {
        Some(status) => status.clone(),
        None => {
            let mut body = response.into_body();
            while body.data().await.is_some() {}
            body.trailers().await.unwrap().unwrap()["grpc-status"].clone()
        }
    };
    assert_eq!(status, "4", "DEADLINE_EXCEEDED");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        intake.unfinished_bytes(),
        0,
        "the unfinished request's bytes were given back"
    );
}
