//! Accepting a challenge: every check of PROTOCOL.md 14.3, in its order, before the devices are
//! taken for it.

use super::{MinerCore, now_ms};
use crate::error::MinerError;
use crate::memory::PoolPlan;
use crate::memory_v4::check_pools_fit;
use gpu_attest_shared::Work;
use gpu_attest_shared::backend::{PoolStates, ResidentPool};
use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::memory::chain_pool::{ChainPool, ChainPoolParams};
use gpu_attest_shared::partition::canonical_partition;
use gpu_attest_shared::statement::{Challenge, MemoryPhase};
use std::time::{Duration, Instant};
use tokio::sync::OwnedMutexGuard;

/// A challenge that passed every check, holding the devices until it is dropped.
pub struct AcceptedChallenge {
    pub challenge: Challenge,
    pub work: Work,
    /// The memory phase the challenge asks for, and what is held of it so far.
    pub memory: AcceptedMemory,
    /// When the work stops by this machine's clock, Unix milliseconds ([`MinerCore::stop_at_ms`]).
    stop_at_ms: u64,
    pub(super) accepted_at: Instant,
    _devices: OwnedMutexGuard<()>,
}

/// An accepted challenge's memory phase, one per protocol version, with what the miner holds of
/// it until the commitment keeps it.
pub enum AcceptedMemory {
    /// Version 2: none.
    None,
    /// Version 3: the pools to fill, and the pools once filled ([`MinerCore::fill`]).
    V3 {
        plan: PoolPlan,
        pools: Option<Vec<Box<dyn ResidentPool>>>,
    },
    /// Version 4: the pool chains, checked against the claim, and their final states once the
    /// chains ran ([`MinerCore::execute`]).
    V4 {
        params: ChainPoolParams,
        states: Option<Vec<Box<dyn PoolStates>>>,
    },
}

impl AcceptedChallenge {
    /// Time left to work by this machine's clock: until the finish-by time when the challenge
    /// has one and this miner works past deadlines (a late commitment still proves its rate),
    /// else until the deadline.
    pub fn time_left(&self) -> Duration {
        Duration::from_millis(self.stop_at_ms.saturating_sub(now_ms()))
    }

    /// What stops the work when it runs out of time, for people.
    pub fn stop_named(&self) -> &'static str {
        stop_named(self.stop_at_ms, &self.challenge)
    }
}

impl MinerCore {
    /// Every check of PROTOCOL.md section 14.3 after decoding, in its order, of `challenge` and
    /// its validator's `signature`; the nonce is recorded only once the challenge is accepted
    /// and the devices are ours.
    pub fn accept(
        &self,
        challenge: Challenge,
        signature: &[u8; 64],
        now_ms: u64,
    ) -> Result<AcceptedChallenge, MinerError> {
        if !self.is_allowed(&challenge.validator_key) {
            return Err(MinerError::ValidatorNotAllowed(challenge.validator_key));
        }
        challenge
            .verify(signature)
            .map_err(|_| MinerError::BadSignature(challenge.validator_key))?;
        let bound = PublicKey(challenge.params.miner_key);
        if bound != self.public_key() {
            return Err(MinerError::WrongMiner {
                bound,
                ours: self.public_key(),
            });
        }
        let ours = self.claim().digest();
        if challenge.inventory_digest != ours {
            return Err(MinerError::InventoryChanged {
                planned: challenge.inventory_digest,
                ours,
            });
        }
        if challenge.deadline_ms <= now_ms {
            return Err(MinerError::DeadlinePassed {
                late_ms: now_ms - challenge.deadline_ms,
            });
        }
        let work = Work::new(challenge.params)?;
        if let Some(finish_by_ms) = challenge.finish_by_ms
            && finish_by_ms <= challenge.deadline_ms
        {
            return Err(MinerError::FinishByBeforeDeadline {
                deadline_ms: challenge.deadline_ms,
                finish_by_ms,
            });
        }
        let memory = self.accepted_memory(&challenge, &work)?;
        if self.running.is_stopping() {
            return Err(MinerError::Stopping);
        }
        let out_of_service = self.selected.backend.out_of_service();
        if !out_of_service.is_empty() {
            self.device_alarm.ring();
            return Err(MinerError::OutOfService(out_of_service));
        }
        let stop_at_ms = self.stop_at_ms(&challenge);
        self.check_limits(&challenge, &work, stop_at_ms, now_ms)?;
        let devices = self.running.try_lock_devices().ok_or(MinerError::Busy)?;
        if let Some(waiting) = self.kept.awaiting_openings(&challenge.validator_key) {
            return Err(MinerError::AwaitingOpenings(waiting));
        }
        // Earlier commitments' pools go now: no other validator waits on them (just checked),
        // and on a GPU they hold the memory this challenge's chains and pools are sized from.
        self.kept.release_pools();
        self.selected
            .backend
            .check_capacity(&work)
            .map_err(MinerError::NoRoom)?;
        self.check_room(&memory, &work)?;
        let fresh = self.nonces.lock().unwrap_or_else(|p| p.into_inner()).claim(
            challenge.params.nonce,
            challenge.deadline_ms,
            now_ms,
        )?;
        if !fresh {
            return Err(MinerError::NonceReused(hex::encode(challenge.params.nonce)));
        }
        Ok(AcceptedChallenge {
            stop_at_ms,
            challenge,
            work,
            memory,
            accepted_at: Instant::now(),
            _devices: devices,
        })
    }

