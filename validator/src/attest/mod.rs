//! One attestation, start to finish: inventory, plan, signed challenge, the challenge stream,
//! commitment checks, sampled or full verification, stored verdict.
//!
//! Failures before the challenge is sent (unreachable, not a miner, nothing to plan) and a
//! refusal within the accept window are errors and store no verdict; once the miner has accepted,
//! or the window has passed, every outcome is a verdict, pass or fail, with all its reasons.
//!
//! - [`client`]: the one connection to the miner, and wire types turned into the engine's;
//!   [`decoding`]: a message this validator could not decode, told from a miner's status.
//! - [`exchange`]: the challenge stream, each event checked against the plan.
//! - [`verify`]: the commitment's checks and the verification of the work.
//! - [`outcome`]: the verdict being assembled.
//! - [`retest`]: the one retest a miss just past the deadline gets.
//! - [`walk`]: version 3's memory walk and its openings; [`walk_v4`]: version 4's walk, timed
//!   per device, and its step checks.

pub mod client;
pub mod decoding;
pub mod exchange;
pub mod locality;
pub mod outcome;
pub mod retest;
pub mod verify;
pub mod walk;
pub mod walk_v4;

pub use client::{MAX_MINER_MESSAGE_BYTES, normalise_url};

use crate::config::{Policy, ValidatorConfig};
use crate::device_identity::{check_commitment_evidence, check_part_reuse};
use crate::metrics::{Phase, ValidatorMetrics};
use crate::planner::{MemoryPhasePlan, Plan, PlanError, classes, plan};
use crate::rates::RateBook;
use crate::store::{ClassObservation, Kept, Store, StoreError};
use crate::transcript::{RecordedPlan, Recorder};
use crate::verdict::Verdict;
use crate::verdict::class::homogeneous;
use crate::verdict::class::{walk_class, walk_v4_class};
use client::MinerConnection;
use exchange::{AcceptWindow, Committed, Received, StreamRead, await_commitment, window_missed};
use gpu_attest_shared::engine::DeviceProgress;
use gpu_attest_shared::evidence::EvidenceTrust;
use gpu_attest_shared::inventory::{HardwareClaim, Inventory, InventoryError};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::statement::memory_v4::StepSample;
use gpu_attest_shared::statement::{Challenge, Commitment};
use gpu_attest_shared::{Backend, Work};
use locality::LocalityAsk;
use outcome::Outcome;
use rand_chacha::rand_core::SeedableRng;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::Code;
use walk::WalkContext;
use walk_v4::StatesWalk;

/// What the memory phase's walk left to open after the chains.
enum Walked {
    /// Nothing: the challenge had no memory phase, the verdict had failed before the walk, or
    /// the walk itself failed (the outcome says why).
    Nothing,
    /// Version 3's walk, whose segments are drawn once it is checked.
    V3(WalkContext),
    /// Version 4's walked states, and the steps drawn to open.
    V4(StatesWalk, Vec<StepSample>),
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What an attestation reports while it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttestEvent {
    Phase { name: &'static str, detail: String },
    Progress(DeviceProgress),
}

#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error("invalid miner URL {url:?}: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("cannot reach miner at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    /// A bound on one network step passed (`deadline.connect_ms`): not an answer, wrong or right.
    #[error("miner at {url} timed out: {detail}")]
    TimedOut { url: String, detail: String },
    #[error("{url} is not a gpu-attest miner ({detail})")]
    NotAMiner { url: String, detail: String },
    #[error("miner at {url} cannot be attested: {source}")]
    Inventory { url: String, source: InventoryError },
    #[error("cannot plan a challenge for {url}: {source}")]
    Plan { url: String, source: PlanError },
    #[error("miner at {url} refused the challenge ({code:?}): {message}")]
    Refused { url: String, code: Code, message: String },
    #[error(
        "miner at {url} presents key {presented}, but it is registered with {registered}; register it again with replace_key set (`validator miners add --replace-key`) to accept the new key"
    )]
    KeyChanged {
        url: String,
        registered: PublicKey,
        presented: PublicKey,
    },
    #[error("this validator could not verify: {0}")]
    Verify(String),
    #[error("miner at {url} changed its {what} between a run and its retest; the first run's verdict stands")]
    RetestChanged { url: String, what: &'static str },
    #[error(transparent)]
    Transport(#[from] gpu_attest_daemon::tls::TransportError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

impl AttestError {
    /// A short name for the kind of failure, for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            AttestError::BadUrl { .. } => "bad-url",
            AttestError::Unreachable { .. } => "unreachable",
            AttestError::TimedOut { .. } => "timed-out",
            AttestError::NotAMiner { .. } => "not-a-miner",
            AttestError::Inventory { .. } => "inventory",
            AttestError::Plan { .. } => "plan",
            AttestError::Refused { .. } => "refused",
            AttestError::KeyChanged { .. } => "key-changed",
            AttestError::Verify(_) => "verify",
            AttestError::RetestChanged { .. } => "retest-changed",
            AttestError::Transport(_) => "transport",
            AttestError::Store(_) => "store",
            AttestError::Random(_) => "random",
        }
    }
}

