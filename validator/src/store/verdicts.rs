//! Verdicts: one row each, written in one transaction with the rate a pass proved.

use super::{ClassObservation, Store, StoreError, as_i64, as_u64};
use crate::verdict::class::RateSource;
use crate::verdict::identity::IdentityProof;
use crate::verdict::memory::MemoryProof;
use crate::verdict::reason::Reason;
use crate::verdict::throughput::{Expectation, Throughput, graded_miss};
use crate::verdict::{FirstRun, StoredParams, Verdict, judged_under};
use gpu_attest_shared::statement::DeviceInfo;
use sqlx::Row;

/// The columns [`verdict_from_row`] reads, in its order: one list for every query that reads
/// whole verdicts, so that none falls out of step with the reader.
macro_rules! verdict_columns {
    () => {
        "id, miner_url, miner_key, nonce, passed, reasons, policy, samples, params, measured_ms, \
         expected_ms, deadline_ms, inventory, backend, kernel, global_checksum, created_at_ms, \
         expected_ops_per_sec, rate_source, rate_miners, slack, memory, identity, finish_by_ms, first_run, \
         peak_ops_per_sec, protocol_version, \
         (SELECT size FROM transcripts WHERE transcripts.verdict_id = verdicts.id)"
    };
}

#[derive(Clone, Debug, Default)]
pub struct VerdictFilter {
    pub miner_url: Option<String>,
    pub passed: Option<bool>,
    pub since_ms: u64,
    /// Only verdicts with id below this (the previous page's last id).
    pub before_id: Option<u64>,
    pub limit: u32,
}

impl Store {
    /// Stores a verdict and returns its id.
    pub async fn insert_verdict(&self, v: &Verdict) -> Result<u64, StoreError> {
        self.record_verdict(v, &[]).await
    }

    /// Stores a verdict and, for a passing one, the rates it proved for its classes (compute,
    /// and walk bandwidth), in one transaction: a crash leaves all or none.
    pub async fn record_verdict(&self, v: &Verdict, observations: &[ClassObservation]) -> Result<u64, StoreError> {
        let miner_key = hex::decode(&v.miner_key).map_err(|e| StoreError::Corrupt(format!("miner key: {e}")))?;
        let mut tx = self.pool.begin().await?;
        let id = insert_verdict_row(&mut tx, v, &miner_key).await?;
        // Only a pass teaches: a graded miss proves a rate too, but one below what its class
        // must reach, and a class's rate must not learn from its misses.
        if v.passed {
            insert_observations(&mut tx, id, v.created_at_ms, observations).await?;
        }
        // A graded miss's devices did verified work for this key too: one GPU must not earn
        // graded misses for many keys unseen (PROTOCOL.md 19.4, step 4).
        if (v.passed || graded_miss(&v.reasons, v.measured_ms, v.finish_by_ms))
            && let Some(identity) = &v.identity
        {
            let parts: Vec<(String, String)> = identity.devices.iter().filter_map(|d| d.part.clone()).collect();
            super::sightings::record(&mut tx, &parts, &miner_key, id, v.created_at_ms).await?;
        }
        tx.commit().await?;
        let id = as_u64(id)?;
        self.stored.send_replace(id);
        Ok(id)
    }

    /// Up to `limit` verdicts with ids above `after_id`, oldest first, of every miner: what a
    /// verdict watcher reads next ([`crate::watch`]; it keeps to its miner itself, since every
    /// miner's verdicts move it on).
    pub async fn verdicts_after(&self, after_id: u64, limit: u32) -> Result<Vec<Verdict>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            verdict_columns!(),
            " FROM verdicts WHERE id > $1 ORDER BY id ASC LIMIT $2"
        ))
        .bind(as_i64(after_id))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(verdict_from_row).collect()
    }

    /// The newest verdict's id, 0 when there is none.
    pub async fn newest_verdict_id(&self) -> Result<u64, StoreError> {
        let (id,): (Option<i64>,) = sqlx::query_as("SELECT MAX(id) FROM verdicts")
            .fetch_one(&self.pool)
            .await?;
        id.map_or(Ok(0), as_u64)
    }

    /// Newest first.
    pub async fn verdicts(&self, filter: &VerdictFilter) -> Result<Vec<Verdict>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            verdict_columns!(),
            " FROM verdicts
             WHERE ($1 IS NULL OR miner_url = $1) AND ($2 IS NULL OR passed = $2)
               AND created_at_ms >= $3 AND ($4 IS NULL OR id < $4)
             ORDER BY id DESC LIMIT $5"
        ))
        .bind(filter.miner_url.clone())
        .bind(filter.passed.map(i64::from))
        .bind(as_i64(filter.since_ms))
        .bind(filter.before_id.map(as_i64))
        .bind(i64::from(filter.limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(verdict_from_row).collect()
    }
}