    /// The memory phase `challenge` asks for, if this miner can take it: version 3's pools
    /// only on a backend that holds them, version 4 only where the inventory says 4, its pools
    /// within what each device claims.
    fn accepted_memory(&self, challenge: &Challenge, work: &Work) -> Result<AcceptedMemory, MinerError> {
        Ok(match &challenge.memory {
            None => AcceptedMemory::None,
            Some(MemoryPhase::V3(_)) if !self.selected.backend.holds_pools() => {
                return Err(MinerError::MemoryPhaseUnsupported(self.selected.name.clone()));
            }
            Some(MemoryPhase::V3(memory)) => AcceptedMemory::V3 {
                plan: PoolPlan::new(*memory, work, &self.selected.devices())?,
                pools: None,
            },
            // Only where the inventory says 4: a miner whose operator turned `protocol_4` off,
            // or whose backend keeps no chain states, speaks 3 and refuses 4.
            Some(phase @ MemoryPhase::V4(_)) if self.protocol_version() < phase.protocol_version() => {
                return Err(MinerError::VersionNotSpoken {
                    asked: phase.protocol_version(),
                    spoken: self.protocol_version(),
                });
            }
            Some(MemoryPhase::V4(params)) => {
                self.check_chain_pools(params, work)?;
                AcceptedMemory::V4 {
                    params: params.clone(),
                    states: None,
                }
            }
        })
    }

    /// Room on the devices for what the phase will hold beside the chains, asked of the backend
    /// before any work (a GPU's free memory).
    fn check_room(&self, memory: &AcceptedMemory, work: &Work) -> Result<(), MinerError> {
        match memory {
            AcceptedMemory::None => {}
            AcceptedMemory::V3 { plan, .. } => plan
                .check_capacity(self.selected.backend.as_ref())
                .map_err(MinerError::NoRoom)?,
            AcceptedMemory::V4 { params, .. } => {
                for pool in self.chain_pools(params, work)? {
                    self.selected
                        .backend
                        .check_chain_pool_capacity(work, &pool, params)
                        .map_err(MinerError::NoRoom)?;
                }
            }
        }
        Ok(())
    }

    /// A version 4 challenge's pools against PROTOCOL.md 20.1's limits and against what each
    /// device claims to hold (the claim the challenge's inventory digest bound).
    fn check_chain_pools(&self, params: &ChainPoolParams, work: &Work) -> Result<(), MinerError> {
        check_pools_fit(&self.chain_pools(params, work)?, &self.selected.devices())
    }

    /// Each device's version 4 pool under `params`, every limit of PROTOCOL.md 20.1 checked.
    fn chain_pools(&self, params: &ChainPoolParams, work: &Work) -> Result<Vec<ChainPool>, MinerError> {
        let devices = self.selected.devices().len() as u32;
        let partition = canonical_partition(work.num_chains(), devices).map_err(|e| MinerError::Engine(e.into()))?;
        Ok(params.pools(work, &partition)?)
    }

    /// `stop_at_ms`: when the work on `challenge` would stop ([`Self::stop_at_ms`]).
    fn check_limits(&self, challenge: &Challenge, work: &Work, stop_at_ms: u64, now_ms: u64) -> Result<(), MinerError> {
        let l = &self.limits;
        let over = |what: String| Err(MinerError::OverLimit(what));
        if work.params().n > l.max_n {
            return over(format!("n={} > max_n={}", work.params().n, l.max_n));
        }
        if work.num_chains() > l.max_chains {
            return over(format!("{} chains > max_chains={}", work.num_chains(), l.max_chains));
        }
        if work.iterations() > l.max_iterations {
            return over(format!(
                "{} iterations > max_iterations={}",
                work.iterations(),
                l.max_iterations
            ));
        }
        // The devices may be held until the work stops, so that is what the limit bounds.
        let window = stop_at_ms.saturating_sub(now_ms);
        if window > l.max_duration_secs.saturating_mul(1000) {
            // The validator reads the limit as the inventory's max_duration_ms; the miner's
            // operator sets it as max_duration_secs. Name both.
            let stop = stop_named(stop_at_ms, challenge);
            return over(format!(
                "{stop} {window} ms away > max_duration_ms={} (the miner's max_duration_secs={})",
                l.max_duration_secs.saturating_mul(1000),
                l.max_duration_secs
            ));
        }
        Ok(())
    }

    /// When the work on `challenge` stops by this machine's clock: its finish-by time, if it has
    /// one and this miner works past deadlines; else its deadline. (A validator sends a
    /// finish-by time only to a miner whose inventory takes one; one sent anyway to a miner whose
    /// operator declined is not a reason to refuse honest work, only to stop at the deadline.)
    fn stop_at_ms(&self, challenge: &Challenge) -> u64 {
        match challenge.finish_by_ms {
            Some(finish_by_ms) if self.limits.work_past_deadline => finish_by_ms,
            _ => challenge.deadline_ms,
        }
    }
}

/// What stops work that runs to `stop_at_ms` on `challenge`, for people.
fn stop_named(stop_at_ms: u64, challenge: &Challenge) -> &'static str {
    if stop_at_ms == challenge.deadline_ms {
        "deadline"
    } else {
        "finish-by time"
    }
}
