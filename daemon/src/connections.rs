//! Accepting connections so that idle or numerous ones cannot take a daemon off the network.
//!
//! The rate limit counts calls, so a peer that opens connections and sends nothing is never
//! limited by it: each such connection holds a file descriptor, and once the process runs out,
//! every honest peer is refused. Three limits stop that, below TLS and HTTP/2:
//! - a connection must complete its handshake within [`ConnectionLimits::handshake_within`],
//!   however it trickles its bytes: under TLS, the client's first application-data record (its
//!   Finished, or its first data after it), which a peer cannot send before the handshake is
//!   done; in plaintext, the 24-byte HTTP/2 preface. It must not then fall silent for longer
//!   than [`ConnectionLimits::silent_for`]: the server pings idle connections every 30 s and an HTTP/2
//!   peer must answer, so only a dead or hostile peer stays silent that long, even while it
//!   reads a long challenge stream;
//! - one address (an IPv6 /64 counting as one) holds at most [`ConnectionLimits::per_address`]
//!   connections at once;
//! - all addresses together hold at most [`ConnectionLimits::total`], kept below the process's
//!   file limit (which [`raise_open_files_limit`] lifts to its hard limit at start).
//!
//! And when accepting fails (the process is out of descriptors after all), the loop waits
//! before trying again instead of spinning on the error.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// How many connections a daemon holds, and how long a silent one lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub per_address: usize,
    pub total: usize,
    pub handshake_within: Duration,
    pub silent_for: Duration,
}

/// File descriptors kept out of [`ConnectionLimits::total`] for everything else a daemon opens:
/// its database or nonce log, GPU device nodes, the metrics listener, log files.
const RESERVED_FILES: u64 = 256;

impl ConnectionLimits {
    /// Limits for a process allowed `open_files` descriptors.
    pub fn for_open_files(open_files: u64) -> Self {
        let total = open_files.saturating_sub(RESERVED_FILES).clamp(64, 16_384) as usize;
        ConnectionLimits {
            per_address: 32.min(total),
            total,
            handshake_within: Duration::from_secs(10),
            silent_for: Duration::from_secs(75),
        }
    }
}

impl Default for ConnectionLimits {
    /// For the common soft limit of 1024 descriptors.
    fn default() -> Self {
        ConnectionLimits::for_open_files(1024)
    }
}

/// Raises this process's soft limit on open files to its hard limit, and returns the limit now
/// in force. Services are commonly started with a soft limit of 1024 under a far higher hard
/// limit, which a daemon holding a connection per peer can reach.
pub fn raise_open_files_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}

/// Raises the open-files limit ([`raise_open_files_limit`]) and sizes the connection limits to
/// it: what a daemon calls once at start.
pub fn limits_for_this_process() -> ConnectionLimits {
    let limits = match raise_open_files_limit() {
        Ok(files) => ConnectionLimits::for_open_files(files),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-files limit; sizing connections for 1024");
            ConnectionLimits::default()
        }
    };
    tracing::info!(
        per_address = limits.per_address,
        total = limits.total,
        "connections held at most"
    );
    limits
}

/// The address a connection counts against: an IPv4 address, or an IPv6 /64, since one host
/// commonly holds a whole /64 and could otherwise take a new address per connection.
fn counted_as(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
        v4 => v4,
    }
}

/// Connections held per address, and in all, shared by the accept loop and the connections it
/// made.
#[derive(Clone, Default)]
struct Held(Arc<Mutex<HeldCounts>>);

#[derive(Default)]
struct HeldCounts {
    per_address: HashMap<IpAddr, usize>,
    total: usize,
}

impl Held {
    /// Counts a new connection from `ip` if both limits allow it.
    fn admit(&self, ip: IpAddr, limits: &ConnectionLimits) -> bool {
        let address = counted_as(ip);
        let mut held = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let from_address = held.per_address.get(&address).copied().unwrap_or(0);
        if held.total >= limits.total || from_address >= limits.per_address {
            return false;
        }
        *held.per_address.entry(address).or_insert(0) += 1;
        held.total += 1;
        true
    }

    fn release(&self, ip: IpAddr) {
        let address = counted_as(ip);
        let mut held = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(n) = held.per_address.get_mut(&address) {
            *n -= 1;
            if *n == 0 {
                held.per_address.remove(&address);
            }
            held.total -= 1;
        }
    }
}

