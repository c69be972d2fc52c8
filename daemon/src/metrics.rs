//! The Prometheus metrics endpoint: `GET /metrics` on its own plain-HTTP listener, apart from
//! the gRPC port, so that a scraper needs neither TLS client certificates nor gRPC, and the
//! figures never travel on the port miners and validators talk on. Being plaintext, it listens
//! on loopback unless the operator allows another address.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use thiserror::Error;
use tokio::net::TcpListener;

pub use prometheus_client;

/// Where the metrics are served. The daemons' `[metrics]` table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve Prometheus metrics (`GET /metrics`, plain HTTP) on this address; unset: not
    /// served. Port 0 picks a free port and prints it.
    pub listen: Option<SocketAddr>,
    /// Allow a non-loopback `listen` address (anyone who reaches it reads the figures).
    pub allow_remote: bool,
}

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error(
        "refusing to serve metrics in plaintext on {0}: use a loopback address, or set [metrics] allow_remote = true to accept that anyone who reaches it reads them"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot listen for metrics on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// What the endpoint serves: a registry, and a refresh run before each scrape for the figures
/// that are read rather than counted (a GPU's temperature, the CPU's load).
#[derive(Clone)]
pub struct Exposition {
    registry: Arc<Registry>,
    refresh: Arc<dyn Fn() + Send + Sync>,
}

impl Exposition {
    pub fn new(registry: Registry, refresh: impl Fn() + Send + Sync + 'static) -> Self {
        Exposition {
            registry: Arc::new(registry),
            refresh: Arc::new(refresh),
        }
    }

    /// The registry in the OpenMetrics text format, refreshed first.
    pub fn render(&self) -> String {
        (self.refresh)();
        let mut text = String::new();
        // Writing into a String cannot fail; a metric that could not encode would be a bug.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(error = %e, "metrics could not be encoded");
        }
        text
    }
}

/// The metrics listener on `address`: loopback, or anywhere when `allow_remote`, and the
/// address it got (the real port when `address` asks for 0). A daemon binds it before its gRPC
/// listener, whose `listening on` line says it is up, and [`announce`]s it after that line.
pub async fn bind(address: SocketAddr, allow_remote: bool) -> Result<(TcpListener, SocketAddr), MetricsError> {
    if !address.ip().is_loopback() && !allow_remote {
        return Err(MetricsError::NotLoopback(address));
    }
    let bind_error = |source| MetricsError::Bind { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    Ok((listener, bound))
}

/// Prints `metrics on http://ADDRESS/metrics` on stdout, the line scripts read for the port.
pub fn announce(bound: SocketAddr) {
    crate::listen::say(&format!("metrics on http://{bound}/metrics"));
}

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` until `shutdown` completes.
pub async fn serve(
    exposition: Exposition,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let exposition = exposition.clone();
            async move {
                // Reading NVML can block for a while; keep it off the async workers.
                let text = tokio::task::spawn_blocking(move || exposition.render())
                    .await
                    .unwrap_or_else(|e| format!("# metrics could not be gathered: {e}\n"));
                ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text)
            }
        }),
    );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// A daemon's metrics endpoint from bind to stop, the same for both daemons. It is bound before
/// the daemon's gRPC listener, whose `listening on` line says the daemon is up (which it would
/// not be if the metrics port then turned out to be taken); announced and served once that line
/// is out ([`Endpoint::serve`]); and stopped after the gRPC server ([`Serving::stop`]).
pub struct Endpoint {
    bound: Option<(TcpListener, SocketAddr)>,
}

impl Endpoint {
    /// Binds `config.listen`, or nothing when it is unset.
    pub async fn bind(config: &MetricsConfig) -> Result<Endpoint, MetricsError> {
        let bound = match config.listen {
            Some(address) => Some(bind(address, config.allow_remote).await?),
            None => None,
        };
        Ok(Endpoint { bound })
    }

    /// Announces the endpoint and serves what `exposition` gives until [`Serving::stop`].
    pub fn serve(self, exposition: impl FnOnce() -> Exposition) -> Serving {
        let Some((listener, address)) = self.bound else {
            return Serving { running: None };
        };
        announce(address);
        tracing::info!(%address, "metrics served at /metrics");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(exposition(), listener, async {
            let _ = stopped.await;
        }));
        Serving {
            running: Some((stop, task)),
        }
    }
}

/// A metrics endpoint being served (or none, when none was configured).
pub struct Serving {
    running: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    )>,
}

impl Serving {
    /// Stops serving and waits for the scrapes in flight.
    pub async fn stop(self) {
        let Some((stop, task)) = self.running else { return };
        let _ = stop.send(());
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the metrics endpoint failed"),
            Err(e) => tracing::warn!(error = %e, "the metrics endpoint's task failed"),
        }
    }
}

/// One label set: `[("outcome", "pass")]`.
pub type Labels = Vec<(&'static str, String)>;

/// Registers `<prefix>_build_info{version, protocol_version} 1`: a series that is there
/// whenever the daemon is, so that an alert on `absent()` of it fires when the daemon is not
/// scraped, and so that a dashboard can tell which release answered.
pub fn register_build_info(registry: &mut Registry) {
    registry.register(
        "build",
        "This daemon's release and the newest protocol version it speaks (always 1)",
        prometheus_client::metrics::info::Info::new(vec![
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            (
                "protocol_version",
                gpu_attest_shared::params::PROTOCOL_VERSION.to_string(),
            ),
        ]),
    );
}

/// A histogram of durations in seconds, from 10 ms to about 3 hours in doubling buckets.
pub fn duration_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.01, 2.0, 21,
    ))
}

/// Duration histograms by label set.
pub type DurationFamily = Family<Labels, Histogram, fn() -> Histogram>;

pub fn duration_family() -> DurationFamily {
    Family::new_with_constructor(duration_histogram)
}

/// A gauge that holds a real number (a rate, a temperature, a load).
pub type RealGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[tokio::test]
    async fn the_endpoint_serves_the_registry_refreshed_and_refuses_remote_addresses_by_default() {
        let mut registry = Registry::with_prefix("gpu_attest_test");
        let counter = Counter::<u64>::default();
        registry.register("things", "Things counted", counter.clone());
        let refreshed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = refreshed.clone();
        let exposition = Exposition::new(registry, move || {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        counter.inc_by(3);
        let (listener, address) = bind("127.0.0.1:0".parse().unwrap(), false).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(exposition, listener, async {
            let _ = stopped.await;
        }));
        let body = http_get(address, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("gpu_attest_test_things_total 3"), "{body}");
        assert!(body.contains("application/openmetrics-text"), "{body}");
        assert_eq!(refreshed.load(std::sync::atomic::Ordering::Relaxed), 1);
        let _ = stop.send(());
        server.await.unwrap().unwrap();

        let refused = bind("0.0.0.0:0".parse().unwrap(), false).await.unwrap_err();
        assert!(matches!(refused, MetricsError::NotLoopback(_)), "{refused}");
    }

    /// A bare HTTP/1.1 GET, so that the test needs no HTTP client crate.
    async fn http_get(address: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }
}
