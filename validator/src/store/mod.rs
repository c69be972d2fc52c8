//! The validator's database: registered miners, every nonce ever issued, verdicts, the rates
//! verdicts proved, and the leases a fleet of validators shares miners by.
//!
//! Two stores, one code path (sqlx's Any driver, the same SQL):
//! - **SQLite** (the default): a file, in WAL mode with `synchronous = FULL`, so a verdict that
//!   was reported is on disk.
//! - **PostgreSQL** (`database = "postgres://..."`): several validators share one database and
//!   split the registered miners between them by leases (`leases`).
//!
//! Each verdict is written in its own transaction (with the rate observation a pass leaves), so
//! a crash leaves it either whole or absent. A nonce is recorded (PRIMARY KEY) before its
//! challenge is sent, so it is never issued twice, even across restarts or validators.
//!
//! - this module: opening either store, and issued nonces;
//! - `schema`: the tables, per dialect, and the migrations;
//! - `verdicts`: verdicts, written with the rate they proved;
//! - `miners`: registered miners and revoked keys;
//! - `rates`: rate observations and imported (shared) rates;
//! - `leases`: which validator attests which miner now;
//! - `transcripts`: the verdicts' kept transcripts, within their budget.

mod leases;
mod miners;
mod rates;
mod schema;
mod sightings;
mod transcripts;
mod verdicts;

pub use leases::{Lease, LeaseRefusal};
pub use miners::{MinerRecord, MinerStanding, RevokedKey};
pub use rates::{ClassObservation, Observation, SharedRate};
pub use schema::SCHEMA_VERSION;
pub use transcripts::Kept;
pub use verdicts::VerdictFilter;

use gpu_attest_shared::keys::PublicKey;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, AssertSqlSafe, Executor};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// Whether `location` names a PostgreSQL database rather than a SQLite file.
pub fn is_postgres(location: &Path) -> bool {
    let text = location.to_string_lossy().to_ascii_lowercase();
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

/// Which database a store is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {location}: {source}")]
    Open { location: String, source: sqlx::Error },
    #[error(
        "database {location} cannot be opened for writing ({source}): the validator writes the file and creates {location}-wal and {location}-shm beside it, so the directory {directory} must exist, and it and the file must be writable by the user the validator runs as (`validator verdicts --database` reads a file it may only read)"
    )]
    NotWritable {
        location: String,
        directory: String,
        source: sqlx::Error,
    },
    #[error("database {location} has schema version {found}; this validator knows version {SCHEMA_VERSION}")]
    SchemaVersion { location: String, found: i64 },
    #[error(
        "database {location} has schema version {found}, older than this validator's {SCHEMA_VERSION}: run this validator's `serve` or `attest` on it once to bring it up to date, then read it"
    )]
    SchemaBehind { location: String, found: i64 },
    #[error("database error: {0}")]
    Sql(sqlx::Error),
    /// The disk is full, or the file or its file system is read-only: the operator's to fix,
    /// and the validator serves on meanwhile (what it could not store, it logged).
    #[error("the database cannot be written ({0}): free disk space or make it writable again; nothing was stored")]
    Unwritable(sqlx::Error),
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    #[error(
        "miner {url} is registered with key {registered}; it now presents {presented}. Register it again with replace_key set (`validator miners add --replace-key`) to accept the new key"
    )]
    KeyChanged {
        url: String,
        registered: PublicKey,
        presented: PublicKey,
    },
    #[error("miner key {0} is revoked ({1})")]
    Revoked(PublicKey, String),
    #[error(
        "miner key {key} is already registered as {name:?} at {url}: one key is one miner. If the miner moved, remove that registration first (`validator miners remove {url}`); if it did not, this URL relays another miner's answers"
    )]
    KeyRegisteredElsewhere { key: PublicKey, url: String, name: String },
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_unwritable(&e) {
            StoreError::Unwritable(e)
        } else {
            StoreError::Sql(e)
        }
    }
}

