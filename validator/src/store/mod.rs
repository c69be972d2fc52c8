//! The validator's SQLite database: registered miners, every nonce ever issued, verdicts, and
//! the rates verdicts proved.
//!
//! WAL mode with `synchronous = FULL`: a verdict that was reported is on disk. Each verdict is
//! written in its own transaction (with the rate observation a pass leaves), so a crash leaves
//! it either whole or absent. A nonce is recorded (PRIMARY KEY) before its challenge is sent, so
//! it is never issued twice, even across restarts.
//!
//! - this module: the file, its schema and migrations, and issued nonces;
//! - `verdicts`: verdicts, written with the rate they proved;
//! - `miners`: registered miners and revoked keys;
//! - `rates`: rate observations and imported (shared) rates.

mod miners;
mod rates;
mod verdicts;

pub use miners::MinerRecord;
pub use rates::ClassObservation;
pub use verdicts::{StoredParams, Verdict, VerdictFilter};

use gpu_attest_shared::identity::PublicKey;
use rusqlite::{Connection, params};
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
    Sql(rusqlite::Error),
    /// The disk is full, or the file or its file system is read-only: the operator's to fix,
    /// and the validator serves on meanwhile (what it could not store, it logged).
    #[error("the database cannot be written ({0}): free disk space or make it writable again; nothing was stored")]
    Unwritable(rusqlite::Error),
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

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode::{DiskFull, ReadOnly, SystemIoFailure};
        match e.sqlite_error_code() {
            // A write that cannot extend the file reports an I/O error on some systems.
            Some(DiskFull | ReadOnly | SystemIoFailure) => StoreError::Unwritable(e),
            _ => StoreError::Sql(e),
        }
    }
}

impl StoreError {
    /// Whether the store could not write (disk full, read-only), as opposed to a bad request
    /// or a bug: callers may retry once the operator has fixed it.
    pub fn is_unwritable(&self) -> bool {
        matches!(self, StoreError::Unwritable(_))
    }
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
}
