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
use gpu_attest_shared::statement::memory_v3::WalkSample;
use gpu_attest_shared::statement::memory_v4::StepSample;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{info, warn};

/// One opening asked for: a chain segment, or a walk segment (version 3) or walk step
/// (version 4), which follow the chains in the request's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sample {
    Chain(SampleRequest),
    Walk(WalkSample),
    Step(StepSample),
}

/// How long an opening round may wait on its validator.
#[derive(Clone, Copy, Debug)]
pub struct RoundLimits {
    /// How long a computed opening may wait for the validator to take it before the devices are
    /// released to other challenges. An honest validator takes the next opening once it has
    /// checked the last: a few steps of one chain, far less work than the whole challenge, so
    /// at least 10 s and at least as long as the challenge took this miner only lets go of a
    /// stalled or vanished one. (Not the deadline: a validator picks that, and a tiny challenge
    /// with a distant deadline would hold the devices again.)
    pub handover: Duration,
    /// The whole round, from the request.
    pub round: Duration,
}

/// The least [`RoundLimits::handover`].
const MIN_HANDOVER: Duration = Duration::from_secs(10);

impl RoundLimits {
    /// The limits for opening `recent`: the round lasts as long as `core` keeps commitments.
    pub fn for_commitment(core: &MinerCore, recent: &RecentCommitment) -> Self {
        let round = core.kept().keep_for();
        RoundLimits {
            handover: recent.computed_in.max(MIN_HANDOVER).min(round),
            round,
        }
    }
}

/// Runs the round for `samples` of `recent`, sending each opening (or the error that ends the
/// round) on `tx`. The recomputation stops when the validator goes away or the round is over.
pub async fn run_round(
    core: Arc<MinerCore>,
    recent: Arc<RecentCommitment>,
    samples: Vec<Sample>,
    tx: mpsc::Sender<Result<v1::ChainOpening, Status>>,
    limits: RoundLimits,
) {
    let nonce = hex::encode(recent.nonce);
    let round_ends = tokio::time::Instant::now() + limits.round;
    let cancel = CancelToken::new();
    let stopper = {
        let (tx, cancel) = (tx.clone(), cancel.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = tx.closed() => {}
                () = tokio::time::sleep_until(round_ends) => {}
            }
            cancel.cancel();
        })
    };
    let round = Round {
        core: &core,
        recent: &recent,
        tx: &tx,
        limits,
        ends: round_ends,
        cancel: &cancel,
        nonce: &nonce,
    };
    round.run(samples).await;
    stopper.abort();
    recent.finish_round();
}

/// What one round works with.
struct Round<'a> {
    core: &'a Arc<MinerCore>,
    recent: &'a Arc<RecentCommitment>,
    tx: &'a mpsc::Sender<Result<v1::ChainOpening, Status>>,
    limits: RoundLimits,
    ends: tokio::time::Instant,
    cancel: &'a CancelToken,
    nonce: &'a str,
}

impl Round<'_> {
    fn over(&self) {
        warn!(nonce = %self.nonce, seconds = self.limits.round.as_secs(), "opening round ended: it has lasted as long as the commitment is kept");
    }

    async fn run(&self, samples: Vec<Sample>) {
        let (core, tx, nonce) = (self.core, self.tx, self.nonce);
        let mut devices = None;
        for sample in samples {
            if devices.is_none() {
                match tokio::time::timeout_at(self.ends, core.running().lock_devices()).await {
                    Ok(locked) => devices = Some(locked),
                    Err(_) => return self.over(),
                }
            }
            if tx.is_closed() {
                return; // the validator is gone
            }
            let (worker, recent, cancel) = (core.clone(), self.recent.clone(), self.cancel.clone());
            let opened = tokio::task::spawn_blocking(move || match sample {
                Sample::Chain(chain) => worker.open(&recent, chain, &cancel),
                Sample::Walk(walk) => worker.open_walk(&recent, walk),
                Sample::Step(step) => worker.open_step(&recent, step),
            })
            .await;
            if self.cancel.is_cancelled() {
                if !tx.is_closed() {
                    self.over();
                }
                return;
            }
            let item = match opened {
                Ok(result) => result.map(|o| crate::wire::opening(&o)).map_err(Status::from),
                Err(join) => Err(Status::internal(format!("opening worker failed: {join}"))),
            };
            let failed = item.is_err();
            core.metrics().opening(!failed);
            let slot = match tokio::time::timeout(self.limits.handover, tx.reserve()).await {
                Ok(slot) => slot,
                Err(_) => {
                    info!(%nonce, "the validator is slow to take openings; devices released while it catches up");
                    devices = None;
                    match tokio::time::timeout_at(self.ends, tx.reserve()).await {
                        Ok(slot) => slot,
                        Err(_) => return self.over(),
                    }
                }
            };
            let Ok(slot) = slot else {
                return; // the validator is gone
            };
            if let Ok(opening) = &item {
                core.record_answer(&self.recent.nonce, crate::answers::Kind::Opening, opening);
            }
            slot.send(item);
            if failed {
                return; // the stream ends with the error it was sent
            }
        }
    }
}

/// Runs a locality opening round (PROTOCOL.md 20.10) for `samples` of `recent`, each opened
/// segment (or the error that ends the round) sent on `tx`, within the limits of an opening
/// round. It does not finish the commitment's round: the chain and step openings follow it.
pub async fn run_lines_round(
    core: Arc<MinerCore>,
    recent: Arc<RecentCommitment>,
    samples: Vec<gpu_attest_shared::statement::locality::SegmentSample>,
    tx: mpsc::Sender<Result<v1::LocalityOpening, Status>>,
    limits: RoundLimits,
) {
    let nonce = hex::encode(recent.nonce);
    let ends = tokio::time::Instant::now() + limits.round;
    let Ok(_devices) = tokio::time::timeout_at(ends, core.running().lock_devices()).await else {
        warn!(%nonce, "locality opening round ended before the devices were free");
        return;
    };
    for sample in samples {
        if tx.is_closed() {
            return; // the validator is gone
        }
        let (worker, held) = (core.clone(), recent.clone());
        let opened = tokio::task::spawn_blocking(move || worker.open_lines(&held, sample)).await;
        let item = match opened {
            Ok(result) => result
                .map(|o| gpu_attest_proto::locality::opening_to_wire(o.device, &o.opening, &o.signature))
                .map_err(Status::from),
            Err(join) => Err(Status::internal(format!("locality opening worker failed: {join}"))),
        };
        let failed = item.is_err();
        core.metrics().opening(!failed);
        let wait = limits
            .handover
            .min(ends.saturating_duration_since(tokio::time::Instant::now()));
        let Ok(Ok(slot)) = tokio::time::timeout(wait, tx.reserve()).await else {
            warn!(%nonce, "locality opening round ended: the validator stopped taking openings");
            return;
        };
        if let Ok(opening) = &item {
            core.record_answer(&recent.nonce, crate::answers::Kind::LocalityOpening, opening);
        }
        slot.send(item);
        if failed {
            return;
        }
    }
}
