//! Kept transcripts (PROTOCOL.md 21): one per verdict at most, all of them within a byte budget
//! that this module enforces, oldest out first.

use super::{Store, StoreError, as_i64};

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
        let size = bytes.len() as u64;
        if size > budget {
            return Ok(Kept::OverBudget { size });
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO transcripts (verdict_id, bytes, size, kept_at_ms) VALUES ($1, $2, $3, $4)")
            .bind(as_i64(verdict_id))
            .bind(bytes.to_vec())
            .bind(as_i64(size))
            .bind(as_i64(now_ms))
            .execute(&mut *tx)
            .await?;
        let mut evicted = 0;
        loop {
            // Cast, as PostgreSQL sums BIGINTs to a NUMERIC that the Any driver cannot read.
            let (total,): (i64,) = sqlx::query_as("SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM transcripts")
                .fetch_one(&mut *tx)
                .await?;
            if total.max(0) as u64 <= budget {
                break;
            }
            // The new one fits alone, so the loop ends before it is the oldest left.
            sqlx::query("DELETE FROM transcripts WHERE verdict_id = (SELECT MIN(verdict_id) FROM transcripts)")
                .execute(&mut *tx)
                .await?;
            evicted += 1;
        }
        tx.commit().await?;
        Ok(Kept::Yes { evicted })
    }

    /// Verdict `verdict_id`'s kept transcript, if it has one.
    pub async fn transcript(&self, verdict_id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let row: Option<(Vec<u8>,)> = sqlx::query_as("SELECT bytes FROM transcripts WHERE verdict_id = $1")
            .bind(as_i64(verdict_id))
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(bytes,)| bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::Kept;
    use crate::store::VerdictFilter;
    use crate::store::test_support::passing_verdict;

    /// The budget is kept oldest out, a transcript larger than all of it is not kept, and each
    /// verdict reads back with the size of the transcript it still has, on every store.
    #[tokio::test]
    async fn transcripts_are_kept_within_their_budget_oldest_out() {
        for (store, _scratch) in crate::store::test_stores("transcripts").await {
            let mut ids = Vec::new();
            for n in 1..=4u8 {
                assert!(store.claim_nonce(&[n; 32], "http://m", 1).await.unwrap());
                ids.push(store.insert_verdict(&passing_verdict([n; 32])).await.unwrap());
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
