//! Leases: how validators sharing one database split the registered miners between them.
//!
//! Before a validator attests a miner on its schedule, it takes the miner's lease: a row naming
//! it as the holder until a time. Taking succeeds only where nobody holds a live lease and the
//! miner is due (the last holder said when, on release), so no miner is attested by two
//! validators at once or twice in one interval. The holder renews its lease while the
//! attestation runs; a validator that dies stops renewing, its lease runs out, and whoever
//! finds the miner due next takes it. Every step is one conditional statement, atomic in either
//! store.

use super::{Store, StoreError, as_i64, as_u64};

/// A lease this validator holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub miner_url: String,
    pub holder: String,
}

/// Why a lease was not taken: another validator holds the miner, or it was attested recently.
/// Either way, when to look again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRefusal {
    pub retry_at_ms: u64,
}

impl Store {
    /// Takes the lease on `miner_url` for `holder` until `now_ms + ttl_ms`, if nobody holds a
    /// live one and the miner is due.
    pub async fn take_lease(
        &self,
        miner_url: &str,
        holder: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Result<Lease, LeaseRefusal>, StoreError> {
        let taken = sqlx::query(
            "INSERT INTO leases (miner_url, holder, expires_at_ms, next_due_ms) VALUES ($1, $2, $3, 0)
             ON CONFLICT (miner_url) DO UPDATE SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms
             WHERE leases.expires_at_ms <= $4 AND leases.next_due_ms <= $4",
        )
        .bind(miner_url)
        .bind(holder)
        .bind(as_i64(now_ms.saturating_add(ttl_ms)))
        .bind(as_i64(now_ms))
        .execute(&self.pool)
        .await?;
        if taken.rows_affected() == 1 {
            return Ok(Ok(Lease {
                miner_url: miner_url.into(),
                holder: holder.into(),
            }));
        }
        let row: Option<(i64, i64)> =
            sqlx::query_as("SELECT expires_at_ms, next_due_ms FROM leases WHERE miner_url = $1")
                .bind(miner_url)
                .fetch_optional(&self.pool)
                .await?;
        let retry_at_ms = match row {
            Some((expires, due)) => as_u64(expires.max(due))?,
            None => now_ms, // released and removed meanwhile: due now
        };
        Ok(Err(LeaseRefusal { retry_at_ms }))
    }

    /// Extends a lease this validator holds to `now_ms + ttl_ms`; `false` if it no longer holds
    /// it (it ran out and another validator took the miner).
    pub async fn renew_lease(&self, lease: &Lease, now_ms: u64, ttl_ms: u64) -> Result<bool, StoreError> {
        let renewed = sqlx::query("UPDATE leases SET expires_at_ms = $3 WHERE miner_url = $1 AND holder = $2")
            .bind(&lease.miner_url)
            .bind(&lease.holder)
            .bind(as_i64(now_ms.saturating_add(ttl_ms)))
            .execute(&self.pool)
            .await?;
        Ok(renewed.rows_affected() == 1)
    }

    /// Gives a lease back, with when the miner is due next (from any validator).
    pub async fn release_lease(&self, lease: &Lease, next_due_ms: u64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE leases SET holder = '', expires_at_ms = 0, next_due_ms = $3 WHERE miner_url = $1 AND holder = $2",
        )
        .bind(&lease.miner_url)
        .bind(&lease.holder)
        .bind(as_i64(next_due_ms))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Gives back every lease `holder` still holds, due at `now_ms`: a validator stopping in the
    /// middle of its attestations, which leaves no verdict for them, so that a restarted one (or
    /// another) takes those miners at once instead of after the lease runs out.
    pub async fn release_leases_of(&self, holder: &str, now_ms: u64) -> Result<u64, StoreError> {
        let released = sqlx::query(
            "UPDATE leases SET holder = '', expires_at_ms = 0, next_due_ms = $2 WHERE holder = $1 AND holder <> ''",
        )
        .bind(holder)
        .bind(as_i64(now_ms))
        .execute(&self.pool)
        .await?;
        Ok(released.rows_affected())
    }
}
