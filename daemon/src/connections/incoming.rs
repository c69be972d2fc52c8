//! The accept loop and the connections it hands to the server: each counted in the
//! [`Connections`] table while it lives, and ended when its peer is slow to complete its
//! handshake, silent too long after, or idle when another peer needs its room.

use super::handshake::Handshake;
use super::table::{Connection, Connections, Ends};
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// How long the accept loop waits after accepting failed (out of descriptors, out of memory),
/// so that it does not spin on an error that only a closing connection can clear.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A log line that a flood could repeat: written at most once a minute.
#[derive(Default)]
struct Throttled(Option<Instant>);

impl Throttled {
    fn due(&mut self) -> bool {
        let due = self.0.is_none_or(|at| at.elapsed() >= Duration::from_secs(60));
        if due {
            self.0 = Some(Instant::now());
        }
        due
    }
}

/// The stream of guarded connections, for `serve_with_incoming`.
pub struct GuardedIncoming {
    listener: TcpListener,
    connections: Connections,
    tls: bool,
    /// Set after an accept error: no accepting until it has passed.
    retry: Option<Pin<Box<Sleep>>>,
    accept_failed: Throttled,
    refused: Throttled,
    made_room: Throttled,
}

impl GuardedIncoming {
    /// `tls` says whether the daemon speaks TLS on these connections, which is how it sees a
    /// handshake end.
    pub(super) fn new(listener: TcpListener, connections: Connections, tls: bool) -> Self {
        GuardedIncoming {
            listener,
            connections,
            tls,
            retry: None,
            accept_failed: Throttled::default(),
            refused: Throttled::default(),
            made_room: Throttled::default(),
        }
    }
}

impl Stream for GuardedIncoming {
    type Item = io::Result<GuardedStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(retry) = this.retry.as_mut() {
                ready!(retry.as_mut().poll(cx));
                this.retry = None;
            }
            let (stream, peer) = match ready!(this.listener.poll_accept(cx)) {
                Ok(accepted) => accepted,
                Err(e) => {
                    if this.accept_failed.due() {
                        tracing::warn!(error = %e, "cannot accept connections; retrying (if the error is EMFILE, raise the open-files limit)");
                    }
                    this.retry = Some(Box::pin(tokio::time::sleep(ACCEPT_RETRY)));
                    continue;
                }
            };
            let ends = match stream.local_addr() {
                Ok(local) => Ends { local, remote: peer },
                Err(_) => continue, // gone already
            };
            let admitted = match this.connections.admit(ends, Some(stream.as_raw_fd())) {
                Ok(admitted) => admitted,
                Err(why) => {
                    if this.refused.due() {
                        let limits = this.connections.limits();
                        tracing::warn!(
                            %peer,
                            per_address = limits.per_address,
                            total = limits.total,
                            "connection closed at once: {why}"
                        );
                    }
                    continue; // `stream` is dropped: closed
                }
            };
            if let Some(closed) = admitted.made_room_by_closing
                && this.made_room.due()
            {
                tracing::info!(%peer, %closed, "an idle connection was closed to make room for a new one");
            }
            return Poll::Ready(Some(Ok(GuardedStream::new(
                stream,
                admitted.connection,
                this.connections.clone(),
                Handshake::new(this.tls),
            ))));
        }
    }
}

/// A connection that counts against its address while it lives and fails its reads once its
/// peer has been slow to complete its handshake, silent too long after, or once it has been
/// closed to make room.
pub struct GuardedStream {
    inner: TcpStream,
    connection: Arc<Connection>,
    connections: Connections,
    /// When the connection ends unless the peer does more: the handshake deadline (which reads
    /// do not move), then the end of each silence.
    silence: Pin<Box<Sleep>>,
    handshake: Handshake,
    silent_for: Duration,
}

impl GuardedStream {
    fn new(inner: TcpStream, connection: Arc<Connection>, connections: Connections, handshake: Handshake) -> Self {
        let _ = inner.set_nodelay(true);
        let limits = *connections.limits();
        GuardedStream {
            inner,
            connection,
            connections,
            silence: Box::pin(tokio::time::sleep(limits.handshake_within)),
            handshake,
            silent_for: limits.silent_for,
        }
    }

    fn closed_to_make_room() -> io::Error {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "closed to make room for another connection: this one had no call running for a while",
        )
    }
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        // Before `inner` closes the socket (fields drop after this body).
        self.connection.socket_closing();
        self.connections.release(&self.connection);
    }
}

impl Connected for GuardedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

