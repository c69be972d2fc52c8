//! Answering a commitment's validator: the walk (version 3) and the one opening round, each
//! request checked in the order of PROTOCOL.md 14.5 and 18.4 before anything runs.

use super::kept::KeptMemory;
use super::{MAX_WALK_SAMPLES, MinerCore, Opened, RecentCommitment, Signed, SignedOpening};
use crate::error::MinerError;
use crate::memory_v4::HeldChainPools;
use gpu_attest_proto::convert::{OpenRequest, WalkRequest};
use gpu_attest_shared::opening::{ChainOpening, SampleRequest, check_sample, open_chain};
use gpu_attest_shared::statement::memory_v3::{
    WalkSample, WalkStatement, open_request_bytes_v3, walk_opening_bytes, walk_request_bytes,
};
use gpu_attest_shared::statement::memory_v4::{self, StepSample, WalkRoot, max_step_samples, step_opening_bytes};
use gpu_attest_shared::statement::{open_request_bytes, opening_bytes};
use gpu_attest_shared::{CancelToken, Digest};
use std::sync::Arc;
use std::time::Instant;

/// An open request that passed every check: the commitment it opens and what to open, the
/// chain segments first, then the walk segments (version 3) or the walk steps (version 4).
pub struct OpenRound {
    pub recent: Arc<RecentCommitment>,
    pub chains: Vec<SampleRequest>,
    pub walks: Vec<WalkSample>,
    pub steps: Vec<StepSample>,
}

impl MinerCore {
    /// Checks a decoded open request in the order of PROTOCOL.md section 14.5: not empty,
    /// within the sample limit, for a recent commitment of ours, from that challenge's own
    /// validator while it is still allowed, correctly signed, every sample in range, and the
    /// first such request for this commitment. Only a request that passes all of it uses up the
    /// commitment's one opening round.
    pub fn check_open_request(&self, request: OpenRequest) -> Result<OpenRound, MinerError> {
        let OpenRequest {
            nonce,
            validator_key,
            samples,
            walks,
            steps,
            signature,
        } = request;
        if samples.is_empty() && walks.is_empty() && steps.is_empty() {
            return Err(MinerError::NoSamples);
        }
        if walks.len() > MAX_WALK_SAMPLES {
            return Err(MinerError::TooManyWalkSamples {
                requested: walks.len(),
                max: MAX_WALK_SAMPLES,
            });
        }
        if samples.len() > self.limits.max_samples as usize {
            return Err(MinerError::TooManySamples {
                requested: samples.len(),
                max: self.limits.max_samples,
            });
        }
        let recent = self.kept.find(&nonce)?;
        // Steps per device of this commitment: a host of many devices is opened as much as one.
        let most_steps = max_step_samples(recent.execution.trees.len());
        if steps.len() > most_steps {
            return Err(MinerError::TooManyWalkSamples {
                requested: steps.len(),
                max: most_steps,
            });
        }
        if validator_key != recent.validator_key.0 || !self.is_allowed(&recent.validator_key) {
            return Err(MinerError::OpenNotAllowed);
        }
        if !steps.is_empty() && recent.memory.v4().is_none() {
            return Err(MinerError::NotVersion4(hex::encode(nonce)));
        }
        if !walks.is_empty() && recent.memory.v4().is_some() {
            return Err(MinerError::OtherVersion {
                nonce: hex::encode(nonce),
                version: 4,
                what: "its walk has no segments; ask for its steps (step_samples)",
            });
        }
        let signed = match &recent.memory {
            KeptMemory::V4(_) => memory_v4::open_request_bytes(&nonce, &samples, &steps),
            KeptMemory::V3(_) => open_request_bytes_v3(&nonce, &samples, &walks),
            KeptMemory::None => open_request_bytes(&nonce, &samples),
        };
        recent
            .validator_key
            .verify(&signed, &signature)
            .map_err(|_| MinerError::BadOpenSignature)?;
        for &sample in &samples {
            check_sample(&recent.work, sample)?;
        }
        // A replay is named as one before the walk's state is looked at: the first round's
        // end released the states, and "released for a later challenge" would send its
        // sender looking for a challenge that never came.
        if recent.round_used() {
            return Err(MinerError::AlreadyOpened(hex::encode(nonce)));
        }
        match &recent.memory {
            KeptMemory::V3(memory) => memory.check_samples(&walks)?,
            KeptMemory::V4(pools) => pools.check_steps(&steps)?,
            KeptMemory::None if !walks.is_empty() => return Err(MinerError::NoMemoryPhase(hex::encode(nonce))),
            KeptMemory::None => {}
        }
        if !recent.claim_round() {
            return Err(MinerError::AlreadyOpened(hex::encode(nonce)));
        }
        Ok(OpenRound {
            recent,
            chains: samples,
            walks,
            steps,
        })
    }

