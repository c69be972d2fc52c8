//! A verdict being assembled while an attestation runs.

use crate::config::Policy;
use crate::planner::{MemoryPhasePlan, Plan};
use crate::transcript::{RecordedPlan, Recorder};
use crate::verdict::identity::IdentityProof;
use crate::verdict::memory::MemoryProof;
use crate::verdict::reason::{Reason, ReasonCode};
use crate::verdict::throughput::{Throughput, graded_miss};
use crate::verdict::{StoredParams, Verdict};
use gpu_attest_shared::Digest;
use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::verify::Rejection;

pub struct Outcome {
    pub url: String,
    pub policy: Policy,
    pub plan: Plan,
    pub reasons: Vec<Reason>,
    pub measured_ms: u64,
    /// The memory phase as planned, then as measured (version 3 or 4; `None` without one).
    pub memory: Option<MemoryProof>,
    /// Device evidence as checked (PROTOCOL.md 19.5); `None` under the `off` policy, or when the
    /// commitment failed before its evidence was read.
    pub identity: Option<IdentityProof>,
    /// The messages as they went, for the transcript (PROTOCOL.md 21).
    pub transcript: Recorder,
    /// The plan as it stood before the challenge was sent, for the transcript.
    planned: Box<RecordedPlan>,
    global: Digest,
}

impl Outcome {
    pub fn new(url: &str, plan: &Plan, policy: Policy) -> Self {
        let memory = match &plan.memory {
            MemoryPhasePlan::V4(pool) => {
                let claimed: Vec<u64> = plan.claim.devices.iter().map(|d| d.memory_bytes).collect();
                Some(pool.planned_proof(plan.params.n, &claimed))
            }
            MemoryPhasePlan::V3(memory) => Some(memory.planned_proof()),
            MemoryPhasePlan::Off => None,
        };
        Self::with_memory(url, plan, policy, memory, plan.memory.protocol_version())
    }

    /// An outcome whose memory phase is `memory` as planned, judged under `protocol_version`:
    /// for an audit, which has the planned figures from a transcript rather than a plan.
    pub fn with_memory(
        url: &str,
        plan: &Plan,
        policy: Policy,
        memory: Option<MemoryProof>,
        protocol_version: u32,
    ) -> Self {
        let planned = Box::new(RecordedPlan {
            policy: policy_name(policy).into(),
            samples: plan.samples,
            expected_ms: plan.expected_ms,
            deadline_ms: plan.deadline_ms,
            finish_by_ms: plan.finish_by_ms,
            expectation: plan.expectation,
            backend: plan.claim.backend.clone(),
            kernel: plan.claim.kernel.clone(),
            inventory: plan.claim.devices.clone(),
            protocol_version,
            memory: memory.clone(),
            v4_settings: None,
        });
        Outcome {
            url: url.into(),
            policy,
            plan: plan.clone(),
            reasons: Vec::new(),
            measured_ms: 0,
            memory,
            identity: None,
            transcript: Recorder::default(),
            planned,
            global: Digest::default(),
        }
    }

    /// Records the settings version 4's planner sized this challenge's memory phase with.
    pub fn record_v4_settings(&mut self, settings: &crate::memory::plan_v4::V4Settings) {
        self.planned.v4_settings = Some(settings.into());
    }

    /// What was recorded, and the plan it was recorded under, taken out before the outcome
    /// becomes a verdict.
    pub fn take_record(&mut self) -> (Recorder, RecordedPlan) {
        (std::mem::take(&mut self.transcript), (*self.planned).clone())
    }

    pub fn fail(&mut self, code: ReasonCode, message: impl Into<String>) {
        self.reasons.push(Reason::new(code, message));
    }

    /// Whether the verdict can still prove a rate: nothing has failed, or only a late
    /// commitment that came by the finish-by time ([`graded_miss`]). Such work is verified as a
    /// pass's is (its evidence read, its pools walked, its chains re-executed or opened); any
    /// other verdict proves nothing, and checking it further would cost both sides for nothing.
    pub fn may_prove(&self) -> bool {
        self.reasons.is_empty() || graded_miss(&self.reasons, self.measured_ms, self.plan.finish_by_ms)
    }

    pub fn reject(&mut self, rejection: &Rejection) {
        self.reasons.push(rejection.into());
    }

    /// The global checksum of a commitment whose signature verified (stored with the verdict,
    /// pass or fail).
    pub fn record_global(&mut self, global: Digest) {
        self.global = global;
    }

    /// The verdict names what the challenge was sized for, never what the miner claimed later:
    /// a commitment that named other hardware has already failed with `hardware-mismatch`.
    pub fn into_verdict(self, created_at_ms: u64) -> Verdict {
        let params = &self.plan.params;
        let stored = StoredParams::from(params);
        let passed = self.reasons.is_empty();
        let proves = self.may_prove();
        let memory = self.memory.map(|mut m| {
            m.settle(proves);
            m
        });
        let throughput = Throughput::of(
            &stored,
            MemoryProof::fill_work_of(memory.as_ref()),
            self.plan.claim.devices.len(),
            self.measured_ms,
            &self.plan.expectation,
            proves,
        );
        Verdict {
            id: 0,
            miner_url: self.url,
            miner_key: PublicKey(params.miner_key).to_string(),
            nonce: hex::encode(params.nonce),
            passed,
            reasons: self.reasons,
            policy: policy_name(self.policy).into(),
            samples: self.plan.samples,
            params: stored,
            measured_ms: self.measured_ms,
            expected_ms: self.plan.expected_ms,
            deadline_ms: self.plan.deadline_ms,
            finish_by_ms: self.plan.finish_by_ms,
            inventory: self.plan.claim.devices,
            backend: self.plan.claim.backend,
            kernel: self.plan.claim.kernel,
            global_checksum: self.global.to_hex(),
            created_at_ms,
            throughput,
            protocol_version: self.planned.protocol_version,
            memory,
            identity: self.identity,
            first_run: None,
            transcript_bytes: None,
        }
    }
}

/// A policy as verdicts name it: re-execution in full, or sampled openings.
pub fn policy_name(policy: Policy) -> &'static str {
    match policy {
        Policy::Full => "full",
        _ => "sampled",
    }
}
