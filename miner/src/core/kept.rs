//! The commitments a miner keeps after committing, for their validators' openings: how long,
//! how many, which of them hold the devices from other validators, and their pools.

use super::{HOLD_SPACING, OPENING_HOLD};
use crate::error::MinerError;
use crate::memory::HeldMemory;
use crate::memory_v4::HeldChainPools;
use gpu_attest_shared::Work;
use gpu_attest_shared::engine::Execution;
use gpu_attest_shared::keys::PublicKey;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Commitments kept for openings at once; older ones are dropped first.
const MAX_RECENT_COMMITMENTS: usize = 4;

/// What the miner keeps after committing, to answer the validator's openings.
pub struct RecentCommitment {
    pub nonce: [u8; 32],
    pub validator_key: PublicKey,
    pub work: Work,
    pub execution: Execution,
    /// How long the work took this miner, from acceptance to commitment: the scale of the
    /// challenge, which no validator can inflate without the devices doing that much work.
    pub computed_in: Duration,
    stored_at: Instant,
    /// When the hold ([`OPENING_HOLD`]) started: at the commitment, and again when its walk
    /// statement was sent, since a version 3 validator opens after the walk.
    hold_from: Mutex<Instant>,
    /// What it holds of its memory phase: version 3's pools or version 4's kept states.
    pub memory: KeptMemory,
    /// Set by the first open request that passes every check: an open request is single-use,
    /// so a captured one cannot make this miner recompute again and again.
    opened: AtomicBool,
    /// Whether this commitment keeps other validators' challenges off while it waits to be
    /// opened ([`OPENING_HOLD`]): not when its validator had another commitment here within
    /// [`HOLD_SPACING`] before, or one validator could hold the miner from all others with tiny
    /// challenges, each renewing the hold.
    holds: bool,
}

impl RecentCommitment {
    /// How long this commitment has held the devices for its validator so far.
    fn held_for(&self) -> Duration {
        self.hold_from.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }

    /// Starts the hold again (the walk statement was just sent; the open request follows it).
    pub(super) fn hold_again(&self) {
        *self.hold_from.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Uses up the one opening round; false if it was used already.
    pub(super) fn claim_round(&self) -> bool {
        !self.opened.swap(true, Ordering::SeqCst)
    }

    /// Whether its one opening round has been used: a request after it is a replay, whatever
    /// became of the states since (PROTOCOL.md 14.5: `ALREADY_EXISTS`).
    pub(super) fn round_used(&self) -> bool {
        self.opened.load(Ordering::SeqCst)
    }

    /// Whether its validator may still open it and has not: what a stopping miner waits for.
    fn awaits_round(&self) -> bool {
        !self.opened.load(Ordering::SeqCst) && self.held_for() < OPENING_HOLD
    }

    /// Ends what this commitment holds once its one opening round is over: nothing may read its
    /// pools after that (a second open request is refused, and the walk came before the round),
    /// so they are freed now rather than when the commitment expires (`keep_commitments_secs`).
    /// Kept until expiry, every recent challenge's pools were held at once, and an hour-long
    /// soak saw the miners' memory rise in steps. The commitment itself stays, so the hold
    /// spacing still sees it and a repeated open request still gets "already opened".
    pub fn finish_round(&self) {
        match &self.memory {
            KeptMemory::None => {}
            KeptMemory::V3(memory) => memory.release(),
            KeptMemory::V4(pools) => pools.release(),
        }
    }
}

/// A kept commitment's memory phase, one per protocol version: decided when the challenge was
/// accepted (`AcceptedMemory`), so that what it answers is never worked out again from which
/// parts happen to be there.
pub enum KeptMemory {
    /// Version 2, or a version 3 challenge whose pools were never filled: nothing to walk.
    None,
    /// Version 3: the pools and their walk.
    V3(HeldMemory),
    /// Version 4: the pool chains' kept states and their walk.
    V4(HeldChainPools),
}

impl KeptMemory {
    /// Version 3's pools, if the commitment has them.
    pub fn v3(&self) -> Option<&HeldMemory> {
        match self {
            KeptMemory::V3(memory) => Some(memory),
            _ => None,
        }
    }