/// Disk full or read-only, in either store: SQLite's SQLITE_FULL (13), SQLITE_READONLY (8) and
/// SQLITE_IOERR (10, what a write that cannot extend the file reports on some systems), with
/// their extended codes; PostgreSQL's class 53 (insufficient resources: disk full, out of
/// memory) and 25006 (read-only transaction: a standby). Told apart by the driver's error type:
/// both kinds of code can be all digits.
fn is_unwritable(e: &sqlx::Error) -> bool {
    let Some(db) = e.as_database_error() else {
        return false;
    };
    let Some(code) = db.code() else { return false };
    if db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some() {
        code.starts_with("53") || code == "25006"
    } else {
        code.parse::<i64>()
            .is_ok_and(|sqlite| matches!(sqlite & 0xff, 8 | 10 | 13))
    }
}

impl StoreError {
    /// Whether the store could not write (disk full, read-only), as opposed to a bad request
    /// or a bug: callers may retry once the operator has fixed it.
    pub fn is_unwritable(&self) -> bool {
        matches!(self, StoreError::Unwritable(_))
    }
}

/// Connections a PostgreSQL store keeps; SQLite takes one writer at a time anyway, so it keeps
/// one (as the file's single writer, it never waits on itself).
const POSTGRES_CONNECTIONS: u32 = 8;

/// How long a call waits for the database (a lock held by another validator or process).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    /// Where it is, for messages: the file, or the URL without its password.
    location: String,
    /// The id of the newest verdict this process stored: wakes verdict watchers at once (verdicts
    /// other validators store in a shared database are found by polling).
    stored: tokio::sync::watch::Sender<u64>,
}

/// How long opening a database may take before the attempt is given up, with the reason.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a store is opened for: serving (writes, and brings the schema up to date), or only
/// reading (an operator's `verdicts` or `rates`, which must work on a file they may only read,
/// and must not migrate a database under a running validator of another version).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    ReadWrite,
    ReadOnly,
}

/// Opens one connection and does what every pooled connection does first (for SQLite, the WAL
/// switch, which fails on a file that is not a database, is read-only, or sits on a full or
/// failing disk), returning the first error as it is.
async fn probe(options: &AnyConnectOptions, dialect: Dialect, access: Access) -> Result<(), sqlx::Error> {
    use sqlx::{AnyConnection, Connection};
    let mut conn = AnyConnection::connect_with(options).await?;
    match (dialect, access) {
        (Dialect::Sqlite, Access::ReadWrite) => conn.execute("PRAGMA journal_mode = WAL").await?,
        // Reads the header and the schema: fails on a file that is not a database.
        (Dialect::Sqlite, Access::ReadOnly) => conn.execute("SELECT count(*) FROM sqlite_master").await?,
        (Dialect::Postgres, _) => conn.execute("SELECT 1").await?,
    };
    conn.close().await
}

/// [`probe`], given up after [`PROBE_TIMEOUT`].
async fn probe_in_time(options: &AnyConnectOptions, dialect: Dialect, access: Access) -> Result<(), sqlx::Error> {
    tokio::time::timeout(PROBE_TIMEOUT, probe(options, dialect, access))
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", PROBE_TIMEOUT.as_secs()),
            )))
        })
}

/// Why the SQLite file at `location` could not be opened to write: a file or directory this
/// validator may not write, or a directory that does not exist, said as such (the directory
/// named in full, a relative location too); anything else as it came.
pub(super) fn opening_to_write_failed(location: &str, source: sqlx::Error) -> StoreError {
    if needs_shared_memory_file(&source) {
        let file = std::path::absolute(location).unwrap_or_else(|_| location.into());
        StoreError::NotWritable {
            location: location.to_string(),
            directory: file.parent().map(|d| d.display().to_string()).unwrap_or_default(),
            source,
        }
    } else {
        StoreError::Open {
            location: location.to_string(),
            source,
        }
    }
}