pub struct Attestor {
    identity: KeyPair,
    config: ValidatorConfig,
    backend: Arc<dyn Backend>,
    backend_is_gpu: bool,
    store: Arc<Store>,
    metrics: ValidatorMetrics,
    /// The roots and tables device evidence is checked against (PROTOCOL.md 19.4).
    evidence_trust: EvidenceTrust,
    /// The miners the scheduler could not attest lately (`miners list` shows them).
    backoffs: crate::backoffs::Backoffs,
}

pub(crate) fn random32() -> Result<[u8; 32], AttestError> {
    let mut out = [0u8; 32];
    getrandom::fill(&mut out).map_err(|e| AttestError::Random(e.to_string()))?;
    Ok(out)
}

impl Attestor {
    pub fn new(
        identity: KeyPair,
        config: ValidatorConfig,
        backend: Arc<dyn Backend>,
        backend_is_gpu: bool,
        store: Arc<Store>,
    ) -> Self {
        let evidence_trust = config.identity.trust();
        Attestor {
            identity,
            config,
            backend,
            backend_is_gpu,
            store,
            metrics: ValidatorMetrics::default(),
            evidence_trust,
            backoffs: crate::backoffs::Backoffs::default(),
        }
    }

    /// Trusts device evidence that chains to `anchors` instead of NVIDIA's root: for tests that
    /// stand a PKI of their own in for NVIDIA's.
    pub fn with_evidence_anchors(mut self, anchors: gpu_attest_shared::evidence::TrustAnchors) -> Self {
        self.evidence_trust.anchors = anchors;
        self
    }

    pub fn metrics(&self) -> &ValidatorMetrics {
        &self.metrics
    }

    pub fn backoffs(&self) -> &crate::backoffs::Backoffs {
        &self.backoffs
    }

