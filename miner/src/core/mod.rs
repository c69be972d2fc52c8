//! The miner's protocol logic, free of gRPC plumbing: accept a challenge, run it, sign the
//! commitment, answer openings. It takes and returns the protocol's own statements; the service
//! decodes requests before calling it and encodes what it returns (`crate::wire`). The service
//! calls these in order; tests that play a dishonest miner call them too and change one thing.

mod accept;
mod kept;
mod lines;
mod open;
mod running;

pub use accept::{AcceptedChallenge, AcceptedMemory};
pub use kept::{KeptCommitments, RecentCommitment};
pub use lines::{LinesRound, SignedSegment};
pub use open::OpenRound;
pub use running::{Running, WorkRunning};

use crate::backends::SelectedBackend;
use crate::config::Limits;
use crate::error::MinerError;
use crate::evidence::EvidenceSource;
use crate::memory::{HeldMemory, pool_commitments};
use crate::memory_v4::HeldChainPools;
use crate::metrics::MinerMetrics;
use crate::nonces::NonceLog;
use gpu_attest_daemon::devices::DeviceAlarm;
use gpu_attest_shared::engine::{self, DeviceProgress, Execution};
use gpu_attest_shared::evidence::{CcState, DeviceEvidence, evidence_statement_bytes, spdm_nonces};
use gpu_attest_shared::inventory::{HardwareClaim, Inventory, MinerLimits};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::memory::check::WalkOpening;
use gpu_attest_shared::memory::slice_walk::StepOpening;
use gpu_attest_shared::opening::ChainOpening;
use gpu_attest_shared::params::{MIN_PROTOCOL_VERSION, NEWEST_PROTOCOL_VERSION, PROTOCOL_VERSION};
use gpu_attest_shared::statement::Commitment;
use gpu_attest_shared::{BackendError, CancelToken};
use kept::{KeptMemory, ToKeep};
use std::collections::HashSet;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// One opening of a round (PROTOCOL.md 14.5, 18.5, 20.8).
#[derive(Clone, Debug)]
pub enum Opened {
    Chain(ChainOpening),
    Walk(WalkOpening),
    /// A version 4 walk step of device `device`.
    Step {
        device: u32,
        opening: StepOpening,
    },
}

/// An opening of commitment `nonce`, signed.
#[derive(Clone, Debug)]
pub struct SignedOpening {
    pub nonce: [u8; 32],
    pub opening: Opened,
    pub signature: [u8; 64],
}