/// The pool of connections a store runs on, each set up for `access`: a SQLite file has one
/// writer connection in WAL mode with full sync (a verdict stored is on disk), waiting out
/// another process's lock for `BUSY_TIMEOUT`; a PostgreSQL store has several connections, a
/// reader's read-only.
async fn open_pool(options: AnyConnectOptions, dialect: Dialect, access: Access) -> Result<AnyPool, sqlx::Error> {
    match dialect {
        Dialect::Sqlite => {
            AnyPoolOptions::new()
                .max_connections(1)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        if access == Access::ReadWrite {
                            conn.execute("PRAGMA journal_mode = WAL").await?;
                            conn.execute("PRAGMA synchronous = FULL").await?;
                            conn.execute("PRAGMA foreign_keys = ON").await?;
                        }
                        sqlx::raw_sql(AssertSqlSafe(format!(
                            "PRAGMA busy_timeout = {}",
                            BUSY_TIMEOUT.as_millis()
                        )))
                        .execute(&mut *conn)
                        .await?;
                        Ok(())
                    })
                })
                .connect_with(options)
                .await
        }
        Dialect::Postgres => {
            let connections = if access == Access::ReadOnly {
                1
            } else {
                POSTGRES_CONNECTIONS
            };
            AnyPoolOptions::new()
                .max_connections(connections)
                .acquire_timeout(BUSY_TIMEOUT * 2)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        if access == Access::ReadOnly {
                            conn.execute("SET default_transaction_read_only = on").await?;
                        }
                        Ok(())
                    })
                })
                .connect_with(options)
                .await
        }
    }
}

/// SQLite's refusal to read a WAL database whose shared-memory file it cannot create, or to
/// open a file it may not write: SQLITE_READONLY (8) or SQLITE_CANTOPEN (14), with their
/// extended codes.
fn needs_shared_memory_file(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|db| db.code())
        .and_then(|code| code.parse::<i64>().ok())
        .is_some_and(|code| matches!(code & 0xff, 8 | 14))
}

/// The write-ahead log beside a SQLite file: present while a connection (a validator) has it open.
fn wal_file(file: &Path) -> std::path::PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push("-wal");
    std::path::PathBuf::from(name)
}

impl Store {
    /// Opens (creating if needed) the database at `location`, a SQLite file path or a
    /// `postgres://` URL, and brings its schema up to date.
    pub async fn open(location: &Path) -> Result<Self, StoreError> {
        let store = Self::connect(location, Access::ReadWrite).await?;
        schema::migrate(&store).await?;
        Ok(store)
    }

    /// Opens an existing database only to read it: nothing is created, migrated or written
    /// (a SQLite file is opened read-only, so a file the operator may only read will do), and
    /// a schema older or newer than this validator's is refused with what to do.
    pub async fn open_for_reading(location: &Path) -> Result<Self, StoreError> {
        let store = Self::connect(location, Access::ReadOnly).await?;
        schema::check_current(&store).await?;
        Ok(store)
    }

