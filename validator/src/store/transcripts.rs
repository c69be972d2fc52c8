//! Kept transcripts (PROTOCOL.md 21): one per verdict at most, all of them within a byte budget
//! that this module enforces, oldest out first. A transcript's bytes are stored in parts
//! (`transcript_parts`): neither SQLite nor PostgreSQL stores a value over 1 GB, and a host of
//! many GPUs at first contact writes transcripts of several.

use super::{Store, StoreError, as_i64};

/// The largest part a transcript is stored in: far under both databases' 1 GB for one value, and
/// large enough that the largest transcript kept (under 2 GiB) is 32 rows.
const PART_BYTES: usize = 64 << 20;

/// What keeping one transcript did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Kept; older transcripts (this many) went to make room.
    Yes { evicted: u64 },
    /// Larger than the whole budget: not kept.
    OverBudget { size: u64 },
}

impl Store {
    /// Keeps `bytes` as verdict `verdict_id`'s transcript, then drops the oldest transcripts
    /// until all of them fit in `budget` bytes, in one transaction: a crash leaves the budget
    /// kept or the transcript absent, never both over.
    pub async fn keep_transcript(
        &self,
        verdict_id: u64,
        bytes: &[u8],
        budget: u64,
        now_ms: u64,
    ) -> Result<Kept, StoreError> {
        self.keep_transcript_in_parts(verdict_id, bytes, budget, now_ms, PART_BYTES)
            .await
    }

    /// [`Store::keep_transcript`] with parts of at most `part_bytes`.
    async fn keep_transcript_in_parts(
        &self,
        verdict_id: u64,
        bytes: &[u8],
        budget: u64,
        now_ms: u64,
        part_bytes: usize,
    ) -> Result<Kept, StoreError> {
        let size = bytes.len() as u64;
        if size > budget {
            return Ok(Kept::OverBudget { size });
        }
        let mut tx = self.pool.begin().await?;
        // The row's own bytes stay empty: they hold a transcript only in rows kept before parts.
        sqlx::query("INSERT INTO transcripts (verdict_id, bytes, size, kept_at_ms) VALUES ($1, $2, $3, $4)")
            .bind(as_i64(verdict_id))
            .bind(Vec::<u8>::new())
            .bind(as_i64(size))
            .bind(as_i64(now_ms))
            .execute(&mut *tx)
            .await?;
        for (part, chunk) in bytes.chunks(part_bytes.max(1)).enumerate() {
            sqlx::query("INSERT INTO transcript_parts (verdict_id, part, bytes) VALUES ($1, $2, $3)")
                .bind(as_i64(verdict_id))
                .bind(as_i64(part as u64))
                .bind(chunk)
                .execute(&mut *tx)
                .await?;
        }
        let mut evicted = 0;
        loop {
            // Cast, as PostgreSQL sums BIGINTs to a NUMERIC that the Any driver cannot read.
            let (total,): (i64,) = sqlx::query_as("SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM transcripts")
                .fetch_one(&mut *tx)
                .await?;
            if total.max(0) as u64 <= budget {
                break;
            }
            // The oldest kept other than the new one, which fits alone: a verdict sealed slowly
            // may be kept after a later one, and must not make room by evicting itself.
            let (oldest,): (i64,) = sqlx::query_as(
                "SELECT verdict_id FROM transcripts WHERE verdict_id <> $1 ORDER BY kept_at_ms, verdict_id LIMIT 1",
            )
            .bind(as_i64(verdict_id))
            .fetch_one(&mut *tx)
            .await?;
            // The parts first, explicitly: SQLite cascades only on connections with foreign keys on.
            sqlx::query("DELETE FROM transcript_parts WHERE verdict_id = $1")
                .bind(oldest)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM transcripts WHERE verdict_id = $1")
                .bind(oldest)
                .execute(&mut *tx)
                .await?;
            evicted += 1;
        }
        tx.commit().await?;
        Ok(Kept::Yes { evicted })
    }

