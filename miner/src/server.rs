//! The miner's gRPC server: the Miner service and the standard health service on one listener.

use crate::core::MinerCore;
use crate::service::MinerService;
use gpu_attest_proto::v1::miner_server::MinerServer;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

/// Largest request a miner decodes: challenges and open requests are small.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Largest message a miner sends: one opening carries an n*n matrix (64 MiB at n = 8192).
pub const MAX_RESPONSE_BYTES: usize = 72 << 20;

/// Serves until `shutdown` completes, then lets in-flight calls finish.
pub async fn serve(
    core: Arc<MinerCore>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<MinerServer<MinerService>>().await;
    let miner = MinerServer::new(MinerService::new(core))
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    Server::builder()
        .add_service(health_service)
        .add_service(miner)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}
