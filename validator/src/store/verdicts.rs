//! Verdicts: one row each, written in one transaction with the rate a pass proved.

use super::{ClassObservation, Store, StoreError};
use crate::rates::RateSource;
use crate::reason::Reason;
use crate::throughput::{Expectation, Throughput};
use gpu_attest_shared::params::ChallengeParams;
use gpu_attest_shared::statement::DeviceInfo;
use rusqlite::params;
use serde::{Deserialize, Serialize};

/// Challenge parameters as stored (JSON with hex bytes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredParams {
    pub nonce: String,
    pub seed: String,
    pub miner_key: String,
    pub n: u32,
    pub num_chains: u64,
    pub iterations: u32,
    pub checkpoint_every: u32,
}

impl From<&ChallengeParams> for StoredParams {
    fn from(p: &ChallengeParams) -> Self {
        StoredParams {
            nonce: hex::encode(p.nonce),
            seed: hex::encode(p.seed),
            miner_key: hex::encode(p.miner_key),
            n: p.n,
            num_chains: p.num_chains,
            iterations: p.iterations,
            checkpoint_every: p.checkpoint_every,
        }
    }
}

/// One attestation's outcome, as stored and served.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Assigned by the store; 0 before it is stored.
    pub id: u64,
    pub miner_url: String,
    pub miner_key: String,
    pub nonce: String,
    pub passed: bool,
    pub reasons: Vec<Reason>,
    pub policy: String,
    pub samples: u32,
    pub params: StoredParams,
    pub measured_ms: u64,
    pub expected_ms: u64,
    pub deadline_ms: u64,
    /// Stored as JSON with `DeviceInfo`'s own field names.
    pub inventory: Vec<DeviceInfo>,
    pub backend: String,
    pub kernel: String,
    pub global_checksum: String,
    pub created_at_ms: u64,
    /// What the verdict proves about throughput; derived from the fields above and the
    /// expected rate, which is stored.
    pub throughput: Throughput,
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
    pub fn insert_verdict(&self, v: &Verdict) -> Result<u64, StoreError> {
        self.record_verdict(v, None)
    }

    /// Stores a verdict and, for a passing one, the rate it proved for its class, in one
    /// transaction: a crash leaves both or neither.
    pub fn record_verdict(&self, v: &Verdict, observation: Option<&ClassObservation>) -> Result<u64, StoreError> {
        let json = |value: serde_json::Result<String>| value.map_err(|e| StoreError::Corrupt(e.to_string()));
        let nonce = hex::decode(&v.nonce).map_err(|e| StoreError::Corrupt(format!("nonce: {e}")))?;
        let miner_key = hex::decode(&v.miner_key).map_err(|e| StoreError::Corrupt(format!("miner key: {e}")))?;
        let global = hex::decode(&v.global_checksum).map_err(|e| StoreError::Corrupt(format!("checksum: {e}")))?;
        let t = &v.throughput;
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO verdicts (miner_url, miner_key, nonce, passed, reasons, policy, samples, params, measured_ms,
                                   expected_ms, deadline_ms, inventory, backend, kernel, global_checksum, created_at_ms,
                                   expected_ops_per_sec, rate_source, rate_miners, slack)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
            params![
                v.miner_url,
                miner_key,
                nonce,
                v.passed,
                json(serde_json::to_string(&v.reasons))?,
                v.policy,
                v.samples,
                json(serde_json::to_string(&v.params))?,
                v.measured_ms as i64,
                v.expected_ms as i64,
                v.deadline_ms as i64,
                json(serde_json::to_string(&v.inventory))?,
                v.backend,
                v.kernel,
                global,
                v.created_at_ms as i64,
                t.expected_ops_per_sec,
                t.rate_source.map(|r| r.as_str()).unwrap_or(""),
                t.rate_miners,
                t.slack,
            ],
        )?;
        let id = tx.last_insert_rowid();
        if let Some(o) = observation.filter(|o| o.ops_per_unit.is_finite() && o.ops_per_unit > 0.0) {
            tx.execute(
                "INSERT INTO rate_observations (backend, kernel, model, n, miner_key, ops_per_unit, verdict_id, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    o.class.backend,
                    o.class.kernel,
                    o.class.model,
                    o.class.n,
                    o.miner_key.as_slice(),
                    o.ops_per_unit,
                    id,
                    v.created_at_ms as i64
                ],
            )?;
        }
        tx.commit()?;
        Ok(id as u64)
    }

    /// Newest first.
    pub fn verdicts(&self, filter: &VerdictFilter) -> Result<Vec<Verdict>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, miner_url, miner_key, nonce, passed, reasons, policy, samples, params, measured_ms,
                    expected_ms, deadline_ms, inventory, backend, kernel, global_checksum, created_at_ms,
                    expected_ops_per_sec, rate_source, rate_miners, slack
             FROM verdicts
             WHERE (?1 IS NULL OR miner_url = ?1) AND (?2 IS NULL OR passed = ?2)
               AND created_at_ms >= ?3 AND (?4 IS NULL OR id < ?4)
             ORDER BY id DESC LIMIT ?5",
        )?;
        let rows = stmt.query_map(
            params![
                filter.miner_url,
                filter.passed,
                filter.since_ms as i64,
                filter.before_id.map(|i| i as i64),
                filter.limit
            ],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                    r.get::<_, Vec<u8>>(3)?,
                    r.get::<_, bool>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, u32>(7)?,
                    r.get::<_, String>(8)?,
                    [
                        r.get::<_, i64>(9)?,
                        r.get::<_, i64>(10)?,
                        r.get::<_, i64>(11)?,
                        r.get::<_, i64>(16)?,
                    ],
                    r.get::<_, String>(12)?,
                    r.get::<_, String>(13)?,
                    r.get::<_, String>(14)?,
                    r.get::<_, Vec<u8>>(15)?,
                    r.get::<_, f64>(17)?,
                    (r.get::<_, String>(18)?, r.get::<_, u32>(19)?, r.get::<_, f64>(20)?),
                ))
            },
        )?;
        let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt(format!("{what}: {e}"));
        rows.map(|row| {
            let (
                id,
                miner_url,
                key,
                nonce,
                passed,
                reasons,
                policy,
                samples,
                params,
                times,
                inventory,
                backend,
                kernel,
                global,
                expected_ops_per_sec,
                (rate_source, rate_miners, slack),
            ) = row?;
            let params: StoredParams = serde_json::from_str(&params).map_err(|e| corrupt("params", e))?;
            let inventory: Vec<DeviceInfo> = serde_json::from_str(&inventory).map_err(|e| corrupt("inventory", e))?;
            let (measured_ms, expected_ms) = (times[0] as u64, times[1] as u64);
            let expected_ops_per_sec = if expected_ops_per_sec > 0.0 {
                expected_ops_per_sec
            } else {
                // Stored before the rate was: what the expected time implies (to within its
                // rounding up to a whole millisecond).
                crate::throughput::operations(&params) / (expected_ms.max(1) as f64 / 1000.0)
            };
            let expectation = Expectation {
                ops_per_sec: expected_ops_per_sec,
                // Empty for verdicts stored before the source was recorded.
                source: RateSource::parse(&rate_source),
                miners: rate_miners,
                slack,
            };
            let throughput = Throughput::of(&params, inventory.len(), measured_ms, &expectation, passed);
            Ok(Verdict {
                id: id as u64,
                miner_url,
                miner_key: hex::encode(key),
                nonce: hex::encode(nonce),
                passed,
                reasons: serde_json::from_str(&reasons).map_err(|e| corrupt("reasons", e))?,
                policy,
                samples,
                params,
                measured_ms,
                expected_ms,
                deadline_ms: times[2] as u64,
                inventory,
                backend,
                kernel,
                global_checksum: hex::encode(global),
                created_at_ms: times[3] as u64,
                throughput,
            })
        })
        .collect()
    }
}
