//! The tables, written once with the few type names that differ between SQLite and PostgreSQL
//! left as placeholders, and the migrations that bring an older database up to date.
//!
//! Versions: 1 the first; 2 verdicts keep the rate the planner expected; 3 verdicts keep where
//! that rate came from and the slack, passing verdicts leave rate observations, imported
//! (shared) rates; 4 leases; 5 verdicts keep what the memory phase proved, and passing ones
//! leave walk bandwidth observations (a table of their own: one observation of each kind per
//! verdict); 6 verdicts keep what device evidence showed (PROTOCOL.md 19.5), and passing ones
//! record the certified parts they saw (`part_sightings`); 7 verdicts keep their challenge's
//! finish-by time (PROTOCOL.md 14.3), which says whether a late one proved its rate, and the
//! first run a retest replaced (14.7); 8 verdicts keep the claimed devices' peak, which says what
//! share of it the proven rate is; 9 verdicts keep the protocol version the planner chose to judge
//! them under (PROTOCOL.md 16.1), rather than leaving it to be told from the memory proof; 10
//! the verdicts' kept transcripts (PROTOCOL.md 21), a table of their own; 11 a transcript's bytes
//! in parts of at most 64 MiB (`transcript_parts`), since SQLite and PostgreSQL store no value
//! over 1 GB and a host of many GPUs writes transcripts of several (a version 10 row keeps its
//! bytes where they are, and reads as before). SQLite keeps the
//! version in `PRAGMA user_version` (as it always has), PostgreSQL in the one-row table
//! `schema_version`.

use super::{Dialect, Store, StoreError};
// Every statement run with AssertSqlSafe is built here from constants, never from input.
use sqlx::{AssertSqlSafe, Executor};

pub const SCHEMA_VERSION: i64 = 11;

