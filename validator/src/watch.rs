//! Following the verdict record as it grows (PROTOCOL.md 16.2): every verdict, once, oldest
//! first, from a given id on, whether this validator stored it or another one sharing its
//! database did.
//!
//! Ids are assigned as verdicts are inserted, and a transaction can commit after one with a
//! higher id has been read: polling `id > last sent` would skip it. So the follower reads from a
//! *floor* below which every verdict is settled, and remembers what it sent above the floor. A
//! verdict made more than [`SETTLE_MS`] ago settles the floor up to its id: every id below it was
//! assigned before it, by a transaction that has long committed or never will.

use crate::store::{Store, StoreError, Verdict};
use std::collections::HashSet;
use std::time::Duration;

/// How long a verdict's transaction may take to commit, clock differences between validators
/// sharing a database included. A verdict older than this no longer has a lower id to wait for.
pub const SETTLE_MS: u64 = 60_000;

/// How often the database is read when nothing in this process says a verdict was stored (one
/// stored by another validator of the fleet is seen within this).
pub const POLL: Duration = Duration::from_secs(1);

/// Verdicts read from the database at a time.
const BATCH: u32 = 100;

/// Where a watcher is in the verdict record.
#[derive(Debug)]
pub struct Follower {
    /// Every verdict with an id at or below this has been sent, or never will be stored.
    floor: u64,
    /// Ids above the floor already sent.
    sent: HashSet<u64>,
    miner_url: Option<String>,
}

impl Follower {
    /// A follower that sends the verdicts with ids above `after_id`, of one miner or of all.
    pub fn after(after_id: u64, miner_url: Option<String>) -> Self {
        Follower {
            floor: after_id,
            sent: HashSet::new(),
            miner_url,
        }
    }

    /// The verdicts stored since the last call that have not been sent, oldest first; empty
    /// when there are none yet.
    pub async fn next(&mut self, store: &Store, now_ms: u64) -> Result<Vec<Verdict>, StoreError> {
        let mut fresh = Vec::new();
        loop {
            let rows = store
                .verdicts_after(self.floor, self.miner_url.as_deref(), BATCH)
                .await?;
            let full = rows.len() == BATCH as usize;
            let before = self.floor;
            fresh.extend(self.take(rows, now_ms));
            // A full batch of settled verdicts (catching up from an old id) moved the floor: read
            // on. Otherwise what is left comes with the next call.
            if !full || self.floor == before {
                return Ok(fresh);
            }
        }
    }

    /// The rows (ids above the floor, ascending) not sent before; the floor moves past every
    /// settled one.
    fn take(&mut self, rows: Vec<Verdict>, now_ms: u64) -> Vec<Verdict> {
        let settled = |made_at: u64| made_at.saturating_add(SETTLE_MS) <= now_ms;
        if let Some(newest_settled) = rows.iter().filter(|v| settled(v.created_at_ms)).map(|v| v.id).max() {
            self.floor = self.floor.max(newest_settled);
        }
        // Every row was read above the old floor: sent now unless sent before. What is above
        // the new floor is remembered until it settles; the rest is forgotten.
        let fresh: Vec<Verdict> = rows.into_iter().filter(|v| self.sent.insert(v.id)).collect();
        let floor = self.floor;
        self.sent.retain(|&id| id > floor);
        fresh
    }
}

/// Follows `store` as [`Follower`] does, calling `on_verdict` for each verdict: those with ids
/// above `after` first when given, else only those stored from now on. Returns only on an
/// error (`validator verdicts --follow` runs until it is stopped).
pub async fn follow_store(
    store: &Store,
    after: Option<u64>,
    miner_url: Option<String>,
    mut on_verdict: impl FnMut(&Verdict),
) -> Result<(), StoreError> {
    let after = match after {
        Some(id) => id,
        None => store.newest_verdict_id().await?,
    };
    let mut follower = Follower::after(after, miner_url);
    loop {
        for v in follower.next(store, crate::attest::now_ms()).await? {
            on_verdict(&v);
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_support::passing_verdict;

    fn verdict(id: u64, made_at: u64) -> Verdict {
        let mut v = passing_verdict([id as u8; 32]);
        v.id = id;
        v.created_at_ms = made_at;
        v
    }

    fn ids(verdicts: &[Verdict]) -> Vec<u64> {
        verdicts.iter().map(|v| v.id).collect()
    }

    #[test]
    fn a_verdict_that_commits_after_a_higher_id_is_still_sent_once() {
        let now = 1_000_000;
        let mut f = Follower::after(0, None);
        // Verdict 2 committed first; 1 was still in its transaction.
        assert_eq!(ids(&f.take(vec![verdict(2, now)], now)), vec![2]);
        assert_eq!(f.floor, 0, "2 is not settled: a lower id may yet come");
        // Now 1 has committed: the read returns both, and only 1 is new.
        assert_eq!(ids(&f.take(vec![verdict(1, now), verdict(2, now)], now + 10)), vec![1]);
        // Once settled, the floor moves past both and they are forgotten.
        let later = now + SETTLE_MS;
        assert!(f.take(vec![verdict(1, now), verdict(2, now)], later).is_empty());
        assert_eq!(f.floor, 2);
        assert!(f.sent.is_empty());
    }

    #[test]
    fn old_verdicts_settle_at_once_so_catching_up_moves_on() {
        let mut f = Follower::after(10, None);
        let got = f.take(vec![verdict(11, 5), verdict(12, 6)], 10_000_000);
        assert_eq!(ids(&got), vec![11, 12]);
        assert_eq!(f.floor, 12);
        assert!(f.sent.is_empty());
    }
}
