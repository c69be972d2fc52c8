//! The miner's gRPC server: the Miner service and the standard health service on one listener.

use crate::config::Limits;
use crate::core::MinerCore;
use crate::service::MinerService;
use gpu_attest_proto::transport::{PeerRateLimiter, RefusalLogLayer};
use gpu_attest_proto::v1::miner_server::MinerServer;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Server, ServerTlsConfig};

/// Largest request a miner decodes: challenges and open requests are small.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Largest message a miner sends: one opening carries an n*n matrix (64 MiB at n = 8192).
pub const MAX_RESPONSE_BYTES: usize = 72 << 20;

/// How the server meets the network: TLS (or none), request rate, concurrency.
#[derive(Clone)]
pub struct ServeOptions {
    pub tls: Option<ServerTlsConfig>,
    pub limiter: PeerRateLimiter,
    pub max_concurrent_streams: u32,
}

impl ServeOptions {
    /// Plaintext with the default limits: for loopback and tests.
    pub fn plaintext(limits: &Limits) -> Self {
        ServeOptions {
            tls: None,
            limiter: PeerRateLimiter::new(limits.requests_per_minute, limits.request_burst),
            max_concurrent_streams: limits.max_concurrent_streams,
        }
    }
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
    let limiter = options.limiter.clone();
    let miner = InterceptedService::new(miner, move |request| limiter.intercept(request));
    let mut builder = Server::builder()
        .layer(RefusalLogLayer)
        .max_concurrent_streams(options.max_concurrent_streams)
        .http2_keepalive_interval(Some(Duration::from_secs(30)));
    if let Some(tls) = options.tls {
        builder = builder.tls_config(tls)?;
    }
    // Built from descriptors embedded at compile time; should that ever fail, serve without it.
    let (reflection_v1, reflection_v1alpha) = match gpu_attest_proto::daemon::reflection_services() {
        Ok((v1, v1alpha)) => (Some(v1), Some(v1alpha)),
        Err(e) => {
            tracing::error!(error = %e, "gRPC reflection is not served");
            (None, None)
        }
    };
    let served = builder
        .add_service(health_service)
        .add_service(miner)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await;
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
