//! The connections a daemon holds, counted per address and in all, and the choice, once a limit
//! is reached, of the connection that makes room for a newcomer.
//!
//! A connection carrying a call that holds it ([`super::holds_connection`]) is never chosen.
//! Otherwise a connection may give way once it has been quiet for
//! [`ConnectionLimits::evictable_after`]: since it opened, or since its last held call started
//! or ended. Other calls do not count, since a stranger can make them at will (the rate limit
//! allows a call every few seconds, and one call per connection every 10 s would keep them all).
//! Of the quiet ones, the one chosen belongs to the address holding the most connections, and is
//! the quietest there. When all addresses together are full and none is quiet, an address
//! holding at least [`CROWDED`] connections, and more than the newcomer's address, gives up its
//! quietest unheld one anyway: a peer that keeps its connections fresh by reconnecting them then
//! needs about one address per [`CROWDED`] - 1 places.
//!
//! A connection chosen to make room is shut down at the socket, so that it ends whatever the
//! server is doing with it (even blocked writing to a peer that does not read). Until it has
//! gone it still holds a descriptor, so at most [`CLOSING_AT_MOST`] such connections are let
//! linger beyond the total before newcomers are refused.

use super::{ConnectionLimits, counted_as};
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

/// The connections an address must hold before, with every place taken and none quiet, its
/// fresh ones give way to an address holding fewer. An honest peer holds one or two at a time.
pub(super) const CROWDED: usize = 4;

/// Connections chosen to make room but not yet gone, beyond the total, before newcomers are
/// refused whatever: the reserve of descriptors is not spent on connections that linger.
const CLOSING_AT_MOST: usize = 32;

/// A connection's two ends: unique among live TCP connections, even on a host with several
/// addresses (where one remote port may reach two of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Ends {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// One held connection, shared by its stream, the table and the calls made on it.
#[derive(Debug)]
pub(super) struct Connection {
    ends: Ends,
    /// The address it counts against ([`counted_as`]).
    address: IpAddr,
    /// The table's clock origin, so that times fit in one atomic.
    epoch: Instant,
    /// Calls running on it that hold it.
    calls_running: AtomicUsize,
    /// When it opened, or a call that holds it last started or ended: nanoseconds since `epoch`.
    quiet_since: AtomicU64,
    /// Set once its peer completed the handshake (TLS, or the HTTP/2 preface). Until then it is
    /// the first to give way at a limit: an honest peer completes it within milliseconds, so a
    /// connection still in it holds nothing yet, and a crowd of connections that never finish
    /// theirs, reopened as the handshake deadline cuts them, would otherwise never be quiet and
    /// could keep an address's honest newcomer out.
    handshake_done: AtomicBool,
    /// Set once it has carried a call a trusted peer proved it made (an allowed validator's
    /// signed challenge): its requests are then not counted against its address's rate or the
    /// budget of unfinished requests, which a stranger at the same address can exhaust.
    trusted: AtomicBool,
    /// Set once it has been chosen to make room: its reads and writes fail from then on.
    closing: AtomicBool,
    /// The task driving the connection, to wake when it is closed.
    driver: Mutex<Option<Waker>>,
    /// Its socket, until its stream drops it: closing shuts it down. Cleared (under the lock)
    /// before the socket is closed, so that a descriptor reused since is never touched.
    socket: Mutex<Option<RawFd>>,
}