/// `{id}`: an auto-assigned 64-bit key; `{int}`, `{real}`, `{blob}`: 64-bit integer, double,
/// bytes. Booleans are integers 0/1 in both, so that both read them the same way.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS miners (
    url              TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    miner_key        {blob} NOT NULL CHECK (length(miner_key) = 32),
    registered_at_ms {int} NOT NULL
);
CREATE TABLE IF NOT EXISTS nonces (
    nonce        {blob} PRIMARY KEY CHECK (length(nonce) = 32),
    miner_url    TEXT NOT NULL,
    issued_at_ms {int} NOT NULL
);
CREATE TABLE IF NOT EXISTS verdicts (
    id              {id},
    miner_url       TEXT NOT NULL,
    miner_key       {blob} NOT NULL,
    nonce           {blob} NOT NULL UNIQUE REFERENCES nonces(nonce),
    passed          {int} NOT NULL CHECK (passed IN (0, 1)),
    reasons         TEXT NOT NULL,
    policy          TEXT NOT NULL,
    samples         {int} NOT NULL,
    params          TEXT NOT NULL,
    measured_ms     {int} NOT NULL,
    expected_ms     {int} NOT NULL,
    deadline_ms     {int} NOT NULL,
    inventory       TEXT NOT NULL,
    backend         TEXT NOT NULL,
    kernel          TEXT NOT NULL,
    global_checksum {blob} NOT NULL,
    created_at_ms   {int} NOT NULL,
    expected_ops_per_sec {real} NOT NULL DEFAULT 0,
    rate_source     TEXT NOT NULL DEFAULT '',
    rate_miners     {int} NOT NULL DEFAULT 0,
    slack           {real} NOT NULL DEFAULT 0,
    memory          TEXT NOT NULL DEFAULT '',
    identity        TEXT NOT NULL DEFAULT '',
    finish_by_ms    {int} NOT NULL DEFAULT 0,
    first_run       TEXT NOT NULL DEFAULT '',
    peak_ops_per_sec {real} NOT NULL DEFAULT 0,
    protocol_version {int} NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS verdicts_by_miner ON verdicts (miner_url, id);
CREATE TABLE IF NOT EXISTS part_sightings (
    chip        TEXT NOT NULL,
    device_id   TEXT NOT NULL,
    miner_key   {blob} NOT NULL CHECK (length(miner_key) = 32),
    verdict_id  {int} NOT NULL,
    seen_at_ms  {int} NOT NULL
);
CREATE INDEX IF NOT EXISTS part_sightings_by_part ON part_sightings (chip, device_id, seen_at_ms);
CREATE TABLE IF NOT EXISTS shared_rates (
    backend        TEXT NOT NULL,
    kernel         TEXT NOT NULL,
    model          TEXT NOT NULL,
    n              {int} NOT NULL,
    ops_per_unit   {real} NOT NULL CHECK (ops_per_unit > 0),
    miners         {int} NOT NULL,
    observations   {int} NOT NULL,
    imported_at_ms {int} NOT NULL,
    PRIMARY KEY (backend, kernel, model, n)
);
CREATE TABLE IF NOT EXISTS revoked_keys (
    miner_key     {blob} PRIMARY KEY CHECK (length(miner_key) = 32),
    reason        TEXT NOT NULL,
    revoked_at_ms {int} NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    miner_url     TEXT PRIMARY KEY,
    holder        TEXT NOT NULL,
    expires_at_ms {int} NOT NULL,
    next_due_ms   {int} NOT NULL
);
CREATE TABLE IF NOT EXISTS transcripts (
    verdict_id  {int} PRIMARY KEY REFERENCES verdicts(id),
    bytes       {blob} NOT NULL,
    size        {int} NOT NULL,
    kept_at_ms  {int} NOT NULL
);
CREATE TABLE IF NOT EXISTS transcript_parts (
    verdict_id  {int} NOT NULL REFERENCES transcripts(verdict_id) ON DELETE CASCADE,
    part        {int} NOT NULL,
    bytes       {blob} NOT NULL,
    PRIMARY KEY (verdict_id, part)
)";

/// What passing verdicts proved, per class: one table for compute rates and one, alike, for walk
/// bandwidths (PROTOCOL.md 18.6), since a verdict leaves at most one observation of each kind.
/// `{table}` and `{index}` are their names; created after `verdicts`, which they refer to.
const OBSERVATIONS: &str = "
CREATE TABLE IF NOT EXISTS {table} (
    id            {id},
    backend       TEXT NOT NULL,
    kernel        TEXT NOT NULL,
    model         TEXT NOT NULL,
    n             {int} NOT NULL,
    miner_key     {blob} NOT NULL CHECK (length(miner_key) = 32),
    ops_per_unit  {real} NOT NULL CHECK (ops_per_unit > 0),
    verdict_id    {int} NOT NULL UNIQUE REFERENCES verdicts(id),
    created_at_ms {int} NOT NULL
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (backend, kernel, model, n, id)";

/// The observation tables and their indexes, by name.
const OBSERVATION_TABLES: [(&str, &str); 2] = [
    ("rate_observations", "observations_by_class"),
    ("walk_observations", "walk_observations_by_class"),
];

/// The schema in `dialect`'s type names, one statement each.
fn statements(dialect: Dialect) -> Vec<String> {
    let (id, int, real, blob) = match dialect {
        Dialect::Sqlite => ("INTEGER PRIMARY KEY AUTOINCREMENT", "INTEGER", "REAL", "BLOB"),
        Dialect::Postgres => (
            "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            "BIGINT",
            "DOUBLE PRECISION",
            "BYTEA",
        ),
    };
    let observations = OBSERVATION_TABLES
        .iter()
        .map(|(table, index)| OBSERVATIONS.replace("{table}", table).replace("{index}", index));
    std::iter::once(SCHEMA.to_string())
        .chain(observations)
        .collect::<Vec<_>>()
        .join(";")
        .split(';')
        .map(|s| {
            s.replace("{id}", id)
                .replace("{int}", int)
                .replace("{real}", real)
                .replace("{blob}", blob)
        })
        .filter(|s| !s.trim().is_empty())
        .collect()
}

/// Columns added to `verdicts` after version 1, by the version that added them. A fresh table
/// has them from SCHEMA; an older SQLite file gets them here. (PostgreSQL stores start at 4:
/// they get what came after from [`POSTGRES_ADDED_COLUMNS`].)
const SQLITE_ADDED_COLUMNS: [(i64, &[&str]); 7] = [
    // Rows from before keep 0: their expected rate is derived from expected_ms on read.
    (
        2,
        &["ALTER TABLE verdicts ADD COLUMN expected_ops_per_sec REAL NOT NULL DEFAULT 0"],
    ),
    // Rows from before read as 'unrecorded'.
    (
        3,
        &[
            "ALTER TABLE verdicts ADD COLUMN rate_source TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE verdicts ADD COLUMN rate_miners INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE verdicts ADD COLUMN slack REAL NOT NULL DEFAULT 0",
        ],
    ),
    // Rows from before read as no memory phase.
    (5, &["ALTER TABLE verdicts ADD COLUMN memory TEXT NOT NULL DEFAULT ''"]),
    // Rows from before read as identity not checked.
    (
        6,
        &["ALTER TABLE verdicts ADD COLUMN identity TEXT NOT NULL DEFAULT ''"],
    ),
    // Rows from before read as challenges without a finish-by time (none is a graded miss),
    // and as first runs.
    (
        7,
        &[
            "ALTER TABLE verdicts ADD COLUMN finish_by_ms INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE verdicts ADD COLUMN first_run TEXT NOT NULL DEFAULT ''",
        ],
    ),
    // Rows from before read as the peak not recorded: no share of it is stated.
    (
        8,
        &["ALTER TABLE verdicts ADD COLUMN peak_ops_per_sec REAL NOT NULL DEFAULT 0"],
    ),
    // Rows from before read 0: their version is told from their memory proof (`judged_under`).
    (
        9,
        &["ALTER TABLE verdicts ADD COLUMN protocol_version INTEGER NOT NULL DEFAULT 0"],
    ),
];

/// Columns added to `verdicts` after a PostgreSQL store's first version (4), each idempotent:
/// the migration runs them all in its one transaction.
const POSTGRES_ADDED_COLUMNS: [&str; 6] = [
    "ALTER TABLE verdicts ADD COLUMN IF NOT EXISTS memory TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE verdicts ADD COLUMN IF NOT EXISTS identity TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE verdicts ADD COLUMN IF NOT EXISTS finish_by_ms BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE verdicts ADD COLUMN IF NOT EXISTS first_run TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE verdicts ADD COLUMN IF NOT EXISTS peak_ops_per_sec DOUBLE PRECISION NOT NULL DEFAULT 0",
    "ALTER TABLE verdicts ADD COLUMN IF NOT EXISTS protocol_version BIGINT NOT NULL DEFAULT 0",
];

/// Arbitrary, fixed: the advisory lock validators sharing a PostgreSQL database take while one
/// of them creates or migrates the schema, so that two starting at once do not race.
const MIGRATION_LOCK: i64 = 0x6770_7561_7474_6573;

/// How long a validator waits for another's migration before it gives up with an error.
const MIGRATION_WAIT_SECS: u64 = 60;

pub(super) async fn migrate(store: &Store) -> Result<(), StoreError> {
    match store.dialect {
        Dialect::Sqlite => migrate_sqlite(store).await,
        Dialect::Postgres => migrate_postgres(store).await,
    }
}

/// Migrating is the first write: a SQLite file that may not be written fails here.
fn opening_failed(store: &Store) -> impl Fn(sqlx::Error) -> StoreError + '_ {
    move |source| match store.dialect {
        Dialect::Sqlite => super::opening_to_write_failed(&store.location, source),
        Dialect::Postgres => StoreError::Open {
            location: store.location.clone(),
            source,
        },
    }
}

/// SQLite: the tables, then each column step past the file's `user_version`.
async fn migrate_sqlite(store: &Store) -> Result<(), StoreError> {
    let open_err = opening_failed(store);
    // One connection throughout: PRAGMAs belong to a connection.
    let mut conn = store.pool.acquire().await.map_err(&open_err)?;
    let (version,): (i64,) = sqlx::query_as("PRAGMA user_version")
        .fetch_one(&mut *conn)
        .await
        .map_err(&open_err)?;
    check_version(store, version)?;
    for statement in statements(Dialect::Sqlite) {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
            .map_err(&open_err)?;
    }
    // Each step records its version in its own transaction, so a crash between steps leaves a
    // database that the next open carries on from, never one that repeats one.
    let due = SQLITE_ADDED_COLUMNS
        .iter()
        .filter(|(to, _)| version >= 1 && version < *to);
    for (to, step) in due {
        conn.execute("BEGIN").await.map_err(&open_err)?;
        for statement in *step {
            conn.execute(*statement).await.map_err(&open_err)?;
        }
        sqlx::raw_sql(AssertSqlSafe(format!("PRAGMA user_version = {to}")))
            .execute(&mut *conn)
            .await
            .map_err(&open_err)?;
        conn.execute("COMMIT").await.map_err(&open_err)?;
    }
    sqlx::raw_sql(AssertSqlSafe(format!("PRAGMA user_version = {SCHEMA_VERSION}")))
        .execute(&mut *conn)
        .await
        .map_err(&open_err)?;
    Ok(())
}

/// PostgreSQL: one transaction holding a transaction-level advisory lock, so that validators
/// starting together migrate one at a time, PostgreSQL's DDL commits or rolls back whole, and
/// the lock goes with the transaction whatever happens (a session lock could stay with a pooled
/// connection). A validator waits at most `MIGRATION_WAIT_SECS` for it.
async fn migrate_postgres(store: &Store) -> Result<(), StoreError> {
    let open_err = opening_failed(store);
    let mut tx = store.pool.begin().await.map_err(&open_err)?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SET LOCAL lock_timeout = '{}s'",
        MIGRATION_WAIT_SECS
    )))
    .execute(&mut *tx)
    .await
    .map_err(&open_err)?;
    // Wrapped in a count: the lock function returns `void`, a type rows cannot carry here.
    sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_xact_lock($1)) AS locked")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(&open_err)?;
    tx.execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        .await
        .map_err(&open_err)?;
    let found: Option<(i64,)> = sqlx::query_as("SELECT version FROM schema_version")
        .fetch_optional(&mut *tx)
        .await
        .map_err(&open_err)?;
    let found = found.map(|(v,)| v);
    check_version(store, found.unwrap_or(0))?;
    for statement in statements(Dialect::Postgres) {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await
            .map_err(&open_err)?;
    }
    for statement in POSTGRES_ADDED_COLUMNS {
        tx.execute(statement).await.map_err(&open_err)?;
    }
    let query = if found.is_some() {
        "UPDATE schema_version SET version = $1"
    } else {
        "INSERT INTO schema_version (version) VALUES ($1)"
    };
    sqlx::query(query)
        .bind(SCHEMA_VERSION)
        .execute(&mut *tx)
        .await
        .map_err(&open_err)?;
    tx.commit().await.map_err(&open_err)?;
    Ok(())
}

