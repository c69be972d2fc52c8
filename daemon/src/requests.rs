//! How long a request may take to arrive, and how much memory unfinished requests may hold.
//!
//! A gRPC server buffers a request's message until it is whole. Without a bound on time, a
//! peer that sends all of a 1 MiB message but its last byte, on each of a connection's 16
//! streams, pins 16 MiB per connection for as long as it answers pings: a few hundred
//! connections, each under every connection limit, took a miner's memory past a gigabyte, and
//! one with a memory limit was killed. Every call of both daemons has a single request message,
//! which an honest peer sends at once, so:
//! - a request must arrive whole, its stream ended, within [`REQUEST_WITHIN`] of its headers,
//!   or its call fails with `DEADLINE_EXCEEDED`;
//! - while the daemon's unfinished requests hold more than [`UNFINISHED_BUDGET`] bytes, a
//!   request that has sent more than [`SMALL_REQUEST`] bytes fails with `RESOURCE_EXHAUSTED`.
//!   Requests that small (every request a validator makes of a miner, with room to spare) are
//!   never refused for it, and neither is any request on a trusted peer's connection
//!   ([`trust_connection`](crate::connections::trust_connection)).
//!
//! Together these bound what unfinished requests hold to the budget plus [`SMALL_REQUEST`] per
//! open stream, each for at most [`REQUEST_WITHIN`].

use crate::connections::on_trusted_connection;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Bytes, Service, http};

/// How long after its headers a request's message must have arrived and its stream ended.
pub const REQUEST_WITHIN: Duration = Duration::from_secs(10);

/// The bytes all unfinished requests together may hold before large ones are refused: 64 of the
/// largest messages the daemons take (1 MiB).
pub const UNFINISHED_BUDGET: usize = 64 << 20;

/// A request's first bytes, which the budget never refuses.
pub const SMALL_REQUEST: usize = 4 << 10;

/// The layer that holds every request to [`REQUEST_WITHIN`] and [`UNFINISHED_BUDGET`]: one per
/// server, its clones sharing the count.
#[derive(Clone)]
pub struct RequestIntake {
    unfinished: Arc<AtomicUsize>,
    within: Duration,
    budget: usize,
}

impl Default for RequestIntake {
    fn default() -> Self {
        RequestIntake::new(REQUEST_WITHIN, UNFINISHED_BUDGET)
    }
}

impl RequestIntake {
    /// Other bounds than the defaults, for tests.
    pub fn new(within: Duration, budget: usize) -> Self {
        RequestIntake {
            unfinished: Arc::new(AtomicUsize::new(0)),
            within,
            budget,
        }
    }

    /// The bytes unfinished requests hold now.
    pub fn unfinished_bytes(&self) -> usize {
        self.unfinished.load(Ordering::Relaxed)
    }

    /// `body`, held to this intake's bounds; `trusted` bodies are not counted.
    fn admit(&self, body: Body, trusted: bool) -> TimedBody {
        TimedBody {
            inner: body,
            deadline: Box::pin(tokio::time::sleep(self.within)),
            intake: self.clone(),
            trusted,
            counted: 0,
            ended: false,
        }
    }
}

impl<S> tower_layer::Layer<S> for RequestIntake {
    type Service = Intake<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Intake {
            inner,
            intake: self.clone(),
        }
    }
}

/// A service whose requests are held to a [`RequestIntake`].
#[derive(Clone)]
pub struct Intake<S> {
    inner: S,
    intake: RequestIntake,
}

impl<S> Service<http::Request<Body>> for Intake<S>
where
    S: Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let trusted = on_trusted_connection(request.extensions());
        let intake = &self.intake;
        self.inner
            .call(request.map(|body| Body::new(intake.admit(body, trusted))))
    }
}

/// A request body held to a deadline and, unless trusted, counted against the budget until it
/// ends or is dropped.
struct TimedBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    intake: RequestIntake,
    /// A trusted connection's request: not counted.
    trusted: bool,
    /// Bytes received and counted in the intake's total, given back when the body ends or
    /// drops.
    counted: usize,
    /// Whether the stream ended (or failed): no deadline and no counting from then on.
    ended: bool,
}

impl TimedBody {
    /// The stream is over, whole or not: its bytes no longer count.
    fn end(&mut self) {
        self.ended = true;
        self.intake
            .unfinished
            .fetch_sub(std::mem::take(&mut self.counted), Ordering::Relaxed);
    }

    /// Counts `len` more bytes; an error once this request is past [`SMALL_REQUEST`] and all
    /// unfinished requests together past the budget.
    fn count(&mut self, len: usize) -> Result<(), Status> {
        if self.trusted {
            return Ok(());
        }
        let total = self
            .intake
            .unfinished
            .fetch_add(len, Ordering::Relaxed)
            .saturating_add(len);
        self.counted += len;
        if self.counted > SMALL_REQUEST && total > self.intake.budget {
            return Err(Status::resource_exhausted(format!(
                "this daemon holds {} MiB of unfinished requests, its most; a request over {} KiB \
                 is refused until they end (within {} s): retry shortly",
                self.intake.budget >> 20,
                SMALL_REQUEST >> 10,
                self.intake.within.as_secs()
            )));
        }
        Ok(())
    }

