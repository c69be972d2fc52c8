//! Rate observations (what passing verdicts proved, per class) and imported (shared) rates.

use super::{Store, StoreError, as_i64};
use crate::verdict::class::RateClass;
use serde::{Deserialize, Serialize};

/// An imported row: a rate another validator learned, with the evidence it reported.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedRate {
    pub ops_per_unit: f64,
    pub miners: u32,
    pub observations: u32,
}

/// One passing verdict's proven rate, per unit of its class.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub miner_key: [u8; 32],
    pub ops_per_unit: f64,
}

/// Observations read per class at most: far more than any `per_miner` x miners in use, and a
/// bound on the work one planning step does.
const MAX_OBSERVATIONS_READ: i64 = 100_000;

/// The rate a passing verdict proved, per unit of its class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassObservation {
    pub class: RateClass,
    pub miner_key: [u8; 32],
    pub ops_per_unit: f64,
}

impl Store {
    /// A class's rate observations since `since_ms`, newest first; a revoked key's no longer
    /// count.
    pub async fn observations(&self, class: &RateClass, since_ms: u64) -> Result<Vec<Observation>, StoreError> {
        // Walk bandwidths are kept apart from compute rates (one observation of each per verdict).
        let select = if class.is_walk() {
            "SELECT miner_key, ops_per_unit FROM walk_observations
             WHERE backend = $1 AND kernel = $2 AND model = $3 AND n = $4 AND created_at_ms >= $5
               AND miner_key NOT IN (SELECT miner_key FROM revoked_keys)
             ORDER BY id DESC LIMIT $6"
        } else {
            "SELECT miner_key, ops_per_unit FROM rate_observations
             WHERE backend = $1 AND kernel = $2 AND model = $3 AND n = $4 AND created_at_ms >= $5
               AND miner_key NOT IN (SELECT miner_key FROM revoked_keys)
             ORDER BY id DESC LIMIT $6"
        };
        let rows: Vec<(Vec<u8>, f64)> = sqlx::query_as(select)
            .bind(&class.backend)
            .bind(&class.kernel)
            .bind(&class.model)
            .bind(i64::from(class.n))
            .bind(as_i64(since_ms))
            .bind(MAX_OBSERVATIONS_READ)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|(key, ops_per_unit)| {
                let miner_key = key
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("observation with a miner key that is not 32 bytes".into()))?;
                Ok(Observation {
                    miner_key,
                    ops_per_unit,
                })
            })
            .collect()
    }

    /// Every class with an observation or an imported rate.
    pub async fn rate_classes(&self) -> Result<Vec<RateClass>, StoreError> {
        let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
            "SELECT backend, kernel, model, n FROM rate_observations
             UNION SELECT backend, kernel, model, n FROM walk_observations
             UNION SELECT backend, kernel, model, n FROM shared_rates
             ORDER BY 1, 2, 3, 4",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(backend, kernel, model, n)| {
                Ok(RateClass {
                    backend,
                    kernel,
                    model,
                    n: small(n, "n")?,
                })
            })
            .collect()
    }

    /// A class's imported rate, if it was imported since `since_ms` (imports age out like
    /// observations, so a fleet file must be refreshed to stay in force).
    pub async fn shared_rate(&self, class: &RateClass, since_ms: u64) -> Result<Option<SharedRate>, StoreError> {
        let row: Option<(f64, i64, i64)> = sqlx::query_as(
            "SELECT ops_per_unit, miners, observations FROM shared_rates
             WHERE backend = $1 AND kernel = $2 AND model = $3 AND n = $4 AND imported_at_ms >= $5",
        )
        .bind(&class.backend)
        .bind(&class.kernel)
        .bind(&class.model)
        .bind(i64::from(class.n))
        .bind(as_i64(since_ms))
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(ops_per_unit, miners, observations)| {
            Ok(SharedRate {
                ops_per_unit,
                miners: small(miners, "miners")?,
                observations: small(observations, "observations")?,
            })
        })
        .transpose()
    }

    /// Imports shared rates, replacing those of the same classes, all in one transaction.
    pub async fn import_shared_rates(&self, rows: &[(RateClass, SharedRate)], now_ms: u64) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for (class, rate) in rows {
            sqlx::query(
                "INSERT INTO shared_rates
                     (backend, kernel, model, n, ops_per_unit, miners, observations, imported_at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (backend, kernel, model, n) DO UPDATE SET
                     ops_per_unit = excluded.ops_per_unit, miners = excluded.miners,
                     observations = excluded.observations, imported_at_ms = excluded.imported_at_ms",
            )
            .bind(&class.backend)
            .bind(&class.kernel)
            .bind(&class.model)
            .bind(i64::from(class.n))
            .bind(rate.ops_per_unit)
            .bind(i64::from(rate.miners))
            .bind(i64::from(rate.observations))
            .bind(as_i64(now_ms))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

fn small(value: i64, what: &str) -> Result<u32, StoreError> {
    u32::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} {value} out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::VerdictFilter;
    use crate::store::test_support::passing_verdict;

    fn class() -> RateClass {
        RateClass {
            backend: "cpu".into(),
            kernel: "portable".into(),
            model: "cpu: test".into(),
            n: 64,
        }
    }

    #[tokio::test]
    async fn a_verdict_and_the_rate_it_proved_are_stored_together_or_not_at_all() {
        for (store, _scratch) in crate::store::test_stores("observations").await {
            together_or_not_at_all(&store).await;
        }
    }

    /// A retest's verdict that is a graded miss (PROTOCOL.md 14.7, 17) reads back whole, first
    /// run and finish-by time included, proves its rate on reading too, and teaches nothing even
    /// when handed an observation.
    #[tokio::test]
    async fn a_graded_retest_reads_back_whole_and_teaches_nothing() {
        use crate::verdict::FirstRun;
        use crate::verdict::reason::{Reason, ReasonCode};
        for (store, _scratch) in crate::store::test_stores("graded").await {
            let first = {
                let mut v = passing_verdict([1; 32]);
                v.passed = false;
                v.measured_ms = 320;
                v.reasons = vec![Reason::new(ReasonCode::LateCommitment, "first run, after 320 ms")];
                v.finish_by_ms = 600;
                FirstRun::from(&v)
            };
            let mut graded = passing_verdict([2; 32]);
            graded.passed = false;
            graded.measured_ms = 310;
            graded.finish_by_ms = 600;
            graded.reasons = vec![Reason::new(ReasonCode::LateCommitment, "after 310 ms")];
            graded.throughput = crate::verdict::throughput::Throughput::of(
                &graded.params,
                crate::verdict::memory::MemoryProof::fill_work_of(graded.memory.as_ref()),
                1,
                310,
                &graded.throughput.expectation(),
                true,
            );
            graded.first_run = Some(first);
            assert!(store.claim_nonce(&[2; 32], "http://m", 1).await.unwrap());
            let observation = ClassObservation {
                class: class(),
                miner_key: [2; 32],
                ops_per_unit: 4.0e9,
            };
            let id = store
                .record_verdict(&graded, std::slice::from_ref(&observation))
                .await
                .unwrap();
            let read = store
                .verdicts(&VerdictFilter {
                    limit: 1,
                    ..Default::default()
                })
                .await
                .unwrap();
            graded.id = id;
            assert_eq!(read, vec![graded], "{:?}", store.dialect());
            assert!(read[0].throughput.proven_ops_per_sec.is_some());
            assert!(store.observations(&class(), 0).await.unwrap().is_empty());
        }
    }

    async fn together_or_not_at_all(store: &Store) {
        let observation = ClassObservation {
            class: class(),
            miner_key: [2; 32],
            ops_per_unit: 4.0e9,
        };
        assert!(store.claim_nonce(&[1; 32], "http://m", 1).await.unwrap());
        let stored = passing_verdict([1; 32]);
        let id = store
            .record_verdict(&stored, std::slice::from_ref(&observation))
            .await
            .unwrap();
        let read = store
            .verdicts(&VerdictFilter {
                limit: 1,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            read[0].throughput, stored.throughput,
            "the rate source and slack round-trip"
        );
        assert_eq!(read[0].id, id);
        let seen = store.observations(&class(), 0).await.unwrap();
        assert_eq!(
            seen,
            vec![Observation {
                miner_key: [2; 32],
                ops_per_unit: 4.0e9
            }]
        );
        assert!(
            store.observations(&class(), 1_001).await.unwrap().is_empty(),
            "older than the window"
        );
        // A verdict that cannot be stored (its nonce was never issued) leaves no observation.
        assert!(
            store
                .record_verdict(&passing_verdict([9; 32]), std::slice::from_ref(&observation))
                .await
                .is_err()
        );
        assert_eq!(store.observations(&class(), 0).await.unwrap().len(), 1);
        // Imported rates are listed beside observed classes and replace their own class's row.
        let other = RateClass { n: 128, ..class() };
        let rate = |ops_per_unit| SharedRate {
            ops_per_unit,
            miners: 4,
            observations: 12,
        };
        store
            .import_shared_rates(&[(other.clone(), rate(1.0e9))], 5)
            .await
            .unwrap();
        store
            .import_shared_rates(&[(other.clone(), rate(2.0e9))], 6)
            .await
            .unwrap();
        assert_eq!(store.shared_rate(&other, 0).await.unwrap(), Some(rate(2.0e9)));
        assert_eq!(
            store.shared_rate(&other, 7).await.unwrap(),
            None,
            "imported before the window"
        );
        assert_eq!(store.shared_rate(&class(), 0).await.unwrap(), None);
        assert_eq!(store.rate_classes().await.unwrap(), vec![class(), other]);
    }
}