    pub fn public_key(&self) -> PublicKey {
        self.identity.public_key()
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn config(&self) -> &ValidatorConfig {
        &self.config
    }

    /// The verification backend's devices that faulted and could not be reset, with the reason
    /// of each: verifying on them is impossible until the process restarts.
    pub fn out_of_service(&self) -> Vec<(u32, String)> {
        self.backend.out_of_service()
    }

    fn policy(&self) -> Policy {
        match self.config.policy {
            Policy::Auto if self.backend_is_gpu => Policy::Full,
            Policy::Auto => Policy::Sampled,
            other => other,
        }
    }

    /// Fetches and checks a miner's inventory, with whether the miner says it allows this
    /// validator (registration uses both).
    pub async fn inventory(
        &self,
        url: &str,
    ) -> Result<(Inventory, gpu_attest_proto::v1::ValidatorStanding), AttestError> {
        let url = normalise_url(url);
        check_url(&url)?;
        MinerConnection::connect(&url, &self.config)
            .await?
            .inventory(self.public_key())
            .await
    }

    /// Attests the miner at `url` and stores the verdict.
    pub async fn attest(
        &self,
        url: &str,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<Verdict, AttestError> {
        let result = self.attest_timed(url, on_event).await;
        // Only registered miners get a rate series of their own: a URL attested once through
        // the API must not add one for good.
        let registered = match &result {
            Ok(v) => matches!(self.store.miner(&v.miner_url).await, Ok(Some(_))),
            Err(_) => false,
        };
        self.metrics
            .attested(result.as_ref().map_err(AttestError::kind), registered);
        result
    }

    async fn attest_timed(
        &self,
        url: &str,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<Verdict, AttestError> {
        let url = normalise_url(url);
        // A URL registered before its form was checked is still attested as it was registered.
        if let Err(bad) = check_url(&url)
            && self.store.miner(&url).await?.is_none()
        {
            return Err(bad);
        }
        let mut first_run = self.run_once(&url, None, on_event).await?;
        let first_record = first_run.take_record();
        let first = first_run.into_verdict(now_ms());
        let (verdict, record) = match retest::due(&first, &self.config.deadline) {
            None => (first, first_record),
            Some(why) => self.retest(&url, first, first_record, why, on_event).await,
        };
        let started = Instant::now();
        let mut stored = self.store_verdict(verdict, on_event).await;
        if let Ok(verdict) = &mut stored {
            verdict.transcript_bytes = self.keep_transcript(verdict, record).await;
        }
        self.metrics.phase(Phase::Store, started.elapsed());
        stored
    }

    /// Seals and keeps the stored `verdict`'s transcript where `[transcripts]` says to, and
    /// returns its size once kept. A transcript that cannot be kept is logged, never lost
    /// silently, and never costs the verdict.
    async fn keep_transcript(&self, verdict: &Verdict, (recorder, plan): (Recorder, RecordedPlan)) -> Option<u64> {
        let config = &self.config.transcripts;
        if !config.keeps(verdict.passed) {
            return None;
        }
        let transcript = match recorder.into_transcript(verdict, &plan) {
            Ok(transcript) => transcript,
            Err(e) => {
                tracing::error!(verdict = verdict.id, error = %e, "transcript could not be written");
                return None;
            }
        };
        let sealed = match crate::transcript::seal_readable(&transcript, &self.identity) {
            Ok(sealed) => sealed,
            Err(e) => {
                // Keeping it would promise an audit that no reader of this release can run: a
                // host of more devices than PROTOCOL.md 21.1's limits hold at this challenge.
                tracing::warn!(
                    verdict = verdict.id,
                    error = %e,
                    "transcript not kept: `validator audit` could not read it (a host of about 15 GPUs or more opened at first contact; fewer `samples`, or the miner's class learned, make it smaller)"
                );
                return None;
            }
        };
        drop(transcript);
        let size = sealed.len() as u64;
        match self
            .store
            .keep_transcript(verdict.id, &sealed, config.budget_bytes(), now_ms())
            .await
        {
            Ok(Kept::Yes { evicted }) => {
                if evicted > 0 {
                    tracing::info!(
                        verdict = verdict.id,
                        evicted,
                        "older transcripts dropped to keep within transcripts.budget_mib"
                    );
                }
                Some(size)
            }
            Ok(Kept::OverBudget { size }) => {
                tracing::warn!(
                    verdict = verdict.id,
                    size,
                    budget_mib = config.budget_mib,
                    "transcript larger than the whole transcripts.budget_mib: not kept"
                );
                None
            }
            Err(e) => {
                tracing::error!(verdict = verdict.id, error = %e, "transcript could not be stored");
                None
            }
        }
    }

    /// A miss within the retest band, retested with a fresh challenge (PROTOCOL.md 14.7): the
    /// retest's verdict, which records the first run, or the first run's when the retest could
    /// not run (it loses nothing).
    async fn retest(
        &self,
        url: &str,
        first: Verdict,
        first_record: (Recorder, RecordedPlan),
        why: String,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> (Verdict, (Recorder, RecordedPlan)) {
        // Logged, since a scheduled attestation shows its phases to nobody.
        tracing::info!(miner = %url, reason = %why, "retesting a miss within the retest band");
        on_event(AttestEvent::Phase {
            name: "retest",
            detail: why,
        });
        match self.run_once(url, Some(&first), on_event).await {
            Ok(mut second) => {
                let record = second.take_record();
                let mut second = second.into_verdict(now_ms());
                second.first_run = Some((&first).into());
                self.metrics.retested(if second.passed { "pass" } else { "fail" });
                (second, record)
            }
            Err(e) => {
                tracing::warn!(miner = %url, error = %e, "the retest could not run; the first run's verdict is stored");
                self.metrics.retested("error");
                (first, first_record)
            }
        }
    }

    /// One challenge to `url`, from its inventory to its verified outcome, not yet stored. A
    /// retest (`first`: the run it would replace) must find the same key and hardware claim: a
    /// verdict records one miner's runs, never another's miss beside its pass.
    async fn run_once(
        &self,
        url: &str,
        first: Option<&Verdict>,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<Outcome, AttestError> {
        let mut clock = Instant::now();
        let mut lap = |phase: Phase| {
            let now = Instant::now();
            self.metrics.phase(phase, now - clock);
            clock = now;
        };
        let url = url.to_string();
        let mut miner = MinerConnection::connect(&url, &self.config).await?;
        let (inventory, _) = miner.inventory(self.public_key()).await?;
        self.check_known_key(&url, inventory.miner_key).await?;
        if let Some(first) = first {
            let changed = |what| AttestError::RetestChanged { url: url.clone(), what };
            if inventory.miner_key.to_string() != first.miner_key {
                return Err(changed("key"));
            }
            if inventory.claim != first.claim() {
                return Err(changed("hardware claim"));
            }
        }
        let plan = self.plan(&url, &inventory).await?;
        let challenge = self.challenge(&plan);
        announce(&plan, on_event);
        let mut outcome = Outcome::new(&url, &plan, self.policy());
        if self.config.transcripts.keep == crate::config::transcripts::KeepTranscripts::None {
            outcome.transcript = Recorder::off();
        }
        if matches!(plan.memory, MemoryPhasePlan::V4(_)) {
            outcome.record_v4_settings(&crate::planner::v4_settings(&self.config, &plan.claim.backend));
        }
        lap(Phase::Prepare);
        let committed = self
            .exchange(&mut miner, &challenge, &plan, &mut outcome, on_event)
            .await?;
        lap(Phase::Challenge);
        if let Some(committed) = committed {
            self.verify(&mut miner, &challenge, &committed, &mut outcome, on_event)
                .await?;
            lap(Phase::Verify);
        }
        Ok(outcome)
    }

    /// A revoked key is never attested, and a registered URL must present its registered key.
    async fn check_known_key(&self, url: &str, presented: PublicKey) -> Result<(), AttestError> {
        self.store.check_not_revoked(&presented).await?;
        match self.store.miner(url).await? {
            Some(registered) if registered.miner_key != presented => Err(AttestError::KeyChanged {
                url: url.into(),
                registered: registered.miner_key,
                presented,
            }),
            _ => Ok(()),
        }
    }

    /// Plans the challenge with a nonce recorded as issued first, so it is never used twice.
    async fn plan(&self, url: &str, inventory: &Inventory) -> Result<Plan, AttestError> {
        let nonce = loop {
            let candidate = random32()?;
            if self.store.claim_nonce(&candidate, url, now_ms()).await? {
                break candidate;
            }
        };
        let sampled = self.policy() != Policy::Full;
        let rates = RateBook::load(
            &self.store,
            &self.config,
            classes(&inventory.claim, &self.config),
            now_ms(),
        )
        .await?;
        // On a blocking thread: sizing a version 4 walk's openings searches the memory bound,
        // a fraction of a second per new clock, which must not stall the walks of other
        // attestations whose roots this runtime is timing.
        let (inventory, config, seed) = (inventory.clone(), self.config.clone(), random32()?);
        let planned = tokio::task::spawn_blocking(move || plan(&inventory, &config, &rates, sampled, nonce, seed))
            .await
            .map_err(|e| AttestError::Verify(format!("planning stopped: {e}")))?;
        planned.map_err(|source| AttestError::Plan {
            url: url.into(),
            source,
        })
    }

    /// Whether this miner's passes count towards calibration
    /// ([`CalibrationConfig::registered_only`](crate::config::calibration::CalibrationConfig)).
    async fn teaches(&self, url: &str, key: [u8; 32]) -> Result<bool, StoreError> {
        if !self.config.calibration.registered_only {
            return Ok(true);
        }
        Ok(self.store.miner(url).await?.is_some_and(|m| m.miner_key.0 == key))
    }

    fn challenge(&self, plan: &Plan) -> Challenge {
        let issued_at_ms = now_ms();
        Challenge {
            params: plan.params,
            issued_at_ms,
            deadline_ms: issued_at_ms.saturating_add(plan.deadline_ms),
            validator_key: self.public_key(),
            inventory_digest: plan.claim.digest(),
            memory: plan.memory.challenge_phase(),
            finish_by_ms: (plan.finish_by_ms > 0).then(|| issued_at_ms.saturating_add(plan.finish_by_ms)),
        }
    }

    /// Sends the challenge and waits for the commitment, timing it on this validator's clock.
    /// `Ok(None)`: the attestation has already failed (the outcome says why).
    async fn exchange(
        &self,
        miner: &mut MinerConnection,
        challenge: &Challenge,
        plan: &Plan,
        outcome: &mut Outcome,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<Option<Committed>, AttestError> {
        // The miner stops at the finish-by time (else the deadline) itself; the grace covers a
        // miner that does not.
        let wait_limit = Duration::from_millis(exchange::time_allowed_ms(plan.deadline_ms, plan.finish_by_ms));
        let signature = challenge.sign(&self.identity);
        outcome
            .transcript
            .challenge(gpu_attest_proto::convert::challenge_to_wire(challenge, &signature));
        let sent = Instant::now();
        let until = tokio::time::Instant::now() + wait_limit;
        let window = AcceptWindow::new(self.config.deadline.accept_ms, plan.deadline_ms);
        outcome
            .transcript
            .stream_started(window.length_ms(), wait_limit.as_millis() as u64);
        // A refusal here came within the window (the call is cut off at its end): an error,
        // no verdict. Silence past it is a verdict: the challenge stands issued.
        let (received, measured_ms) = match window.bound(miner.run_challenge(challenge, &signature)).await {
            // The stream goes at the end of this arm: a miner still computing is cancelled.
            Some(started) => {
                let mut stream = started?;
                let recorder = &mut outcome.transcript;
                await_commitment(miner.url(), &mut stream, plan, sent, until, &window, recorder, on_event).await?
            }
            None => {
                let after_us = sent.elapsed().as_micros() as u64;
                outcome
                    .transcript
                    .stream_read(StreamRead::WindowPassed.recorded(after_us), false);
                (Received::Failed(window_missed(window.length_ms())), after_us / 1000)
            }
        };
        // The time of the read that decided the stream, as the transcript records it.
        outcome.measured_ms = measured_ms;
        match received {
            Received::Failed(reason) => {
                outcome.reasons.push(reason);
                Ok(None)
            }
            Received::Unreadable(wire, reason) => {
                outcome.transcript.commitment(*wire, outcome.measured_ms);
                outcome.reasons.push(reason);
                Ok(None)
            }
            Received::Commitment(committed) => {
                outcome
                    .transcript
                    .commitment(committed.wire.clone(), outcome.measured_ms);
                let measured = outcome.measured_ms;
                on_event(AttestEvent::Phase {
                    name: "commitment-received",
                    detail: format!("after {measured} ms"),
                });
                if measured > plan.deadline_ms {
                    outcome.fail(crate::verdict::reason::ReasonCode::LateCommitment, late(measured, plan));
                }
                Ok(Some(*committed))
            }
        }
    }

    async fn verify(
        &self,
        miner: &mut MinerConnection,
        challenge: &Challenge,
        committed: &Committed,
        outcome: &mut Outcome,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<(), AttestError> {
        let (commitment, signature) = (&committed.commitment, &committed.signature);
        // The planner validated these parameters before the challenge was sent.
        let work = Work::new(challenge.params).map_err(|e| AttestError::Plan {
            url: outcome.url.clone(),
            source: PlanError::Params(e),
        })?;
        if !verify::check_statement(challenge, &work, commitment, signature, outcome) {
            return Ok(());
        }
        if outcome.may_prove() {
            // As the walk: a verdict that can no longer prove anything (it failed, other than as a
            // graded miss may) does not have its evidence read.
            self.check_identity(challenge, committed, outcome, on_event).await?;
        }
        let Some(walked) = self.walk(miner, &work, commitment, outcome, on_event).await? else {
            return Ok(());
        };
        let memory_openings = match &walked {
            Walked::V3(context) => Some(verify::MemoryOpenings::Segments(verify::WalkOpenings {
                context,
                samples: context.draw_samples(&mut rand_chacha::ChaCha20Rng::from_seed(random32()?)),
            })),
            Walked::V4(walked, steps) => Some(verify::MemoryOpenings::Steps(verify::StepOpenings {
                walked,
                steps: steps.clone(),
            })),
            Walked::Nothing => None,
        };
        if outcome.policy == Policy::Full && !outcome.may_prove() {
            // Re-execution costs this validator as much as the work: a miner that has already
            // failed (past the finish-by time, or naming other hardware) must not make it spend
            // that for nothing. A graded miss is re-executed: what it proves rests on it.
            on_event(AttestEvent::Phase {
                name: "verifying",
                detail: "Full policy: not re-executed, the verdict has already failed".into(),
            });
            return Ok(());
        }
        on_event(AttestEvent::Phase {
            name: "verifying",
            detail: format!("{:?} policy", outcome.policy),
        });
        let backend = self.backend.clone();
        let chains = match outcome.policy {
            Policy::Full => {
                verify::full(backend.clone(), &work, commitment, outcome, on_event).await?;
                // Re-execution covers the chains; the walk is checked by sampling whatever the
                // policy.
                0
            }
            _ => outcome.plan.samples,
        };
        if chains == 0 && memory_openings.is_none() {
            return Ok(());
        }
        verify::sampled(
            miner,
            &self.identity,
            backend,
            &work,
            commitment,
            chains,
            memory_openings,
            outcome,
        )
        .await
    }

    /// The memory phase's walk, of the challenge's version: `None` when the commitment has
    /// already failed it (the outcome says why), else what the walk left to open. A verdict
    /// that can no longer prove anything is not walked: the walk costs the miner seconds.
    async fn walk(
        &self,
        miner: &mut MinerConnection,
        work: &Work,
        commitment: &Commitment,
        outcome: &mut Outcome,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<Option<Walked>, AttestError> {
        let not_asked = || AttestEvent::Phase {
            name: "walking",
            detail: "not asked for: the verdict has already failed".into(),
        };
        if let Some(why) = pools_out_of_place(&outcome.plan.memory, commitment.pools.is_some()) {
            outcome.fail(crate::verdict::reason::ReasonCode::PoolNotCanonical, why);
            return Ok(None);
        }
        match outcome.plan.memory.clone() {
            MemoryPhasePlan::Off => Ok(Some(Walked::Nothing)),
            MemoryPhasePlan::V3(memory) => {
                if !walk::check_pools(commitment, &memory, outcome) {
                    return Ok(None);
                }
                if !outcome.may_prove() {
                    on_event(not_asked());
                    return Ok(Some(Walked::Nothing));
                }
                let context = walk::request_walk(miner, &self.identity, work, commitment, outcome, on_event).await?;
                Ok(Some(context.map_or(Walked::Nothing, Walked::V3)))
            }
            MemoryPhasePlan::V4(_) if !outcome.may_prove() => {
                on_event(not_asked());
                Ok(Some(Walked::Nothing))
            }
            MemoryPhasePlan::V4(pool) => {
                let walked = walk_v4::walk_states(
                    miner,
                    &self.identity,
                    work,
                    commitment,
                    &pool,
                    &mut outcome.reasons,
                    &mut outcome.transcript,
                    on_event,
                )
                .await?;
                let Some(mut walked) = walked else {
                    return Ok(Some(Walked::Nothing));
                };
                if let Some(proof) = outcome.memory.as_mut() {
                    // Each device's own time, and the slowest as the proof's one walk time.
                    for (j, device) in walked.devices.iter().enumerate() {
                        proof.record_device_walk(j, device.measured_us.div_ceil(1000).max(1));
                    }
                }
                // A verdict that can no longer prove anything is not asked, nor told why not.
                let ask = match outcome.may_prove() {
                    true => locality::locality_ask(&self.config.memory.locality, &outcome.plan.claim),
                    false => LocalityAsk::Off,
                };
                let ask = match ask {
                    LocalityAsk::NotAsked(why) => {
                        on_event(AttestEvent::Phase {
                            name: "locality",
                            detail: format!("not asked: {why}"),
                        });
                        None
                    }
                    LocalityAsk::Off => None,
                    LocalityAsk::Asked(plan) => Some(plan),
                };
                if let Some(plan) = ask {
                    let devices = walked.devices.iter().map(|d| (d.pool, d.committed)).collect();
                    let walked_lines = locality::walk_lines(
                        miner,
                        &self.identity,
                        work,
                        commitment,
                        &plan,
                        devices,
                        &mut outcome.transcript,
                        on_event,
                    )
                    .await?;
                    record_locality(outcome, walked_lines, on_event);
                }
                let steps = walked.draw_steps(&pool, &mut rand_chacha::ChaCha20Rng::from_seed(random32()?));
                outcome.transcript.walk_row_checked(walked.row_checked_steps());
                Ok(Some(Walked::V4(walked, steps)))
            }
        }
    }

    /// Device evidence under this validator's identity policy (PROTOCOL.md 19.4): before the
    /// walk, which a failure here saves the miner. The signature checks run on the blocking
    /// pool: a claim of many devices costs a few hundred of them.
    async fn check_identity(
        &self,
        challenge: &Challenge,
        committed: &Committed,
        outcome: &mut Outcome,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<(), AttestError> {
        let (config, trust, challenge_owned, commitment, claimed, evidence) = (
            self.config.identity.clone(),
            self.evidence_trust.clone(),
            challenge.clone(),
            committed.commitment.clone(),
            outcome.plan.claim.devices.clone(),
            committed.evidence.clone(),
        );
        let now = now_ms();
        outcome.transcript.evidence_checked(&config, now);
        let (mut proof, mut reasons) = tokio::task::spawn_blocking(move || {
            check_commitment_evidence(
                &config,
                &trust,
                &challenge_owned,
                &commitment,
                &claimed,
                &evidence,
                now / 1000,
            )
        })
        .await
        .map_err(|e| AttestError::Verify(format!("the evidence check failed: {e}")))?;
        if let Some(proof) = &mut proof {
            reasons.extend(
                check_part_reuse(
                    &self.store,
                    proof,
                    &challenge.params.miner_key,
                    now,
                    self.config.identity.part_reuse_ms(),
                )
                .await?,
            );
            on_event(AttestEvent::Phase {
                name: "identity",
                detail: format!(
                    "{} policy: {} of {} device(s) genuine",
                    proof.policy,
                    proof.genuine(),
                    proof.devices.len()
                ),
            });
        }
        outcome.identity = proof;
        outcome.reasons.extend(reasons);
        Ok(())
    }

    async fn store_verdict(
        &self,
        mut verdict: Verdict,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<Verdict, AttestError> {
        let claim = verdict.claim();
        // Written by into_verdict from the challenge's key, so it always reads back.
        let miner_key = PublicKey::from_hex(&verdict.miner_key)
            .ok_or_else(|| {
                AttestError::Verify(format!("the verdict's miner key {:?} is not a key", verdict.miner_key))
            })?
            .0;
        let observations = if self.teaches(&verdict.miner_url, miner_key).await? {
            learned_from(&verdict, &claim, miner_key)
        } else {
            Vec::new()
        };
        verdict.id = self
            .store
            .record_verdict(&verdict, &observations)
            .await
            .inspect_err(|e| {
                // The verdict would be lost with the error: the log keeps what it said.
                tracing::error!(
                    miner = %verdict.miner_url,
                    nonce = %verdict.nonce,
                    passed = verdict.passed,
                    reasons = ?verdict.reasons.iter().map(|r| r.code.as_str()).collect::<Vec<_>>(),
                    error = %e,
                    "verdict could not be stored"
                );
            })?;
        let summary = if verdict.passed {
            "pass".into()
        } else {
            verdict
                .reasons
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        };
        on_event(AttestEvent::Phase {
            name: "verdict",
            detail: summary,
        });
        Ok(verdict)
    }
}

/// What a locality walk adds to the outcome: each device's figures, nothing (a miner that
/// cannot walk lines), or the reason it failed.
pub fn record_locality(
    outcome: &mut Outcome,
    walked: locality::Walked,
    on_event: &(dyn Fn(AttestEvent) + Send + Sync),
) {
    match walked {
        Ok(Some(devices)) => {
            if let Some(proof) = outcome.memory.as_mut() {
                for (device, figures) in proof.devices.iter_mut().zip(devices) {
                    device.locality = Some(figures);
                }
            }
        }
        Ok(None) => on_event(AttestEvent::Phase {
            name: "locality",
            detail: "the miner cannot walk lines (UNIMPLEMENTED): the verdict records no locality walk".into(),
        }),
        Err(reason) => outcome.fail(reason.code, reason.message),
    }
}

/// A miner URL as this validator takes a new one: a scheme, a host and a port
/// ([`client::miner_url_problem`]).
fn check_url(url: &str) -> Result<(), AttestError> {
    match client::miner_url_problem(url) {
        Some(problem) => Err(AttestError::BadUrl {
            url: client::shown_url(url),
            detail: problem.into(),
        }),
        None => Ok(()),
    }
}

/// Why a commitment's pool list does not fit the challenge's memory phase (PROTOCOL.md 13.2,
/// 18.4, 20.8), if it does not: only a version 3 commitment names pools. Checked before the walk,
/// so that the version every later step speaks (the walk's request, the open request's signed
/// bytes) is the one the planner chose, never one told from what the commitment happens to carry.
pub fn pools_out_of_place(phase: &MemoryPhasePlan, names_pools: bool) -> Option<&'static str> {
    match phase {
        MemoryPhasePlan::Off if names_pools => {
            Some("the commitment names pools, but the challenge asked for no memory phase (PROTOCOL.md 13.2)")
        }
        MemoryPhasePlan::V4(_) if names_pools => Some(
            "the commitment names pools, but a version 4 challenge's pool is its chains' states (PROTOCOL.md 20.8)",
        ),
        _ => None,
    }
}

/// What a passing verdict teaches about its hardware classes: the class rate it proves per
/// unit (the fill counted at its weight), and the proven walk bandwidth per unit of each walk
/// class. A compute rate (and version 3's one walk time) is learned only from a claim of one
/// class, since a mixed claim's rate cannot be split between its classes; version 4 clocks each
/// device on its own, so each device teaches its own `walk-v4` class whatever sits beside it. A
/// failed verdict teaches nothing, a graded miss included (its rate is below what the class
/// must reach).
fn learned_from(verdict: &Verdict, claim: &HardwareClaim, miner_key: [u8; 32]) -> Vec<ClassObservation> {
    if !verdict.passed {
        return Vec::new();
    }
    let mut learned = Vec::new();
    let memory = verdict.memory.as_ref();
    if verdict.protocol_version >= 4 {
        // A version 4 walk is timed without the host: it must not raise the rate version 3
        // walks are timed at, nor be timed by theirs.
        for (device, walked) in claim.devices.iter().zip(memory.map_or(&[][..], |m| &m.devices)) {
            if let Some(rate) = walked.walk.as_ref().and_then(|w| w.proven_bytes_per_sec) {
                learned.push(ClassObservation {
                    class: walk_v4_class(claim, device, verdict.params.n),
                    miner_key,
                    ops_per_unit: rate / crate::verdict::class::units(&claim.backend, device),
                });
            }
        }
    }
    let Some((class, units)) = homogeneous(claim, verdict.params.n) else {
        return learned;
    };
    // The class's rate, not the plain operations over the time: a pass with pools spent most of
    // its time filling at n = 256, which the deadline timed at the fill's weight.
    if let Some(proven) = verdict.throughput.proven_class_rate() {
        learned.push(ClassObservation {
            class,
            miner_key,
            ops_per_unit: proven / units,
        });
    }
    let version_3_walk = memory
        .filter(|_| verdict.protocol_version == 3)
        .and_then(|m| m.proven_walk_bytes_per_sec);
    if let (Some(per_device), Some(device)) = (version_3_walk, claim.devices.first()) {
        // Every device walked the same bytes in the measured time; a unit is a core on CPUs.
        learned.push(ClassObservation {
            class: walk_class(claim, device),
            miner_key,
            ops_per_unit: per_device / crate::verdict::class::units(&claim.backend, device),
        });
    }
    learned
}

/// Why a commitment after the deadline fails, and whether its work still counts: by the
/// finish-by time it is verified and the verdict states the rate it proved; past it, nothing.
pub fn late(measured: u64, plan: &Plan) -> String {
    let late = format!(
        "commitment arrived after {measured} ms; the deadline was {} ms",
        plan.deadline_ms
    );
    match plan.finish_by_ms {
        0 => late,
        f if measured <= f => format!("{late} (by the finish-by time, {f} ms: the rate it proves is stated)"),
        f => format!("{late}, and past the finish-by time, {f} ms: it proves nothing"),
    }
}

fn announce(plan: &Plan, on_event: &(dyn Fn(AttestEvent) + Send + Sync)) {
    let p = &plan.params;
    on_event(AttestEvent::Phase {
        name: "challenge-sent",
        detail: format!(
            "n={} chains={} iterations={} checkpoint every {} on {} device(s); expected {} ms at {} ({}), deadline {} ms{}",
            p.n,
            p.num_chains,
            p.iterations,
            p.checkpoint_every,
            plan.claim.devices.len(),
            plan.expected_ms,
            crate::verdict::throughput::show_rate(plan.expectation.ops_per_sec),
            plan.expectation.basis(),
            plan.deadline_ms,
            match plan.finish_by_ms {
                0 => String::new(),
                f => format!(", finish-by {f} ms"),
            }
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::{MemoryPhasePlan, pools_out_of_place};

    #[test]
    fn a_commitment_naming_pools_to_a_challenge_without_a_memory_phase_is_refused() {
        let why = pools_out_of_place(&MemoryPhasePlan::Off, true).expect("pools out of place");
        assert!(why.contains("no memory phase"), "{why}");
        assert_eq!(pools_out_of_place(&MemoryPhasePlan::Off, false), None);
    }
}
