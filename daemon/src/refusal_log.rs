//! A log line for every call a server refuses, whoever refused it.

use tonic::codegen::{Service, http};

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
        let peer = crate::connect_info::peer_address(request.extensions())
            .map_or_else(|| "unknown peer".into(), |a| a.to_string());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            // Errors decided before the response starts travel in its headers (trailers-only);
            // those found later in a stream are logged by the handler that found them.
            // The message travels percent-encoded: decoded here, so the log reads as it was meant.
            if let Some(status) = tonic::Status::from_header_map(response.headers())
                && status.code() != tonic::Code::Ok
            {
                if is_health_answer(&method, status.code()) {
                    tracing::debug!(peer = %peer, %method, message = status.message(), "health asked about a service not served here");
                } else {
                    tracing::warn!(peer = %peer, %method, code = ?status.code(), message = status.message(), "request refused");
                }
            }
            Ok(response)
        })
    }
}

/// A health check about a service this daemon does not serve is answered NOT_FOUND: an answer
/// to a probe (a load balancer asking about the other daemon's service, say), not a refusal
/// worth a warning.
fn is_health_answer(method: &str, code: tonic::Code) -> bool {
    code == tonic::Code::NotFound && method.starts_with("/grpc.health.v1.Health/")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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
                .insert("grpc-message", "too%20big".parse().unwrap());
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
            "the message is logged decoded: {log}"
        );
        assert!(log.contains("OutOfRange"), "the code by its name: {log}");
    }

    #[test]
    fn only_a_health_check_about_another_service_is_not_a_refusal() {
        assert!(is_health_answer("/grpc.health.v1.Health/Check", tonic::Code::NotFound));
        assert!(is_health_answer("/grpc.health.v1.Health/Watch", tonic::Code::NotFound));
        assert!(!is_health_answer(
            "/grpc.health.v1.Health/Check",
            tonic::Code::ResourceExhausted
        ));
        assert!(!is_health_answer(
            "/gpu_attest.v1.Miner/OpenChains",
            tonic::Code::NotFound
        ));
    }

    /// A service answering every request with `f`'s response.
    pub(crate) fn tower_service_fn<F>(
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
}