/// How long the accept loop waits after accepting failed (out of descriptors, out of memory),
/// so that it does not spin on an error that only a closing connection can clear.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The connections `listener` accepts, within `limits`. A connection over a limit is closed at
/// once; an accept error is logged (at most once a minute) and retried after a pause.
/// `tls` says whether the daemon speaks TLS on these connections, which is how it sees a
/// handshake end.
pub fn guarded(listener: TcpListener, limits: ConnectionLimits, tls: bool) -> GuardedIncoming {
    GuardedIncoming {
        listener,
        limits,
        tls,
        held: Held::default(),
        retry: None,
        last_warning: None,
    }
}

/// The stream of [`guarded`] connections, for `serve_with_incoming`.
pub struct GuardedIncoming {
    listener: TcpListener,
    limits: ConnectionLimits,
    tls: bool,
    held: Held,
    /// Set after an accept error: no accepting until it has passed.
    retry: Option<Pin<Box<Sleep>>>,
    last_warning: Option<Instant>,
}

impl GuardedIncoming {
    /// Logs `what`, unless something was logged in the last minute: a flood must not flood the
    /// log too.
    fn warn(&mut self, what: &str, detail: String) {
        if self
            .last_warning
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
        {
            self.last_warning = Some(Instant::now());
            tracing::warn!(%detail, "{what}");
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
                    this.warn(
                        "cannot accept connections; retrying (if the error is EMFILE, raise the open-files limit)",
                        e.to_string(),
                    );
                    this.retry = Some(Box::pin(tokio::time::sleep(ACCEPT_RETRY)));
                    continue;
                }
            };
            if !this.held.admit(peer.ip(), &this.limits) {
                let detail = format!(
                    "{peer}; at most {} per address and {} in all",
                    this.limits.per_address, this.limits.total
                );
                this.warn(
                    "connection closed at once: its address, or all addresses together, hold the most connections allowed",
                    detail,
                );
                continue; // `stream` is dropped: closed
            }
            let held = this.held.clone();
            let handshake = Handshake::new(this.tls);
            return Poll::Ready(Some(Ok(GuardedStream::new(
                stream,
                peer,
                held,
                &this.limits,
                handshake,
            ))));
        }
    }
}

/// How far a connection's handshake has come, read from the bytes its peer sent.
#[derive(Debug)]
enum Handshake {
    /// Plaintext HTTP/2: this many bytes of the client preface still to come.
    Preface(usize),
    /// TLS: walking the client's records until a whole application-data record has arrived.
    Tls {
        header: [u8; 5],
        header_len: usize,
        /// Body bytes of the current record still to come, and its content type.
        body_left: usize,
        content_type: u8,
    },
    Done,
}

/// TLS's content type for application data: under TLS 1.3 the client's Finished already goes
/// out as one, under TLS 1.2 its first data after the handshake.
const APPLICATION_DATA: u8 = 23;

impl Handshake {
    fn new(tls: bool) -> Self {
        if tls {
            Handshake::Tls {
                header: [0; 5],
                header_len: 0,
                body_left: 0,
                content_type: 0,
            }
        } else {
            Handshake::Preface(24)
        }
    }

    /// Takes in bytes the peer sent.
    fn read(&mut self, mut data: &[u8]) {
        loop {
            match self {
                Handshake::Done => return,
                Handshake::Preface(left) => {
                    *left = left.saturating_sub(data.len());
                    if *left == 0 {
                        *self = Handshake::Done;
                    }
                    return;
                }
                Handshake::Tls {
                    header,
                    header_len,
                    body_left,
                    content_type,
                } => {
                    if data.is_empty() {
                        return;
                    }
                    if *body_left > 0 {
                        let take = (*body_left).min(data.len());
                        *body_left -= take;
                        data = &data[take..];
                        if *body_left == 0 && *content_type == APPLICATION_DATA {
                            *self = Handshake::Done;
                        }
                        continue;
                    }
                    header[*header_len] = data[0];
                    *header_len += 1;
                    data = &data[1..];
                    if *header_len == header.len() {
                        *header_len = 0;
                        *content_type = header[0];
                        *body_left = usize::from(u16::from_be_bytes([header[3], header[4]]));
                        if *body_left == 0 && *content_type == APPLICATION_DATA {
                            *self = Handshake::Done;
                        }
                    }
                }
            }
        }
    }

    fn done(&self) -> bool {
        matches!(self, Handshake::Done)
    }
}

