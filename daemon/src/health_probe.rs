//! The health probe: the standard gRPC health service (`grpc.health.v1.Health`) alone, in
//! plaintext, on a listener of its own, and the `health` command that asks it.
//!
//! A supervisor's probe (a container's `HEALTHCHECK`, an orchestrator's gRPC probe) runs beside
//! the daemon, not as one of its peers: on the gRPC port a miner with mutual TLS would refuse it
//! for want of a client certificate, and a probe holding one would be a credential left in every
//! container. The probe's listener serves nothing but the health answers (the same ones the gRPC
//! port gives, from the same reporter, so a device out of service shows as `NOT_SERVING` here
//! too), and like the metrics endpoint it listens on loopback unless the operator allows more.

use crate::exit::Answer;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};

/// Where the probe is served. The daemons' `[health]` table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Serve the gRPC health service alone, in plaintext, on this address; unset: not served
    /// (the gRPC port serves it either way). Port 0 picks a free port and logs it.
    pub listen: Option<SocketAddr>,
    /// Allow a non-loopback `listen` address (an orchestrator probing from outside the host or
    /// container; the answers say only whether the daemon serves).
    pub allow_remote: bool,
}

#[derive(Debug, Error)]
pub enum HealthProbeError {
    #[error(
        "refusing to serve the health probe in plaintext on {0}: use a loopback address, or set [health] allow_remote = true for a prober outside this host"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot listen for health probes on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// The probe's bound listener, shared by the clones of a daemon's serve options; the server
/// takes a handle of its own when it starts.
#[derive(Clone, Debug)]
pub struct ProbeListener {
    listener: Arc<std::net::TcpListener>,
    address: SocketAddr,
}

impl ProbeListener {
    /// Binds `config.listen`, or nothing when it is unset. A daemon binds it before its gRPC
    /// listener, so that a taken port stops the daemon before it says it is listening.
    pub fn bind(config: &HealthConfig) -> Result<Option<ProbeListener>, HealthProbeError> {
        let Some(address) = config.listen else { return Ok(None) };
        if !address.ip().is_loopback() && !config.allow_remote {
            return Err(HealthProbeError::NotLoopback(address));
        }
        let bind_error = |source| HealthProbeError::Bind { address, source };
        let listener = std::net::TcpListener::bind(address).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let address = listener.local_addr().map_err(bind_error)?;
        Ok(Some(ProbeListener {
            listener: Arc::new(listener),
            address,
        }))
    }

    /// The address it got (the real port when the config asked for 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves `health` on the listener until the task is aborted (the daemon's server does so
    /// when it stops). A listener that cannot be handed to the runtime is logged, not fatal: the
    /// gRPC port still answers health checks.
    pub fn spawn<H: Health>(&self, health: HealthServer<H>) -> tokio::task::JoinHandle<()> {
        let handle = self.listener.try_clone().and_then(tokio::net::TcpListener::from_std);
        let address = self.address;
        tokio::spawn(async move {
            let listener = match handle {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::error!(%address, error = %e, "the health probe is not served");
                    return;
                }
            };
            tracing::info!(%address, "health probe served (grpc.health.v1, plaintext)");
            // Few connections, kept as the gRPC port keeps its own: a prober holding `Watch`
            // streams or silent connections gives way to the next, and never takes the
            // descriptors the daemon's peers need.
            let (incoming, calls) = crate::connections::guarded(listener, PROBE_CONNECTIONS, false);
            let served = tonic::transport::Server::builder()
                .timeout(PROBE_TIMEOUT)
                .max_concurrent_streams(4)
                .layer(calls)
                .add_service(health)
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = served {
                tracing::error!(%address, error = %crate::errors::error_chain(&e), "the health probe stopped");
            }
        })
    }
}

/// The probe's connections: a supervisor needs one at a time.
const PROBE_CONNECTIONS: crate::connections::ConnectionLimits = crate::connections::ConnectionLimits {
    per_address: 8,
    total: 16,
    handshake_within: Duration::from_secs(10),
    silent_for: Duration::from_secs(75),
    evictable_after: Duration::from_secs(10),
};

/// How long the `health` command waits to connect, and then for the answer: well inside the
/// usual probe timeouts (a container's `HEALTHCHECK` defaults to 30 s), so that a hung daemon
/// is reported as such by the command, not by the prober killing it.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the `health` command could not get an answer.
#[derive(Debug, Error)]
pub enum ProbeError {
    #[error(
        "no health probe address: set [health] listen in the daemon's config file (the one the daemon runs with), or pass --address"
    )]
    NoAddress,
    #[error(
        "the health probe listens on port 0, a port picked at start that the command cannot know: pass --address with the port the daemon logged"
    )]
    PickedPort,
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
}

/// The address the `health` command asks: `flag` when given, else the config's `[health]
/// listen`, where a wildcard address (`0.0.0.0`, `::`) is reached on loopback.
pub fn probe_address(flag: Option<SocketAddr>, config: &HealthConfig) -> Result<SocketAddr, ProbeError> {
    let mut address = flag.or(config.listen).ok_or(ProbeError::NoAddress)?;
    if address.port() == 0 {
        return Err(ProbeError::PickedPort);
    }
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(address)
}

