//! The miner's protocol logic, free of gRPC plumbing: accept a challenge, run it, sign the
//! commitment, answer openings. It takes and returns the protocol's own statements; the service
//! decodes requests before calling it and encodes what it returns (`crate::wire`). The service
//! calls these in order; tests that play a dishonest miner call them too and change one thing.

use crate::backends::SelectedBackend;
use crate::config::Limits;
use crate::error::MinerError;
use crate::evidence::EvidenceSource;
use crate::memory::{HeldMemory, PoolPlan, pool_commitments};
use crate::metrics::MinerMetrics;
use crate::nonces::NonceLog;
use gpu_attest_daemon::devices::DeviceAlarm;
use gpu_attest_proto::convert::{OpenRequest, WalkRequest};
use gpu_attest_shared::backend::ResidentPool;
use gpu_attest_shared::engine::{self, DeviceProgress, Execution};
use gpu_attest_shared::evidence::{CcState, DeviceEvidence, evidence_statement_bytes, spdm_nonces};
use gpu_attest_shared::inventory::{HardwareClaim, Inventory, MinerLimits};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::memory::check::WalkOpening;
use gpu_attest_shared::memory::statement::{
    WalkSample, WalkStatement, open_request_bytes_v3, walk_opening_bytes, walk_request_bytes,
};
use gpu_attest_shared::opening::{ChainOpening, SampleRequest, check_sample, open_chain};
use gpu_attest_shared::params::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
use gpu_attest_shared::statement::{Challenge, Commitment, open_request_bytes, opening_bytes};
use gpu_attest_shared::{BackendError, CancelToken, Work};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::OwnedMutexGuard;

/// Commitments kept for openings at once; older ones are dropped first.
const MAX_RECENT_COMMITMENTS: usize = 4;

/// Walk openings answered per open request at most (PROTOCOL.md 18.4).
pub const MAX_WALK_SAMPLES: usize = gpu_attest_shared::memory::params::MAX_WALK_SAMPLES as usize;

/// How long after a commitment the devices are kept from other validators' challenges while the
/// committing validator has not opened it yet. Its open request follows the commitment within a
/// round trip; without the hold, a long challenge from another validator taking the devices in
/// between would make those openings wait, and time out, for an honest miner.
pub const OPENING_HOLD: Duration = Duration::from_secs(5);

/// A validator gets a hold for a commitment only if it had no other commitment here within this
/// long before. Tiny challenges in a loop, opened or not, would otherwise renew the hold and
/// keep every other validator out; an honest validator attests a miner every few minutes, and
/// keeps the hold each time.
pub const HOLD_SPACING: Duration = Duration::from_secs(60);

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A device's evidence as sent: one over the wire's limits (PROTOCOL.md 19.3) would make the
/// validator refuse the whole list, so it is sent as offering nothing instead.
fn within_wire_limits(evidence: DeviceEvidence) -> DeviceEvidence {
    match evidence.wire_limit_problem() {
        None => evidence,
        Some((field, problem)) => {
            tracing::warn!(
                device = evidence.index,
                "device evidence's {field}: {problem}; sent as none"
            );
            DeviceEvidence::not_offered(evidence.index, evidence.cc_state)
        }
    }
}

/// A statement with this miner's signature over its signing bytes.
#[derive(Clone, Debug)]
pub struct Signed<T> {
    pub statement: T,
    pub signature: [u8; 64],
}

/// One opening of a round (PROTOCOL.md 14.5, 18.5).
#[derive(Clone, Debug)]
pub enum Opened {
    Chain(ChainOpening),
    Walk(WalkOpening),
}

/// An opening of commitment `nonce`, signed.
#[derive(Clone, Debug)]
pub struct SignedOpening {
    pub nonce: [u8; 32],
    pub opening: Opened,
    pub signature: [u8; 64],
}

