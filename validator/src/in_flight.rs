//! The API's attestations in flight, by miner URL. A request for a miner that an earlier request
//! is attesting follows that attestation (its events from then on, and its verdict) instead of
//! challenging the miner again, which the miner would refuse as busy. An attestation whose client
//! went away runs on to its stored verdict, and the next client to ask is told it.

use gpu_attest_proto::v1;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;
use tonic::Status;

/// What an attestation's stream carries: events, and last a verdict or the status it ended with.
pub type Item = Result<v1::AttestEvent, Status>;

/// Events a follower may fall behind by before it skips some (never the last).
const FOLLOWER_BACKLOG: usize = 256;

#[derive(Clone, Default)]
pub struct InFlight(Arc<Mutex<HashMap<String, broadcast::Sender<Item>>>>);

/// What a request for a miner comes to.
pub enum Joined {
    /// None was running: this request attests it, and publishes to any that follow.
    Started(Publisher),
    /// One was running: this request follows it.
    Following(broadcast::Receiver<Item>),
}

impl InFlight {
    pub fn join(&self, url: &str) -> Joined {
        let mut running = self.lock();
        if let Some(sender) = running.get(url) {
            return Joined::Following(sender.subscribe());
        }
        let (sender, _) = broadcast::channel(FOLLOWER_BACKLOG);
        running.insert(url.to_string(), sender.clone());
        Joined::Started(Publisher {
            url: url.to_string(),
            sender,
            in_flight: self.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<Item>>> {
        // A panic elsewhere while holding it leaves a map that is still whole.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The attestation a request started, as its followers see it. Dropped without [`finish`]
/// (the task failed), it leaves the table all the same, and its followers are told.
///
/// [`finish`]: Publisher::finish
pub struct Publisher {
    url: String,
    sender: broadcast::Sender<Item>,
    in_flight: InFlight,
}

impl Publisher {
    /// A sender for the attestation's events.
    pub fn events(&self) -> broadcast::Sender<Item> {
        self.sender.clone()
    }

    /// The last item. The attestation leaves the table first, so that a request that comes
    /// after it starts one of its own, and every follower gets this.
    pub fn finish(self, last: Item) {
        self.leave();
        let _ = self.sender.send(last);
    }

    fn leave(&self) {
        let mut running = self.in_flight.lock();
        if running.get(&self.url).is_some_and(|s| s.same_channel(&self.sender)) {
            running.remove(&self.url);
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Relays `followed` to `out` until its last item: a verdict, or the status it ended with.
pub async fn follow(mut followed: broadcast::Receiver<Item>, out: tokio::sync::mpsc::Sender<Item>) {
    use broadcast::error::RecvError;
    loop {
        let item = match followed.recv().await {
            Ok(item) => item,
            // Events it fell behind on are skipped; the last item is never among them.
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => Err(Status::aborted(
                "the attestation this request followed ended without a result (the validator is stopping, or it failed inside); ask again",
            )),
        };
        let last = matches!(
            &item,
            Err(_)
                | Ok(v1::AttestEvent {
                    event: Some(v1::attest_event::Event::Verdict(_))
                })
        );
        if out.send(item).await.is_err() || last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(id: u64) -> Item {
        Ok(v1::AttestEvent {
            event: Some(v1::attest_event::Event::Verdict(v1::Verdict {
                id,
                ..Default::default()
            })),
        })
    }

    #[tokio::test]
    async fn a_second_request_follows_the_first_and_a_later_one_starts_anew() {
        let in_flight = InFlight::default();
        let Joined::Started(publisher) = in_flight.join("http://a") else {
            panic!("nothing was running")
        };
        let Joined::Following(followed) = in_flight.join("http://a") else {
            panic!("the first is running")
        };
        assert!(
            matches!(in_flight.join("http://b"), Joined::Started(_)),
            "another miner is its own"
        );
        let (out, mut relayed) = tokio::sync::mpsc::channel(8);
        let follower = tokio::spawn(follow(followed, out));
        publisher.finish(verdict(7));
        follower.await.unwrap();
        assert!(
            matches!(relayed.recv().await, Some(Ok(v1::AttestEvent { event: Some(v1::attest_event::Event::Verdict(v)) })) if v.id == 7)
        );
        assert!(
            matches!(in_flight.join("http://a"), Joined::Started(_)),
            "it left the table"
        );
    }

    #[tokio::test]
    async fn a_publisher_dropped_unfinished_leaves_and_tells_its_followers() {
        let in_flight = InFlight::default();
        let Joined::Started(publisher) = in_flight.join("http://a") else {
            panic!("nothing was running")
        };
        let Joined::Following(followed) = in_flight.join("http://a") else {
            panic!("the first is running")
        };
        drop(publisher);
        let (out, mut relayed) = tokio::sync::mpsc::channel(8);
        follow(followed, out).await;
        assert!(matches!(relayed.recv().await, Some(Err(s)) if s.code() == tonic::Code::Aborted));
        assert!(matches!(in_flight.join("http://a"), Joined::Started(_)));
    }
}
