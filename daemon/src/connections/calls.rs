//! Seeing the calls made on each held connection, so that the table knows which connections
//! are busy and which have gone quiet.
//!
//! A call whose handler marked its response with [`holds_connection`] keeps its connection from
//! being closed to make room, from the response's start until it has been sent whole or
//! dropped; its start and end also count as the connection's activity. Other calls count for
//! nothing: a stranger can make them at will.
//!
//! Handlers mark the long calls of peers they trust: an allowed validator's challenge or opening
//! round, an attestation followed through the API. A trusted unary call that may run long (a
//! registration that probes a miner) holds its connection from its handler instead, with
//! [`hold_connection_while_handling`], since its response comes only at its end. Nothing else holds a connection, because
//! anything else a stranger can make last: a health `Watch` never ends, a call's message can be
//! left unsent, and a response can be left unread (an HTTP/2 peer that grants no flow-control
//! window).

use super::table::{Connections, Ends, RunningCall};
use std::pin::Pin;
use std::sync::Arc;
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

/// What the layer puts in each request's extensions, so that a handler can hold its
/// connection while it works: see [`hold_connection_while_handling`].
#[derive(Clone)]
struct ConnectionOfCall(Arc<super::table::Connection>);

/// Keeps the connection of the call whose request carried `extensions` from being closed to
/// make room, until the returned guard drops: for a trusted peer's unary call that may take
/// longer than a connection may stay quiet (a registration that probes a slow miner), whose
/// response, and so [`holds_connection`]'s mark, comes only at its end. `None` for a request
/// that came on no tracked connection (an in-memory transport).
pub fn hold_connection_while_handling(extensions: &http::Extensions) -> Option<HeldConnection> {
    extensions.get::<ConnectionOfCall>().map(|c| HeldConnection {
        _running: c.0.call_started(),
    })
}

/// Marks the connection of the call whose request carried `extensions` as a trusted peer's, for
/// as long as it lives: its later requests are not counted against its address's request rate
/// ([`crate::rate_limit`]) or the budget of unfinished requests ([`crate::requests`]). Only for
/// a call whose peer proved who it is and is allowed (a miner: a challenge signed by a
/// validator on its allow-list), since a stranger sharing the address could otherwise exhaust
/// both and have that peer's next request, its open request, refused.
pub fn trust_connection(extensions: &http::Extensions) {
    if let Some(c) = extensions.get::<ConnectionOfCall>() {
        c.0.trust();
    }
}

/// Whether the call whose request carried `extensions` came on a connection marked by
/// [`trust_connection`].
pub fn on_trusted_connection(extensions: &http::Extensions) -> bool {
    extensions.get::<ConnectionOfCall>().is_some_and(|c| c.0.is_trusted())
}

/// A handler's hold on its connection: see [`hold_connection_while_handling`].
#[derive(Debug)]
pub struct HeldConnection {
    _running: RunningCall,
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

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // A request without a socket address (an in-memory transport) belongs to no connection.
        let connection = connection_ends(request.extensions()).and_then(|ends| self.connections.find(ends));
        if let Some(connection) = &connection {
            request.extensions_mut().insert(ConnectionOfCall(connection.clone()));
        }
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            let running = match response.extensions().get::<HoldsConnection>() {
                Some(_) => connection.map(|c| c.call_started()),
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