/// A challenge that passed every check, holding the devices until it is dropped.
pub struct AcceptedChallenge {
    pub challenge: Challenge,
    pub work: Work,
    /// The pools a version 3 challenge asks for; `None` for version 2.
    pub pool_plan: Option<PoolPlan>,
    /// The pools once filled ([`MinerCore::fill`]), until the commitment keeps them.
    pub pools: Option<Vec<Box<dyn ResidentPool>>>,
    /// When the work stops by this machine's clock, Unix milliseconds ([`MinerCore::stop_at_ms`]).
    stop_at_ms: u64,
    accepted_at: Instant,
    _devices: OwnedMutexGuard<()>,
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

/// An open request that passed every check: the commitment it opens and what to open, the
/// chain segments first, then the walk segments (version 3).
pub struct OpenRound {
    pub recent: Arc<RecentCommitment>,
    pub chains: Vec<SampleRequest>,
    pub walks: Vec<WalkSample>,
}

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
    /// The pools and walk of a version 3 commitment.
    pub memory: Option<HeldMemory>,
    /// Set by the first open request that passes every check: an open request is single-use,
    /// so a captured one cannot make this miner recompute again and again.
    opened: AtomicBool,
    /// Whether this commitment keeps other validators' challenges off while it waits to be
    /// opened ([`OPENING_HOLD`]): not when its validator had another commitment here within
    /// [`HOLD_SPACING`] before, or one validator could hold the miner from all others with tiny
    /// challenges, each renewing the hold.
    holds: bool,
}

pub struct MinerCore {
    identity: KeyPair,
    /// Replaced whole on reload (SIGHUP): removing a key revokes that validator at once, for
    /// new challenges and for openings alike.
    allowed: RwLock<HashSet<PublicKey>>,
    limits: Limits,
    selected: SelectedBackend,
    devices: Arc<tokio::sync::Mutex<()>>,
    /// Accepted nonces with their deadlines; a nonce past its deadline cannot come back (the
    /// deadline check refuses it), so it can be forgotten then.
    nonces: Mutex<NonceLog>,
    recent: Mutex<VecDeque<Arc<RecentCommitment>>>,
    keep_commitments: Duration,
    metrics: MinerMetrics,
    /// Set once the miner is stopping: new challenges are refused while the one in flight
    /// finishes and is opened ([`MinerCore::settle`]).
    stopping: AtomicBool,
    /// Challenges and opening rounds running, whether or not they hold the devices right now.
    working: Arc<AtomicUsize>,
    /// Where device evidence comes from (PROTOCOL.md 19).
    evidence: Box<dyn EvidenceSource>,
    /// Rung when a challenge is refused for a device out of service, so that the server stops
    /// at once rather than at its watcher's next tick.
    device_alarm: DeviceAlarm,
}

impl MinerCore {
    pub fn new(
        identity: KeyPair,
        allowed: HashSet<PublicKey>,
        limits: Limits,
        selected: SelectedBackend,
        keep_commitments: Duration,
        nonces: NonceLog,
    ) -> Self {
        let evidence = crate::evidence::for_backend(selected.is_cuda());
        MinerCore {
            evidence,
            identity,
            allowed: RwLock::new(allowed),
            limits,
            selected,
            devices: Arc::new(tokio::sync::Mutex::new(())),
            nonces: Mutex::new(nonces),
            recent: Mutex::new(VecDeque::new()),
            keep_commitments,
            metrics: MinerMetrics::default(),
            stopping: AtomicBool::new(false),
            working: Arc::new(AtomicUsize::new(0)),
            device_alarm: DeviceAlarm::default(),
        }
    }

    /// What a refusal for a device out of service rings (see [`crate::server::serve`]).
    pub fn device_alarm(&self) -> &DeviceAlarm {
        &self.device_alarm
    }

    /// Takes device evidence from `source` instead of the backend's own (a test's PKI).
    pub fn with_evidence(mut self, source: Box<dyn EvidenceSource>) -> Self {
        self.evidence = source;
        self
    }

    pub fn metrics(&self) -> &MinerMetrics {
        &self.metrics
    }

