//! A daemon's run, the same for both: its transport checked, the metrics endpoint and the gRPC
//! listener bound, gRPC served until shutdown, the metrics stopped, and then the end: the gRPC
//! server's result, then any device that went out of service while it served, as the error the
//! daemon exits with. Each daemon brings only what is its own: its core, its gRPC services,
//! its listening line.

use crate::devices::{EXIT_DEVICE_FAULT, describe};
use crate::health_probe::{HealthConfig, HealthProbeError, ProbeListener};
use crate::listen::BindError;
use crate::metrics::{Endpoint, Exposition, MetricsConfig, MetricsError};
use crate::tls::{TlsFiles, TransportError};
use std::future::Future;
use std::net::SocketAddr;
use thiserror::Error;
use tokio::net::TcpListener;
use tonic::transport::ServerTlsConfig;

/// Why a daemon could not serve, or stopped: what both daemons share at the network's edge.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Health(#[from] HealthProbeError),
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

/// Where a daemon meets the network, as its config says.
#[derive(Clone, Copy, Debug)]
pub struct Network<'a> {
    pub listen: SocketAddr,
    pub tls: &'a TlsFiles,
    pub allow_plaintext: bool,
    pub metrics: &'a MetricsConfig,
    pub health: &'a HealthConfig,
}

impl Network<'_> {
    /// The gRPC server's TLS, or none: plaintext only on loopback, or where the config allows it
    /// (then with a warning in the log). Asked first, so that a bad transport stops the daemon
    /// before it loads keys or devices.
    pub fn server_tls(&self) -> Result<Option<ServerTlsConfig>, ServeError> {
        let tls = self.tls.server_config()?;
        if let Some(warning) = crate::tls::check_plaintext_server(self.listen, tls.is_some(), self.allow_plaintext)? {
            tracing::warn!("{warning}");
        }
        Ok(tls)
    }

    /// The health probe's listener, bound now (before the gRPC port, as the metrics are), or
    /// none when the config names no address.
    pub fn health_probe(&self) -> Result<Option<ProbeListener>, ServeError> {
        Ok(ProbeListener::bind(self.health)?)
    }
}

/// What one daemon serves in [`serve`].
pub struct Daemon<Expose, Announce, Grpc, Devices> {
    /// "miner" or "validator", for its last log line and its device-fault error.
    pub name: &'static str,
    /// Its metrics, read at each scrape.
    pub exposition: Expose,
    /// Logs that it listens at the bound address.
    pub announce: Announce,
    /// Serves gRPC on the bound listener until shutdown.
    pub grpc: Grpc,
    /// The devices (index, why) that went out of service while it served.
    pub out_of_service: Devices,
}

/// Binds the metrics endpoint and the gRPC listener of `network`, serves `daemon` until its
/// gRPC server returns, stops the metrics, and ends the run as [`finish`] does. The metrics
/// are bound first, so that a taken metrics port stops the daemon before it takes the gRPC one.
pub async fn serve<Expose, Announce, Grpc, Served, Devices>(
    network: Network<'_>,
    daemon: Daemon<Expose, Announce, Grpc, Devices>,
) -> Result<(), ServeError>
where
    Expose: FnOnce() -> Exposition,
    Announce: FnOnce(SocketAddr),
    Grpc: FnOnce(TcpListener) -> Served,
    Served: Future<Output = Result<(), tonic::transport::Error>>,
    Devices: FnOnce() -> Vec<(u32, String)>,
{
    let metrics = Endpoint::bind(network.metrics).await?;
    let (listener, address) = crate::listen::bind(network.listen).await?;
    (daemon.announce)(address);
    let metrics = metrics.serve(daemon.exposition);
    let served = (daemon.grpc)(listener).await;
    metrics.stop().await;
    Ok(finish(daemon.name, served, (daemon.out_of_service)())?)
}

/// Why a daemon that was serving stopped, other than being asked to.
#[derive(Debug, Error)]
pub enum Stopped {
    #[error("the gRPC server stopped: {0}")]
    Server(String),
    #[error(
        "stopped because {}; a CUDA fault cannot be cleared inside the process, so the {daemon} exits for its supervisor to restart it (exit status {EXIT_DEVICE_FAULT})",
        describe(.devices)
    )]
    DevicesOutOfService {
        daemon: &'static str,
        devices: Vec<(u32, String)>,
    },
}

/// The end of `daemon`'s run: the server's result `served`, then the devices `out_of_service`
/// (index and why) that ended it.
pub fn finish(
    daemon: &'static str,
    served: Result<(), tonic::transport::Error>,
    out_of_service: Vec<(u32, String)>,
) -> Result<(), Stopped> {
    served.map_err(|e| Stopped::Server(crate::errors::error_chain(&e)))?;
    if !out_of_service.is_empty() {
        return Err(Stopped::DevicesOutOfService {
            daemon,
            devices: out_of_service,
        });
    }
    tracing::info!("{daemon} stopped");
    Ok(())
}