/// A connection that counts against its address while it lives and fails its reads once its
/// peer has been slow to complete its handshake, or silent too long after.
pub struct GuardedStream {
    inner: TcpStream,
    peer: SocketAddr,
    held: Held,
    /// When the connection ends unless the peer does more: the handshake deadline (which reads
    /// do not move), then the end of each silence.
    silence: Pin<Box<Sleep>>,
    handshake: Handshake,
    silent_for: Duration,
}

impl GuardedStream {
    fn new(inner: TcpStream, peer: SocketAddr, held: Held, limits: &ConnectionLimits, handshake: Handshake) -> Self {
        let _ = inner.set_nodelay(true);
        GuardedStream {
            inner,
            peer,
            held,
            silence: Box::pin(tokio::time::sleep(limits.handshake_within)),
            handshake,
            silent_for: limits.silent_for,
        }
    }
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        self.held.release(self.peer.ip());
    }
}

impl Connected for GuardedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    if !this.handshake.done() {
                        this.handshake.read(&buf.filled()[before..]);
                    }
                    // Until the handshake is done, only its own deadline counts.
                    if this.handshake.done() {
                        let next = Instant::now() + this.silent_for;
                        this.silence.as_mut().reset(next);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                ready!(this.silence.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer did not complete its handshake in time, or then sent nothing for too long",
                )))
            }
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    fn limits(per_address: usize, total: usize) -> ConnectionLimits {
        ConnectionLimits {
            per_address,
            total,
            handshake_within: Duration::from_millis(300),
            silent_for: Duration::from_millis(600),
        }
    }

    async fn listening(limits: ConnectionLimits) -> (GuardedIncoming, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        (guarded(listener, limits, false), address)
    }

    /// Whether the server closed `client`'s connection (end of stream or reset).
    async fn closed_by_server(client: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), client.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// Bytes trickled before the handshake is done do not keep a connection: a ClientHello
    /// dribbled a byte at a time would otherwise hold it for hours.
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

    #[test]
    fn a_tls_handshake_ends_with_the_first_whole_application_data_record() {
        let mut handshake = Handshake::new(true);
        // A ClientHello record (type 22) of 3 bytes, split anyhow.
        handshake.read(&[22, 3, 1]);
        handshake.read(&[0, 3, 1]);
        handshake.read(&[2, 3]);
        assert!(!handshake.done());
        // A change-cipher-spec record, then the header of an application-data record.
        handshake.read(&[20, 3, 3, 0, 1, 1, 23, 3, 3, 0, 4]);
        assert!(!handshake.done(), "a record header alone is not a finished handshake");
        handshake.read(&[9, 9, 9]);
        assert!(!handshake.done());
        handshake.read(&[9, 99, 99]);
        assert!(handshake.done());
        let mut plain = Handshake::new(false);
        plain.read(&PREFACE[..23]);
        assert!(!plain.done());
        plain.read(&PREFACE[23..]);
        assert!(plain.done());
    }

    #[test]
    fn an_ipv6_host_counts_as_its_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(counted_as(a), counted_as(b));
        assert_ne!(counted_as(a), counted_as(other));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(counted_as(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
        let held = Held::default();
        let limits = ConnectionLimits {
            per_address: 1,
            ..ConnectionLimits::default()
        };
        assert!(held.admit(a, &limits));
        assert!(!held.admit(b, &limits), "a second address of the same /64 got in");
        assert!(held.admit(other, &limits));
        held.release(a);
        assert!(held.admit(b, &limits));
    }

    #[test]
    fn limits_follow_the_open_files_limit_and_keep_a_reserve() {
        assert_eq!(ConnectionLimits::for_open_files(1024).total, 768);
        assert_eq!(ConnectionLimits::for_open_files(1_048_576).total, 16_384);
        let tiny = ConnectionLimits::for_open_files(100);
        assert_eq!((tiny.total, tiny.per_address), (64, 32));
        assert!(raise_open_files_limit().unwrap() >= 64);
    }

    #[tokio::test]
    async fn an_address_over_its_limit_is_closed_at_once_and_admitted_when_one_goes() {
        let (mut incoming, address) = listening(limits(2, 10)).await;
        let mut clients = Vec::new();
        let mut served = Vec::new();
        for _ in 0..2 {
            clients.push(TcpStream::connect(address).await.unwrap());
            served.push(incoming.next().await.unwrap().unwrap());
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

    #[tokio::test]
    async fn all_addresses_together_are_held_to_the_total() {
        let (mut incoming, address) = listening(limits(10, 1)).await;
        let _first = TcpStream::connect(address).await.unwrap();
        let _held = incoming.next().await.unwrap().unwrap();
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
}
