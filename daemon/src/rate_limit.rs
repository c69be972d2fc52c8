//! A request rate per peer address, as a layer over every service a daemon serves (health and
//! reflection included): a flood of cheap calls costs a peer its own budget, nobody else's.

use crate::connect_info::peer_address;
use crate::connections::{counted_as, on_trusted_connection};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tonic::Status;
use tonic::codegen::{Service, http};

/// Token bucket per peer address (an IPv6 /64 counting as one): `per_minute` requests a minute on average, bursts up to `burst`.
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
}

impl<S> tower_layer::Layer<S> for PeerRateLimiter {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: self.clone(),
        }
    }
}

/// A service behind a [`PeerRateLimiter`]: a call over the peer's rate is answered
/// RESOURCE_EXHAUSTED, with the wait, before it reaches the service.
#[derive(Clone)]
pub struct RateLimited<S> {
    inner: S,
    limiter: PeerRateLimiter,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for RateLimited<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // A request without a socket address (an in-memory transport) is not limited, and
        // neither is one on a trusted peer's connection (`trust_connection`): a stranger at the
        // same address must not be able to spend that peer's budget.
        let verdict = match peer_address(request.extensions()) {
            _ if on_trusted_connection(request.extensions()) => Ok(()),
            // Per /64 for IPv6, as connections are counted: a host holds a whole /64.
            Some(peer) => self.limiter.check(counted_as(peer.ip())),
            None => Ok(()),
        };
        match verdict {
            Ok(()) => Box::pin(self.inner.call(request)),
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn over_the_rate_a_call_is_answered_resource_exhausted_without_reaching_the_service() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tonic::transport::server::TcpConnectInfo;
        use tower_layer::Layer;

        let reached = Arc::new(AtomicUsize::new(0));
        let counter = reached.clone();
        let inner = crate::refusal_log::tests::tower_service_fn(move |_req: http::Request<()>| {
            counter.fetch_add(1, Ordering::Relaxed);
            http::Response::new(())
        });
        let mut service = PeerRateLimiter::new(1, 2).layer(inner);
        let request = || {
            let mut request = http::Request::builder()
                .uri("/grpc.health.v1.Health/Check")
                .body(())
                .unwrap();
            request.extensions_mut().insert(TcpConnectInfo {
                local_addr: None,
                remote_addr: Some("127.0.0.7:5000".parse().unwrap()),
            });
            request
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let statuses: Vec<_> = (0..3)
            .map(|_| {
                let response = runtime.block_on(service.call(request())).unwrap();
                response
                    .headers()
                    .get("grpc-status")
                    .map(|v| v.to_str().unwrap().to_string())
            })
            .collect();
        assert_eq!(
            statuses,
            [None, None, Some("8".to_string())],
            "the third call is over a burst of 2"
        );
        assert_eq!(
            reached.load(Ordering::Relaxed),
            2,
            "the refused call must not reach the service"
        );
    }

    /// A host holds a whole IPv6 /64: its addresses share one budget, as they share one
    /// connection limit.
    #[test]
    fn the_addresses_of_one_ipv6_slash_64_share_a_budget() {
        use tonic::transport::server::TcpConnectInfo;
        use tower_layer::Layer;

        let inner = crate::refusal_log::tests::tower_service_fn(|_req: http::Request<()>| http::Response::new(()));
        let mut service = PeerRateLimiter::new(1, 2).layer(inner);
        let from = |remote: &str| {
            let mut request = http::Request::builder().uri("/x").body(()).unwrap();
            request.extensions_mut().insert(TcpConnectInfo {
                local_addr: None,
                remote_addr: Some(remote.parse().unwrap()),
            });
            request
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut refused = |remote: &str| {
            let response = runtime.block_on(service.call(from(remote))).unwrap();
            response.headers().get("grpc-status").is_some()
        };
        assert!(!refused("[2001:db8:1:2::1]:5000"));
        assert!(!refused("[2001:db8:1:2::2]:5000"));
        assert!(
            refused("[2001:db8:1:2::3]:5000"),
            "a third address of the /64 had its own budget"
        );
        assert!(!refused("[2001:db8:1:3::1]:5000"), "another /64 is another budget");
    }
}
