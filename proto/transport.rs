//! Transport policy shared by both daemons: TLS and mutual TLS from PEM files, plaintext only
//! where it cannot leave the machine (or when explicitly allowed), and a per-peer request rate.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use thiserror::Error;
use tonic::codegen::{Service, http};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Status};

/// PEM files for one side of a TLS connection.
///
/// As a server: `cert` + `key` turn TLS on; `ca` additionally requires clients to present a
/// certificate signed by it (mutual TLS). As a client: `ca` is the root the server's certificate
/// must chain to; `cert` + `key` are presented to servers that require client certificates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
}

#[derive(Debug, Error)]
pub enum TransportError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("tls: `cert` and `key` must be given together")]
    HalfIdentity,
    #[error(
        "refusing to serve plaintext on {0}: configure [tls] cert and key, or set allow_plaintext = true to accept the risk"
    )]
    PlaintextServer(SocketAddr),
    #[error(
        "refusing plaintext to {0}: use an https:// URL with a CA configured, or set allow_plaintext_miners = true to accept the risk"
    )]
    PlaintextClient(String),
    #[error("https:// URL {0} needs a CA certificate to check the server against (miner_tls.ca)")]
    NoCa(String),
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TransportError> {
    std::fs::read(path).map_err(|source| TransportError::Read {
        what,
        path: path.display().to_string(),
        source,
    })
}

impl TlsFiles {
    fn identity(&self) -> Result<Option<Identity>, TransportError> {
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Ok(Some(Identity::from_pem(read("certificate", cert)?, read("key", key)?))),
            (None, None) => Ok(None),
            _ => Err(TransportError::HalfIdentity),
        }
    }

    /// The server TLS config, or `None` for plaintext.
    pub fn server_config(&self) -> Result<Option<ServerTlsConfig>, TransportError> {
        let Some(identity) = self.identity()? else {
            return Ok(None);
        };
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.ca {
            config = config.client_ca_root(Certificate::from_pem(read("client CA", ca)?));
        }
        Ok(Some(config))
    }

    /// The client TLS config for `https://` URLs.
    pub fn client_config(&self, url: &str) -> Result<ClientTlsConfig, TransportError> {
        let ca = self.ca.as_ref().ok_or_else(|| TransportError::NoCa(url.to_string()))?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("CA", ca)?));
        if let Some(identity) = self.identity()? {
            config = config.identity(identity);
        }
        Ok(config)
    }
}

/// Whether a server may listen without TLS: always on loopback, elsewhere only when allowed
/// (then `Ok(Some(warning))`).
pub fn check_plaintext_server(addr: SocketAddr, tls: bool, allow: bool) -> Result<Option<String>, TransportError> {
    if tls || addr.ip().is_loopback() {
        Ok(None)
    } else if allow {
        Ok(Some(format!(
            "serving PLAINTEXT on {addr}: challenges, keys' signatures and verdicts travel unencrypted"
        )))
    } else {
        Err(TransportError::PlaintextServer(addr))
    }
}

/// The full cause chain of an error, which tonic otherwise hides behind "transport error".
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.dedup();
    parts.join(": ")
}

/// Whether a client may connect to `url` without TLS; same rule as servers.
pub fn check_plaintext_client(url: &str, allow: bool) -> Result<Option<String>, TransportError> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Ok(None);
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(None)
    } else if allow {
        Ok(Some(format!("connecting to {url} in PLAINTEXT")))
    } else {
        Err(TransportError::PlaintextClient(url.to_string()))
    }
}

/// Token bucket per peer IP: `per_minute` requests a minute on average, bursts up to `burst`.
/// Memory is bounded: past `MAX_PEERS` tracked addresses, peers whose buckets are full again are
/// forgotten first.
#[derive(Clone)]
pub struct PeerRateLimiter {
    inner: Arc<Mutex<HashMap<IpAddr, (f64, Instant)>>>,
    per_second: f64,
    burst: f64,
}

const MAX_PEERS: usize = 10_000;

impl PeerRateLimiter {
    pub fn new(per_minute: u32, burst: u32) -> Self {
        PeerRateLimiter {
            inner: Arc::new(Mutex::new(HashMap::new())),
            per_second: f64::from(per_minute) / 60.0,
            burst: f64::from(burst.max(1)),
        }
    }

    /// Takes one token for `peer`, or says how long until one is free.
    pub fn check(&self, peer: IpAddr) -> Result<(), Status> {
        let now = Instant::now();
        let mut buckets = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_PEERS && !buckets.contains_key(&peer) {
            let (rate, burst) = (self.per_second, self.burst);
            buckets.retain(|_, (tokens, at)| *tokens + at.elapsed().as_secs_f64() * rate < burst);
        }
        let (tokens, at) = buckets.entry(peer).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.per_second).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            let wait = if self.per_second > 0.0 {
                (1.0 - *tokens) / self.per_second
            } else {
                f64::INFINITY
            };
            tracing::warn!(%peer, "request rate limit exceeded");
            Err(Status::resource_exhausted(format!(
                "rate limit: at most {:.0} requests a minute from one address; retry in {wait:.1} s",
                self.per_second * 60.0
            )))
        }
    }

    /// As a tonic interceptor: limits by the connection's remote address.
    pub fn intercept(&self, request: Request<()>) -> Result<Request<()>, Status> {
        match request.remote_addr() {
            Some(addr) => self.check(addr.ip()).map(|()| request),
            None => Ok(request),
        }
    }
}