    /// Verdict `verdict_id`'s kept transcript, if it has one: its parts joined in order, or, for
    /// a row kept before parts, the row's own bytes. Read in one transaction that sees one state
    /// of the store (PostgreSQL's default isolation gives each statement its own, so it is
    /// raised), and checked against the size kept with it, so that an eviction while it is read
    /// cannot hand back part of a transcript.
    pub async fn transcript(&self, verdict_id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let mut tx = self.pool.begin().await?;
        if self.dialect == super::Dialect::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *tx)
                .await?;
        }
        let row: Option<(Vec<u8>, i64)> = sqlx::query_as("SELECT bytes, size FROM transcripts WHERE verdict_id = $1")
            .bind(as_i64(verdict_id))
            .fetch_optional(&mut *tx)
            .await?;
        let Some((own, size)) = row else {
            return Ok(None);
        };
        // Part by part, so that reading holds the transcript and one part, not every part twice.
        let mut bytes = Vec::new();
        let mut parts = 0u64;
        while let Some((part,)) =
            sqlx::query_as::<_, (Vec<u8>,)>("SELECT bytes FROM transcript_parts WHERE verdict_id = $1 AND part = $2")
                .bind(as_i64(verdict_id))
                .bind(as_i64(parts))
                .fetch_optional(&mut *tx)
                .await?
        {
            if parts == 0 {
                let size = usize::try_from(size).unwrap_or(0);
                bytes.reserve(size.min(gpu_attest_proto::transcript::MAX_TRANSCRIPT_BYTES));
            }
            bytes.extend_from_slice(&part);
            parts += 1;
        }
        tx.commit().await?;
        let bytes = if parts == 0 { own } else { bytes };
        if bytes.len() as u64 != size.max(0) as u64 {
            return Err(StoreError::Corrupt(format!(
                "verdict {verdict_id}'s kept transcript is {} bytes, where {size} were kept",
                bytes.len()
            )));
        }
        Ok(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::Kept;
    use crate::store::VerdictFilter;
    use crate::store::test_support::stored_passing_verdict;

    /// A transcript is stored in parts and read back whole; an evicted one takes its parts with
    /// it; a row kept before parts (its bytes in the row itself) reads as it was, on every store.
    #[tokio::test]
    async fn transcripts_are_kept_in_parts_and_rows_from_before_parts_still_read() {
        for (store, _scratch) in crate::store::test_stores("transcript-parts").await {
            let mut ids = Vec::new();
            for n in 1..=3u8 {
                ids.push(stored_passing_verdict(&store, n).await);
            }
            // A schema 10 row: the bytes in the row, no parts.
            sqlx::query("INSERT INTO transcripts (verdict_id, bytes, size, kept_at_ms) VALUES ($1, $2, $3, $4)")
                .bind(crate::store::as_i64(ids[0]))
                .bind(vec![9u8; 30])
                .bind(30i64)
                .bind(1i64)
                .execute(&store.pool)
                .await
                .unwrap();
            assert_eq!(store.transcript(ids[0]).await.unwrap(), Some(vec![9; 30]));
            let transcript: Vec<u8> = (0..40).collect();
            assert_eq!(
                store
                    .keep_transcript_in_parts(ids[1], &transcript, 100, 2, 7)
                    .await
                    .unwrap(),
                Kept::Yes { evicted: 0 }
            );
            let parts = |id: u64| {
                let store = &store;
                async move {
                    let (count,): (i64,) =
                        sqlx::query_as("SELECT COUNT(*) FROM transcript_parts WHERE verdict_id = $1")
                            .bind(crate::store::as_i64(id))
                            .fetch_one(&store.pool)
                            .await
                            .unwrap();
                    count
                }
            };
            assert_eq!(parts(ids[1]).await, 6, "40 bytes in parts of 7");
            assert_eq!(store.transcript(ids[1]).await.unwrap(), Some(transcript.clone()));
            // 30 + 40 + 40 over a budget of 100: the schema 10 row goes first.
            assert_eq!(
                store
                    .keep_transcript_in_parts(ids[2], &transcript, 100, 3, 7)
                    .await
                    .unwrap(),
                Kept::Yes { evicted: 1 }
            );
            assert_eq!(store.transcript(ids[0]).await.unwrap(), None);
            // Over the budget again (80 + 40): the oldest with parts goes, and its parts with it.
            let fourth = stored_passing_verdict(&store, 4).await;
            assert_eq!(
                store
                    .keep_transcript_in_parts(fourth, &transcript, 100, 4, 64)
                    .await
                    .unwrap(),
                Kept::Yes { evicted: 1 }
            );
            assert_eq!(store.transcript(ids[1]).await.unwrap(), None);
            assert_eq!(parts(ids[1]).await, 0);
            assert_eq!(parts(fourth).await, 1);
            assert_eq!(store.transcript(ids[2]).await.unwrap(), Some(transcript.clone()));
            assert_eq!(store.transcript(fourth).await.unwrap(), Some(transcript));
        }
    }

    /// A verdict kept after a later one (sealed more slowly) makes room by evicting the one kept
    /// first, never itself.
    #[tokio::test]
    async fn a_transcript_kept_late_does_not_evict_itself() {
        for (store, _scratch) in crate::store::test_stores("transcript-late").await {
            let mut ids = Vec::new();
            for n in 1..=2u8 {
                ids.push(stored_passing_verdict(&store, n).await);
            }
            store.keep_transcript(ids[1], &[2; 60], 100, 1).await.unwrap();
            assert_eq!(
                store.keep_transcript(ids[0], &[1; 60], 100, 2).await.unwrap(),
                Kept::Yes { evicted: 1 }
            );
            assert_eq!(store.transcript(ids[0]).await.unwrap(), Some(vec![1; 60]));
            assert_eq!(store.transcript(ids[1]).await.unwrap(), None);
        }
    }

    /// The budget is kept oldest out, a transcript larger than all of it is not kept, and each
    /// verdict reads back with the size of the transcript it still has, on every store.
    #[tokio::test]
    async fn transcripts_are_kept_within_their_budget_oldest_out() {
        for (store, _scratch) in crate::store::test_stores("transcripts").await {
            let mut ids = Vec::new();
            for n in 1..=4u8 {
                ids.push(stored_passing_verdict(&store, n).await);
            }
            let budget = 100;
            assert_eq!(
                store.keep_transcript(ids[0], &[1; 40], budget, 1).await.unwrap(),
                Kept::Yes { evicted: 0 }
            );
            assert_eq!(
                store.keep_transcript(ids[1], &[2; 40], budget, 2).await.unwrap(),
                Kept::Yes { evicted: 0 }
            );
            // 120 bytes over a budget of 100: the oldest goes.
            assert_eq!(
                store.keep_transcript(ids[2], &[3; 40], budget, 3).await.unwrap(),
                Kept::Yes { evicted: 1 }
            );
            assert_eq!(
                store.keep_transcript(ids[3], &[4; 101], budget, 4).await.unwrap(),
                Kept::OverBudget { size: 101 }
            );
            assert_eq!(store.transcript(ids[0]).await.unwrap(), None);
            assert_eq!(store.transcript(ids[2]).await.unwrap(), Some(vec![3; 40]));
            let read = store
                .verdicts(&VerdictFilter {
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap();
            let sizes: Vec<(u64, Option<u64>)> = read.iter().map(|v| (v.id, v.transcript_bytes)).collect();
            assert_eq!(
                sizes,
                vec![(ids[3], None), (ids[2], Some(40)), (ids[1], Some(40)), (ids[0], None)]
            );
        }
    }
}