    /// Checks a decoded version 4 walk request (PROTOCOL.md 20.7, 20.8) as a version 3 one is
    /// checked ([`Self::check_walk_request`]), its signature over version 4's bytes. Passing
    /// uses up the walk.
    pub fn check_states_walk_request(
        &self,
        request: WalkRequest,
    ) -> Result<(Arc<RecentCommitment>, WalkRequest), MinerError> {
        let recent = self.signed_walk_request(&request, memory_v4::walk_request_bytes)?;
        let pools = held_chain_pools(&recent)?;
        if !pools.claim_walk() {
            return Err(MinerError::AlreadyWalked(hex::encode(request.nonce)));
        }
        Ok((recent, request))
    }

    /// Walks the kept states of `recent` (blocking), handing each device's signed walk root to
    /// `send` as soon as that device's walk ends (on its thread). The hold starts again once
    /// every device has walked: the validator's open request follows.
    pub fn walk_states(
        &self,
        recent: &RecentCommitment,
        request: &WalkRequest,
        cancel: &CancelToken,
        send: &(dyn Fn(Signed<WalkRoot>) + Sync),
    ) -> Result<(), MinerError> {
        let pools = held_chain_pools(recent)?;
        let requested = std::time::Instant::now();
        let ended = |device: u32, root: Digest, took: std::time::Duration| {
            let walked_at = requested.elapsed();
            let statement = WalkRoot {
                nonce: request.nonce,
                miner_key: self.public_key(),
                validator_key: recent.validator_key,
                walk_seed: request.walk_seed,
                device,
                root,
                device_us: took.as_micros() as u64,
            };
            let signature = self.identity.sign(&statement.signing_bytes());
            // Each phase of the device's walk on the miner's clock: the walk alone (what the
            // root states), when it ended after the request, and when its root was signed.
            tracing::info!(
                nonce = %hex::encode(request.nonce),
                device,
                walk_ms = took.as_secs_f64() * 1e3,
                ended_after_request_ms = walked_at.as_secs_f64() * 1e3,
                signed_after_request_ms = requested.elapsed().as_secs_f64() * 1e3,
                "version 4 walk: device's root signed and sent"
            );
            send(Signed { statement, signature });
        };
        pools.walk(request.nonce, request.walk_seed, cancel, &ended)?;
        tracing::info!(
            nonce = %hex::encode(request.nonce),
            walkers = pools.params().walkers,
            steps = pools.params().walk_steps,
            all_walked_after_request_ms = requested.elapsed().as_secs_f64() * 1e3,
            "version 4 walk: every device's root sent"
        );
        recent.hold_again();
        Ok(())
    }

    /// Builds and signs one opened walk step (blocking: walks the step's walker again).
    pub fn open_step(&self, recent: &RecentCommitment, sample: StepSample) -> Result<SignedOpening, MinerError> {
        let pools = held_chain_pools(recent)?;
        let chain = chain_of(recent);
        let opening = pools.open(sample, chain)?;
        Ok(SignedOpening {
            nonce: recent.nonce,
            signature: self
                .identity
                .sign(&step_opening_bytes(&recent.nonce, sample.device, &opening)),
            opening: Opened::Step {
                device: sample.device,
                opening,
            },
        })
    }

    /// Checks a decoded walk request (PROTOCOL.md 18.4) as an open request is checked: for a
    /// recent commitment of ours, from its validator while still allowed, correctly signed,
    /// for a version 3 commitment, and the first such request. Passing uses up the walk.
    pub fn check_walk_request(&self, request: WalkRequest) -> Result<(Arc<RecentCommitment>, WalkRequest), MinerError> {
        let recent = self.signed_walk_request(&request, walk_request_bytes)?;
        if recent.memory.v4().is_some() {
            return Err(MinerError::OtherVersion {
                nonce: hex::encode(request.nonce),
                version: 4,
                what: "its walk is asked for with WalkStates, signed over version 4's walk request",
            });
        }
        let memory = recent
            .memory
            .v3()
            .ok_or_else(|| MinerError::NoMemoryPhase(hex::encode(request.nonce)))?;
        if !memory.claim_walk() {
            return Err(MinerError::AlreadyWalked(hex::encode(request.nonce)));
        }
        Ok((recent, request))
    }

