//! Seeing the calls made on each held connection, so that the table knows which connections
//! are busy and which have gone quiet.
//!
//! A call of the daemon's own services (`/gpu_attest.…`) keeps its connection from being closed
//! to make room until its response has been sent whole or dropped: a challenge's stream, an
//! opening round or an attestation followed through the API. Health checks and reflection count
//! as activity when they start but do not hold the connection: a health `Watch` never ends, and
//! a peer could otherwise hold connections open with one each.

use super::table::{Connections, RunningCall};
use crate::refusal_log::peer_address;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::codegen::{Service, http};

/// The path prefix of the daemon's own services.
const OWN_SERVICES: &str = "/gpu_attest.";

/// The layer that reports calls to the [`Connections`] table.
#[derive(Clone)]
pub struct CallTracking {
    connections: Connections,
}

impl CallTracking {
    pub(super) fn new(connections: Connections) -> Self {
        CallTracking { connections }
    }
}

impl<S> tower_layer::Layer<S> for CallTracking {
    type Service = TrackedCalls<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TrackedCalls {
            inner,
            connections: self.connections.clone(),
        }
    }
}

/// A service whose calls are reported to the [`Connections`] table.
#[derive(Clone)]
pub struct TrackedCalls<S> {
    inner: S,
    connections: Connections,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for TrackedCalls<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = http::Response<TrackedBody<R>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // A request without a socket address (an in-memory transport) belongs to no connection.
        let connection = peer_address(request.extensions()).and_then(|peer| self.connections.find(peer));
        let running = connection.and_then(|connection| {
            if request.uri().path().starts_with(OWN_SERVICES) {
                Some(connection.call_started())
            } else {
                connection.touch();
                None
            }
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| TrackedBody { inner: body, running }))
        })
    }
}

/// A response body that holds its call's [`RunningCall`] until it is sent whole or dropped.
#[derive(Debug, Default)]
pub struct TrackedBody<B> {
    inner: B,
    running: Option<RunningCall>,
}

impl<B> http_body::Body for TrackedBody<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.running = None; // sent whole
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