pub struct MinerCore {
    identity: KeyPair,
    /// Replaced whole on reload (SIGHUP): removing a key revokes that validator at once, for
    /// new challenges and for openings alike.
    allowed: RwLock<HashSet<PublicKey>>,
    limits: Limits,
    selected: SelectedBackend,
    /// Accepted nonces with their deadlines; a nonce past its deadline cannot come back (the
    /// deadline check refuses it), so it can be forgotten then.
    nonces: Mutex<NonceLog>,
    kept: KeptCommitments,
    metrics: MinerMetrics,
    running: Running,
    /// Where device evidence comes from (PROTOCOL.md 19).
    evidence: Box<dyn EvidenceSource>,
    /// Rung when a challenge is refused for a device out of service, so that the server stops
    /// at once rather than at its watcher's next tick.
    device_alarm: DeviceAlarm,
    /// This miner's record of what it answered (`[answers]`); `None` when off.
    answers: Option<crate::answers::AnswerLog>,
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
            nonces: Mutex::new(nonces),
            kept: KeptCommitments::new(keep_commitments),
            metrics: MinerMetrics::default(),
            running: Running::default(),
            device_alarm: DeviceAlarm::default(),
            answers: None,
        }
    }

    /// Keeps a record of what this miner answers in `log`.
    pub fn with_answer_log(mut self, log: crate::answers::AnswerLog) -> Self {
        self.answers = Some(log);
        self
    }

    /// Records `message` of `kind` for challenge `nonce`, where the answer log is on.
    pub fn record_answer(&self, nonce: &[u8], kind: crate::answers::Kind, message: &impl prost::Message) {
        if let Some(log) = &self.answers {
            log.record(nonce, kind, message);
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
    /// pools, 2 otherwise (PROTOCOL.md 14.2); 4 where `protocol_4` is on (the default) and the
    /// backend keeps its chains' states (PROTOCOL.md 20).
    pub fn protocol_version(&self) -> u32 {
        let backend = &self.selected.backend;
        if self.limits.protocol_4 && backend.keeps_chain_pools() {
            NEWEST_PROTOCOL_VERSION
        } else if backend.holds_pools() {
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

    /// Runs the accepted work on every device (blocking: call it from a blocking thread). For a
    /// version 4 challenge the pool chains' final states are kept in `accepted`.
    pub fn execute(
        &self,
        accepted: &mut AcceptedChallenge,
        progress: &(dyn Fn(DeviceProgress) + Sync),
        cancel: &CancelToken,
    ) -> Result<Execution, MinerError> {
        let backend = self.selected.backend.as_ref();
        match &mut accepted.memory {
            AcceptedMemory::V4 { params, states } => {
                let kept = engine::execute_with_pools(backend, &accepted.work, &params.pool_chains, progress, cancel)?;
                *states = Some(kept.pools);
                Ok(kept.execution)
            }
            AcceptedMemory::None | AcceptedMemory::V3 { .. } => {
                Ok(engine::execute(backend, &accepted.work, progress, cancel)?)
            }
        }
    }

    /// Fills the pools of a version 3 challenge (blocking; after [`MinerCore::execute`], in the
    /// memory the chains no longer need) and keeps them in `accepted`. Nothing for version 2.
    pub fn fill(
        &self,
        accepted: &mut AcceptedChallenge,
        progress: &(dyn Fn(u32, u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<(), MinerError> {
        if let AcceptedMemory::V3 { plan, pools } = &mut accepted.memory {
            let filled = plan
                .fill(self.selected.backend.as_ref(), progress, cancel)
                .map_err(|e| match e {
                    BackendError::Cancelled => MinerError::Engine(engine::EngineError::Backend(e)),
                    other => MinerError::Fill(other),
                })?;
            *pools = Some(filled);
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
            pools: match &accepted.memory {
                AcceptedMemory::V3 { pools: Some(pools), .. } => Some(pool_commitments(pools)),
                _ => None,
            },
        }
    }

    pub fn sign_commitment(&self, statement: &Commitment) -> Signed<Commitment> {
        Signed {
            signature: statement.sign(&self.identity),
            statement: statement.clone(),
        }
    }

    /// Keeps an execution openable by the challenge's validator, and releases the devices.
    pub fn remember(&self, accepted: AcceptedChallenge, execution: Execution) {
        let memory = match accepted.memory {
            AcceptedMemory::V3 {
                plan,
                pools: Some(pools),
            } => KeptMemory::V3(HeldMemory::new(plan.params, pools)),
            AcceptedMemory::V4 {
                params,
                states: Some(states),
            } => KeptMemory::V4(HeldChainPools::new(params, execution.commitment.global, states)),
            _ => KeptMemory::None,
        };
        self.kept.keep(ToKeep {
            nonce: accepted.challenge.params.nonce,
            validator_key: accepted.challenge.validator_key,
            computed_in: accepted.accepted_at.elapsed(),
            memory,
            work: accepted.work,
            execution,
        });
    }

    /// Signs, remembers and returns the commitment for an honest execution.
    pub fn commit(&self, accepted: AcceptedChallenge, execution: Execution, compute_ms: u64) -> Signed<Commitment> {
        let signed = self.sign_commitment(&self.statement(&accepted, &execution, compute_ms));
        self.remember(accepted, execution);
        signed
    }

    /// The commitments kept for their opening rounds.
    pub fn kept(&self) -> &KeptCommitments {
        &self.kept
    }

    /// The devices' lock and the work in flight.
    pub fn running(&self) -> &Running {
        &self.running
    }

    /// Stops taking challenges, then waits, up to `within`, for the challenge in flight to be
    /// committed and its opening round to run: a miner restarted mid-challenge would otherwise
    /// fail an attestation it has done the work for. A commitment counts as awaiting its round
    /// for [`OPENING_HOLD`] (a full-policy validator never opens). Returns whether all of it
    /// finished in time.
    pub async fn settle(&self, within: Duration) -> bool {
        self.running.stop_taking_challenges();
        let until = Instant::now() + within;
        loop {
            if self.running.is_idle() && !self.kept.any_awaiting_round() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