/// Inserts the verdict's row (its miner key already decoded) and returns its id.
async fn insert_verdict_row(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    v: &Verdict,
    miner_key: &[u8],
) -> Result<i64, StoreError> {
    let json = |value: serde_json::Result<String>| value.map_err(|e| StoreError::Corrupt(e.to_string()));
    let nonce = hex::decode(&v.nonce).map_err(|e| StoreError::Corrupt(format!("nonce: {e}")))?;
    let global = hex::decode(&v.global_checksum).map_err(|e| StoreError::Corrupt(format!("checksum: {e}")))?;
    let t = &v.throughput;
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO verdicts (miner_url, miner_key, nonce, passed, reasons, policy, samples, params, measured_ms,
                               expected_ms, deadline_ms, inventory, backend, kernel, global_checksum, created_at_ms,
                               expected_ops_per_sec, rate_source, rate_miners, slack, memory, identity, finish_by_ms,
                               first_run, peak_ops_per_sec, protocol_version)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22,
                 $23, $24, $25, $26)
         RETURNING id",
    )
    .bind(&v.miner_url)
    .bind(miner_key)
    .bind(nonce)
    .bind(i64::from(v.passed))
    .bind(json(serde_json::to_string(&v.reasons))?)
    .bind(&v.policy)
    .bind(i64::from(v.samples))
    .bind(json(serde_json::to_string(&v.params))?)
    .bind(as_i64(v.measured_ms))
    .bind(as_i64(v.expected_ms))
    .bind(as_i64(v.deadline_ms))
    .bind(json(serde_json::to_string(&v.inventory))?)
    .bind(&v.backend)
    .bind(&v.kernel)
    .bind(global)
    .bind(as_i64(v.created_at_ms))
    .bind(t.expected_ops_per_sec)
    .bind(t.rate_source.map(|r| r.as_str()).unwrap_or(""))
    .bind(i64::from(t.rate_miners))
    .bind(t.slack)
    .bind(optional_json_text(v.memory.as_ref())?)
    .bind(optional_json_text(v.identity.as_ref())?)
    .bind(as_i64(v.finish_by_ms))
    .bind(optional_json_text(v.first_run.as_ref())?)
    .bind(t.claimed_peak_ops_per_sec)
    .bind(i64::from(v.protocol_version))
    .fetch_one(&mut **tx)
    .await?;
    Ok(id)
}