impl GuardedStream {
    /// What ends the connection while the socket has nothing to give or take: being closed to
    /// make room, or the peer's silence. Polled whether the server waits to read or to write, so
    /// that a peer which stops reading cannot keep a connection by blocking the server's writes.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        self.connection.wake_on_close(cx.waker());
        // Checked after the waker's registration: a close in between still wakes this task.
        if self.connection.is_closing() {
            return Poll::Ready(Self::closed_to_make_room());
        }
        ready!(self.silence.as_mut().poll(cx));
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            "the peer did not complete its handshake in time, or then sent nothing for too long",
        ))
    }

    /// `Err` once the connection has been closed to make room.
    fn check_open(&self) -> io::Result<()> {
        if self.connection.is_closing() {
            Err(Self::closed_to_make_room())
        } else {
            Ok(())
        }
    }

    /// A write-side result, unless the write is stuck past the connection's end.
    fn unless_ended<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => self.poll_end(cx).map(Err),
            ready => ready,
        }
    }
}

impl GuardedStream {
    /// `read` arrived: the handshake reads it until it is done, and from then on every read
    /// puts the silence deadline off again (until the handshake is done, only its own counts).
    fn bytes_came(&mut self, read: &[u8]) {
        if !self.handshake.done() {
            self.handshake.read(read);
            if self.handshake.done() {
                self.connection.handshake_done();
            }
        }
        if self.handshake.done() {
            let next = Instant::now() + self.silent_for;
            self.silence.as_mut().reset(next);
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_open()?;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.bytes_came(&buf.filled()[before..]);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_end(cx).map(Err),
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_open()?;
        let polled = Pin::new(&mut this.inner).poll_write(cx, data);
        this.unless_ended(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_open()?;
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.unless_ended(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.unless_ended(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_open()?;
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.unless_ended(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::super::ConnectionLimits;
    use super::super::handshake::HTTP2_PREFACE as PREFACE;
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    fn limits(per_address: usize, total: usize) -> ConnectionLimits {
        ConnectionLimits {
            per_address,
            total,
            handshake_within: Duration::from_millis(300),
            silent_for: Duration::from_millis(600),
            evictable_after: Duration::from_secs(60),
        }
    }

    async fn listening(limits: ConnectionLimits) -> (GuardedIncoming, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        (GuardedIncoming::new(listener, Connections::new(limits), false), address)
    }

    /// A client whose connection the server has taken, past its handshake (the preface read).
    async fn established(incoming: &mut GuardedIncoming, address: SocketAddr) -> (TcpStream, GuardedStream) {
        let mut client = TcpStream::connect(address).await.unwrap();
        let mut served = incoming.next().await.unwrap().unwrap();
        client.write_all(PREFACE).await.unwrap();
        served.read_exact(&mut [0u8; PREFACE.len()]).await.unwrap();
        (client, served)
    }

    /// Whether the server closed `client`'s connection (end of stream or reset).
    async fn closed_by_server(client: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), client.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn a_handshake_trickled_in_is_cut_at_its_deadline() {
        let (mut incoming, address) = listening(limits(4, 4)).await;
        let started = Instant::now();
        let mut trickler = TcpStream::connect(address).await.unwrap();
        let mut server = incoming.next().await.unwrap().unwrap();
        let feed = tokio::spawn(async move {
            for byte in PREFACE.iter().take(20) {
                if trickler.write_all(&[*byte]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            trickler
        });
        let mut got = Vec::new();
        let err = loop {
            let mut byte = [0u8; 1];
            match server.read(&mut byte).await {
                Ok(n) => got.extend_from_slice(&byte[..n]),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "each byte moved the deadline"
        );
        assert!(!got.is_empty(), "the trickle was read");
        feed.abort();
    }

    #[tokio::test]
    async fn an_address_over_its_limit_is_closed_at_once_and_admitted_when_one_goes() {
        let (mut incoming, address) = listening(limits(2, 10)).await;
        let mut clients = Vec::new();
        let mut served = Vec::new();
        for _ in 0..2 {
            let (client, server) = established(&mut incoming, address).await;
            clients.push(client);
            served.push(server);
        }
        // The third is accepted and closed inside the stream; the stream waits for the next.
        let mut third = TcpStream::connect(address).await.unwrap();
        let next = tokio::time::timeout(Duration::from_millis(200), incoming.next()).await;
        assert!(
            next.is_err(),
            "a third connection from one address was handed to the server"
        );
        assert!(closed_by_server(&mut third).await);
        // One of the two closes: the address may connect again.
        drop(served.pop());
        let _again = TcpStream::connect(address).await.unwrap();
        assert!(incoming.next().await.unwrap().is_ok());
    }

    /// Connections that never finish their handshake, reopened as its deadline cuts them, are
    /// always younger than the grace: they must still give way to a newcomer from their address
    /// (a validator behind the same NAT), the oldest first, or 32 of them keep it out.
    #[tokio::test]
    async fn a_connection_still_in_its_handshake_gives_way_to_a_newcomer() {
        let (mut incoming, address) = listening(limits(2, 10)).await;
        let mut stalled = TcpStream::connect(address).await.unwrap();
        let _stalled_served = incoming.next().await.unwrap().unwrap();
        let _established = established(&mut incoming, address).await;
        // At the address's limit, with nothing quiet by the grace: the stalled one goes.
        let _newcomer = TcpStream::connect(address).await.unwrap();
        assert!(incoming.next().await.unwrap().is_ok(), "the newcomer was refused");
        assert!(closed_by_server(&mut stalled).await);
    }

    #[tokio::test]
    async fn all_addresses_together_are_held_to_the_total() {
        let (mut incoming, address) = listening(limits(10, 1)).await;
        let _first = established(&mut incoming, address).await;
        let mut second = TcpStream::connect(address).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), incoming.next())
                .await
                .is_err()
        );
        assert!(closed_by_server(&mut second).await);
    }

    #[tokio::test]
    async fn a_peer_silent_from_the_start_or_later_is_cut_off() {
        let (mut incoming, address) = listening(limits(4, 4)).await;
        // Sends nothing at all: the first-bytes deadline ends it.
        let started = Instant::now();
        let _silent = TcpStream::connect(address).await.unwrap();
        let mut server = incoming.next().await.unwrap().unwrap();
        let err = server.read(&mut [0u8; 16]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(300));
        // Completes its handshake, talks, then falls silent: after the handshake each read
        // moves the deadline, then silence ends it.
        let mut talker = TcpStream::connect(address).await.unwrap();
        let mut server = incoming.next().await.unwrap().unwrap();
        talker.write_all(PREFACE).await.unwrap();
        server.read_exact(&mut [0u8; 24]).await.unwrap();
        let mut last_read = Instant::now();
        for _ in 0..3 {
            talker.write_all(b"ping").await.unwrap();
            let mut got = [0u8; 4];
            server.read_exact(&mut got).await.unwrap();
            last_read = Instant::now();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let err = server.read(&mut [0u8; 16]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            last_read.elapsed() >= Duration::from_millis(550),
            "{:?}",
            last_read.elapsed()
        );
    }

    /// Room for one connection, which gives way to the next at once unless busy; no other
    /// limit comes near.
    async fn one_place_for_the_quiet() -> (GuardedIncoming, SocketAddr) {
        listening(ConnectionLimits {
            evictable_after: Duration::ZERO,
            silent_for: Duration::from_secs(60),
            handshake_within: Duration::from_secs(60),
            ..limits(4, 1)
        })
        .await
    }

    /// A connection closed to make room ends at once, even while its reader waits on a peer
    /// that sends nothing.
    #[tokio::test]
    async fn an_idle_connection_closed_to_make_room_ends_its_pending_read() {
        let (mut incoming, address) = one_place_for_the_quiet().await;
        let _idle = TcpStream::connect(address).await.unwrap();
        let mut held = incoming.next().await.unwrap().unwrap();
        let reader = tokio::spawn(async move { held.read(&mut [0u8; 16]).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _newcomer = TcpStream::connect(address).await.unwrap();
        let _admitted = incoming.next().await.unwrap().unwrap();
        let read = tokio::time::timeout(Duration::from_secs(2), reader)
            .await
            .expect("the idle connection's read was not ended")
            .unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    }

    /// A connection blocked writing to a peer that does not read ends too when it is closed to
    /// make room: its driver may never come back to read.
    #[tokio::test]
    async fn a_connection_blocked_writing_ends_when_closed_to_make_room() {
        let (mut incoming, address) = one_place_for_the_quiet().await;
        let _never_reads = TcpStream::connect(address).await.unwrap();
        let mut held = incoming.next().await.unwrap().unwrap();
        let writer = tokio::spawn(async move {
            let chunk = vec![0u8; 1 << 20];
            loop {
                if let Err(e) = held.write_all(&chunk).await {
                    return e;
                }
            }
        });
        // Long enough for the socket buffers to fill and the writer to block.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!writer.is_finished());
        let _newcomer = TcpStream::connect(address).await.unwrap();
        let _admitted = incoming.next().await.unwrap().unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(2), writer)
            .await
            .expect("the blocked writer was not ended")
            .unwrap();
        assert!(
            matches!(
                ended.kind(),
                io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{ended:?}"
        );
    }
}