/// For a store opened only to read: its schema must be this validator's exactly, since the
/// reader neither migrates it nor knows a newer one's columns.
pub(super) async fn check_current(store: &Store) -> Result<(), StoreError> {
    let open_err = |source| StoreError::Open {
        location: store.location.clone(),
        source,
    };
    let found = match store.dialect {
        Dialect::Sqlite => {
            let (version,): (i64,) = sqlx::query_as("PRAGMA user_version")
                .fetch_one(&store.pool)
                .await
                .map_err(open_err)?;
            version
        }
        Dialect::Postgres => {
            let (tables,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = 'schema_version'",
            )
            .fetch_one(&store.pool)
            .await
            .map_err(open_err)?;
            if tables == 0 {
                0
            } else {
                let found: Option<(i64,)> = sqlx::query_as("SELECT version FROM schema_version")
                    .fetch_optional(&store.pool)
                    .await
                    .map_err(open_err)?;
                found.map_or(0, |(v,)| v)
            }
        }
    };
    check_version(store, found)?;
    if found < SCHEMA_VERSION {
        return Err(StoreError::SchemaBehind {
            location: store.location.clone(),
            found,
        });
    }
    Ok(())
}

fn check_version(store: &Store, found: i64) -> Result<(), StoreError> {
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaVersion {
            location: store.location.clone(),
            found,
        });
    }
    Ok(())
}
