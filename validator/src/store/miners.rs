//! Registered miners and revoked keys.

use super::{Store, StoreError, as_i64, as_u64};
use gpu_attest_shared::keys::PublicKey;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MinerRecord {
    pub url: String,
    pub name: String,
    pub miner_key: PublicKey,
    pub registered_at_ms: u64,
}

/// Where a registered miner stands, as the database tells it: its latest verdict, its latest
/// pass, when the scheduler attests it next, and whether its key is revoked. Times are Unix ms;
/// 0 where there is none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MinerStanding {
    pub last_verdict_id: u64,
    pub last_verdict_passed: bool,
    pub last_verdict_at_ms: u64,
    pub last_pass_at_ms: u64,
    pub next_due_ms: u64,
    pub revoked: bool,
}

/// A miner key that is never challenged or registered again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokedKey {
    pub miner_key: PublicKey,
    pub reason: String,
    pub revoked_at_ms: u64,
}

fn key_from(bytes: &[u8]) -> Result<PublicKey, StoreError> {
    PublicKey::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl Store {
    /// Registers a miner at `url` bound to `key`, named `name` (a new miner without one is named
    /// by its URL). Re-registering with the same key renames it if a name is given and keeps
    /// its name otherwise; a different key is refused unless `replace_key` (the operator's
    /// explicit action). A revoked key is refused always, and so is a key registered at
    /// another URL.
    pub async fn register_miner(
        &self,
        url: &str,
        name: Option<&str>,
        key: PublicKey,
        replace_key: bool,
        now_ms: u64,
    ) -> Result<MinerRecord, StoreError> {
        self.check_not_revoked(&key).await?;
        let mut tx = self.pool.begin().await?;
        if self.dialect() == super::Dialect::Postgres {
            // Two validators of a fleet registering one key at two URLs at once would each see
            // no other registration under READ COMMITTED; registrations take turns instead (a
            // rare act; attestations only read the table and are not held up). SQLite has one
            // writer at a time anyway.
            sqlx::query("LOCK TABLE miners IN SHARE ROW EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await?;
        }
        // One key is one miner: a second URL for it would be a relay (its verdicts credited to
        // whoever registered that URL) or the same miner attested twice at once.
        let elsewhere: Option<(String, String)> =
            sqlx::query_as("SELECT url, name FROM miners WHERE miner_key = $1 AND url <> $2 LIMIT 1")
                .bind(key.0.to_vec())
                .bind(url)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((registered_url, registered_name)) = elsewhere {
            return Err(StoreError::KeyRegisteredElsewhere {
                key,
                url: registered_url,
                name: registered_name,
            });
        }
        let existing: Option<(Vec<u8>, String)> = sqlx::query_as("SELECT miner_key, name FROM miners WHERE url = $1")
            .bind(url)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some((existing, registered_name)) = existing {
            let registered = key_from(&existing)?;
            if registered != key && !replace_key {
                return Err(StoreError::KeyChanged {
                    url: url.into(),
                    registered,
                    presented: key,
                });
            }
            sqlx::query("UPDATE miners SET name = $2, miner_key = $3 WHERE url = $1")
                .bind(url)
                .bind(name.unwrap_or(&registered_name))
                .bind(key.0.to_vec())
                .execute(&mut *tx)
                .await?;
        } else {
            sqlx::query("INSERT INTO miners (url, name, miner_key, registered_at_ms) VALUES ($1, $2, $3, $4)")
                .bind(url)
                .bind(name.unwrap_or(url))
                .bind(key.0.to_vec())
                .bind(as_i64(now_ms))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.miner(url)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("miner {url} vanished after registration")))
    }

    /// The miner registered at `url`: one indexed lookup (it runs twice per attestation).
    pub async fn miner(&self, url: &str) -> Result<Option<MinerRecord>, StoreError> {
        Ok(self.select_miners(Some(url)).await?.pop())
    }

    pub async fn miners(&self) -> Result<Vec<MinerRecord>, StoreError> {
        self.select_miners(None).await
    }

    /// Every registered miner with where it stands, in URL order. One statement: each figure is
    /// an indexed lookup (verdicts by miner and id, leases and revoked keys by key).
    pub async fn miner_standings(&self) -> Result<Vec<(MinerRecord, MinerStanding)>, StoreError> {
        type Row = (String, String, Vec<u8>, i64, i64, i64, i64, i64, i64, i64);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT m.url, m.name, m.miner_key, m.registered_at_ms, \
                COALESCE((SELECT v.id FROM verdicts v WHERE v.miner_url = m.url ORDER BY v.id DESC LIMIT 1), 0), \
                COALESCE((SELECT v.passed FROM verdicts v WHERE v.miner_url = m.url ORDER BY v.id DESC LIMIT 1), 0), \
                COALESCE((SELECT v.created_at_ms FROM verdicts v WHERE v.miner_url = m.url ORDER BY v.id DESC LIMIT 1), 0), \
                COALESCE((SELECT v.created_at_ms FROM verdicts v WHERE v.miner_url = m.url AND v.passed = 1 \
                    ORDER BY v.id DESC LIMIT 1), 0), \
                COALESCE((SELECT l.next_due_ms FROM leases l WHERE l.miner_url = m.url), 0), \
                (SELECT COUNT(*) FROM revoked_keys r WHERE r.miner_key = m.miner_key) \
             FROM miners m ORDER BY m.url",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(url, name, key, at, id, passed, verdict_at, pass_at, due, revoked)| {
                Ok((
                    MinerRecord {
                        url,
                        name,
                        miner_key: key_from(&key)?,
                        registered_at_ms: as_u64(at)?,
                    },
                    MinerStanding {
                        last_verdict_id: as_u64(id)?,
                        last_verdict_passed: passed == 1,
                        last_verdict_at_ms: as_u64(verdict_at)?,
                        last_pass_at_ms: as_u64(pass_at)?,
                        next_due_ms: as_u64(due)?,
                        revoked: revoked > 0,
                    },
                ))
            })
            .collect()
    }

    /// Every registered miner, or only the one at `url`.
    async fn select_miners(&self, url: Option<&str>) -> Result<Vec<MinerRecord>, StoreError> {
        let rows: Vec<(String, String, Vec<u8>, i64)> = match url {
            Some(url) => {
                sqlx::query_as("SELECT url, name, miner_key, registered_at_ms FROM miners WHERE url = $1")
                    .bind(url)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                sqlx::query_as("SELECT url, name, miner_key, registered_at_ms FROM miners ORDER BY url")
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.into_iter()
            .map(|(url, name, key, at)| {
                Ok(MinerRecord {
                    url,
                    name,
                    miner_key: key_from(&key)?,
                    registered_at_ms: as_u64(at)?,
                })
            })
            .collect()
    }

    /// Revokes `key` for good; `false` if it already was.
    pub async fn revoke_key(&self, key: &PublicKey, reason: &str, now_ms: u64) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO revoked_keys (miner_key, reason, revoked_at_ms) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        )
        .bind(key.0.to_vec())
        .bind(reason)
        .bind(as_i64(now_ms))
        .execute(&self.pool)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    /// Every revoked key, newest revocation first.
    pub async fn revoked_keys(&self) -> Result<Vec<RevokedKey>, StoreError> {
        let rows: Vec<(Vec<u8>, String, i64)> = sqlx::query_as(
            "SELECT miner_key, reason, revoked_at_ms FROM revoked_keys ORDER BY revoked_at_ms DESC, miner_key",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(key, reason, at)| {
                Ok(RevokedKey {
                    miner_key: key_from(&key)?,
                    reason,
                    revoked_at_ms: as_u64(at)?,
                })
            })
            .collect()
    }

    pub async fn check_not_revoked(&self, key: &PublicKey) -> Result<(), StoreError> {
        let reason: Option<(String,)> = sqlx::query_as("SELECT reason FROM revoked_keys WHERE miner_key = $1")
            .bind(key.0.to_vec())
            .fetch_optional(&self.pool)
            .await?;
        match reason {
            Some((reason,)) => Err(StoreError::Revoked(*key, reason)),
            None => Ok(()),
        }
    }

    /// Removes the miner and its lease (so that registering it again starts afresh).
    pub async fn remove_miner(&self, url: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let removed = sqlx::query("DELETE FROM miners WHERE url = $1")
            .bind(url)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM leases WHERE miner_url = $1")
            .bind(url)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(removed.rows_affected() == 1)
    }
}
