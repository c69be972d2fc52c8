//! Following the verdict record as it grows (PROTOCOL.md 16.2): every verdict once, in id
//! order, from a given id on, whether this validator stored it or another one sharing its
//! database did.
//!
//! Ids are assigned as verdicts are inserted, and on a shared database a transaction can commit
//! after one with a higher id: sending the higher one first, and resuming after it, would skip
//! the lower. So the follower sends strictly in id order and waits at a gap: an id above the last
//! one sent that is not there yet holds back every id after it until it appears, or until this
//! follower has waited [`GAP_WAIT`] for it (an insert that was rolled back leaves a gap that never
//! fills). The wait is measured on this process's own clock, so clocks of other validators do
//! not enter.

use crate::store::{Store, StoreError};
use crate::verdict::Verdict;
use std::time::{Duration, Instant};

/// How long a gap in the ids may hold the verdicts after it: longer than any verdict's
/// transaction takes to commit.
pub const GAP_WAIT: Duration = Duration::from_secs(60);

/// How often the database is read when nothing in this process says a verdict was stored (one
/// stored by another validator of the fleet is seen within this).
pub const POLL: Duration = Duration::from_secs(1);

/// Verdicts read from the database at a time, and so the most a follower holds.
pub const BATCH: u32 = 100;

/// Where a watcher is in the verdict record.
#[derive(Debug)]
pub struct Follower {
    /// Every id at or below this has been sent (if it matched), or was given up as a gap.
    last: u64,
    /// Since when the id after `last` has been missing while a later one was there.
    gap_since: Option<Instant>,
    miner_url: Option<String>,
}

/// What one read gave: the verdicts to send, in id order, and whether more are waiting.
#[derive(Debug, Default)]
pub struct Step {
    pub verdicts: Vec<Verdict>,
    /// A full batch was read and passed: read again at once rather than after [`POLL`].
    pub more: bool,
}

impl Follower {
    /// A follower that sends the verdicts with ids above `after_id`, of one miner or of all.
    pub fn after(after_id: u64, miner_url: Option<String>) -> Self {
        Follower {
            last: after_id,
            gap_since: None,
            miner_url,
        }
    }

    /// The id of the last verdict passed: where a client resumes.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// One read: the verdicts after the last one passed, up to the first gap that is still
    /// waited for. Every miner's verdicts are read (a gap is a gap whoever's it is), and only the
    /// watched miner's are returned.
    pub async fn next(&mut self, store: &Store) -> Result<Step, StoreError> {
        let rows = store.verdicts_after(self.last, BATCH).await?;
        Ok(self.take(rows, Instant::now()))
    }

    fn take(&mut self, rows: Vec<Verdict>, now: Instant) -> Step {
        let full = rows.len() == BATCH as usize;
        let mut step = Step::default();
        let mut passed_all = true;
        for v in rows {
            if v.id != self.last + 1 {
                let since = *self.gap_since.get_or_insert(now);
                if now.duration_since(since) < GAP_WAIT {
                    passed_all = false;
                    break;
                }
                // Waited long enough: that id will never come.
            }
            self.gap_since = None;
            self.last = v.id;
            if self.miner_url.as_deref().is_none_or(|url| url == v.miner_url) {
                step.verdicts.push(v);
            }
        }
        step.more = full && passed_all;
        step
    }
}

/// Follows `store` as [`Follower`] does, calling `on_verdict` for each verdict until it returns
/// `false`: those with ids above `after` first when given, else those stored after the newest
/// one now. Returns `Ok` when `on_verdict` stops it, else only on an error.
pub async fn follow_store(
    store: &Store,
    after: Option<u64>,
    miner_url: Option<String>,
    mut on_verdict: impl FnMut(&Verdict) -> bool,
) -> Result<(), StoreError> {
    let after = match after {
        Some(id) => id,
        None => store.newest_verdict_id().await?,
    };
    let mut follower = Follower::after(after, miner_url);
    loop {
        let step = follower.next(store).await?;
        for v in &step.verdicts {
            if !on_verdict(v) {
                return Ok(());
            }
        }
        if !step.more {
            tokio::time::sleep(POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_support::passing_verdict;

    fn verdict(id: u64, miner: &str) -> Verdict {
        let mut v = passing_verdict([id as u8; 32]);
        v.id = id;
        v.miner_url = miner.into();
        v
    }

    fn ids(step: &Step) -> Vec<u64> {
        step.verdicts.iter().map(|v| v.id).collect()
    }

    #[test]
    fn verdicts_go_in_id_order_and_a_gap_holds_back_what_follows_it() {
        let t0 = Instant::now();
        let mut f = Follower::after(0, None);
        // 2 committed before 1: it waits for 1.
        assert!(ids(&f.take(vec![verdict(2, "a")], t0)).is_empty());
        assert_eq!(f.last(), 0);
        // 1 has committed: both go, in order, once.
        assert_eq!(ids(&f.take(vec![verdict(1, "a"), verdict(2, "a")], t0)), vec![1, 2]);
        assert_eq!(f.last(), 2);
        assert!(ids(&f.take(vec![], t0)).is_empty());
    }

    #[test]
    fn a_gap_that_never_fills_is_given_up_after_the_wait() {
        let t0 = Instant::now();
        let mut f = Follower::after(10, None);
        // 11 was rolled back; 12 waits, then goes.
        assert!(ids(&f.take(vec![verdict(12, "a")], t0)).is_empty());
        assert!(ids(&f.take(vec![verdict(12, "a")], t0 + GAP_WAIT / 2)).is_empty());
        assert_eq!(
            ids(&f.take(vec![verdict(12, "a"), verdict(13, "a")], t0 + GAP_WAIT)),
            vec![12, 13]
        );
        // A later gap is timed from when it is first seen.
        let t1 = t0 + GAP_WAIT * 3;
        assert!(ids(&f.take(vec![verdict(15, "a")], t1)).is_empty());
        assert!(ids(&f.take(vec![verdict(15, "a")], t1 + GAP_WAIT / 2)).is_empty());
    }

    #[test]
    fn a_watched_miner_moves_the_follower_on_past_other_miners_verdicts() {
        let t0 = Instant::now();
        let mut f = Follower::after(0, Some("a".into()));
        let step = f.take(vec![verdict(1, "b"), verdict(2, "a"), verdict(3, "b")], t0);
        assert_eq!(ids(&step), vec![2]);
        assert_eq!(f.last(), 3, "other miners' verdicts are passed, not read again");
    }

    #[test]
    fn a_full_batch_says_there_is_more_unless_a_gap_stopped_it() {
        let t0 = Instant::now();
        let full: Vec<Verdict> = (1..=u64::from(BATCH)).map(|id| verdict(id, "a")).collect();
        let mut f = Follower::after(0, None);
        assert!(f.take(full, t0).more);
        let gapped: Vec<Verdict> = (BATCH as u64 + 2..=2 * BATCH as u64 + 1)
            .map(|id| verdict(id, "a"))
            .collect();
        assert!(!f.take(gapped, t0).more);
    }
}
