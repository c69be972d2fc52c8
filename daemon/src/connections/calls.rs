//! Seeing the calls made on each held connection, so that the table knows which connections
//! are busy and which have gone quiet.
//!
//! A call whose handler marked its response with [`holds_connection`] keeps its connection from
//! being closed to make room, from the response's start until it has been sent whole or
//! dropped; its start and end also count as the connection's activity. Other calls count for
//! nothing: a stranger can make them at will.
//!
//! Handlers mark the long calls of peers they trust: an allowed validator's challenge or opening
//! round, an attestation followed through the API. Nothing else holds a connection, because
//! anything else a stranger can make last: a health `Watch` never ends, a call's message can be
//! left unsent, and a response can be left unread (an HTTP/2 peer that grants no flow-control
//! window).

use super::table::{Connections, Ends, RunningCall};
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::codegen::{Service, http};

/// The mark of a response that holds its connection while it is sent: see [`holds_connection`].
#[derive(Clone, Copy, Debug)]
struct HoldsConnection;

/// Marks `response` as one that keeps its connection from being closed to make room until it
/// has been sent whole. Only for the long calls of trusted peers (see the module's comment).
pub fn holds_connection<T>(mut response: tonic::Response<T>) -> tonic::Response<T> {
    response.extensions_mut().insert(HoldsConnection);
    response
}

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
        let ends = connection_ends(request.extensions());
        let connections = self.connections.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            let running = match response.extensions().get::<HoldsConnection>() {
                Some(_) => ends.and_then(|ends| connections.find(ends)).map(|c| c.call_started()),
                None => None,
            };
            Ok(response.map(|body| TrackedBody { inner: body, running }))
        })
    }
}

/// The two ends of the connection a request came on, from what tonic records of it (under TLS,
/// inside the TLS information).
fn connection_ends(extensions: &http::Extensions) -> Option<Ends> {
    let tcp = crate::connect_info::tcp_connect_info(extensions)?;
    Some(Ends {
        local: tcp.local_addr()?,
        remote: tcp.remote_addr()?,
    })
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
