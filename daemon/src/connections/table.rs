//! The connections a daemon holds, counted per address and in all, and the choice, once a limit
//! is reached, of the idle connection that makes room for a newcomer.
//!
//! A connection carrying a call that holds it ([`super::holds_connection`]) is never chosen, nor
//! one on which a call started or ended (or which opened) less than
//! [`ConnectionLimits::evictable_after`] ago. Of the rest, the
//! one chosen belongs to the address holding the most connections, and is the one quiet the
//! longest. So a peer that holds connections open and never calls keeps them only while nobody
//! else needs the room, and an honest peer's idle connection, if it is taken, costs that peer a
//! reconnection on its next call.

use super::{ConnectionLimits, counted_as};
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

/// One held connection, shared by its stream, the table and the calls made on it.
#[derive(Debug)]
pub(super) struct Connection {
    peer: SocketAddr,
    /// The address it counts against ([`counted_as`]).
    address: IpAddr,
    /// The table's clock origin, so that times fit in one atomic.
    epoch: Instant,
    /// Calls running on it that hold it.
    calls_running: AtomicUsize,
    /// When a call last started or ended on it, or it opened: nanoseconds since `epoch`.
    quiet_since: AtomicU64,
    /// Set once it has been chosen to make room: its reads fail from then on.
    closing: AtomicBool,
    /// The task reading the connection, to wake when it is closed.
    reader: Mutex<Option<Waker>>,
}

impl Connection {
    fn new(peer: SocketAddr, epoch: Instant) -> Self {
        let connection = Connection {
            peer,
            address: counted_as(peer.ip()),
            epoch,
            calls_running: AtomicUsize::new(0),
            quiet_since: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            reader: Mutex::new(None),
        };
        connection.touch();
        connection
    }

    /// Records activity now: a call started or ended.
    pub(super) fn touch(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.quiet_since.store(now, Ordering::Relaxed);
    }