/// Asks the health probe at `address` whether the daemon serves `service` (its gRPC service's
/// full name), and prints the answer on one line: `SERVING`, or why not. Serving is
/// [`Answer::Yes`] (exit status 0); anything else, no answer within [`PROBE_TIMEOUT`] included,
/// is [`Answer::No`] (status 1, "unhealthy" to a container runtime).
pub fn check(address: SocketAddr, service: &str) -> Result<Answer, ProbeError> {
    // The one-shot commands' runtime: a write to a probe that reset its connection is an error
    // for the call, not a SIGPIPE ending the command without its line.
    let runtime = crate::signals::one_shot_runtime().map_err(ProbeError::Runtime)?;
    // One bound on the whole question, connecting included.
    let answer = runtime.block_on(async {
        tokio::time::timeout(PROBE_TIMEOUT, ask(address, service))
            .await
            .unwrap_or_else(|_| Err(format!("no answer from {address} within {} s", PROBE_TIMEOUT.as_secs())))
    });
    match answer {
        Ok(ServingStatus::Serving) => {
            println!("SERVING");
            Ok(Answer::Yes)
        }
        Ok(status) => {
            println!("{}: {service} at {address}", status.as_str_name());
            Ok(Answer::No)
        }
        Err(why) => {
            println!("UNREACHABLE: {why}");
            Ok(Answer::No)
        }
    }
}

async fn ask(address: SocketAddr, service: &str) -> Result<ServingStatus, String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(PROBE_TIMEOUT)
        .timeout(PROBE_TIMEOUT);
    let channel = tokio::time::timeout(PROBE_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| format!("no connection to {address} within {} s", PROBE_TIMEOUT.as_secs()))?
        .map_err(|e| format!("cannot connect to {address}: {}", crate::errors::error_chain(&e)))?;
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    let response = tokio::time::timeout(PROBE_TIMEOUT, HealthClient::new(channel).check(request))
        .await
        .map_err(|_| format!("no answer from {address} within {} s", PROBE_TIMEOUT.as_secs()))?
        .map_err(|status| format!("{address} answered {:?}: {}", status.code(), status.message()))?;
    Ok(ServingStatus::try_from(response.into_inner().status).unwrap_or(ServingStatus::Unknown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_asks_the_flag_then_the_config_and_a_wildcard_on_loopback() {
        let config = |listen: &str| HealthConfig {
            listen: Some(listen.parse().unwrap()),
            allow_remote: true,
        };
        let flag: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(probe_address(Some(flag), &config("127.0.0.2:8")).unwrap(), flag);
        assert_eq!(
            probe_address(None, &config("0.0.0.0:8")).unwrap(),
            "127.0.0.1:8".parse().unwrap()
        );
        assert_eq!(
            probe_address(None, &config("[::]:8")).unwrap(),
            "[::1]:8".parse().unwrap()
        );
        assert!(matches!(
            probe_address(None, &HealthConfig::default()),
            Err(ProbeError::NoAddress)
        ));
        assert!(matches!(
            probe_address(None, &config("127.0.0.1:0")),
            Err(ProbeError::PickedPort)
        ));
    }

    #[test]
    fn a_remote_address_needs_allow_remote() {
        let config = HealthConfig {
            listen: Some("0.0.0.0:0".parse().unwrap()),
            allow_remote: false,
        };
        let err = ProbeListener::bind(&config).unwrap_err();
        assert!(err.to_string().contains("allow_remote = true"), "{err}");
        let allowed = HealthConfig {
            allow_remote: true,
            ..config
        };
        assert!(ProbeListener::bind(&allowed).unwrap().is_some());
    }

    #[test]
    fn unset_binds_nothing_and_a_taken_port_says_which() {
        assert!(ProbeListener::bind(&HealthConfig::default()).unwrap().is_none());
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = HealthConfig {
            listen: Some(taken.local_addr().unwrap()),
            allow_remote: false,
        };
        let err = ProbeListener::bind(&config).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "cannot listen for health probes on {}",
                taken.local_addr().unwrap()
            )),
            "{err}"
        );
    }

    /// The command's answers from a real probe listener: serving, then not serving once the
    /// reporter says so (as a device fault makes it), and unreachable once it is gone.
    #[test]
    fn the_command_reports_what_the_reporter_says() {
        const SERVICE: &str = "gpu_attest.v1.Example";
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let config = HealthConfig {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            allow_remote: false,
        };
        let probe = ProbeListener::bind(&config).unwrap().unwrap();
        let address = probe.address();
        let (reporter, server) = tonic_health::server::health_reporter();
        runtime.block_on(reporter.set_service_status(SERVICE, tonic_health::ServingStatus::Serving));
        let task = {
            let _entered = runtime.enter();
            probe.spawn(server)
        };
        let status = |service: &str| runtime.block_on(ask(address, service));
        assert_eq!(status(SERVICE), Ok(ServingStatus::Serving));
        assert!(matches!(check(address, SERVICE), Ok(Answer::Yes)));
        // A service the daemon does not serve is NOT_FOUND from the health service.
        let unknown = status("gpu_attest.v1.Other").unwrap_err();
        assert!(unknown.contains("NotFound"), "{unknown}");
        runtime.block_on(reporter.set_service_status(SERVICE, tonic_health::ServingStatus::NotServing));
        assert_eq!(status(SERVICE), Ok(ServingStatus::NotServing));
        assert!(matches!(check(address, SERVICE), Ok(Answer::No)));
        task.abort();
        let _ = runtime.block_on(task);
        drop(probe);
        let gone = status(SERVICE).unwrap_err();
        assert!(gone.starts_with(&format!("cannot connect to {address}")), "{gone}");
        assert!(matches!(check(address, SERVICE), Ok(Answer::No)));
    }
}
