//! The validator's gRPC server (Validator API + health) and its scheduler, with one shutdown.

use crate::attest::Attestor;
use crate::config::ValidatorConfig;
use crate::scheduler;
use crate::service::ValidatorService;
use gpu_attest_proto::transport::{PeerRateLimiter, RefusalLogLayer};
use gpu_attest_proto::v1::validator_server::ValidatorServer;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Server, ServerTlsConfig};

pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// How the API meets the network: TLS (or none) and the request rate per address.
#[derive(Clone)]
pub struct ServeOptions {
    pub tls: Option<ServerTlsConfig>,
    pub limiter: PeerRateLimiter,
}

impl ServeOptions {
    pub fn plaintext(config: &ValidatorConfig) -> Self {
        ServeOptions {
            tls: None,
            limiter: PeerRateLimiter::new(config.requests_per_minute, config.request_burst),
        }
    }
}

/// Serves the API (and runs the scheduler when `schedule` is set) until `shutdown` completes.
pub async fn serve(
    attestor: Arc<Attestor>,
    listener: TcpListener,
    schedule: Option<scheduler::Schedule>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let scheduler = schedule.map(|schedule| tokio::spawn(scheduler::run(attestor.clone(), schedule, stop_rx)));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ValidatorServer<ValidatorService>>().await;
    let api = ValidatorServer::new(ValidatorService::new(attestor)).max_decoding_message_size(MAX_REQUEST_BYTES);
    let limiter = options.limiter.clone();
    let api = InterceptedService::new(api, move |request| limiter.intercept(request));
    let mut builder = Server::builder().layer(RefusalLogLayer).max_concurrent_streams(64);
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
    let result = builder
        .add_service(health_service)
        .add_service(api)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await;
    let _ = stop_tx.send(true);
    if let Some(task) = scheduler {
        let _ = task.await;
    }
    result
}