    /// How long it has gone without a call starting or ending.
    fn quiet_for(&self) -> Duration {
        let since = Duration::from_nanos(self.quiet_since.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(since)
    }

    /// A call that holds it starts; it ends when the guard drops.
    pub(super) fn call_started(self: &Arc<Self>) -> RunningCall {
        self.calls_running.fetch_add(1, Ordering::AcqRel);
        self.touch();
        RunningCall(self.clone())
    }

    fn may_make_room(&self, limits: &ConnectionLimits) -> bool {
        self.calls_running.load(Ordering::Acquire) == 0 && self.quiet_for() >= limits.evictable_after
    }

    /// Whether it has been chosen to make room.
    pub(super) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Has `waker` woken when the connection is closed to make room.
    pub(super) fn wake_on_close(&self, waker: &Waker) {
        let mut reader = lock(&self.reader);
        if !reader.as_ref().is_some_and(|held| held.will_wake(waker)) {
            *reader = Some(waker.clone());
        }
    }

    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        if let Some(waker) = lock(&self.reader).take() {
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
    /// Its address holds the most connections allowed, none of them idle.
    AddressFull,
    /// All addresses together hold the most connections allowed, none of them idle.
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

/// An admitted connection, and the idle one closed to make room for it, if any.
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
    /// On one listener the peer's socket address tells live connections apart.
    by_peer: HashMap<SocketAddr, Arc<Connection>>,
    per_address: HashMap<IpAddr, usize>,
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

    /// Counts a new connection from `peer`, closing an idle one to make room if a limit is
    /// reached and one may be closed.
    pub(super) fn admit(&self, peer: SocketAddr) -> Result<Admitted, Refused> {
        let limits = &self.0.limits;
        let address = counted_as(peer.ip());
        let mut table = lock(&self.0.table);
        let mut made_room_by_closing = None;
        if table.per_address.get(&address).copied().unwrap_or(0) >= limits.per_address {
            let victim = table
                .by_peer
                .values()
                .filter(|c| c.address == address && c.may_make_room(limits))
                .max_by_key(|c| c.quiet_for())
                .cloned()
                .ok_or(Refused::AddressFull)?;
            made_room_by_closing = Some(victim.peer);
            table.close(&victim);
        }
        if table.by_peer.len() >= limits.total {
            let victim = table
                .by_peer
                .values()
                .filter(|c| c.may_make_room(limits))
                .max_by_key(|c| (table.per_address.get(&c.address).copied(), c.quiet_for()))
                .cloned()
                .ok_or(Refused::AllFull)?;
            made_room_by_closing = Some(victim.peer);
            table.close(&victim);
        }
        let connection = Arc::new(Connection::new(peer, self.0.epoch));
        *table.per_address.entry(address).or_insert(0) += 1;
        // A peer's socket address is unique among live connections, but one closed to make
        // room may not have gone yet: it has left the table already, so this replaces nothing.
        table.by_peer.insert(peer, connection.clone());
        Ok(Admitted {
            connection,
            made_room_by_closing,
        })
    }

    /// Forgets `connection`, which has ended (unless it was closed to make room: then it was
    /// forgotten then).
    pub(super) fn release(&self, connection: &Arc<Connection>) {
        let mut table = lock(&self.0.table);
        if table
            .by_peer
            .get(&connection.peer)
            .is_some_and(|held| Arc::ptr_eq(held, connection))
        {
            table.forget(connection);
        }
    }

    /// The held connection whose peer is at `peer`.
    pub(super) fn find(&self, peer: SocketAddr) -> Option<Arc<Connection>> {
        lock(&self.0.table).by_peer.get(&peer).cloned()
    }
}

impl Table {
    fn forget(&mut self, connection: &Connection) {
        self.by_peer.remove(&connection.peer);
        if let Some(n) = self.per_address.get_mut(&connection.address) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&connection.address);
            }
        }
    }

    /// Closes `connection` to make room: it leaves the counts now, and its reader is woken to
    /// end it.
    fn close(&mut self, connection: &Arc<Connection>) {
        self.forget(connection);
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

    fn at(address: &str, port: u16) -> SocketAddr {
        SocketAddr::new(address.parse().unwrap(), port)
    }

    #[test]
    fn one_slash_64_is_held_to_one_address_limit() {
        let connections = Connections::new(limits(1, 100, Duration::from_secs(60)));
        let a = at("2001:db8:1:2:aaaa::1", 1);
        let b = at("2001:db8:1:2:bbbb::9", 2);
        let other = at("2001:db8:1:3::1", 3);
        let first = connections.admit(a).unwrap().connection;
        assert_eq!(
            connections.admit(b).unwrap_err(),
            Refused::AddressFull,
            "a second address of the same /64 got in"
        );
        connections.admit(other).unwrap();
        connections.release(&first);
        connections.admit(b).unwrap();
    }

    #[test]
    fn a_busy_or_recently_used_connection_is_never_closed_to_make_room() {
        let connections = Connections::new(limits(10, 2, Duration::from_millis(50)));
        let busy = connections.admit(at("192.0.2.1", 1)).unwrap().connection;
        let call = busy.call_started();
        let fresh = connections.admit(at("192.0.2.2", 1)).unwrap().connection;
        assert_eq!(
            connections.admit(at("192.0.2.3", 1)).unwrap_err(),
            Refused::AllFull,
            "nothing is idle yet"
        );
        std::thread::sleep(Duration::from_millis(80));
        // Now `fresh` has been quiet long enough; `busy` still has its call.
        let admitted = connections.admit(at("192.0.2.3", 1)).unwrap();
        assert_eq!(admitted.made_room_by_closing, Some(at("192.0.2.2", 1)));
        assert!(fresh.is_closing() && !busy.is_closing());
        // Its stream ending later forgets nothing else.
        connections.release(&fresh);
        assert!(connections.find(at("192.0.2.3", 1)).is_some());
        // A call that has just ended protects its connection for the grace again.
        drop(call);
        assert_eq!(connections.admit(at("192.0.2.4", 1)).unwrap_err(), Refused::AllFull);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(
            connections.admit(at("192.0.2.4", 1)).unwrap().made_room_by_closing,
            Some(at("192.0.2.3", 1)),
            "of two idle connections, the one quiet the longest goes"
        );
        assert!(!busy.is_closing());
    }

    #[test]
    fn room_is_made_first_at_the_address_holding_the_most() {
        let connections = Connections::new(limits(10, 4, Duration::ZERO));
        // The honest peer's connection is the oldest, hence quiet the longest.
        let honest = connections.admit(at("192.0.2.1", 1)).unwrap().connection;
        std::thread::sleep(Duration::from_millis(5));
        for port in 1..=3 {
            connections.admit(at("198.51.100.9", port)).unwrap();
        }
        let admitted = connections.admit(at("203.0.113.5", 1)).unwrap();
        let closed = admitted.made_room_by_closing.unwrap();
        assert_eq!(closed.ip(), "198.51.100.9".parse::<IpAddr>().unwrap());
        assert!(!honest.is_closing());
    }

    #[test]
    fn an_address_at_its_limit_makes_room_from_its_own_connections() {
        let connections = Connections::new(limits(2, 100, Duration::from_millis(50)));
        let other = connections.admit(at("192.0.2.1", 1)).unwrap().connection;
        let own = [at("192.0.2.2", 1), at("192.0.2.2", 2)].map(|p| connections.admit(p).unwrap().connection);
        std::thread::sleep(Duration::from_millis(80));
        let _call = own[1].call_started();
        let admitted = connections.admit(at("192.0.2.2", 3)).unwrap();
        assert_eq!(admitted.made_room_by_closing, Some(at("192.0.2.2", 1)));
        assert!(!other.is_closing(), "another address paid for this one's limit");
        assert_eq!(
            connections.admit(at("192.0.2.2", 4)).unwrap_err(),
            Refused::AddressFull,
            "the newest is too recent and the other busy"
        );
    }

    #[test]
    fn closing_wakes_the_reader() {
        use std::sync::atomic::AtomicUsize;
        use std::task::Wake;

        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let connections = Connections::new(limits(1, 1, Duration::ZERO));
        let idle = connections.admit(at("192.0.2.1", 1)).unwrap().connection;
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        idle.wake_on_close(&Waker::from(woken.clone()));
        connections.admit(at("192.0.2.1", 2)).unwrap();
        assert!(idle.is_closing());
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
    }
}
