//! Throwaway databases for tests and benchmarks: a fresh database on the PostgreSQL server that
//! [`POSTGRES_ENV`] names, so that the same tests run on both stores
//! where a server is at hand and on SQLite alone elsewhere.
//! Compiled only for tests and with the `test-support` feature (the integration tests and
//! benchmarks turn it on), so that no production build carries it.

use sqlx::{AnyConnection, Connection, Executor};

/// An admin URL (`postgres://user@host:port/postgres`) of a server the tests may create
/// databases on. `.ci/run` starts a throwaway cluster and sets it.
pub const POSTGRES_ENV: &str = "GPU_ATTEST_TEST_POSTGRES";

/// The server's admin URL, or `None` after saying in one line that PostgreSQL is skipped.
pub fn postgres_server(test: &str) -> Option<String> {
    match std::env::var(POSTGRES_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            gpu_attest_shared::prerequisite::skip(
                &format!("{test} on PostgreSQL"),
                &format!("{POSTGRES_ENV} is not set (scripts/test-postgres.sh starts a server)"),
            );
            None
        }
    }
}

/// A new, empty database on the server at `admin_url`; its URL. Panics when the server
/// cannot be reached: a test told to use it must not pass without it.
pub async fn postgres_database(admin_url: &str, tag: &str) -> String {
    sqlx::any::install_default_drivers();
    let mut random = [0u8; 6];
    getrandom::fill(&mut random).expect("randomness for a database name");
    let name = format!(
        "gpu_attest_{}_{}",
        tag.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
        hex::encode(random)
    );
    let mut admin = AnyConnection::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV}={admin_url}: cannot connect: {e}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .unwrap_or_else(|e| panic!("cannot create database {name}: {e}"));
    let _ = admin.close().await;
    let (base, _) = admin_url.rsplit_once('/').expect("an admin URL names a database");
    let query = admin_url
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    format!("{base}/{name}{query}")
}