    /// A walk request's first checks, either version's: for a recent commitment of ours, from
    /// its validator while still allowed, and signed over `statement`'s bytes.
    fn signed_walk_request(
        &self,
        request: &WalkRequest,
        statement: fn(&[u8; 32], &[u8; 32], u64) -> Vec<u8>,
    ) -> Result<Arc<RecentCommitment>, MinerError> {
        let recent = self.kept.find(&request.nonce)?;
        if request.validator_key != recent.validator_key.0 || !self.is_allowed(&recent.validator_key) {
            return Err(MinerError::OpenNotAllowed);
        }
        recent
            .validator_key
            .verify(
                &statement(&request.nonce, &request.walk_seed, request.deadline_ms),
                &request.signature,
            )
            .map_err(|_| MinerError::BadWalkSignature)?;
        Ok(recent)
    }

    /// Walks the pools of `recent` (blocking) and signs the walk statement. The hold starts
    /// again once it is signed: the validator's open request follows it.
    pub fn walk(
        &self,
        recent: &RecentCommitment,
        request: &WalkRequest,
        cancel: &CancelToken,
    ) -> Result<Signed<WalkStatement>, MinerError> {
        let memory = recent
            .memory
            .v3()
            .ok_or_else(|| MinerError::NoMemoryPhase(hex::encode(request.nonce)))?;
        let started = Instant::now();
        let roots = memory.walk(request.nonce, request.walk_seed, cancel)?;
        let statement = WalkStatement {
            nonce: request.nonce,
            miner_key: self.public_key(),
            validator_key: recent.validator_key,
            walk_seed: request.walk_seed,
            roots,
            walk_ms: started.elapsed().as_millis() as u64,
        };
        recent.hold_again();
        Ok(Signed {
            signature: self.identity.sign(&statement.signing_bytes()),
            statement,
        })
    }

    /// Builds and signs one walk opening (blocking: copies the segment's entries).
    pub fn open_walk(&self, recent: &RecentCommitment, sample: WalkSample) -> Result<SignedOpening, MinerError> {
        let memory = recent
            .memory
            .v3()
            .ok_or_else(|| MinerError::NoMemoryPhase(hex::encode(recent.nonce)))?;
        let opening = memory.open(sample)?;
        Ok(SignedOpening {
            nonce: recent.nonce,
            signature: self.identity.sign(&walk_opening_bytes(&recent.nonce, &opening)),
            opening: Opened::Walk(opening),
        })
    }

    /// Builds and signs one opening (blocking: recomputes up to K steps).
    pub fn open(
        &self,
        recent: &RecentCommitment,
        sample: SampleRequest,
        cancel: &CancelToken,
    ) -> Result<SignedOpening, MinerError> {
        let checkpoints = recent
            .execution
            .chains
            .get(sample.chain as usize)
            .map(|c| c.checkpoints.as_slice())
            .unwrap_or_default();
        let opening = open_chain(
            self.selected.backend.as_ref(),
            &recent.work,
            checkpoints,
            &recent.execution.trees,
            sample,
            cancel,
        )?;
        Ok(self.sign_opening(&recent.nonce, opening))
    }

    pub fn sign_opening(&self, nonce: &[u8; 32], opening: ChainOpening) -> SignedOpening {
        SignedOpening {
            nonce: *nonce,
            signature: self.identity.sign(&opening_bytes(nonce, &opening)),
            opening: Opened::Chain(opening),
        }
    }
}

/// Chain `i`'s checkpoint hashes and its leaf's proof in its device root, as `recent` kept
/// them: what a walk step's or a locality line's opening proves its state against.
pub(super) fn chain_of(
    recent: &RecentCommitment,
) -> impl Fn(u64) -> (Vec<Digest>, gpu_attest_shared::merkle::MerkleProof) + '_ {
    let execution = &recent.execution;
    move |i: u64| {
        let checkpoints = execution.chains.get(i as usize).map(|c| c.checkpoints.clone());
        let proof = execution
            .trees
            .iter()
            .find(|t| t.slice.contains(i))
            .and_then(|t| t.tree.proof(i - t.slice.offset));
        // Every pool chain is one of its device's chains (checked when the challenge was
        // accepted), so both are there.
        (checkpoints.unwrap_or_default(), proof.unwrap_or_default())
    }
}

/// The kept states of a version 4 commitment, or why `recent` has none.
pub(super) fn held_chain_pools(recent: &RecentCommitment) -> Result<&HeldChainPools, MinerError> {
    match &recent.memory {
        KeptMemory::V4(pools) => Ok(pools),
        KeptMemory::V3(_) => Err(MinerError::OtherVersion {
            nonce: hex::encode(recent.nonce),
            version: 3,
            what: "its walk is asked for with WalkPool",
        }),
        KeptMemory::None => Err(MinerError::NotVersion4(hex::encode(recent.nonce))),
    }
}