impl Connection {
    fn new(ends: Ends, socket: Option<RawFd>, epoch: Instant) -> Self {
        let connection = Connection {
            ends,
            address: counted_as(ends.remote.ip()),
            epoch,
            calls_running: AtomicUsize::new(0),
            quiet_since: AtomicU64::new(0),
            handshake_done: AtomicBool::new(false),
            trusted: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            driver: Mutex::new(None),
            socket: Mutex::new(socket),
        };
        connection.touch();
        connection
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn touch(&self) {
        let now = u64::try_from(self.now().as_nanos()).unwrap_or(u64::MAX);
        self.quiet_since.store(now, Ordering::Relaxed);
    }

    /// How long, at `now` (since the epoch), it has been quiet.
    fn quiet_for(&self, now: Duration) -> Duration {
        now.saturating_sub(Duration::from_nanos(self.quiet_since.load(Ordering::Relaxed)))
    }

    /// A call that holds it starts; it ends when the guard drops.
    pub(super) fn call_started(self: &Arc<Self>) -> RunningCall {
        self.calls_running.fetch_add(1, Ordering::AcqRel);
        self.touch();
        RunningCall(self.clone())
    }

    fn is_held(&self) -> bool {
        self.calls_running.load(Ordering::Acquire) > 0
    }

    fn is_quiet(&self, limits: &ConnectionLimits, now: Duration) -> bool {
        !self.is_held() && (self.in_handshake() || self.quiet_for(now) >= limits.evictable_after)
    }

    /// Its peer finished the handshake.
    pub(super) fn handshake_done(&self) {
        self.handshake_done.store(true, Ordering::Release);
    }

    fn in_handshake(&self) -> bool {
        !self.handshake_done.load(Ordering::Acquire)
    }

    /// Marks it as a trusted peer's (see the field).
    pub(super) fn trust(&self) {
        self.trusted.store(true, Ordering::Release);
    }

    pub(super) fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    /// Whether it has been chosen to make room.
    pub(super) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Has `waker` woken when the connection is closed to make room.
    pub(super) fn wake_on_close(&self, waker: &Waker) {
        let mut driver = lock(&self.driver);
        if !driver.as_ref().is_some_and(|held| held.will_wake(waker)) {
            *driver = Some(waker.clone());
        }
    }

    /// Its stream is about to close the socket: closing must not touch it from now on.
    pub(super) fn socket_closing(&self) {
        lock(&self.socket).take();
    }

    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        if let Some(fd) = *lock(&self.socket) {
            // SAFETY: `fd` is this connection's open socket: its stream clears it under this
            // lock before closing it. Shutting it down ends the connection's reads and writes
            // (whichever its driver is blocked on) without closing the descriptor, which stays
            // the stream's to close.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        if let Some(waker) = lock(&self.driver).take() {
            waker.wake();
        }
    }
}

/// A call running on a connection: while one lives, the connection is not closed to make room.
#[derive(Debug)]
pub(super) struct RunningCall(Arc<Connection>);

impl Drop for RunningCall {
    fn drop(&mut self) {
        self.0.touch();
        self.0.calls_running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Its address holds the most connections allowed, none of them quiet.
    AddressFull,
    /// All addresses together hold the most connections allowed, none of them able to give way.
    AllFull,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refused::AddressFull => "its address holds the most connections allowed, each one busy or recently used",
            Refused::AllFull => {
                "all addresses together hold the most connections allowed, each one busy or recently used"
            }
        })
    }
}

/// An admitted connection, and the one closed to make room for it, if any.
#[derive(Debug)]
pub(super) struct Admitted {
    pub connection: Arc<Connection>,
    pub made_room_by_closing: Option<SocketAddr>,
}

/// The connections held on one listener, shared by its accept loop, its connections and the
/// layer that sees their calls.
#[derive(Clone)]
pub struct Connections(Arc<Shared>);

