//! The one gRPC server stack both daemons run: their services, the standard health service and
//! server reflection on one listener, behind the same layers (refusal log, call tracking, the
//! per-peer rate limit, and the request intake's deadline and memory budget, over every
//! service) with the same TLS and connection limits; and the health service alone on the
//! probe's listener, where one is configured ([`crate::health_probe`]).

use crate::connections::{self, ConnectionLimits};
use crate::health_probe::ProbeListener;
use crate::rate_limit::PeerRateLimiter;
use crate::refusal_log::RefusalLogLayer;
use crate::requests::RequestIntake;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::{Server, ServerTlsConfig};
use tonic_health::pb::health_server::{Health, HealthServer};

/// How a daemon meets the network: TLS (or none), request rate per address, concurrency.
#[derive(Clone)]
pub struct ServeOptions {
    pub tls: Option<ServerTlsConfig>,
    pub limiter: PeerRateLimiter,
    /// HTTP/2 streams (calls) one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// How long in-flight calls may run once shutdown begins; then the server stops anyway.
    pub drain_limit: Duration,
    /// Connections held at once, how long a silent one lives, when an idle one gives way.
    pub connections: ConnectionLimits,
    /// How long a request may take to arrive, and how much unfinished requests may hold.
    pub requests: RequestIntake,
    /// How often the daemon asks its backend for devices out of service, besides when a
    /// refusal rings its [`crate::devices::DeviceAlarm`].
    pub device_watch: Duration,
    /// Where the health service is also served alone, in plaintext, for a supervisor's probe.
    pub health_probe: Option<ProbeListener>,
}

/// The default [`ServeOptions::drain_limit`]: long enough for a challenge's commitment to go
/// out, and shorter than the systemd units' `TimeoutStopSec=30`, so that the daemon stops on
/// its own terms. Without a limit a peer holding a stream open (a health `Watch` never ends)
/// would keep a daemon that must restart, after a device fault, from ever exiting.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(25);

impl ServeOptions {
    /// Plaintext, for loopback and tests.
    pub fn plaintext(limiter: PeerRateLimiter, max_concurrent_streams: u32) -> Self {
        ServeOptions {
            tls: None,
            limiter,
            max_concurrent_streams,
            drain_limit: DRAIN_LIMIT,
            connections: ConnectionLimits::default(),
            requests: RequestIntake::default(),
            device_watch: crate::devices::WATCH_INTERVAL,
            health_probe: None,
        }
    }
}

/// Idle connections are pinged this often, so that a peer that vanished without closing its
/// connection (a host powered off, a cable pulled) is noticed and its streams released.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// Serves `api` (the service named `api_name`) and `health` (and reflection over both) on
/// `listener` until `shutdown` completes, then lets in-flight calls finish for up to
/// `options.drain_limit`, or until a second interrupt (SIGINT or SIGTERM) says not to wait.
pub async fn serve<H: Health>(
    options: ServeOptions,
    health: HealthServer<H>,
    (api_name, api): (&'static str, Routes),
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let tls = options.tls.is_some();
    // The probe answers from the same reporter; it stops with the server (aborted below).
    let probe = options.health_probe.as_ref().map(|probe| probe.spawn(health.clone()));
    let mut server = Server::builder()
        .max_concurrent_streams(options.max_concurrent_streams)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    if let Some(tls) = options.tls {
        server = server.tls_config(tls)?;
    }
    let (incoming, calls) = connections::guarded(listener, options.connections, tls);
    // Outermost first: the refusal log also sees the calls the rate limit and the request
    // intake refuse; the call tracking finds each call's connection before the rate limit and
    // the intake ask whether it is a trusted peer's (a refused call never holds a connection).
    let mut server = server
        .layer(RefusalLogLayer)
        .layer(calls)
        .layer(options.limiter)
        .layer(options.requests);
    let mut routes = api.add_service(health);
    // Built from descriptors embedded at compile time; should that ever fail, serve without it.
    match reflection_services(api_name) {
        Ok((v1, v1alpha)) => routes = routes.add_service(v1).add_service(v1alpha),
        Err(e) => tracing::error!(error = %e, "gRPC reflection is not served"),
    }
    let (draining, drain_started) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = draining.send(());
    };
    let served = server
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown);
    let drain_limit = options.drain_limit;
    let drain_over = async move {
        if drain_started.await.is_err() {
            // The server ended without a shutdown: the other branch has its result.
            return std::future::pending().await;
        }
        tracing::info!(
            seconds = drain_limit.as_secs_f64(),
            "open calls have up to the drain limit to finish; interrupt again (Ctrl-C or SIGTERM) to stop now"
        );
        tokio::select! {
            () = tokio::time::sleep(drain_limit) => tracing::warn!(
                seconds = drain_limit.as_secs_f64(),
                "calls still open after the drain limit; stopping without them"
            ),
            () = crate::signals::interrupted() => {
                tracing::warn!("interrupted again: stopping now, without the calls still open");
            }
        }
    };
    let result = tokio::select! {
        result = served => result,
        () = drain_over => Ok(()),
    };
    if let Some(probe) = probe {
        probe.abort();
    }
    result
}

/// gRPC server reflection over the service `api_name`, the health service and reflection
/// itself, in both versions (v1, and the v1alpha that many clients, grpcurl among them, still
/// ask for), so that generic clients work without the .proto files. The other daemon's service
/// shares the descriptors but is not listed: this daemon does not serve it.
fn reflection_services(
    api_name: &'static str,
) -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(gpu_attest_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(api_name)
            .with_service_name("grpc.health.v1.Health")
            .with_service_name("grpc.reflection.v1.ServerReflection")
            .with_service_name("grpc.reflection.v1alpha.ServerReflection")
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}
