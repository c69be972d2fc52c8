//! Registered miners and revoked keys.

use super::{Store, StoreError};
use gpu_attest_shared::identity::PublicKey;
use rusqlite::{OptionalExtension, params};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MinerRecord {
    pub url: String,
    pub name: String,
    pub miner_key: PublicKey,
    pub registered_at_ms: u64,
}

impl Store {
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

    /// The miner registered at `url`: one indexed lookup (it runs twice per attestation).
    pub fn miner(&self, url: &str) -> Result<Option<MinerRecord>, StoreError> {
        Ok(self.select_miners(Some(url))?.pop())
    }

    pub fn miners(&self) -> Result<Vec<MinerRecord>, StoreError> {
        self.select_miners(None)
    }

    /// Every registered miner, or only the one at `url`.
    fn select_miners(&self, url: Option<&str>) -> Result<Vec<MinerRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT url, name, miner_key, registered_at_ms FROM miners WHERE (?1 IS NULL OR url = ?1) ORDER BY url",
        )?;
        let rows = stmt.query_map([url], |r| {
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