struct Shared {
    limits: ConnectionLimits,
    epoch: Instant,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    live: HashMap<Ends, Arc<Connection>>,
    per_address: HashMap<IpAddr, usize>,
    /// Closed to make room, and not yet gone.
    closing: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Connections {
    pub(super) fn new(limits: ConnectionLimits) -> Self {
        Connections(Arc::new(Shared {
            limits,
            epoch: Instant::now(),
            table: Mutex::new(Table::default()),
        }))
    }

    pub(super) fn limits(&self) -> &ConnectionLimits {
        &self.0.limits
    }

    /// Counts a new connection with `ends` on `socket`, closing another to make room if a limit
    /// is reached and one may give way.
    pub(super) fn admit(&self, ends: Ends, socket: Option<RawFd>) -> Result<Admitted, Refused> {
        let limits = &self.0.limits;
        let now = self.0.epoch.elapsed();
        let address = counted_as(ends.remote.ip());
        let mut table = lock(&self.0.table);
        if table.closing >= CLOSING_AT_MOST {
            return Err(Refused::AllFull);
        }
        let mut made_room_by_closing = None;
        if table.held_by(address) >= limits.per_address {
            let victim = table
                .live
                .values()
                .filter(|c| c.address == address && c.is_quiet(limits, now))
                .max_by_key(|c| c.quiet_for(now))
                .cloned()
                .ok_or(Refused::AddressFull)?;
            made_room_by_closing = Some(victim.ends.remote);
            table.close(&victim);
        }
        if table.live.len() >= limits.total {
            let victim = table
                .quietest_of_the_crowded(limits, now)
                .or_else(|| table.freshest_crowd_gives_way(address, now))
                .ok_or(Refused::AllFull)?;
            made_room_by_closing = Some(victim.ends.remote);
            table.close(&victim);
        }
        let connection = Arc::new(Connection::new(ends, socket, self.0.epoch));
        *table.per_address.entry(address).or_insert(0) += 1;
        table.live.insert(ends, connection.clone());
        Ok(Admitted {
            connection,
            made_room_by_closing,
        })
    }

    /// Forgets `connection`, whose stream has ended.
    pub(super) fn release(&self, connection: &Arc<Connection>) {
        let mut table = lock(&self.0.table);
        if connection.is_closing() {
            table.closing -= 1; // it left the live ones when it was closed
        } else if table
            .live
            .get(&connection.ends)
            .is_some_and(|held| Arc::ptr_eq(held, connection))
        {
            table.forget(connection);
        }
    }

    /// The live connection with these `ends`.
    pub(super) fn find(&self, ends: Ends) -> Option<Arc<Connection>> {
        lock(&self.0.table).live.get(&ends).cloned()
    }
}

impl Table {
    fn held_by(&self, address: IpAddr) -> usize {
        self.per_address.get(&address).copied().unwrap_or(0)
    }

    /// The quiet connection of the address holding the most, the quietest there.
    fn quietest_of_the_crowded(&self, limits: &ConnectionLimits, now: Duration) -> Option<Arc<Connection>> {
        self.live
            .values()
            .filter(|c| c.is_quiet(limits, now))
            .max_by_key(|c| (self.held_by(c.address), c.quiet_for(now)))
            .cloned()
    }

    /// With none quiet: the quietest unheld connection of the address holding the most, if it
    /// holds at least [`CROWDED`] and more than `newcomer` would after joining.
    fn freshest_crowd_gives_way(&self, newcomer: IpAddr, now: Duration) -> Option<Arc<Connection>> {
        let (&crowded, &holds) = self.per_address.iter().max_by_key(|(_, held)| **held)?;
        if holds < CROWDED || holds <= self.held_by(newcomer) + 1 {
            return None;
        }
        self.live
            .values()
            .filter(|c| c.address == crowded && !c.is_held())
            .max_by_key(|c| c.quiet_for(now))
            .cloned()
    }

