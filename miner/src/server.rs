//! The miner's gRPC server: the Miner service and the standard health service on one listener.

use crate::config::Limits;
use crate::core::MinerCore;
use crate::service::MinerService;
use gpu_attest_daemon::{PeerRateLimiter, devices, stack};
use gpu_attest_proto::v1::miner_server::MinerServer;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::service::Routes;

pub use gpu_attest_daemon::ServeOptions;

/// Largest request a miner decodes: challenges and open requests are small.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// The daemon's gRPC service, as the health service and reflection name it.
pub const SERVICE_NAME: &str = <MinerServer<MinerService> as tonic::server::NamedService>::NAME;
/// Largest message a miner sends: one opening carries an n*n matrix (64 MiB at n = 8192).
pub const MAX_RESPONSE_BYTES: usize = 72 << 20;

/// Plaintext with `limits`' rate and concurrency: for loopback and tests.
pub fn plaintext_options(limits: &Limits) -> ServeOptions {
    ServeOptions {
        drain_limit: DRAIN_AFTER_SETTLING,
        ..ServeOptions::plaintext(
            PeerRateLimiter::new(limits.requests_per_minute, limits.request_burst),
            limits.max_concurrent_streams,
        )
    }
}

/// How long a stopping miner waits for its challenge in flight to be committed and opened
/// ([`MinerCore::settle`]) before it stops serving; with the drain that follows
/// ([`DRAIN_AFTER_SETTLING`]) within the systemd unit's 30 s stop timeout.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(15);

/// The drain once settled: nothing of the miner's own should be left running by then.
pub const DRAIN_AFTER_SETTLING: Duration = Duration::from_secs(10);

/// Serves until `shutdown` completes or a device goes out of service, then lets in-flight
/// calls finish. On `shutdown` the miner first refuses new challenges and settles (see
/// [`SETTLE_LIMIT`]); a lost device stops it at once, since no work can finish. The caller
/// tells the two apart by asking the backend for devices out of service (see
/// [`crate::daemon::run`]).
pub async fn serve(
    core: Arc<MinerCore>,
    listener: TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<MinerServer<MinerService>>().await;
    // Challenges are refused with the reason once a device is out of service; the server stops
    // because only a fresh process gets the device back (see `gpu_attest_daemon::devices`).
    let probe = {
        let core = core.clone();
        move || core.backend().backend.out_of_service()
    };
    let settled = {
        let core = core.clone();
        async move {
            shutdown.await;
            tracing::info!(
                seconds = SETTLE_LIMIT.as_secs(),
                "stopping: new challenges are refused; the one in flight finishes and is opened first"
            );
            if !core.settle(SETTLE_LIMIT).await {
                tracing::warn!(
                    seconds = SETTLE_LIMIT.as_secs(),
                    "work still running after the settling limit; stopping anyway"
                );
            }
        }
    };
    let watch = (options.device_watch, core.device_alarm().clone());
    let stop = devices::shutdown_or_device_lost::<MinerServer<MinerService>>(settled, probe, watch, health, "miner");
    let miner = MinerServer::new(MinerService::new(core))
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    let api = (SERVICE_NAME, Routes::new(miner));
    // Boxed: the server's future is large, and callers spawn or await this one.
    Box::pin(stack::serve(options, health_service, api, listener, stop)).await
}