    async fn connect(location: &Path, access: Access) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let text = location.to_string_lossy();
        let (dialect, url, shown, file) = if is_postgres(location) {
            (Dialect::Postgres, text.to_string(), redact_url(&text), None)
        } else {
            // Absolute first: the URL parser would resolve `..` against nothing.
            let file = std::path::absolute(location).unwrap_or_else(|_| location.to_path_buf());
            let url = sqlite_url(&file.to_string_lossy(), access);
            (Dialect::Sqlite, url, text.to_string(), Some(file))
        };
        let open_err = |source| StoreError::Open {
            location: shown.clone(),
            source,
        };
        let mut options = AnyConnectOptions::from_str(&url).map_err(open_err)?;
        // One connection first, to say what is wrong: the pool retries a failing connection
        // until its timeout and then reports only that it timed out (after 30 s), hiding "file
        // is not a database", "disk I/O error" or "connection refused".
        let mut probed = probe_in_time(&options, dialect, access).await;
        if let (Err(e), Some(file)) = (&probed, &file)
            && access == Access::ReadOnly
            && needs_shared_memory_file(e)
            && !wal_file(file).exists()
        {
            // A WAL database read from a directory we may not write, with no validator
            // connected to it (it would have left its `-wal` file): SQLite cannot create the
            // shared-memory file readers coordinate through, so the file is read as
            // immutable, without it. A validator starting meanwhile could make this read fail
            // with an error; it cannot make it write.
            options = AnyConnectOptions::from_str(&format!("{url}&immutable=true")).map_err(open_err)?;
            probed = probe_in_time(&options, dialect, access).await;
        }
        // A SQLite file this validator may not write (or whose directory it may not write, or
        // that does not exist) fails here or when the pool first sets the journal mode.
        let open_failure = |source: sqlx::Error| match (&file, access) {
            (Some(_), Access::ReadWrite) => opening_to_write_failed(&shown, source),
            _ => open_err(source),
        };
        probed.map_err(open_failure)?;
        let pool = open_pool(options, dialect, access).await.map_err(open_failure)?;
        Ok(Store {
            pool,
            dialect,
            location: shown,
            stored: tokio::sync::watch::Sender::new(0),
        })
    }

    /// Changes whenever this process stores a verdict (to its id).
    pub fn stored_verdicts(&self) -> tokio::sync::watch::Receiver<u64> {
        self.stored.subscribe()
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The file, or the URL without its password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Records a nonce as issued; `false` if it was issued before (then it must not be used).
    pub async fn claim_nonce(&self, nonce: &[u8; 32], miner_url: &str, now_ms: u64) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO nonces (nonce, miner_url, issued_at_ms) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        )
        .bind(nonce.to_vec())
        .bind(miner_url)
        .bind(as_i64(now_ms))
        .execute(&self.pool)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    pub async fn nonce_count(&self) -> Result<u64, StoreError> {
        let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM nonces")
            .fetch_one(&self.pool)
            .await?;
        Ok(count as u64)
    }

    /// Closes every connection (SQLite: checkpoints the WAL into the file).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// A count or a time as SQL's 64-bit integer. Times in ms and counts stay far below 2^63.
pub(crate) fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A stored 64-bit integer back as the unsigned value it was written from.
pub(crate) fn as_u64(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative count or time {value}")))
}

/// `path` as an sqlx SQLite URL that creates the file when missing. Every byte that the URL
/// syntax would read as something else is percent-encoded (sqlx decodes the path).
fn sqlite_url(path: &str, access: Access) -> String {
    let mut url = String::from("sqlite://");
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || b"/._-~".contains(&byte) {
            url.push(byte as char);
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    url.push_str(match access {
        Access::ReadWrite => "?mode=rwc",
        Access::ReadOnly => "?mode=ro",
    });
    url
}

/// A URL (`postgres://user:password@host/db`, a miner's) with the password replaced and the
/// query (which may carry one too) dropped, for logs and errors. The credentials end at the
/// last `@`, so a password holding `/` or `:` unencoded is hidden whole.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<a URL that cannot be shown>".into();
    };
    let rest = rest.split_once('?').map_or(rest, |(before, _)| before);
    match rest.rsplit_once('@') {
        Some((credentials, place)) => {
            let user = credentials.split_once(':').map_or(credentials, |(user, _)| user);
            let hidden = if credentials.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{place}")
        }
        None => format!("{scheme}://{rest}"),
    }
}

/// Throwaway databases for tests and benchmarks; never in a production build.
#[cfg(any(test, feature = "test-support"))]
pub mod scratch;

#[cfg(test)]
pub(crate) mod test_support {
    use super::Store;
    use crate::verdict::class::RateSource;
    use crate::verdict::throughput::{Expectation, Throughput};
    use crate::verdict::{StoredParams, Verdict};
    use gpu_attest_shared::statement::DeviceInfo;

    /// Removes a scratch SQLite directory when dropped.
    pub struct ScratchDir(pub std::path::PathBuf);
    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// [`passing_verdict`] for nonce `[nonce; 32]`, its nonce claimed and the verdict stored in
    /// `store`: its id.
    pub async fn stored_passing_verdict(store: &Store, nonce: u8) -> u64 {
        assert!(store.claim_nonce(&[nonce; 32], "http://m", 1).await.unwrap());
        store.insert_verdict(&passing_verdict([nonce; 32])).await.unwrap()
    }

