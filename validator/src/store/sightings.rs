//! Certified parts seen in passing verdicts (PROTOCOL.md 19.4, step 4): one genuine GPU answers
//! for one miner key at a time, so a part rented out to many miners shows as the same device id
//! under several keys.

use super::{Store, StoreError, as_i64, as_u64};
use sqlx::Row;

/// Where a part was last seen under another key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub miner_key: [u8; 32],
    pub verdict_id: u64,
    pub seen_at_ms: u64,
}

impl Store {
    /// The newest sighting since `since_ms` of the part `chip`/`device_id` (compared without
    /// regard to ASCII case) under a miner key other than `miner_key`.
    pub async fn part_seen_elsewhere(
        &self,
        chip: &str,
        device_id: &str,
        miner_key: &[u8; 32],
        since_ms: u64,
    ) -> Result<Option<Sighting>, StoreError> {
        let row = sqlx::query(
            "SELECT miner_key, verdict_id, seen_at_ms FROM part_sightings
             WHERE chip = $1 AND device_id = $2 AND miner_key <> $3 AND seen_at_ms >= $4
             ORDER BY seen_at_ms DESC LIMIT 1",
        )
        .bind(chip.to_ascii_uppercase())
        .bind(device_id.to_ascii_uppercase())
        .bind(miner_key.to_vec())
        .bind(as_i64(since_ms))
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let key: Vec<u8> = row.try_get(0)?;
        Ok(Some(Sighting {
            miner_key: key
                .try_into()
                .map_err(|_| StoreError::Corrupt("part_sightings.miner_key is not 32 bytes".into()))?,
            verdict_id: as_u64(row.try_get(1)?)?,
            seen_at_ms: as_u64(row.try_get(2)?)?,
        }))
    }
}

/// Inserts the sightings of a stored verdict, inside its transaction.
pub(super) async fn record(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    parts: &[(String, String)],
    miner_key: &[u8],
    verdict_id: i64,
    seen_at_ms: u64,
) -> Result<(), StoreError> {
    for (chip, device_id) in parts {
        sqlx::query(
            "INSERT INTO part_sightings (chip, device_id, miner_key, verdict_id, seen_at_ms)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(chip.to_ascii_uppercase())
        .bind(device_id.to_ascii_uppercase())
        .bind(miner_key.to_vec())
        .bind(verdict_id)
        .bind(as_i64(seen_at_ms))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
