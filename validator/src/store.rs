//! The validator's SQLite database: registered miners, every nonce ever issued, and verdicts.
//!
//! WAL mode with `synchronous = FULL`: a verdict that was reported is on disk. Each verdict is
//! one INSERT in its own transaction, so a crash leaves it either whole or absent. A nonce is
//! recorded (PRIMARY KEY) before its challenge is sent, so it is never issued twice, even across
//! restarts.

use crate::rates::calibration::Observation;
use crate::rates::{RateClass, RateSource, SharedRate};
use crate::reason::Reason;
use crate::throughput::{Expectation, Throughput};
use gpu_attest_shared::identity::PublicKey;
use gpu_attest_shared::params::ChallengeParams;
use gpu_attest_shared::statement::DeviceInfo;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Mutex;

/// 2: verdicts keep the rate the planner expected (`expected_ops_per_sec`).
/// 3: verdicts keep where that rate came from and the slack; passing verdicts leave rate
///    observations; imported (shared) rates.
const SCHEMA_VERSION: i64 = 3;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS miners (
    url              TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    miner_key        BLOB NOT NULL CHECK (length(miner_key) = 32),
    registered_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS nonces (
    nonce        BLOB PRIMARY KEY CHECK (length(nonce) = 32),
    miner_url    TEXT NOT NULL,
    issued_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS verdicts (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    miner_url       TEXT NOT NULL,
    miner_key       BLOB NOT NULL,
    nonce           BLOB NOT NULL UNIQUE REFERENCES nonces(nonce),
    passed          INTEGER NOT NULL CHECK (passed IN (0, 1)),
    reasons         TEXT NOT NULL,
    policy          TEXT NOT NULL,
    samples         INTEGER NOT NULL,
    params          TEXT NOT NULL,
    measured_ms     INTEGER NOT NULL,
    expected_ms     INTEGER NOT NULL,
    deadline_ms     INTEGER NOT NULL,
    inventory       TEXT NOT NULL,
    backend         TEXT NOT NULL,
    kernel          TEXT NOT NULL,
    global_checksum BLOB NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    expected_ops_per_sec REAL NOT NULL DEFAULT 0,
    rate_source     TEXT NOT NULL DEFAULT '',
    rate_miners     INTEGER NOT NULL DEFAULT 0,
    slack           REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS verdicts_by_miner ON verdicts (miner_url, id);
CREATE TABLE IF NOT EXISTS rate_observations (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    backend       TEXT NOT NULL,
    kernel        TEXT NOT NULL,
    model         TEXT NOT NULL,
    n             INTEGER NOT NULL,
    miner_key     BLOB NOT NULL CHECK (length(miner_key) = 32),
    ops_per_unit  REAL NOT NULL CHECK (ops_per_unit > 0),
    verdict_id    INTEGER NOT NULL UNIQUE REFERENCES verdicts(id),
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS observations_by_class ON rate_observations (backend, kernel, model, n, id);
CREATE TABLE IF NOT EXISTS shared_rates (
    backend        TEXT NOT NULL,
    kernel         TEXT NOT NULL,
    model          TEXT NOT NULL,
    n              INTEGER NOT NULL,
    ops_per_unit   REAL NOT NULL CHECK (ops_per_unit > 0),
    miners         INTEGER NOT NULL,
    observations   INTEGER NOT NULL,
    imported_at_ms INTEGER NOT NULL,
    PRIMARY KEY (backend, kernel, model, n)
);
CREATE TABLE IF NOT EXISTS revoked_keys (
    miner_key     BLOB PRIMARY KEY CHECK (length(miner_key) = 32),
    reason        TEXT NOT NULL,
    revoked_at_ms INTEGER NOT NULL
);
";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {source}")]
    Open { path: String, source: rusqlite::Error },
    #[error("database {path} has schema version {found}; this validator knows version {SCHEMA_VERSION}")]
    SchemaVersion { path: String, found: i64 },
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    #[error(
        "miner {url} is registered with key {registered}; it now presents {presented}. Register it again with replace_key set to accept the new key"
    )]
    KeyChanged {
        url: String,
        registered: PublicKey,
        presented: PublicKey,
    },
    #[error("miner key {0} is revoked ({1})")]
    Revoked(PublicKey, String),
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MinerRecord {
    pub url: String,
    pub name: String,
    pub miner_key: PublicKey,
    pub registered_at_ms: u64,
}

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

