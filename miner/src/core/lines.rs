//! The locality walk on the miner (PROTOCOL.md 20.10): its request and its one opening round,
//! each checked before anything runs, in the order an open request is (14.5): a recent
//! version 4 commitment of ours, from its own validator while still allowed, correctly signed,
//! after its version 4 walk, within the limits, and the first such request.

use super::open::{chain_of, held_chain_pools};
use super::{MinerCore, RecentCommitment, Signed};
use crate::error::MinerError;
use gpu_attest_proto::locality::{LocalityRequest, OpenLinesRequest, request_from_wire, request_nonce};
use gpu_attest_proto::v1;
use gpu_attest_shared::memory::locality::SegmentOpening;
use gpu_attest_shared::statement::locality::{
    MAX_SEGMENT_SAMPLES_PER_DEVICE, SegmentSample, open_request_bytes, opening_bytes, request_bytes, root_bytes,
};
use gpu_attest_shared::statement::memory_v4::WalkRoot;
use gpu_attest_shared::{CancelToken, Digest};
use std::sync::Arc;

/// A locality open request that passed every check.
pub struct LinesRound {
    pub recent: Arc<RecentCommitment>,
    pub samples: Vec<SegmentSample>,
}

/// One opened locality segment of device `device`, signed.
pub struct SignedSegment {
    pub device: u32,
    pub opening: SegmentOpening,
    pub signature: [u8; 64],
}

impl MinerCore {
    /// Checks a locality request. Passing uses up the commitment's one locality walk.
    pub fn check_locality_request(
        &self,
        wire: &v1::LocalityRequest,
    ) -> Result<(Arc<RecentCommitment>, LocalityRequest), MinerError> {
        let nonce = request_nonce(wire)?;
        let recent = self.kept.find(&nonce)?;
        let pools = held_chain_pools(&recent)?;
        let request = request_from_wire(wire, pools.global())?;
        if request.validator_key != recent.validator_key.0 || !self.is_allowed(&recent.validator_key) {
            return Err(MinerError::OpenNotAllowed);
        }
        recent
            .validator_key
            .verify(&request_bytes(&request.walk, request.deadline_ms), &request.signature)
            .map_err(|_| MinerError::BadLocalitySignature)?;
        request.walk.check_shape()?;
        if !pools.has_walked() {
            return Err(MinerError::LocalityBeforeWalk(hex::encode(nonce)));
        }
        if recent.round_used() {
            return Err(MinerError::AlreadyOpened(hex::encode(nonce)));
        }
        if !pools.claim_lines() {
            return Err(MinerError::LinesAlreadyWalked(hex::encode(nonce)));
        }
        Ok((recent, request))
    }

    /// Walks the lines of `recent`'s kept states (blocking), handing each device's signed
    /// locality root to `send` as soon as that device's walk ends. The hold starts again once
    /// every device has walked: the validator's locality open request follows.
    pub fn walk_lines(
        &self,
        recent: &RecentCommitment,
        request: &LocalityRequest,
        cancel: &CancelToken,
        send: &(dyn Fn(Signed<WalkRoot>) + Sync),
    ) -> Result<(), MinerError> {
        let pools = held_chain_pools(recent)?;
        let ended = |device: u32, root: Digest, took: std::time::Duration| {
            let statement = WalkRoot {
                nonce: request.walk.nonce,
                miner_key: self.public_key(),
                validator_key: recent.validator_key,
                walk_seed: request.walk.seed,
                device,
                root,
                device_us: took.as_micros() as u64,
            };
            let signature = self.identity.sign(&root_bytes(&statement));
            tracing::info!(
                nonce = %hex::encode(request.walk.nonce),
                device,
                walk_ms = took.as_secs_f64() * 1e3,
                "locality walk: device's root signed and sent"
            );
            send(Signed { statement, signature });
        };
        pools.walk_lines(request.walk.clone(), cancel, &ended)?;
        recent.hold_again();
        Ok(())
    }

    /// Checks a locality open request. Passing uses up its one round.
    pub fn check_lines_open_request(&self, request: OpenLinesRequest) -> Result<LinesRound, MinerError> {
        let OpenLinesRequest {
            nonce,
            samples,
            validator_key,
            signature,
        } = request;
        if samples.is_empty() {
            return Err(MinerError::NoSamples);
        }
        let recent = self.kept.find(&nonce)?;
        let pools = held_chain_pools(&recent)?;
        let most = MAX_SEGMENT_SAMPLES_PER_DEVICE.saturating_mul(recent.execution.trees.len().max(1));
        if samples.len() > most {
            return Err(MinerError::TooManyWalkSamples {
                requested: samples.len(),
                max: most,
            });
        }
        if validator_key != recent.validator_key.0 || !self.is_allowed(&recent.validator_key) {
            return Err(MinerError::OpenNotAllowed);
        }
        recent
            .validator_key
            .verify(&open_request_bytes(&nonce, &samples), &signature)
            .map_err(|_| MinerError::BadOpenSignature)?;
        if recent.round_used() {
            return Err(MinerError::AlreadyOpened(hex::encode(nonce)));
        }
        pools.check_line_samples(&samples)?;
        if !pools.claim_lines_opening() {
            return Err(MinerError::LinesAlreadyOpened(hex::encode(nonce)));
        }
        Ok(LinesRound { recent, samples })
    }

    /// Builds and signs one locality segment (blocking: walks that walker's generation again
    /// and cuts each line's chunk path from its state).
    pub fn open_lines(&self, recent: &RecentCommitment, sample: SegmentSample) -> Result<SignedSegment, MinerError> {
        let pools = held_chain_pools(recent)?;
        let opening = pools.open_lines(sample, &chain_of(recent))?;
        Ok(SignedSegment {
            device: sample.device,
            signature: self
                .identity
                .sign(&opening_bytes(&recent.nonce, sample.device, &opening)),
            opening,
        })
    }
}
