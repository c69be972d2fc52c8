//! A real miner whose answer to one method is changed on the wire, after tonic has encoded it:
//! bytes no honest encoder writes, so that the tests can see how a validator names a message it
//! cannot decode (PROTOCOL.md 14.1: never as the miner's refusal or failure).

use super::Running;
use bytes::{BufMut, Bytes, BytesMut};
use gpu_attest_miner::MinerCore;
use gpu_attest_miner::service::MinerService;
use gpu_attest_proto::v1::miner_server::MinerServer;
use http_body::{Body, Frame};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

/// What replaces the first message of the answer.
#[derive(Clone, Copy, Debug)]
pub enum Mangle {
    /// A length prefix of 100 MB, past every limit a validator sets; nothing follows.
    Oversized,
    /// A length prefix of 1000 bytes, and then 5 bytes and the end of the stream.
    LyingLength,
    /// 64 bytes of 0xff: not a protobuf message of any type.
    Garbage,
}

impl Mangle {
    pub const ALL: [Mangle; 3] = [Mangle::Oversized, Mangle::LyingLength, Mangle::Garbage];

    /// The gRPC message frame: a compression flag of 0, a big-endian length, the body.
    fn frame(self) -> Bytes {
        let (length, body): (u32, &[u8]) = match self {
            Mangle::Oversized => (100_000_000, &[]),
            Mangle::LyingLength => (1000, &[0x0a, 0x03, 1, 2, 3]),
            Mangle::Garbage => (64, &[0xff; 64]),
        };
        let mut frame = BytesMut::with_capacity(5 + body.len());
        frame.put_u8(0);
        frame.put_u32(length);
        frame.put_slice(body);
        frame.freeze()
    }
}

/// The honest miner around `core`, its answers on `path` (`/gpu_attest.v1.Miner/WalkPool`, say)
/// mangled: the first message replaced by `mangle`'s frame, the later ones dropped, the
/// trailers kept.
pub async fn spawn_mangled(core: Arc<MinerCore>, path: &'static str, mangle: Mangle) -> Running {
    let (listener, address) = super::listener().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(MangleLayer { path, mangle })
            .add_service(MinerServer::new(MinerService::new(core)))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    Running {
        address,
        stop: Some(stop),
    }
}

#[derive(Clone)]
struct MangleLayer {
    path: &'static str,
    mangle: Mangle,
}

impl<S> tower_layer::Layer<S> for MangleLayer {
    type Service = MangleService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MangleService {
            inner,
            path: self.path,
            mangle: self.mangle,
        }
    }
}

#[derive(Clone)]
struct MangleService<S> {
    inner: S,
    path: &'static str,
    mangle: Mangle,
}

impl<S, Request> tower_service::Service<http::Request<Request>> for MangleService<S>
where
    S: tower_service::Service<http::Request<Request>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Request>) -> Self::Future {
        let mangle = (request.uri().path() == self.path).then_some(self.mangle);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(match mangle {
                None => response,
                Some(mangle) => response.map(|body| {
                    tonic::body::Body::new(MangledBody {
                        inner: body,
                        first: Some(mangle.frame()),
                    })
                }),
            })
        })
    }
}

struct MangledBody {
    inner: tonic::body::Body,
    /// Sent in place of the first data frame.
    first: Option<Bytes>,
}

impl Body for MangledBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) if frame.is_data() => match this.first.take() {
                    Some(mangled) => return Poll::Ready(Some(Ok(Frame::data(mangled)))),
                    // The validator stopped decoding at the first; the rest would be unread.
                    None => continue,
                },
                other => return Poll::Ready(other),
            }
        }
    }
}