    fn forget(&mut self, connection: &Connection) {
        self.live.remove(&connection.ends);
        if let Some(n) = self.per_address.get_mut(&connection.address) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&connection.address);
            }
        }
    }

    /// Closes `connection` to make room: it leaves the live ones now, and counts as closing
    /// until its stream has gone.
    fn close(&mut self, connection: &Arc<Connection>) {
        self.forget(connection);
        self.closing += 1;
        connection.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_address: usize, total: usize, evictable_after: Duration) -> ConnectionLimits {
        ConnectionLimits {
            per_address,
            total,
            handshake_within: Duration::from_secs(10),
            silent_for: Duration::from_secs(75),
            evictable_after,
        }
    }

    /// A connection from `address:port` to the listener's first local address.
    fn at(address: &str, port: u16) -> Ends {
        Ends {
            local: "192.0.2.254:7000".parse().unwrap(),
            remote: SocketAddr::new(address.parse().unwrap(), port),
        }
    }

    impl Connections {
        /// A connection whose peer has finished its handshake.
        fn open(&self, address: &str, port: u16) -> Result<Admitted, Refused> {
            let admitted = self.open_in_handshake(address, port)?;
            admitted.connection.handshake_done();
            Ok(admitted)
        }

        fn open_in_handshake(&self, address: &str, port: u16) -> Result<Admitted, Refused> {
            self.admit(at(address, port), None)
        }
    }

    /// Connections still in their handshake hold nothing yet: at a limit they give way first,
    /// the oldest first, even when younger than the grace; an established one that young
    /// does not.
    #[test]
    fn connections_still_in_their_handshake_give_way_first() {
        let connections = Connections::new(limits(3, 100, Duration::from_secs(60)));
        let stalled = [1, 2].map(|port| connections.open_in_handshake("192.0.2.1", port).unwrap().connection);
        let established = connections.open("192.0.2.1", 3).unwrap().connection;
        assert_eq!(
            closed(connections.open("192.0.2.1", 4).unwrap()),
            Some(at("192.0.2.1", 1)),
            "the oldest stalled handshake"
        );
        assert_eq!(
            closed(connections.open("192.0.2.1", 5).unwrap()),
            Some(at("192.0.2.1", 2))
        );
        assert!(stalled.iter().all(|c| c.is_closing()) && !established.is_closing());
        assert_eq!(
            connections.open("192.0.2.1", 6).unwrap_err(),
            Refused::AddressFull,
            "established connections within the grace keep their places"
        );
    }

    fn closed(admitted: Admitted) -> Option<Ends> {
        admitted.made_room_by_closing.map(|remote| Ends {
            remote,
            ..at("0.0.0.0", 0)
        })
    }

    #[test]
    fn one_slash_64_is_held_to_one_address_limit() {
        let connections = Connections::new(limits(1, 100, Duration::from_secs(60)));
        let first = connections.open("2001:db8:1:2:aaaa::1", 1).unwrap().connection;
        assert_eq!(
            connections.open("2001:db8:1:2:bbbb::9", 2).unwrap_err(),
            Refused::AddressFull,
            "a second address of the same /64 got in"
        );
        connections.open("2001:db8:1:3::1", 3).unwrap();
        connections.release(&first);
        connections.open("2001:db8:1:2:bbbb::9", 2).unwrap();
    }

    #[test]
    fn a_held_or_recently_used_connection_is_never_closed_to_make_room() {
        let connections = Connections::new(limits(10, 2, Duration::from_millis(50)));
        let busy = connections.open("192.0.2.1", 1).unwrap().connection;
        let call = busy.call_started();
        let fresh = connections.open("192.0.2.2", 1).unwrap().connection;
        assert_eq!(
            connections.open("192.0.2.3", 1).unwrap_err(),
            Refused::AllFull,
            "nothing is quiet yet"
        );
        std::thread::sleep(Duration::from_millis(80));
        // Now `fresh` has been quiet long enough; `busy` still has its call.
        let admitted = connections.open("192.0.2.3", 1).unwrap();
        assert_eq!(closed(admitted), Some(at("192.0.2.2", 1)));
        assert!(fresh.is_closing() && !busy.is_closing());
        // Its stream ending later forgets nothing else.
        connections.release(&fresh);
        assert!(connections.find(at("192.0.2.3", 1)).is_some());
        // A held call that has just ended protects its connection for the grace again.
        drop(call);
        assert_eq!(connections.open("192.0.2.4", 1).unwrap_err(), Refused::AllFull);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(
            closed(connections.open("192.0.2.4", 1).unwrap()),
            Some(at("192.0.2.3", 1)),
            "of two quiet connections, the quietest goes"
        );
        assert!(!busy.is_closing());
    }

    #[test]
    fn room_is_made_first_at_the_address_holding_the_most() {
        let connections = Connections::new(limits(10, 4, Duration::ZERO));
        // The honest peer's connection is the oldest, hence the quietest.
        let honest = connections.open("192.0.2.1", 1).unwrap().connection;
        std::thread::sleep(Duration::from_millis(5));
        for port in 1..=3 {
            connections.open("198.51.100.9", port).unwrap();
        }
        let closed = connections
            .open("203.0.113.5", 1)
            .unwrap()
            .made_room_by_closing
            .unwrap();
        assert_eq!(closed.ip(), "198.51.100.9".parse::<IpAddr>().unwrap());
        assert!(!honest.is_closing());
    }

    #[test]
    fn an_address_at_its_limit_makes_room_from_its_own_connections() {
        let connections = Connections::new(limits(2, 100, Duration::from_millis(50)));
        let other = connections.open("192.0.2.1", 1).unwrap().connection;
        let own = [1, 2].map(|port| connections.open("192.0.2.2", port).unwrap().connection);
        std::thread::sleep(Duration::from_millis(80));
        let _call = own[1].call_started();
        let admitted = connections.open("192.0.2.2", 3).unwrap();
        assert_eq!(closed(admitted), Some(at("192.0.2.2", 1)));
        assert!(!other.is_closing(), "another address paid for this one's limit");
        assert_eq!(
            connections.open("192.0.2.2", 4).unwrap_err(),
            Refused::AddressFull,
            "the newest is too recent and the other busy"
        );
    }

    /// Reconnecting keeps connections fresh, but an address that holds many gives way to one
    /// that holds fewer all the same; a small holder keeps its fresh ones.
    #[test]
    fn a_crowd_of_fresh_connections_gives_way_to_a_newcomer() {
        let connections = Connections::new(limits(32, CROWDED + 1, Duration::from_secs(60)));
        let honest = connections.open("192.0.2.1", 1).unwrap().connection;
        let crowd: Vec<_> = (1..=CROWDED as u16)
            .map(|port| connections.open("198.51.100.9", port).unwrap().connection)
            .collect();
        let _held = crowd[0].call_started();
        let admitted = connections.open("203.0.113.5", 1).unwrap();
        assert_eq!(
            closed(admitted),
            Some(at("198.51.100.9", 2)),
            "the crowd's quietest unheld connection"
        );
        assert!(!honest.is_closing() && !crowd[0].is_closing());
        // Now the crowd holds CROWDED - 1: below the mark, nobody gives way.
        assert_eq!(connections.open("203.0.113.6", 1).unwrap_err(), Refused::AllFull);
    }

    /// A connection with the same remote end on another local address is another connection.
    #[test]
    fn connections_are_told_apart_by_both_ends() {
        let connections = Connections::new(limits(10, 10, Duration::from_secs(60)));
        let first = connections.admit(at("192.0.2.1", 5), None).unwrap().connection;
        let other_local = Ends {
            local: "198.51.100.254:7000".parse().unwrap(),
            ..at("192.0.2.1", 5)
        };
        let second = connections.admit(other_local, None).unwrap().connection;
        assert!(Arc::ptr_eq(&connections.find(at("192.0.2.1", 5)).unwrap(), &first));
        assert!(Arc::ptr_eq(&connections.find(other_local).unwrap(), &second));
        connections.release(&first);
        connections.release(&second);
        assert_eq!(lock(&connections.0.table).per_address.len(), 0, "a count leaked");
    }

    /// Connections closed to make room hold descriptors until they go: only so many may linger.
    #[test]
    fn connections_that_linger_after_closing_are_bounded() {
        let connections = Connections::new(limits(100, 1, Duration::ZERO));
        let mut lingering = vec![connections.open("192.0.2.1", 0).unwrap().connection];
        for port in 1..=CLOSING_AT_MOST as u16 {
            lingering.push(connections.open("192.0.2.1", port).unwrap().connection);
        }
        assert_eq!(
            connections.open("192.0.2.1", 999).unwrap_err(),
            Refused::AllFull,
            "{CLOSING_AT_MOST} closed connections that never went"
        );
        connections.release(&lingering[0]);
        connections.open("192.0.2.1", 999).unwrap();
    }

    #[test]
    fn closing_shuts_the_socket_down_and_wakes_its_driver() {
        use std::io::Read;
        use std::sync::atomic::AtomicUsize;
        use std::task::Wake;

        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        let connections = Connections::new(limits(1, 1, Duration::ZERO));
        let idle = connections
            .admit(at("192.0.2.1", 1), Some(std::os::fd::AsRawFd::as_raw_fd(&served)))
            .unwrap()
            .connection;
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        idle.wake_on_close(&Waker::from(woken.clone()));
        connections.open("192.0.2.1", 2).unwrap();
        assert!(idle.is_closing());
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(client.read(&mut [0u8; 1]).unwrap(), 0, "the peer did not see the end");
        drop(served);
    }
}
