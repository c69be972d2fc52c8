//! The validator's gRPC server (Validator API + health) and its scheduler, with one shutdown.

use crate::attest::Attestor;
use crate::config::ValidatorConfig;
use crate::scheduler;
use crate::service::ValidatorService;
use gpu_attest_daemon::{PeerRateLimiter, devices, stack};
use gpu_attest_proto::v1::validator_server::ValidatorServer;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;

pub use gpu_attest_daemon::ServeOptions;

pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// The daemon's gRPC service, as the health service and reflection name it.
pub const SERVICE_NAME: &str = <ValidatorServer<ValidatorService> as tonic::server::NamedService>::NAME;
/// Calls one operator connection may have open at once: the API's calls are short.
pub const MAX_CONCURRENT_STREAMS: u32 = 64;

/// Plaintext with `config`'s request rate: for loopback and tests.
pub fn plaintext_options(config: &ValidatorConfig) -> ServeOptions {
    ServeOptions::plaintext(
        PeerRateLimiter::new(config.requests_per_minute, config.request_burst),
        MAX_CONCURRENT_STREAMS,
    )
}

/// Serves the API (and runs the scheduler when `schedule` is set) until `shutdown` completes or
/// a verification device goes out of service. The caller tells the two apart by asking the
/// attestor (see [`crate::daemon::run`]).
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
    // Every verification on a device out of service would fail until a fresh process gets it
    // back (see `gpu_attest_daemon::devices`), so the server stops.
    let probe = {
        let attestor = attestor.clone();
        move || attestor.out_of_service()
    };
    // Nothing in the validator rings the alarm: a failed verification is noticed at the next tick.
    let watch = (options.device_watch, devices::DeviceAlarm::default());
    let stop = devices::shutdown_or_device_lost::<ValidatorServer<ValidatorService>>(
        shutdown,
        probe,
        watch,
        health,
        "validator",
    );
    // Verdict watchers end their streams as the drain starts (their clients come back from the
    // last verdict they saw), rather than hold the stop for the drain limit. The scheduler is
    // told at the same moment: it starts nothing more, and its attestations in flight go on to
    // their verdicts (`scheduler::STOP_DRAIN`) while the API drains.
    let (stopping_tx, stopping) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let stop = {
        let stop_tx = stop_tx.clone();
        async move {
            stop.await;
            let _ = stopping_tx.send(true);
            let _ = stop_tx.send(true);
        }
    };
    let api =
        ValidatorServer::new(ValidatorService::new(attestor, stopping)).max_decoding_message_size(MAX_REQUEST_BYTES);
    let api = (SERVICE_NAME, Routes::new(api));
    let result = stack::serve(options, health_service, api, listener, stop).await;
    // Also when the server ended on its own, without the stop.
    let _ = stop_tx.send(true);
    if let Some(task) = scheduler {
        let _ = task.await;
    }
    result
}
