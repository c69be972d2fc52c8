//! Places for long-lived calls (a verdict watch holds a task for as long as its client stays),
//! bounded in all and per client, so that one client cannot take every place. A client is what
//! the connection table and the rate limiter count a peer as: its IPv4 address, or its IPv6 /64
//! (one host commonly holds a whole /64). Calls with no known address (an in-process transport)
//! share one client, and so do all the callers behind one address, a local proxy's included.

use crate::connections::counted_as;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The places, and who holds them.
#[derive(Debug)]
pub struct Slots {
    total: usize,
    per_client: usize,
    held: Arc<Mutex<Held>>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_client: HashMap<Option<IpAddr>, usize>,
}

/// Why no place was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Crowded {
    #[error("all {0} places are taken")]
    Full(usize),
    #[error("this client already holds {0} places, as many as one client may")]
    ClientFull(usize),
}

/// One place, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    client: Option<IpAddr>,
    held: Arc<Mutex<Held>>,
}

impl Slots {
    /// At most `total` places, and at most `per_client` of them for one client.
    pub fn new(total: usize, per_client: usize) -> Self {
        Slots {
            total,
            per_client: per_client.min(total),
            held: Arc::default(),
        }
    }

    /// A place for `client`, or why there is none. The client's own limit is checked first, so
    /// that a client at its limit is told so even when every place is taken.
    pub fn take(&self, peer: Option<IpAddr>) -> Result<Slot, Crowded> {
        let client = peer.map(counted_as);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mine = held.by_client.get(&client).copied().unwrap_or(0);
        if mine >= self.per_client {
            return Err(Crowded::ClientFull(self.per_client));
        }
        if held.total >= self.total {
            return Err(Crowded::Full(self.total));
        }
        held.total += 1;
        *held.by_client.entry(client).or_insert(0) += 1;
        Ok(Slot {
            client,
            held: self.held.clone(),
        })
    }

    /// Places held now, in all.
    pub fn in_use(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.total -= 1;
        if let Some(count) = held.by_client.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.by_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([192, 0, 2, last]))
    }

    #[test]
    fn one_client_cannot_take_every_place() {
        let slots = Slots::new(4, 2);
        let first = [slots.take(client(1)).unwrap(), slots.take(client(1)).unwrap()];
        assert_eq!(slots.take(client(1)).unwrap_err(), Crowded::ClientFull(2));
        let others = [slots.take(client(2)).unwrap(), slots.take(None).unwrap()];
        assert_eq!(slots.in_use(), 4);
        assert_eq!(slots.take(client(3)).unwrap_err(), Crowded::Full(4));
        // The client at its own limit hears that, not that the validator is full.
        assert_eq!(slots.take(client(1)).unwrap_err(), Crowded::ClientFull(2));
        drop(others);
        assert!(slots.take(client(3)).is_ok());
        drop(first);
        assert_eq!(slots.in_use(), 0);
    }

    #[test]
    fn one_ipv6_host_is_one_client_whatever_its_address_in_its_64() {
        let slots = Slots::new(8, 2);
        let host = |last: u16| Some(IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]));
        let _held = [slots.take(host(1)).unwrap(), slots.take(host(2)).unwrap()];
        assert_eq!(slots.take(host(3)).unwrap_err(), Crowded::ClientFull(2));
        // Another /64 is another client.
        assert!(
            slots
                .take(Some(IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 1])))
                .is_ok()
        );
        // An IPv4-mapped address is the IPv4 address it maps.
        let _v4 = slots.take(client(5)).unwrap();
        let mapped = Some(IpAddr::from(std::net::Ipv4Addr::new(192, 0, 2, 5).to_ipv6_mapped()));
        let _mapped = slots.take(mapped).unwrap();
        assert_eq!(slots.take(client(5)).unwrap_err(), Crowded::ClientFull(2));
    }

    #[test]
    fn a_place_given_back_can_be_taken_again_by_its_client() {
        let slots = Slots::new(8, 1);
        let held = slots.take(client(9)).unwrap();
        assert!(slots.take(client(9)).is_err());
        drop(held);
        assert!(slots.take(client(9)).is_ok());
    }

    #[test]
    fn the_per_client_limit_never_exceeds_the_total() {
        let slots = Slots::new(1, 5);
        let _held = slots.take(client(1)).unwrap();
        assert_eq!(slots.take(client(1)).unwrap_err(), Crowded::ClientFull(1));
    }
}