    /// A passing verdict of a small CPU challenge, for `nonce`.
    pub fn passing_verdict(nonce: [u8; 32]) -> Verdict {
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
            // The portable kernel's ceiling on one core: stored and read back like the rest.
            peak_ops_per_sec: 3.2e11,
        };
        // A version 3 verdict: its pools are in what it proves.
        let memory = crate::verdict::memory::MemoryProof {
            pool_permille: 950,
            walkers: 8,
            walk_steps: 64,
            walk_checkpoint_every: 8,
            walk_samples: 64,
            devices: vec![crate::verdict::memory::DeviceMemory {
                locality: None,
                claimed_bytes: 1 << 20,
                pool_entries: 15,
                proven_bytes: 15 << 16,
                walk: None,
            }],
            walk_bytes: 8 * 64 * 65536,
            walk_measured_ms: 20,
            walk_expected_ms: 50,
            walk_deadline_ms: 100,
            expected_walk_bytes_per_sec: 4.0e9,
            proven_walk_bytes_per_sec: Some(1.6777216e9),
            bandwidth_source: "shipped".into(),
            bandwidth_miners: 0,
            slack: 2.0,
            fill_weight: 1.25,
            host_held_at_least: None,
            proves: String::new(),
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
            throughput: Throughput::of(&params, memory.fill_work(), 1, 50, &expectation, true),
            params,
            measured_ms: 50,
            expected_ms: 100,
            deadline_ms: 300,
            finish_by_ms: 0,
            inventory: vec![DeviceInfo::default()],
            backend: "cpu".into(),
            kernel: "portable".into(),
            global_checksum: hex::encode([3u8; 32]),
            created_at_ms: 1_000,
            memory: Some(memory),
            protocol_version: 3,
            // Its device's evidence: stored and read back with the verdict (PROTOCOL.md 19.5).
            identity: Some(crate::verdict::identity::IdentityProof {
                policy: "when-offered".into(),
                devices: vec![crate::verdict::identity::DeviceIdentity {
                    index: 0,
                    status: crate::verdict::identity::IdentityStatus::NotOffered,
                    line: "not offered (CC not supported)".into(),
                    reason: None,
                    part: None,
                }],
            }),
            first_run: None,
            transcript_bytes: None,
        }
    }

    /// Where a test store is (to open it again), and its directory, removed when dropped.
    pub struct Scratch {
        pub location: std::path::PathBuf,
        _dir: Option<ScratchDir>,
    }

    /// A fresh SQLite store, and a fresh PostgreSQL one where a server is configured.
    pub async fn test_stores(tag: &str) -> Vec<(Store, Scratch)> {
        let dir = std::env::temp_dir().join(format!("gpu-attest-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("validator.db");
        let mut stores = vec![(
            Store::open(&file).await.unwrap(),
            Scratch {
                location: file,
                _dir: Some(ScratchDir(dir)),
            },
        )];
        if let Some(admin) = super::scratch::postgres_server(tag) {
            let url = std::path::PathBuf::from(super::scratch::postgres_database(&admin, tag).await);
            stores.push((
                Store::open(&url).await.unwrap(),
                Scratch {
                    location: url,
                    _dir: None,
                },
            ));
        }
        stores
    }
}
#[cfg(test)]
pub(crate) use test_support::test_stores;

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::{AnyConnection, Connection};

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
        )";

    /// A file that is not a database is named as such, at once: not after the pool's 30 s
    /// timeout, as "pool timed out".
    #[tokio::test]
    async fn a_file_that_is_not_a_database_is_refused_at_once_with_the_reason() {
        let dir = test_support::ScratchDir(
            std::env::temp_dir().join(format!("gpu-attest-store-junk-{}", std::process::id())),
        );
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join("validator.db");
        std::fs::write(&path, vec![b'x'; 8192]).unwrap();
        let started = std::time::Instant::now();
        let message = Store::open(&path).await.err().expect("junk opened").to_string();
        assert!(message.contains("not a database"), "{message}");
        assert!(started.elapsed() < PROBE_TIMEOUT, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_version_1_database_is_migrated_and_its_verdicts_read() {
        sqlx::any::install_default_drivers();
        let dir =
            test_support::ScratchDir(std::env::temp_dir().join(format!("gpu-attest-store-v1-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join("validator db #1.db"); // a name the URL must encode
        {
            let mut conn = AnyConnection::connect(&sqlite_url(&path.to_string_lossy(), Access::ReadWrite))
                .await
                .unwrap();
            conn.execute(
                "CREATE TABLE nonces (nonce BLOB PRIMARY KEY, miner_url TEXT NOT NULL, issued_at_ms INTEGER NOT NULL)",
            )
            .await
            .unwrap();
            conn.execute(VERDICTS_V1).await.unwrap();
            sqlx::query("INSERT INTO nonces VALUES ($1, 'http://m', 1)")
                .bind(vec![1u8; 32])
                .execute(&mut conn)
                .await
                .unwrap();
            let params =
                r#"{"nonce":"","seed":"","miner_key":"","n":64,"num_chains":5,"iterations":4,"checkpoint_every":2}"#;
            sqlx::query(
                "INSERT INTO verdicts (miner_url, miner_key, nonce, passed, reasons, policy, samples, params,
                     measured_ms, expected_ms, deadline_ms, inventory, backend, kernel, global_checksum, created_at_ms)
                 VALUES ('http://m', $1, $2, 1, '[]', 'sampled', 8, $3, 50, 100, 1500, '[{\"index\":0,\"name\":\"cpu\",\"uuid\":\"\",\"memory_bytes\":0,\"sm_count\":0,\"compute_capability\":[0,0],\"pci_bus_id\":\"\",\"driver_version\":\"\"}]', 'cpu', 'portable', $4, 7)",
            )
            .bind(vec![2u8; 32])
            .bind(vec![1u8; 32])
            .bind(params)
            .bind(vec![3u8; 32])
            .execute(&mut conn)
            .await
            .unwrap();
            conn.execute("PRAGMA user_version = 1").await.unwrap();
            conn.close().await.unwrap();
        }
        // A reader neither migrates it nor misreads it: it says what to do.
        let err = Store::open_for_reading(&path)
            .await
            .err()
            .expect("an old schema is refused");
        assert!(matches!(err, StoreError::SchemaBehind { found: 1, .. }), "{err}");
        assert!(err.to_string().contains("`serve` or `attest`"), "{err}");
        let store = Store::open(&path).await.unwrap();
        let all = VerdictFilter {
            limit: 10,
            ..Default::default()
        };
        let verdicts = store.verdicts(&all).await.unwrap();
        assert_eq!(verdicts.len(), 1);
        let t = verdicts[0].throughput;
        let operations = 2.0 * 64f64.powi(3) * 5.0 * 4.0;
        assert_eq!(t.operations, operations);
        // The old row has no stored rate: the expected time gives it.
        assert_eq!(t.expected_ops_per_sec, operations / 0.1);
        assert_eq!(t.proven_ops_per_sec, Some(operations / 0.05));
        // Stored before versions were, and without a memory phase: judged under version 2.
        assert_eq!(verdicts[0].protocol_version, 2);
        // And the migrated table takes new verdicts with their rate and the version they carry,
        // as carried: not told again from the memory phase (which this one has none of).
        let mut newer = verdicts[0].clone();
        newer.nonce = hex::encode([4u8; 32]);
        newer.throughput.expected_ops_per_sec = 123.0;
        newer.protocol_version = 4;
        assert!(store.claim_nonce(&[4; 32], "http://m", 2).await.unwrap());
        store.insert_verdict(&newer).await.unwrap();
        let back = store.verdicts(&VerdictFilter { limit: 1, ..all }).await.unwrap();
        assert_eq!(back[0].throughput.expected_ops_per_sec, 123.0);
        assert_eq!(back[0].protocol_version, 4);
        store.close().await;
        // Opened again, it is at the current version and stays readable, leases and all.
        let again = Store::open(&path).await.unwrap();
        assert!(again.take_lease("http://m", "v1", 10, 100).await.unwrap().is_ok());
        let (version,): (i64,) = sqlx::query_as("PRAGMA user_version")
            .fetch_one(&again.pool)
            .await
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    /// What `validator verdicts` and `rates` open: it reads beside a serving validator and
    /// writes nothing, so a file the operator may only read will do.
    #[tokio::test]
    async fn a_store_opened_for_reading_reads_beside_the_writer_and_writes_nothing() {
        for (writer, scratch) in test_stores("reading").await {
            assert!(writer.claim_nonce(&[1; 32], "http://m", 1).await.unwrap());
            writer
                .record_verdict(&test_support::passing_verdict([1; 32]), &[])
                .await
                .unwrap();
            let reader = Store::open_for_reading(&scratch.location).await.unwrap();
            let all = VerdictFilter {
                limit: 10,
                ..Default::default()
            };
            let read = reader.verdicts(&all).await.unwrap();
            assert_eq!(read.len(), 1, "{:?}", writer.dialect());
            assert_eq!(read[0].nonce, hex::encode([1u8; 32]));
            let refused = reader
                .claim_nonce(&[2; 32], "http://m", 2)
                .await
                .expect_err("a reader must not write");
            assert!(refused.is_unwritable(), "{:?}: {refused}", writer.dialect());
            // The writer goes on, and the reader sees what it writes next.
            assert!(writer.claim_nonce(&[2; 32], "http://m", 3).await.unwrap());
            assert_eq!(reader.nonce_count().await.unwrap(), 2);
            reader.close().await;
            writer.close().await;
        }
    }

    /// A database the validator cannot open for writing (here a directory that does not exist,
    /// which even root cannot write into) names the directory and what the validator needs.
    #[tokio::test]
    async fn a_database_that_cannot_be_written_says_what_the_validator_needs() {
        let path = std::env::temp_dir().join(format!("gpu-attest-no-such-dir-{}/v.db", std::process::id()));
        let err = Store::open(&path).await.err().expect("no directory to create it in");
        assert!(matches!(err, StoreError::NotWritable { .. }), "{err}");
        let message = err.to_string();
        let directory = path.parent().unwrap().display().to_string();
        assert!(
            message.contains(&format!("directory {directory} must exist")),
            "{message}"
        );
        assert!(message.contains("-wal"), "{message}");
    }

    #[tokio::test]
    async fn a_missing_file_is_not_created_by_a_reader() {
        let dir = test_support::ScratchDir(
            std::env::temp_dir().join(format!("gpu-attest-store-absent-{}", std::process::id())),
        );
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join("none.db");
        let err = Store::open_for_reading(&path).await.err().expect("nothing to read");
        assert!(matches!(err, StoreError::Open { .. }), "{err}");
        assert!(!path.exists(), "a reader created {}", path.display());
    }

    #[tokio::test]
    async fn a_database_from_a_newer_validator_is_refused() {
        for (store, scratch) in test_stores("newer").await {
            let bump = match store.dialect() {
                Dialect::Sqlite => format!("PRAGMA user_version = {}", SCHEMA_VERSION + 1),
                Dialect::Postgres => format!("UPDATE schema_version SET version = {}", SCHEMA_VERSION + 1),
            };
            sqlx::raw_sql(AssertSqlSafe(bump)).execute(&store.pool).await.unwrap();
            store.close().await;
            let err = Store::open(&scratch.location)
                .await
                .err()
                .expect("a newer schema is refused");
            assert!(
                matches!(err, StoreError::SchemaVersion { found, .. } if found == SCHEMA_VERSION + 1),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn leases_give_each_miner_to_one_validator_at_a_time_and_expire() {
        for (store, _scratch) in test_stores("leases").await {
            let url = "http://miner:7070";
            let a = store.take_lease(url, "validator-a", 1_000, 100).await.unwrap().unwrap();
            // Held: another validator is told when to look again, and cannot renew or release it.
            assert_eq!(
                store.take_lease(url, "validator-b", 1_050, 100).await.unwrap(),
                Err(LeaseRefusal { retry_at_ms: 1_100 })
            );
            assert!(store.renew_lease(&a, 1_090, 100).await.unwrap());
            assert!(
                store.take_lease(url, "validator-b", 1_150, 100).await.unwrap().is_err(),
                "renewed to 1190"
            );
            let b_view = Lease {
                miner_url: url.into(),
                holder: "validator-b".into(),
            };
            assert!(!store.renew_lease(&b_view, 1_150, 100).await.unwrap());
            // Released with the next due time: nobody takes it before then.
            store.release_lease(&a, 5_000).await.unwrap();
            assert_eq!(
                store.take_lease(url, "validator-b", 1_200, 100).await.unwrap(),
                Err(LeaseRefusal { retry_at_ms: 5_000 })
            );
            let b = store.take_lease(url, "validator-b", 5_000, 100).await.unwrap().unwrap();
            // A holder that dies stops renewing: the lease runs out and the miner is taken again.
            assert!(store.take_lease(url, "validator-a", 5_099, 100).await.unwrap().is_err());
            let a_again = store.take_lease(url, "validator-a", 5_100, 100).await.unwrap().unwrap();
            assert!(!store.renew_lease(&b, 5_101, 100).await.unwrap(), "b lost it");
            assert_eq!(a_again.holder, "validator-a");
        }
    }

    #[tokio::test]
    async fn a_stopping_validator_gives_back_its_own_leases_only() {
        for (store, _scratch) in test_stores("lease-stop").await {
            store
                .take_lease("http://m1", "stopping", 1_000, 60_000)
                .await
                .unwrap()
                .unwrap();
            store
                .take_lease("http://m2", "stopping", 1_000, 60_000)
                .await
                .unwrap()
                .unwrap();
            store
                .take_lease("http://m3", "other", 1_000, 60_000)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(store.release_leases_of("stopping", 2_000).await.unwrap(), 2);
            for url in ["http://m1", "http://m2"] {
                assert!(
                    store.take_lease(url, "restarted", 2_000, 60_000).await.unwrap().is_ok(),
                    "{url}"
                );
            }
            assert!(
                store
                    .take_lease("http://m3", "restarted", 2_000, 60_000)
                    .await
                    .unwrap()
                    .is_err()
            );
        }
    }

    #[tokio::test]
    async fn of_many_validators_taking_one_lease_at_once_exactly_one_gets_it() {
        for (store, _scratch) in test_stores("lease-race").await {
            let store = std::sync::Arc::new(store);
            let mut takers = tokio::task::JoinSet::new();
            for i in 0..16 {
                let store = store.clone();
                takers.spawn(async move { store.take_lease("http://m", &format!("v{i}"), 1_000, 60_000).await });
            }
            let mut won = 0;
            while let Some(taken) = takers.join_next().await {
                won += usize::from(taken.unwrap().unwrap().is_ok());
            }
            assert_eq!(won, 1);
        }
    }

    #[test]
    fn urls_are_shown_without_passwords_and_paths_encoded() {
        assert_eq!(
            redact_url("postgres://gpu:s3cret@db.internal:5432/attest?sslmode=require&password=x"),
            "postgres://gpu:***@db.internal:5432/attest"
        );
        assert_eq!(redact_url("postgres://db/attest"), "postgres://db/attest");
        assert_eq!(
            redact_url("postgres://u:ab/c@d:e@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert!(is_postgres(Path::new("PostgreSQL://u:pw@h/db")));
        assert_eq!(
            sqlite_url("/var/lib/a b#?.db", Access::ReadWrite),
            "sqlite:///var/lib/a%20b%23%3F.db?mode=rwc"
        );
        assert_eq!(sqlite_url("/v.db", Access::ReadOnly), "sqlite:///v.db?mode=ro");
    }
}