    fn fail(&mut self, status: Status) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        self.end();
        Poll::Ready(Some(Err(status)))
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.ended {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(status) = this.count(data.len())
                {
                    return this.fail(status);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.end();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.end();
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => this.fail(Status::deadline_exceeded(format!(
                    "the request did not arrive whole within {} s of its headers; send the \
                     message and end the stream at once",
                    this.intake.within.as_secs()
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use std::future::poll_fn;

    /// A request body fed by hand: the returned sender's chunks arrive as the body's frames,
    /// and dropping the sender ends it.
    fn body() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let frames = http_body_stream(stream);
        (tx, Body::new(frames))
    }

    fn http_body_stream(
        stream: tokio_stream::wrappers::ReceiverStream<Bytes>,
    ) -> impl http_body::Body<Data = Bytes, Error = Status> + Send + 'static {
        struct Frames(tokio_stream::wrappers::ReceiverStream<Bytes>);
        impl http_body::Body for Frames {
            type Data = Bytes;
            type Error = Status;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
                use tokio_stream::Stream;
                Pin::new(&mut self.0)
                    .poll_next(cx)
                    .map(|chunk| chunk.map(|b| Ok(http_body::Frame::data(b))))
            }
        }
        Frames(stream)
    }

    async fn next(body: &mut TimedBody) -> Option<Result<usize, Status>> {
        poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
            .await
            .map(|frame| frame.map(|f| f.into_data().map_or(0, |d| d.len())))
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_does_not_arrive_in_time_fails_and_gives_its_bytes_back() {
        let intake = RequestIntake::new(Duration::from_secs(10), 1 << 20);
        let (tx, inner) = body();
        let mut timed = intake.admit(inner, false);
        tx.send(Bytes::from(vec![0u8; 1000])).await.unwrap();
        assert_eq!(next(&mut timed).await.unwrap().unwrap(), 1000);
        assert_eq!(intake.unfinished_bytes(), 1000);
        // The rest never comes: the deadline ends the call, naming the limit.
        let status = next(&mut timed).await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(status.message().contains("within 10 s"), "{status:?}");
        assert_eq!(intake.unfinished_bytes(), 0);
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_arrives_whole_is_not_timed_and_gives_its_bytes_back() {
        let intake = RequestIntake::new(Duration::from_secs(10), 1 << 20);
        let (tx, inner) = body();
        let mut timed = intake.admit(inner, false);
        tx.send(Bytes::from_static(b"hello")).await.unwrap();
        drop(tx);
        assert_eq!(next(&mut timed).await.unwrap().unwrap(), 5);
        assert!(next(&mut timed).await.is_none());
        assert_eq!(intake.unfinished_bytes(), 0);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(next(&mut timed).await.is_none(), "an ended request has no deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_budget_large_requests_are_refused_small_and_trusted_ones_are_not() {
        let budget = 3 * SMALL_REQUEST;
        let intake = RequestIntake::new(Duration::from_secs(10), budget);
        // A stranger holds more than the budget in one unfinished request...
        let (hog_tx, hog) = body();
        let mut hog = intake.admit(hog, false);
        for _ in 0..3 {
            hog_tx.send(Bytes::from(vec![0u8; SMALL_REQUEST])).await.unwrap();
            next(&mut hog).await.unwrap().unwrap();
        }
        hog_tx.send(Bytes::from(vec![0u8; SMALL_REQUEST])).await.unwrap();
        let refused = next(&mut hog).await.unwrap().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
        assert_eq!(intake.unfinished_bytes(), 0, "the refused request gave its bytes back");

        // ... now another unfinished one fills it again.
        let (filler_tx, filler) = body();
        let mut filler = intake.admit(filler, false);
        for _ in 0..3 {
            filler_tx.send(Bytes::from(vec![0u8; SMALL_REQUEST])).await.unwrap();
            next(&mut filler).await.unwrap().unwrap();
        }
        assert_eq!(intake.unfinished_bytes(), budget);
        // A small request still passes, whole.
        let (tx, small) = body();
        let mut small = intake.admit(small, false);
        tx.send(Bytes::from(vec![0u8; 100])).await.unwrap();
        drop(tx);
        assert_eq!(next(&mut small).await.unwrap().unwrap(), 100);
        assert!(next(&mut small).await.is_none());
        // A large one on a trusted connection passes, uncounted.
        let (tx, trusted) = body();
        let mut trusted = intake.admit(trusted, true);
        tx.send(Bytes::from(vec![0u8; 2 * SMALL_REQUEST])).await.unwrap();
        assert_eq!(next(&mut trusted).await.unwrap().unwrap(), 2 * SMALL_REQUEST);
        assert_eq!(intake.unfinished_bytes(), budget);
        // A large untrusted one is refused once past its first bytes.
        let (tx, large) = body();
        let mut large = intake.admit(large, false);
        tx.send(Bytes::from(vec![0u8; SMALL_REQUEST])).await.unwrap();
        next(&mut large).await.unwrap().unwrap();
        tx.send(Bytes::from(vec![0u8; 1])).await.unwrap();
        assert_eq!(
            next(&mut large).await.unwrap().unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        // Dropping the filler gives its bytes back.
        drop(filler);
        assert_eq!(intake.unfinished_bytes(), 0);
    }
}