/// Logs every call a server refuses or fails, with the peer, the method and the status: also
/// those refused inside tonic before any handler runs (a message over the size limit, one
/// that does not decode), which would otherwise leave no trace.
#[derive(Clone, Copy, Debug, Default)]
pub struct RefusalLogLayer;

impl<S> tower_layer::Layer<S> for RefusalLogLayer {
    type Service = RefusalLog<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RefusalLog { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RefusalLog<S> {
    inner: S,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for RefusalLog<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().to_string();
        let peer = peer_of(request.extensions());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            // Errors decided before the response starts travel in its headers (trailers-only);
            // those found later in a stream are logged by the handler that found them.
            if let Some(code) = response.headers().get("grpc-status").and_then(|v| v.to_str().ok())
                && code != "0"
            {
                let message = response
                    .headers()
                    .get("grpc-message")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                tracing::warn!(peer = %peer, %method, status = %tonic::Code::from_bytes(code.as_bytes()).description(), message, "request refused");
            }
            Ok(response)
        })
    }
}

fn peer_of(extensions: &http::Extensions) -> String {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
        .map(|a| a.to_string())
        .unwrap_or_else(|| "unknown peer".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_only_on_loopback_unless_allowed() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert!(check_plaintext_server(lo, false, false).unwrap().is_none());
        assert!(check_plaintext_server(any, true, false).unwrap().is_none());
        assert!(matches!(
            check_plaintext_server(any, false, false),
            Err(TransportError::PlaintextServer(_))
        ));
        assert!(check_plaintext_server(any, false, true).unwrap().is_some());
        for ok in [
            "http://127.0.0.1:7070",
            "http://localhost:1",
            "http://[::1]:7070/x",
            "https://gpu-host:7070",
        ] {
            assert!(check_plaintext_client(ok, false).unwrap().is_none(), "{ok}");
        }
        assert!(check_plaintext_client("http://gpu-host:7070", false).is_err());
        assert!(check_plaintext_client("http://10.0.0.8:7070", true).unwrap().is_some());
    }

    #[test]
    fn refused_calls_are_logged_with_their_status() {
        use std::sync::{Arc, Mutex};
        use tower_layer::Layer;

        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let refusing = tower_service_fn(|_req: http::Request<()>| {
            let mut response = http::Response::new(());
            response.headers_mut().insert("grpc-status", "11".parse().unwrap());
            response
                .headers_mut()
                .insert("grpc-message", "too big".parse().unwrap());
            response
        });
        let mut service = RefusalLogLayer.layer(refusing);
        let request = http::Request::builder()
            .uri("/gpu_attest.v1.Miner/RunChallenge")
            .body(())
            .unwrap();
        tracing::subscriber::with_default(subscriber, || {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(service.call(request)).unwrap();
        });
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(log.contains("request refused"), "{log}");
        assert!(
            log.contains("/gpu_attest.v1.Miner/RunChallenge") && log.contains("too big"),
            "{log}"
        );
    }

    /// A service answering every request with `f`'s response.
    fn tower_service_fn<F>(
        f: F,
    ) -> impl Service<
        http::Request<()>,
        Response = http::Response<()>,
        Error = std::convert::Infallible,
        Future = std::future::Ready<Result<http::Response<()>, std::convert::Infallible>>,
    >
    where
        F: FnMut(http::Request<()>) -> http::Response<()>,
    {
        struct Fn<F>(F);
        impl<F: FnMut(http::Request<()>) -> http::Response<()>> Service<http::Request<()>> for Fn<F> {
            type Response = http::Response<()>;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
            fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
                std::task::Poll::Ready(Ok(()))
            }
            fn call(&mut self, request: http::Request<()>) -> Self::Future {
                std::future::ready(Ok((self.0)(request)))
            }
        }
        Fn(f)
    }

    #[test]
    fn rate_limiter_allows_burst_then_refuses_then_refills() {
        let limiter = PeerRateLimiter::new(60_000, 3); // 1000/s refill
        let peer: IpAddr = "127.0.0.9".parse().unwrap();
        for _ in 0..3 {
            limiter.check(peer).unwrap();
        }
        let refused = limiter.check(peer).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        // Another peer is unaffected.
        limiter.check("127.0.0.10".parse().unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        limiter.check(peer).unwrap();
    }
}