/// Inserts the rates a passing verdict proved, each in its kind's table (compute or walk
/// bandwidth); figures that are not positive and finite teach nothing.
async fn insert_observations(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: i64,
    created_at_ms: u64,
    observations: &[ClassObservation],
) -> Result<(), StoreError> {
    for o in observations
        .iter()
        .filter(|o| o.ops_per_unit.is_finite() && o.ops_per_unit > 0.0)
    {
        let insert = if o.class.is_walk() {
            "INSERT INTO walk_observations (backend, kernel, model, n, miner_key, ops_per_unit, verdict_id, created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        } else {
            "INSERT INTO rate_observations (backend, kernel, model, n, miner_key, ops_per_unit, verdict_id, created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        };
        sqlx::query(insert)
            .bind(&o.class.backend)
            .bind(&o.class.kernel)
            .bind(&o.class.model)
            .bind(i64::from(o.class.n))
            .bind(o.miner_key.to_vec())
            .bind(o.ops_per_unit)
            .bind(id)
            .bind(as_i64(created_at_ms))
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

fn verdict_from_row(r: &sqlx::any::AnyRow) -> Result<Verdict, StoreError> {
    let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt(format!("{what}: {e}"));
    let small = |value: i64, what: &str| {
        u32::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} {value} out of range")))
    };
    let params: StoredParams = serde_json::from_str(&r.try_get::<String, _>(8)?).map_err(|e| corrupt("params", e))?;
    let inventory: Vec<DeviceInfo> =
        serde_json::from_str(&r.try_get::<String, _>(12)?).map_err(|e| corrupt("inventory", e))?;
    let passed = r.try_get::<i64, _>(4)? != 0;
    let measured_ms = as_u64(r.try_get(9)?)?;
    let expected_ms = as_u64(r.try_get(10)?)?;
    let stored_rate: f64 = r.try_get(17)?;
    let expected_ops_per_sec = if stored_rate > 0.0 {
        stored_rate
    } else {
        // Stored before the rate was: what the expected time implies (to within its rounding
        // up to a whole millisecond).
        crate::verdict::throughput::operations(&params) / (expected_ms.max(1) as f64 / 1000.0)
    };
    let expectation = Expectation {
        ops_per_sec: expected_ops_per_sec,
        // Empty for verdicts stored before the source was recorded.
        source: RateSource::parse(&r.try_get::<String, _>(18)?),
        miners: small(r.try_get(19)?, "rate_miners")?,
        slack: r.try_get(20)?,
        // 0 for verdicts stored before the peak was.
        peak_ops_per_sec: r.try_get(25)?,
    };
    let memory: Option<MemoryProof> = optional_json(r, 21, "memory")?;
    let identity: Option<IdentityProof> = optional_json(r, 22, "identity")?;
    let reasons: Vec<Reason> = serde_json::from_str(&r.try_get::<String, _>(5)?).map_err(|e| corrupt("reasons", e))?;
    // 0 for verdicts stored before finish-by times: none of them is graded.
    let finish_by_ms = as_u64(r.try_get(23)?)?;
    let proves = passed || graded_miss(&reasons, measured_ms, finish_by_ms);
    let first_run: Option<FirstRun> = optional_json(r, 24, "first_run")?;
    let fill = MemoryProof::fill_work_of(memory.as_ref());
    let throughput = Throughput::of(&params, fill, inventory.len(), measured_ms, &expectation, proves);
    // 0 for verdicts stored before the version was: told from their memory proof.
    let protocol_version = match small(r.try_get(26)?, "protocol_version")? {
        0 => judged_under(memory.as_ref()),
        version => version,
    };
    Ok(Verdict {
        id: as_u64(r.try_get(0)?)?,
        miner_url: r.try_get(1)?,
        miner_key: hex::encode(r.try_get::<Vec<u8>, _>(2)?),
        nonce: hex::encode(r.try_get::<Vec<u8>, _>(3)?),
        passed,
        reasons,
        policy: r.try_get(6)?,
        samples: small(r.try_get(7)?, "samples")?,
        params,
        measured_ms,
        expected_ms,
        deadline_ms: as_u64(r.try_get(11)?)?,
        finish_by_ms,
        inventory,
        backend: r.try_get(13)?,
        kernel: r.try_get(14)?,
        global_checksum: hex::encode(r.try_get::<Vec<u8>, _>(15)?),
        created_at_ms: as_u64(r.try_get(16)?)?,
        throughput,
        memory,
        identity,
        first_run,
        protocol_version,
        transcript_bytes: r.try_get::<Option<i64>, _>(27)?.map(as_u64).transpose()?,
    })
}

/// The text of a JSON column that [`optional_json`] reads back: empty for a part the verdict
/// does not have.
fn optional_json_text<T: serde::Serialize>(part: Option<&T>) -> Result<String, StoreError> {
    part.map_or(Ok(String::new()), |part| {
        serde_json::to_string(part).map_err(|e| StoreError::Corrupt(e.to_string()))
    })
}

/// A JSON column that is empty for a verdict without the part (or stored before it was kept).
fn optional_json<T: serde::de::DeserializeOwned>(
    r: &sqlx::any::AnyRow,
    column: usize,
    what: &str,
) -> Result<Option<T>, StoreError> {
    let text: String = r.try_get(column)?;
    if text.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}
