//! The validator's gRPC server (Validator API + health) and its scheduler, with one shutdown.

use crate::attest::Attestor;
use crate::scheduler;
use crate::service::ValidatorService;
use gpu_attest_proto::v1::validator_server::ValidatorServer;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// Serves the API (and runs the scheduler when `schedule` is set) until `shutdown` completes.
pub async fn serve(
    attestor: Arc<Attestor>,
    listener: TcpListener,
    schedule: Option<Duration>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let scheduler = schedule.map(|interval| tokio::spawn(scheduler::run(attestor.clone(), interval, stop_rx)));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ValidatorServer<ValidatorService>>().await;
    let result = Server::builder()
        .add_service(health_service)
        .add_service(ValidatorServer::new(ValidatorService::new(attestor)).max_decoding_message_size(MAX_REQUEST_BYTES))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await;
    let _ = stop_tx.send(true);
    if let Some(task) = scheduler {
        let _ = task.await;
    }
    result
}
