//! Plumbing both daemons share: their TOML config files, their logs, their listening socket,
//! the signals that stop them, and gRPC server reflection.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::path::Path;
use thiserror::Error;
use tokio::net::TcpListener;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    /// One line: where in the file, and what is wrong there. (The TOML error's own text spans
    /// several lines with a snippet; the daemons print errors as one line.)
    #[error("config file {path} is not valid: {location}{message}")]
    Parse {
        path: String,
        location: String,
        message: String,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The defaults overlaid with `path`'s TOML, if a path is given. Keys the file leaves out keep
/// their defaults (configs use `#[serde(default)]`); unknown keys are an error.
pub fn load_config<T: DeserializeOwned + Default>(path: Option<&Path>) -> Result<T, ConfigError> {
    let Some(path) = path else { return Ok(T::default()) };
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    toml::from_str(&text).map_err(|e: toml::de::Error| ConfigError::Parse {
        path: shown,
        location: e.span().map_or_else(String::new, |span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: ")
        }),
        message: e.message().trim().replace('\n', "; "),
    })
}

/// A config as TOML: what `--print-config` shows, and a complete file to start from.
pub fn config_to_toml<T: Serialize>(config: &T) -> String {
    toml::to_string_pretty(config).expect("configs serialise to TOML")
}

/// Structured logs to stderr; the level comes from `GPU_ATTEST_LOG` (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPU_ATTEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

#[derive(Debug, Error)]
#[error("cannot listen on {address}: {source}")]
pub struct BindError {
    pub address: SocketAddr,
    pub source: std::io::Error,
}

/// The daemon's listener on `address`, and the address it got (the real port when `address`
/// asks for port 0). Prints `listening on ADDRESS` on stdout, the line scripts and tests read
/// to learn a port-0 address.
pub async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), BindError> {
    let bind_error = |source| BindError { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    println!("listening on {bound}");
    Ok((listener, bound))
}

/// Completes on SIGINT or SIGTERM, for a graceful shutdown.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutdown signal received; finishing in-flight calls");
}

/// gRPC server reflection over this project's services and the health service, in both
/// versions (v1, and the v1alpha that many clients, grpcurl among them, still ask for), so that
/// generic clients work without the .proto files.
pub fn reflection_services() -> Result<
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
            .register_encoded_file_descriptor_set(crate::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn bind_reports_the_port_it_got_and_a_taken_port_plainly() {
        let (listener, bound) = super::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        assert_ne!(bound.port(), 0, "port 0 must come back as the real port");
        assert_eq!(listener.local_addr().unwrap(), bound);
        let err = super::bind(bound).await.unwrap_err();
        assert!(
            err.to_string().starts_with(&format!("cannot listen on {bound}: ")),
            "{err}"
        );
    }
}