    /// Whether it still holds its pools (or kept states): until its walk and opening round are
    /// over, or it is released for another challenge.
    pub fn holds_pools(&self) -> bool {
        match self {
            KeptMemory::None => false,
            KeptMemory::V3(memory) => memory.holds_pools(),
            KeptMemory::V4(pools) => pools.holds_pools(),
        }
    }

    /// Version 4's kept states, if the commitment has them.
    pub fn v4(&self) -> Option<&HeldChainPools> {
        match self {
            KeptMemory::V4(pools) => Some(pools),
            _ => None,
        }
    }
}

/// What a commitment is kept with: its challenge's work, the execution and the memory phase.
pub(super) struct ToKeep {
    pub nonce: [u8; 32],
    pub validator_key: PublicKey,
    pub work: Work,
    pub execution: Execution,
    pub computed_in: Duration,
    pub memory: KeptMemory,
}

/// The kept commitments, oldest first, each for `keep_for`.
pub struct KeptCommitments {
    recent: Mutex<VecDeque<Arc<RecentCommitment>>>,
    keep_for: Duration,
}

impl KeptCommitments {
    pub(super) fn new(keep_for: Duration) -> Self {
        KeptCommitments {
            recent: Mutex::new(VecDeque::new()),
            keep_for,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<RecentCommitment>>> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long a commitment is kept for its opening round (`keep_commitments_secs`).
    pub fn keep_for(&self) -> Duration {
        self.keep_for
    }

    /// Keeps a commitment openable by its challenge's validator, dropping expired ones and, past
    /// [`MAX_RECENT_COMMITMENTS`], the oldest.
    pub(super) fn keep(&self, kept: ToKeep) {
        let mut recent = self.lock();
        recent.retain(|r| r.stored_at.elapsed() < self.keep_for);
        let holds = recent
            .iter()
            .rev()
            .find(|r| r.validator_key == kept.validator_key)
            .is_none_or(|previous| previous.stored_at.elapsed() >= HOLD_SPACING);
        let entry = Arc::new(RecentCommitment {
            nonce: kept.nonce,
            validator_key: kept.validator_key,
            computed_in: kept.computed_in,
            hold_from: Mutex::new(Instant::now()),
            memory: kept.memory,
            work: kept.work,
            execution: kept.execution,
            stored_at: Instant::now(),
            opened: AtomicBool::new(false),
            holds,
        });
        while recent.len() >= MAX_RECENT_COMMITMENTS {
            recent.pop_front();
        }
        recent.push_back(entry);
    }

    /// A kept commitment by its nonce.
    pub(super) fn find(&self, nonce: &[u8; 32]) -> Result<Arc<RecentCommitment>, MinerError> {
        self.lock()
            .iter()
            .find(|r| r.nonce == *nonce && r.stored_at.elapsed() < self.keep_for)
            .cloned()
            .ok_or_else(|| MinerError::UnknownCommitment(hex::encode(nonce)))
    }

    /// Another validator whose fresh commitment has not been opened yet, if any. Only a
    /// validator's newest commitment holds: one that has committed again since has moved on.
    pub(super) fn awaiting_openings(&self, asking: &PublicKey) -> Option<PublicKey> {
        let recent = self.lock();
        recent
            .iter()
            .enumerate()
            .find(|&(i, r)| {
                r.holds
                    && r.validator_key != *asking
                    && r.awaits_round()
                    && !recent
                        .iter()
                        .skip(i + 1)
                        .any(|later| later.validator_key == r.validator_key)
            })
            .map(|(_, r)| r.validator_key)
    }

    /// Whether any commitment still awaits its opening round ([`RecentCommitment::awaits_round`]).
    pub(super) fn any_awaiting_round(&self) -> bool {
        self.lock().iter().any(|r| r.awaits_round())
    }

    /// Frees the pools of every kept commitment.
    pub(super) fn release_pools(&self) {
        for r in self.lock().iter() {
            r.finish_round();
        }
    }

    /// How many kept commitments still hold their pools: those awaiting their walk or opening
    /// round, or kept by a validator that never opens (the full policy) until they expire or
    /// another challenge needs the memory.
    pub fn holding_pools(&self) -> usize {
        self.lock().iter().filter(|r| r.memory.holds_pools()).count()
    }
}