    /// Every device's evidence for an accepted challenge, each asked with its own SPDM nonce,
    /// and this miner's signature over the evidence statement (PROTOCOL.md 19.2 and 19.3).
    pub fn gather_evidence(&self, accepted: &AcceptedChallenge) -> Signed<Vec<DeviceEvidence>> {
        let challenge = &accepted.challenge;
        let devices = self.selected.devices();
        let nonces = spdm_nonces(challenge, devices.len());
        // The driver is trusted, but a wrapper that slices by a size it reports must not take
        // the challenge down with it: a panic here is a device that offers nothing.
        let gathered =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.evidence.gather(&devices, &nonces)));
        let evidence: Vec<DeviceEvidence> = match gathered {
            Ok(evidence) if evidence.len() == devices.len() => evidence.into_iter().map(within_wire_limits).collect(),
            Ok(_) | Err(_) => {
                tracing::warn!("device evidence could not be gathered; every device offers none");
                devices
                    .iter()
                    .map(|d| DeviceEvidence::not_offered(d.index, CcState::Unspecified))
                    .collect()
            }
        };
        let statement = evidence_statement_bytes(
            &challenge.params.nonce,
            &self.public_key().0,
            &challenge.validator_key.0,
            &evidence,
        );
        Signed {
            signature: self.identity.sign(&statement),
            statement: evidence,
        }
    }

    pub fn public_key(&self) -> PublicKey {
        self.identity.public_key()
    }

    /// Replaces the allow-list (config reload); returns how many validators it now holds.
    pub fn set_allowed(&self, allowed: HashSet<PublicKey>) -> usize {
        let mut current = self.allowed.write().unwrap_or_else(|p| p.into_inner());
        *current = allowed;
        current.len()
    }

    /// Whether the allow-list holds `key`: challenges and open requests signed by any other
    /// validator are refused.
    pub fn is_allowed(&self, key: &PublicKey) -> bool {
        self.allowed.read().unwrap_or_else(|p| p.into_inner()).contains(key)
    }

    pub fn backend(&self) -> &SelectedBackend {
        &self.selected
    }

    /// The hardware this miner computes on, as its inventory and commitments name it.
    pub fn claim(&self) -> HardwareClaim {
        HardwareClaim {
            backend: self.selected.name.clone(),
            kernel: self.selected.kernel.clone(),
            devices: self.selected.devices(),
        }
    }

    /// The protocol version this miner speaks: 3 (the memory phase) where its backend can hold
    /// pools, 2 otherwise (PROTOCOL.md 14.2).
    pub fn protocol_version(&self) -> u32 {
        if self.selected.backend.holds_pools() {
            PROTOCOL_VERSION
        } else {
            MIN_PROTOCOL_VERSION
        }
    }

    pub fn inventory(&self) -> Inventory {
        Inventory {
            miner_key: self.public_key(),
            claim: self.claim(),
            protocol_version: self.protocol_version(),
            software_version: env!("CARGO_PKG_VERSION").to_string(),
            takes_finish_by: self.limits.work_past_deadline,
            limits: MinerLimits {
                max_n: self.limits.max_n,
                max_chains: self.limits.max_chains,
                max_iterations: self.limits.max_iterations,
                max_duration_ms: self.limits.max_duration_secs.saturating_mul(1000),
                max_samples: self.limits.max_samples,
            },
        }
    }

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
        if challenge.memory.is_some() && !self.selected.backend.holds_pools() {
            return Err(MinerError::MemoryPhaseUnsupported(self.selected.name.clone()));
        }
        let pool_plan = challenge
            .memory
            .map(|memory| PoolPlan::new(memory, &work, &self.selected.devices()))
            .transpose()?;
        if self.stopping.load(Ordering::SeqCst) {
            return Err(MinerError::Stopping);
        }
        let out_of_service = self.selected.backend.out_of_service();
        if !out_of_service.is_empty() {
            self.device_alarm.ring();
            return Err(MinerError::OutOfService(out_of_service));
        }
        let stop_at_ms = self.stop_at_ms(&challenge);
        self.check_limits(&challenge, &work, stop_at_ms, now_ms)?;
        let devices = self.devices.clone().try_lock_owned().map_err(|_| MinerError::Busy)?;
        if let Some(waiting) = self.awaiting_openings(&challenge.validator_key) {
            return Err(MinerError::AwaitingOpenings(waiting));
        }
        // Earlier commitments' pools go now: no other validator waits on them (just checked),
        // and on a GPU they hold the memory this challenge's chains and pools are sized from.
        self.release_pools();
        self.selected
            .backend
            .check_capacity(&work)
            .map_err(MinerError::NoRoom)?;
        if let Some(plan) = &pool_plan {
            plan.check_capacity(self.selected.backend.as_ref())
                .map_err(MinerError::NoRoom)?;
        }
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
            pool_plan,
            pools: None,
            accepted_at: Instant::now(),
            _devices: devices,
        })
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

    /// Frees the pools of every kept commitment.
    fn release_pools(&self) {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        for r in recent.iter() {
            if let Some(memory) = &r.memory {
                memory.release();
            }
        }
    }

    /// Ends what a commitment holds once its one opening round is over: nothing may read its
    /// pools after that (a second open request is refused, and the walk came before the round),
    /// so they are freed now rather than when the commitment expires (`keep_commitments_secs`).
    /// Kept until expiry, every recent challenge's pools were held at once, and an hour-long
    /// soak saw the miners' memory rise in steps. The commitment itself stays, so the hold
    /// spacing still sees it and a repeated open request still gets "already opened".
    pub fn finish_round(&self, recent: &RecentCommitment) {
        if let Some(memory) = &recent.memory {
            memory.release();
        }
    }

    /// How many kept commitments still hold their pools: those awaiting their walk or opening
    /// round, or kept by a validator that never opens (the full policy) until they expire or
    /// another challenge needs the memory.
    pub fn commitments_holding_pools(&self) -> usize {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent
            .iter()
            .filter(|r| r.memory.as_ref().is_some_and(HeldMemory::holds_pools))
            .count()
    }

    /// Another validator whose fresh commitment has not been opened yet, if any. Only a
    /// validator's newest commitment holds: one that has committed again since has moved on.
    fn awaiting_openings(&self, asking: &PublicKey) -> Option<PublicKey> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent
            .iter()
            .enumerate()
            .find(|&(i, r)| {
                r.holds
                    && r.validator_key != *asking
                    && !r.opened.load(Ordering::SeqCst)
                    && r.held_for() < OPENING_HOLD
                    && !recent
                        .iter()
                        .skip(i + 1)
                        .any(|later| later.validator_key == r.validator_key)
            })
            .map(|(_, r)| r.validator_key)
    }

    /// Runs the accepted work on every device (blocking: call it from a blocking thread).
    pub fn execute(
        &self,
        accepted: &AcceptedChallenge,
        progress: &(dyn Fn(DeviceProgress) + Sync),
        cancel: &CancelToken,
    ) -> Result<Execution, MinerError> {
        Ok(engine::execute(
            self.selected.backend.as_ref(),
            &accepted.work,
            progress,
            cancel,
        )?)
    }

    /// Fills the pools of a version 3 challenge (blocking; after [`MinerCore::execute`], in the
    /// memory the chains no longer need) and keeps them in `accepted`. Nothing for version 2.
    pub fn fill(
        &self,
        accepted: &mut AcceptedChallenge,
        progress: &(dyn Fn(u32, u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<(), MinerError> {
        if let Some(plan) = &accepted.pool_plan {
            let pools = plan
                .fill(self.selected.backend.as_ref(), progress, cancel)
                .map_err(|e| match e {
                    BackendError::Cancelled => MinerError::Engine(engine::EngineError::Backend(e)),
                    other => MinerError::Fill(other),
                })?;
            accepted.pools = Some(pools);
        }
        Ok(())
    }

    /// The commitment statement for an execution (and the pools [`MinerCore::fill`] kept),
    /// before signing.
    pub fn statement(&self, accepted: &AcceptedChallenge, execution: &Execution, compute_ms: u64) -> Commitment {
        Commitment {
            work: execution.commitment.clone(),
            miner_key: self.public_key(),
            validator_key: accepted.challenge.validator_key,
            inventory: self.selected.devices(),
            backend: self.selected.name.clone(),
            kernel: self.selected.kernel.clone(),
            compute_ms,
            pools: accepted.pools.as_deref().map(pool_commitments),
        }
    }

    pub fn sign_commitment(&self, statement: &Commitment) -> Signed<Commitment> {
        Signed {
            signature: statement.sign(&self.identity),
            statement: statement.clone(),
        }
    }

    /// Keeps an execution openable by the challenge's validator, and releases the devices.
    pub fn remember(&self, mut accepted: AcceptedChallenge, execution: Execution) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|r| r.stored_at.elapsed() < self.keep_commitments);
        let validator_key = accepted.challenge.validator_key;
        let holds = recent
            .iter()
            .rev()
            .find(|r| r.validator_key == validator_key)
            .is_none_or(|previous| previous.stored_at.elapsed() >= HOLD_SPACING);
        let memory = match (accepted.pool_plan.as_ref(), accepted.pools.take()) {
            (Some(plan), Some(pools)) => Some(HeldMemory::new(plan.params, pools)),
            _ => None,
        };
        let entry = Arc::new(RecentCommitment {
            nonce: accepted.challenge.params.nonce,
            validator_key,
            computed_in: accepted.accepted_at.elapsed(),
            hold_from: Mutex::new(Instant::now()),
            memory,
            work: accepted.work,
            execution,
            stored_at: Instant::now(),
            opened: AtomicBool::new(false),
            holds,
        });
        while recent.len() >= MAX_RECENT_COMMITMENTS {
            recent.pop_front();
        }
        recent.push_back(entry);
    }

    /// Signs, remembers and returns the commitment for an honest execution.
    pub fn commit(&self, accepted: AcceptedChallenge, execution: Execution, compute_ms: u64) -> Signed<Commitment> {
        let signed = self.sign_commitment(&self.statement(&accepted, &execution, compute_ms));
        self.remember(accepted, execution);
        signed
    }

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
            signature,
        } = request;
        if samples.is_empty() && walks.is_empty() {
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
        let recent = self.recent_commitment(&nonce)?;
        if validator_key != recent.validator_key.0 || !self.is_allowed(&recent.validator_key) {
            return Err(MinerError::OpenNotAllowed);
        }
        let signed = match &recent.memory {
            Some(_) => open_request_bytes_v3(&nonce, &samples, &walks),
            None => open_request_bytes(&nonce, &samples),
        };
        recent
            .validator_key
            .verify(&signed, &signature)
            .map_err(|_| MinerError::BadOpenSignature)?;
        for &sample in &samples {
            check_sample(&recent.work, sample)?;
        }
        match &recent.memory {
            Some(memory) => memory.check_samples(&walks)?,
            None if !walks.is_empty() => return Err(MinerError::NoMemoryPhase(hex::encode(nonce))),
            None => {}
        }
        if recent.opened.swap(true, Ordering::SeqCst) {
            return Err(MinerError::AlreadyOpened(hex::encode(nonce)));
        }
        Ok(OpenRound {
            recent,
            chains: samples,
            walks,
        })
    }

    /// Checks a decoded walk request (PROTOCOL.md 18.4) as an open request is checked: for a
    /// recent commitment of ours, from its validator while still allowed, correctly signed,
    /// for a version 3 commitment, and the first such request. Passing uses up the walk.
    pub fn check_walk_request(&self, request: WalkRequest) -> Result<(Arc<RecentCommitment>, WalkRequest), MinerError> {
        let recent = self.recent_commitment(&request.nonce)?;
        if request.validator_key != recent.validator_key.0 || !self.is_allowed(&recent.validator_key) {
            return Err(MinerError::OpenNotAllowed);
        }
        recent
            .validator_key
            .verify(
                &walk_request_bytes(&request.nonce, &request.walk_seed, request.deadline_ms),
                &request.signature,
            )
            .map_err(|_| MinerError::BadWalkSignature)?;
        let memory = recent
            .memory
            .as_ref()
            .ok_or_else(|| MinerError::NoMemoryPhase(hex::encode(request.nonce)))?;
        if !memory.claim_walk() {
            return Err(MinerError::AlreadyWalked(hex::encode(request.nonce)));
        }
        Ok((recent, request))
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
            .as_ref()
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
        *recent.hold_from.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        Ok(Signed {
            signature: self.identity.sign(&statement.signing_bytes()),
            statement,
        })
    }

    /// A kept commitment by its nonce.
    fn recent_commitment(&self, nonce: &[u8; 32]) -> Result<Arc<RecentCommitment>, MinerError> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent
            .iter()
            .find(|r| r.nonce == *nonce && r.stored_at.elapsed() < self.keep_commitments)
            .cloned()
            .ok_or_else(|| MinerError::UnknownCommitment(hex::encode(nonce)))
    }

    /// Builds and signs one walk opening (blocking: copies the segment's entries).
    pub fn open_walk(&self, recent: &RecentCommitment, sample: WalkSample) -> Result<SignedOpening, MinerError> {
        let memory = recent
            .memory
            .as_ref()
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

    /// How long a commitment is kept for its opening round (`keep_commitments_secs`).
    pub fn keep_commitments(&self) -> Duration {
        self.keep_commitments
    }

    /// Counts a challenge or an opening round as running until the guard drops: what stopping
    /// waits for.
    pub fn work_started(&self) -> WorkRunning {
        self.working.fetch_add(1, Ordering::SeqCst);
        WorkRunning(self.working.clone())
    }

    /// Ends work counted by `running` and, once no other challenge or round runs, hands the
    /// memory it freed back to the system ([`gpu_attest_daemon::allocator::release_free_memory`]).
    /// Only for work an allowed validator asked for: a refused request just drops its guard, so
    /// a stranger's requests cannot make the miner walk its arenas again and again.
    ///
    /// Why: a round frees its matrices and messages below blocks that outlive it (the kept
    /// commitment, the next connection's buffers), where the allocator cannot give them back,
    /// and the hour-long soak (BENCHMARKS.md) saw honest miners' resident memory creep up by
    /// such blocks for the whole hour.
    pub fn work_ended(&self, running: WorkRunning) {
        drop(running);
        if self.working.load(Ordering::SeqCst) == 0 {
            let started = Instant::now();
            let released = gpu_attest_daemon::allocator::release_free_memory();
            tracing::debug!(
                released,
                micros = started.elapsed().as_micros() as u64,
                "idle: free memory handed back to the system"
            );
        }
    }

    /// Stops taking challenges, then waits, up to `within`, for the challenge in flight to be
    /// committed and its opening round to run: a miner restarted mid-challenge would otherwise
    /// fail an attestation it has done the work for. A commitment counts as awaiting its round
    /// for [`OPENING_HOLD`] (a full-policy validator never opens). Returns whether all of it
    /// finished in time.
    pub async fn settle(&self, within: Duration) -> bool {
        self.stopping.store(true, Ordering::SeqCst);
        let until = Instant::now() + within;
        loop {
            let awaiting = {
                let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
                recent
                    .iter()
                    .any(|r| !r.opened.load(Ordering::SeqCst) && r.held_for() < OPENING_HOLD)
            };
            if self.working.load(Ordering::SeqCst) == 0 && !awaiting {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the devices (openings queue behind a running challenge instead of failing).
    pub async fn lock_devices(&self) -> OwnedMutexGuard<()> {
        self.devices.clone().lock_owned().await
    }
}

impl RecentCommitment {
    /// How long this commitment has held the devices for its validator so far.
    fn held_for(&self) -> Duration {
        self.hold_from.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }
}

/// A challenge or opening round running on a [`MinerCore`] ([`MinerCore::work_started`]).
pub struct WorkRunning(Arc<AtomicUsize>);

impl Drop for WorkRunning {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
