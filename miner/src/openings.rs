//! An opening round (PROTOCOL.md 14.5): one signed opening per sample, in request order, each
//! recomputed on the devices and handed to the validator's stream.
//!
//! The devices are held for the round, so that another validator's challenge cannot start
//! between two openings and make the rest wait past the requesting validator's budget. But a
//! validator that stops reading must not keep them: the stream's buffer fills, the hand-over
//! blocks, and with it every other validator. So an opening the validator has not taken within
//! [`RoundLimits::handover`] is waited on with the devices released (they are taken again for
//! the next one), and the round ends once it has lasted as long as the miner keeps the
//! commitment.

use crate::core::{MinerCore, RecentCommitment};
use gpu_attest_proto::v1;
use gpu_attest_shared::CancelToken;
use gpu_attest_shared::opening::SampleRequest;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{info, warn};

/// How long an opening round may wait on its validator.
#[derive(Clone, Copy, Debug)]
pub struct RoundLimits {
    /// How long a computed opening may wait for the validator to take it before the devices are
    /// released to other challenges. An honest validator takes the next opening as soon as it
    /// has checked the last, which on the sizes it plans takes far less than the default 10 s,
    /// so only a stalled or vanished one is waited on without them.
    pub handover: Duration,
    /// The whole round, from the request.
    pub round: Duration,
}

impl RoundLimits {
    /// The default hand-over; the round lasts as long as `core` keeps its commitments.
    pub fn for_core(core: &MinerCore) -> Self {
        RoundLimits {
            handover: Duration::from_secs(10),
            round: core.keep_commitments(),
        }
    }
}

/// Runs the round for `samples` of `recent`, sending each opening (or the error that ends the
/// round) on `tx`.
pub async fn run_round(
    core: Arc<MinerCore>,
    recent: Arc<RecentCommitment>,
    samples: Vec<SampleRequest>,
    tx: mpsc::Sender<Result<v1::ChainOpening, Status>>,
    limits: RoundLimits,
) {
    let nonce = hex::encode(recent.nonce);
    let round_ends = tokio::time::Instant::now() + limits.round;
    let cancel = CancelToken::new();
    let mut devices = None;
    for sample in samples {
        if devices.is_none() {
            devices = Some(core.lock_devices().await);
        }
        let (worker, recent, cancel) = (core.clone(), recent.clone(), cancel.clone());
        let opened = tokio::task::spawn_blocking(move || worker.open(&recent, sample, &cancel)).await;
        let item = match opened {
            Ok(result) => result.map_err(Status::from),
            Err(join) => Err(Status::internal(format!("opening worker failed: {join}"))),
        };
        let failed = item.is_err();
        core.metrics().opening(!failed);
        let slot = match tokio::time::timeout(limits.handover, tx.reserve()).await {
            Ok(slot) => slot,
            Err(_) => {
                info!(%nonce, "the validator is slow to take openings; devices released while it catches up");
                devices = None;
                match tokio::time::timeout_at(round_ends, tx.reserve()).await {
                    Ok(slot) => slot,
                    Err(_) => {
                        warn!(%nonce, seconds = limits.round.as_secs(), "opening round ended: the validator took no opening for the rest of its time");
                        return;
                    }
                }
            }
        };
        let Ok(slot) = slot else {
            return; // the validator is gone
        };
        slot.send(item);
        if failed {
            return; // the stream ends with the error it was sent
        }
    }
}
