//! The miner's gRPC server: the Miner service and the standard health service on one listener.

use crate::config::Limits;
use crate::core::MinerCore;
use crate::service::MinerService;
use gpu_attest_daemon::{PeerRateLimiter, stack};
use gpu_attest_proto::v1::miner_server::MinerServer;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::service::Routes;

pub use gpu_attest_daemon::ServeOptions;

/// Largest request a miner decodes: challenges and open requests are small.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Largest message a miner sends: one opening carries an n*n matrix (64 MiB at n = 8192).
pub const MAX_RESPONSE_BYTES: usize = 72 << 20;

/// Plaintext with `limits`' rate and concurrency: for loopback and tests.
pub fn plaintext_options(limits: &Limits) -> ServeOptions {
    ServeOptions::plaintext(
        PeerRateLimiter::new(limits.requests_per_minute, limits.request_burst),
        limits.max_concurrent_streams,
    )
}

/// Serves until `shutdown` completes, then lets in-flight calls finish.
pub async fn serve(
    core: Arc<MinerCore>,
    listener: TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<MinerServer<MinerService>>().await;
    let watch = tokio::spawn(watch_devices(core.clone(), health));
    let miner = MinerServer::new(MinerService::new(core))
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    let served = stack::serve(options, health_service, Routes::new(miner), listener, shutdown).await;
    watch.abort();
    served
}

/// How often the health service looks for devices out of service.
const DEVICE_WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// Sets the Miner service NOT_SERVING, with one error line, once a device goes out of service
/// (it faulted and could not be reset; see the CUDA backend). Challenges are refused from then
/// on with the reason; health tells load balancers and operators without sending one.
async fn watch_devices(core: Arc<MinerCore>, health: tonic_health::server::HealthReporter) {
    let mut ticks = tokio::time::interval(DEVICE_WATCH_INTERVAL);
    loop {
        ticks.tick().await;
        let out_of_service = core.backend().backend.out_of_service();
        if !out_of_service.is_empty() {
            for (device, reason) in &out_of_service {
                tracing::error!(device, %reason, "device out of service: the miner takes no more challenges until it is restarted");
            }
            health.set_not_serving::<MinerServer<MinerService>>().await;
            return;
        }
    }
}
