//! Accepting connections so that idle or numerous ones cannot take a daemon off the network.
//!
//! The rate limit counts calls, so a peer that opens connections and sends nothing is never
//! limited by it: each such connection holds a file descriptor, and once the process runs out,
//! every honest peer is refused. Four rules stop that, below TLS and HTTP/2:
//! - a connection must complete its handshake within [`ConnectionLimits::handshake_within`],
//!   however it trickles its bytes: under TLS, the client's first application-data record (its
//!   Finished, or its first data after it), which a peer cannot send before the handshake is
//!   done; in plaintext, the 24-byte HTTP/2 preface. It must not then fall silent, or stop
//!   reading, for longer than [`ConnectionLimits::silent_for`]: the server pings idle
//!   connections every 30 s and an HTTP/2 peer must answer, so only a dead or hostile peer stays
//!   silent that long, even while it reads a long challenge stream;
//! - one address (an IPv6 /64 counting as one, as it does for the request rate) holds at most
//!   [`ConnectionLimits::per_address`] connections at once;
//! - all addresses together hold at most [`ConnectionLimits::total`], kept below the process's
//!   file limit (which [`raise_open_files_limit`] lifts to its hard limit at start);
//! - a connection that answers pings but carries no trusted peer's long call keeps its place
//!   only while nobody else needs it: at a limit, a newcomer takes the place of one still in
//!   its handshake, or of one that has carried no call that holds it ([`holds_connection`]: a
//!   trusted peer's challenge, opening round or attestation) for
//!   [`ConnectionLimits::evictable_after`], instead of being refused.
//!   The table module says which one, and when a crowded address gives way sooner.
//!
//! And when accepting fails (the process is out of descriptors after all), the loop waits
//! before trying again instead of spinning on the error.
//!
//! [`guarded`] gives the two halves: the connections, for the server, and the layer that tells
//! the table about the calls made on them.

mod calls;
mod handshake;
mod incoming;
mod table;

pub use calls::{
    CallTracking, HeldConnection, TrackedBody, TrackedCalls, hold_connection_while_handling, holds_connection,
    on_trusted_connection, trust_connection,
};
pub use incoming::{GuardedIncoming, GuardedStream};
pub use table::Connections;

use std::io;
use std::net::IpAddr;
use std::time::Duration;
use tokio::net::TcpListener;

/// How many connections a daemon holds, how long a silent one lives, and when an idle one
/// gives way to a newcomer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub per_address: usize,
    pub total: usize,
    pub handshake_within: Duration,
    pub silent_for: Duration,
    /// How long a connection keeps its place at a limit after it opened, or after its last call
    /// that holds it ([`holds_connection`]) started or ended. Long enough to span the start of
    /// an attestation (a validator dials, asks the inventory, plans, then challenges) and the gap
    /// between the challenge and the openings, so that only a connection its peer has stopped
    /// using gives way.
    pub evictable_after: Duration,
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
            evictable_after: Duration::from_secs(10),
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

/// The address a connection, or a call, counts against: an IPv4 address, or an IPv6 /64, since
/// one host commonly holds a whole /64 and could otherwise take a new address per connection.
pub fn counted_as(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
        v4 => v4,
    }
}

/// The connections `listener` accepts, within `limits`, and the layer that reports the calls
/// made on them (which must be on the server's stack for idle connections to be told from busy
/// ones). A connection over a limit, with no idle one to make room, is closed at once; an
/// accept error is logged (at most once a minute) and retried after a pause. `tls` says whether
/// the daemon speaks TLS on these connections, which is how it sees a handshake end.
pub fn guarded(listener: TcpListener, limits: ConnectionLimits, tls: bool) -> (GuardedIncoming, CallTracking) {
    let connections = Connections::new(limits);
    (
        GuardedIncoming::new(listener, connections.clone(), tls),
        CallTracking::new(connections),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_host_counts_as_its_slash_64() {
        let counted = |ip: &str| counted_as(ip.parse().unwrap());
        assert_eq!(counted("2001:db8:1:2:aaaa::1"), counted("2001:db8:1:2:bbbb::9"));
        assert_ne!(counted("2001:db8:1:2:aaaa::1"), counted("2001:db8:1:3::1"));
        assert_eq!(counted("::ffff:192.0.2.7"), counted("192.0.2.7"));
        assert_eq!(counted("192.0.2.7"), "192.0.2.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn limits_follow_the_open_files_limit_and_keep_a_reserve() {
        assert_eq!(ConnectionLimits::for_open_files(1024).total, 768);
        assert_eq!(ConnectionLimits::for_open_files(1_048_576).total, 16_384);
        let tiny = ConnectionLimits::for_open_files(100);
        assert_eq!((tiny.total, tiny.per_address), (64, 32));
        assert!(raise_open_files_limit().unwrap() >= 64);
    }
}