pub struct Store {
    conn: Mutex<Connection>,
}

impl Store {
    /// Opens (creating if needed) the database file and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let shown = path.display().to_string();
        let open_err = |source| StoreError::Open {
            path: shown.clone(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", true).map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(open_err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(open_err)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::SchemaVersion {
                path: shown,
                found: version,
            });
        }
        conn.execute_batch(SCHEMA).map_err(open_err)?;
        // Columns added to `verdicts` since version 1. A fresh table has them from SCHEMA;
        // an older one gets them here, one transaction per version.
        const ADDED_COLUMNS: [&str; 2] = [
            // 2. Rows from before keep 0: their expected rate is derived from expected_ms on read.
            "ALTER TABLE verdicts ADD COLUMN expected_ops_per_sec REAL NOT NULL DEFAULT 0;",
            // 3. Rows from before read as 'unrecorded'.
            "ALTER TABLE verdicts ADD COLUMN rate_source TEXT NOT NULL DEFAULT '';
             ALTER TABLE verdicts ADD COLUMN rate_miners INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE verdicts ADD COLUMN slack REAL NOT NULL DEFAULT 0;",
        ];
        // Each step records its version in its own transaction, so a crash between steps leaves
        // a database that the next open carries on from, never one that repeats a step.
        if version >= 1 {
            for (i, step) in ADDED_COLUMNS.iter().enumerate() {
                let to = i as i64 + 2;
                if version < to {
                    conn.execute_batch(&format!("BEGIN; {step} PRAGMA user_version = {to}; COMMIT;"))
                        .map_err(open_err)?;
                }
            }
        }
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(open_err)?;
        Ok(Store { conn: Mutex::new(conn) })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a nonce as issued; `false` if it was issued before (then it must not be used).
    pub fn claim_nonce(&self, nonce: &[u8; 32], miner_url: &str, now_ms: u64) -> Result<bool, StoreError> {
        let inserted = self.conn().execute(
            "INSERT OR IGNORE INTO nonces (nonce, miner_url, issued_at_ms) VALUES (?1, ?2, ?3)",
            params![nonce.as_slice(), miner_url, now_ms as i64],
        )?;
        Ok(inserted == 1)
    }

    pub fn nonce_count(&self) -> Result<u64, StoreError> {
        Ok(self
            .conn()
            .query_row("SELECT count(*) FROM nonces", [], |r| r.get::<_, i64>(0))? as u64)
    }

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

    /// A class's rate observations since `since_ms`, newest first; a revoked key's no longer
    /// count.
    pub fn observations(&self, class: &RateClass, since_ms: u64) -> Result<Vec<Observation>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT miner_key, ops_per_unit FROM rate_observations
             WHERE backend = ?1 AND kernel = ?2 AND model = ?3 AND n = ?4 AND created_at_ms >= ?5
               AND miner_key NOT IN (SELECT miner_key FROM revoked_keys)
             ORDER BY id DESC LIMIT ?6",
        )?;
        let rows = stmt.query_map(
            params![
                class.backend,
                class.kernel,
                class.model,
                class.n,
                since_ms as i64,
                MAX_OBSERVATIONS_READ
            ],
            |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, f64>(1)?)),
        )?;
        rows.map(|row| {
            let (key, ops_per_unit) = row?;
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
    pub fn rate_classes(&self) -> Result<Vec<RateClass>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT backend, kernel, model, n FROM rate_observations
             UNION SELECT backend, kernel, model, n FROM shared_rates
             ORDER BY 1, 2, 3, 4",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(RateClass {
                backend: r.get(0)?,
                kernel: r.get(1)?,
                model: r.get(2)?,
                n: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// A class's imported rate, if it was imported since `since_ms` (imports age out like
    /// observations, so a fleet file must be refreshed to stay in force).
    pub fn shared_rate(&self, class: &RateClass, since_ms: u64) -> Result<Option<SharedRate>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT ops_per_unit, miners, observations FROM shared_rates
                 WHERE backend = ?1 AND kernel = ?2 AND model = ?3 AND n = ?4 AND imported_at_ms >= ?5",
                params![class.backend, class.kernel, class.model, class.n, since_ms as i64],
                |r| {
                    Ok(SharedRate {
                        ops_per_unit: r.get(0)?,
                        miners: r.get(1)?,
                        observations: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// Imports shared rates, replacing those of the same classes, all in one transaction.
    pub fn import_shared_rates(&self, rows: &[(RateClass, SharedRate)], now_ms: u64) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for (class, rate) in rows {
            tx.execute(
                "INSERT OR REPLACE INTO shared_rates
                     (backend, kernel, model, n, ops_per_unit, miners, observations, imported_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    class.backend,
                    class.kernel,
                    class.model,
                    class.n,
                    rate.ops_per_unit,
                    rate.miners,
                    rate.observations,
                    now_ms as i64
                ],
            )?;
        }
        tx.commit()?;
        Ok(())
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

    /// Registers a miner at `url` bound to `key`. Re-registering with the same key updates the
    /// name; a different key is refused unless `replace_key` (the operator's explicit action).
    /// A revoked key is refused always.
    pub fn register_miner(
        &self,
        url: &str,
        name: &str,
        key: PublicKey,
        replace_key: bool,
        now_ms: u64,
    ) -> Result<MinerRecord, StoreError> {
        self.check_not_revoked(&key)?;
        let conn = self.conn();
        let existing: Option<Vec<u8>> = conn
            .query_row("SELECT miner_key FROM miners WHERE url = ?1", [url], |r| r.get(0))
            .optional()?;
        if let Some(existing) = existing {
            let registered = PublicKey::from_slice(&existing).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if registered != key && !replace_key {
                return Err(StoreError::KeyChanged {
                    url: url.into(),
                    registered,
                    presented: key,
                });
            }
            conn.execute(
                "UPDATE miners SET name = ?2, miner_key = ?3 WHERE url = ?1",
                params![url, name, key.0.as_slice()],
            )?;
        } else {
            conn.execute(
                "INSERT INTO miners (url, name, miner_key, registered_at_ms) VALUES (?1, ?2, ?3, ?4)",
                params![url, name, key.0.as_slice(), now_ms as i64],
            )?;
        }
        drop(conn);
        self.miner(url)?
            .ok_or_else(|| StoreError::Corrupt(format!("miner {url} vanished after registration")))
    }

    pub fn miner(&self, url: &str) -> Result<Option<MinerRecord>, StoreError> {
        Ok(self.miners()?.into_iter().find(|m| m.url == url))
    }

    pub fn miners(&self) -> Result<Vec<MinerRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT url, name, miner_key, registered_at_ms FROM miners ORDER BY url")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Vec<u8>>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?;
        rows.map(|row| {
            let (url, name, key, at) = row?;
            let miner_key = PublicKey::from_slice(&key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            Ok(MinerRecord {
                url,
                name,
                miner_key,
                registered_at_ms: at as u64,
            })
        })
        .collect()
    }

    /// Revokes `key` for good; `false` if it already was.
    pub fn revoke_key(&self, key: &PublicKey, reason: &str, now_ms: u64) -> Result<bool, StoreError> {
        let inserted = self.conn().execute(
            "INSERT OR IGNORE INTO revoked_keys (miner_key, reason, revoked_at_ms) VALUES (?1, ?2, ?3)",
            params![key.0.as_slice(), reason, now_ms as i64],
        )?;
        Ok(inserted == 1)
    }

    pub fn check_not_revoked(&self, key: &PublicKey) -> Result<(), StoreError> {
        let reason: Option<String> = self
            .conn()
            .query_row(
                "SELECT reason FROM revoked_keys WHERE miner_key = ?1",
                [key.0.as_slice()],
                |r| r.get(0),
            )
            .optional()?;
        match reason {
            Some(reason) => Err(StoreError::Revoked(*key, reason)),
            None => Ok(()),
        }
    }

    pub fn remove_miner(&self, url: &str) -> Result<bool, StoreError> {
        Ok(self.conn().execute("DELETE FROM miners WHERE url = ?1", [url])? == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdicts table as schema version 1 created it.
    const VERDICTS_V1: &str = "
        CREATE TABLE verdicts (
            id INTEGER PRIMARY KEY AUTOINCREMENT, miner_url TEXT NOT NULL, miner_key BLOB NOT NULL,
            nonce BLOB NOT NULL UNIQUE REFERENCES nonces(nonce),
            passed INTEGER NOT NULL CHECK (passed IN (0, 1)), reasons TEXT NOT NULL, policy TEXT NOT NULL,
            samples INTEGER NOT NULL, params TEXT NOT NULL, measured_ms INTEGER NOT NULL,
            expected_ms INTEGER NOT NULL, deadline_ms INTEGER NOT NULL, inventory TEXT NOT NULL,
            backend TEXT NOT NULL, kernel TEXT NOT NULL, global_checksum BLOB NOT NULL,
            created_at_ms INTEGER NOT NULL
        );";

    #[test]
    fn a_version_1_database_is_migrated_and_its_verdicts_read() {
        let dir = std::env::temp_dir().join(format!("gpu-attest-store-v1-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("validator.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE nonces (nonce BLOB PRIMARY KEY, miner_url TEXT NOT NULL, issued_at_ms INTEGER NOT NULL);",
            )
            .unwrap();
            conn.execute_batch(VERDICTS_V1).unwrap();
            conn.execute("INSERT INTO nonces VALUES (?1, 'http://m', 1)", [[1u8; 32].as_slice()])
                .unwrap();
            let params =
                r#"{"nonce":"","seed":"","miner_key":"","n":64,"num_chains":5,"iterations":4,"checkpoint_every":2}"#;
            conn.execute(
                "INSERT INTO verdicts (miner_url, miner_key, nonce, passed, reasons, policy, samples, params,
                     measured_ms, expected_ms, deadline_ms, inventory, backend, kernel, global_checksum, created_at_ms)
                 VALUES ('http://m', ?1, ?2, 1, '[]', 'sampled', 8, ?3, 50, 100, 1500, '[{\"index\":0,\"name\":\"cpu\",\"uuid\":\"\",\"memory_bytes\":0,\"sm_count\":0,\"compute_capability\":[0,0],\"pci_bus_id\":\"\",\"driver_version\":\"\"}]', 'cpu', 'portable', ?4, 7)",
                params![[2u8; 32].as_slice(), [1u8; 32].as_slice(), params, [3u8; 32].as_slice()],
            )
            .unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
        }
        let store = Store::open(&path).unwrap();
        let verdicts = store.verdicts(&VerdictFilter {
            limit: 10,
            ..Default::default()
        });
        let verdicts = verdicts.unwrap();
        assert_eq!(verdicts.len(), 1);
        let t = verdicts[0].throughput;
        let operations = 2.0 * 64f64.powi(3) * 5.0 * 4.0;
        assert_eq!(t.operations, operations);
        // The old row has no stored rate: the expected time gives it.
        assert_eq!(t.expected_ops_per_sec, operations / 0.1);
        assert_eq!(t.proven_ops_per_sec, Some(operations / 0.05));
        // And the migrated table takes new verdicts with their rate.
        let mut newer = verdicts[0].clone();
        newer.nonce = hex::encode([4u8; 32]);
        newer.throughput.expected_ops_per_sec = 123.0;
        assert!(store.claim_nonce(&[4; 32], "http://m", 2).unwrap());
        store.insert_verdict(&newer).unwrap();
        let back = store.verdicts(&VerdictFilter {
            limit: 1,
            ..Default::default()
        });
        assert_eq!(back.unwrap()[0].throughput.expected_ops_per_sec, 123.0);
        drop(store);
        // Opened again, it is at the current version and stays readable.
        Store::open(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
    fn temp_store(tag: &str) -> (Store, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("gpu-attest-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        (Store::open(&dir.join("validator.db")).unwrap(), dir)
    }

    fn passing_verdict(nonce: [u8; 32]) -> Verdict {
        let params = StoredParams {
            nonce: hex::encode(nonce),
            seed: hex::encode([0u8; 32]),
            miner_key: hex::encode([2u8; 32]),
            n: 64,
            num_chains: 5,
            iterations: 4,
            checkpoint_every: 2,
        };
        let expectation = Expectation {
            ops_per_sec: 1.0e9,
            source: Some(RateSource::Shipped),
            miners: 0,
            slack: 3.0,
        };
        Verdict {
            id: 0,
            miner_url: "http://m".into(),
            miner_key: hex::encode([2u8; 32]),
            nonce: hex::encode(nonce),
            passed: true,
            reasons: Vec::new(),
            policy: "sampled".into(),
            samples: 8,
            throughput: Throughput::of(&params, 1, 50, &expectation, true),
            params,
            measured_ms: 50,
            expected_ms: 100,
            deadline_ms: 300,
            inventory: vec![DeviceInfo::default()],
            backend: "cpu".into(),
            kernel: "portable".into(),
            global_checksum: hex::encode([3u8; 32]),
            created_at_ms: 1_000,
        }
    }

    fn class() -> RateClass {
        RateClass {
            backend: "cpu".into(),
            kernel: "portable".into(),
            model: "cpu: test".into(),
            n: 64,
        }
    }

    #[test]
    fn a_verdict_and_the_rate_it_proved_are_stored_together_or_not_at_all() {
        let (store, dir) = temp_store("observations");
        let observation = ClassObservation {
            class: class(),
            miner_key: [2; 32],
            ops_per_unit: 4.0e9,
        };
        assert!(store.claim_nonce(&[1; 32], "http://m", 1).unwrap());
        let stored = passing_verdict([1; 32]);
        let id = store.record_verdict(&stored, Some(&observation)).unwrap();
        let read = store
            .verdicts(&VerdictFilter {
                limit: 1,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            read[0].throughput, stored.throughput,
            "the rate source and slack round-trip"
        );
        assert_eq!(read[0].id, id);
        let seen = store.observations(&class(), 0).unwrap();
        assert_eq!(
            seen,
            vec![Observation {
                miner_key: [2; 32],
                ops_per_unit: 4.0e9
            }]
        );
        assert!(
            store.observations(&class(), 1_001).unwrap().is_empty(),
            "older than the window"
        );
        // A verdict that cannot be stored (its nonce was never issued) leaves no observation.
        assert!(
            store
                .record_verdict(&passing_verdict([9; 32]), Some(&observation))
                .is_err()
        );
        assert_eq!(store.observations(&class(), 0).unwrap().len(), 1);
        // Imported rates are listed beside observed classes and replace their own class's row.
        let other = RateClass { n: 128, ..class() };
        let rate = |ops_per_unit| SharedRate {
            ops_per_unit,
            miners: 4,
            observations: 12,
        };
        store.import_shared_rates(&[(other.clone(), rate(1.0e9))], 5).unwrap();
        store.import_shared_rates(&[(other.clone(), rate(2.0e9))], 6).unwrap();
        assert_eq!(store.shared_rate(&other, 0).unwrap(), Some(rate(2.0e9)));
        assert_eq!(
            store.shared_rate(&other, 7).unwrap(),
            None,
            "imported before the window"
        );
        assert_eq!(store.shared_rate(&class(), 0).unwrap(), None);
        assert_eq!(store.rate_classes().unwrap(), vec![class(), other]);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
