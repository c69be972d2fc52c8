//! The attestation again, from its transcript: the validator's own checks, in the order an
//! attestation runs them (`attest::Attestor::run_once` and `verify`), on the messages as
//! received and the times as read, and the verdict they come to compared with the one stated.

use super::Report;
use super::stream::{StreamEnd, replay_stream};
use crate::attest::exchange::{malformed_commitment, walk_give_up};
use crate::attest::locality::{
    LocalityJudge, LocalityPlan, Walked, ended_early as locality_ended_early,
    opening_failed as locality_opening_failed, openings_timed_out as locality_openings_timed_out,
};
use crate::attest::outcome::Outcome;
use crate::attest::verify::{
    Due, MemoryOpenings, StepOpenings, WalkOpenings, check_opening, check_statement, full, openings_timed_out, owed,
    received_opening, refused,
};
use crate::attest::walk::{
    WalkAnswer, WalkContext, WalkRows, check_opening as check_walk_opening, check_pools, judge_walk,
};
use crate::attest::walk_v4::{Roots, StatesWalk, StepChecks, WalkedDevice, walked_devices};
use crate::attest::{late, pools_out_of_place, record_locality};
use crate::config::Policy;
use crate::device_identity::check_commitment_evidence;
use crate::memory::MemoryPlan;
use crate::memory::plan::planned_pools;
use crate::memory::plan_v4::{ChainPoolPlan, ExpectedWalk, plan_chain_pools};
use crate::planner::{MemoryPhasePlan, Plan};
use crate::transcript::{Opened, RecordedEvidence, RecordedPlan, Recorder};
use crate::verdict::Verdict;
use crate::verdict::class::RateSource;
use crate::verdict::identity::{IdentityProof, IdentityStatus};
use crate::verdict::reason::{Reason, ReasonCode};
use gpu_attest_proto::convert::{
    WalkRequest, challenge_from_wire, commitment_from_wire, walk_request_from_wire, walk_sample_from_wire,
};
use gpu_attest_proto::evidence::evidence_from_wire;
use gpu_attest_proto::locality::{
    request_from_wire as locality_request_from_wire, sample_from_wire as locality_sample_from_wire,
};
use gpu_attest_proto::memory_v4::step_sample_from_wire;
use gpu_attest_proto::transcript::{FORMAT_WITH_VERSION_3_WALK, restored_opening};
use gpu_attest_proto::v1;
use gpu_attest_proto::v1::recorded_opening::Received;
use gpu_attest_shared::evidence::TrustAnchors;
use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::memory::MemoryParams;
use gpu_attest_shared::memory::slice_walk::SliceWalk;
use gpu_attest_shared::opening::SampleRequest;
use gpu_attest_shared::statement::locality::{self as locality_statement, SegmentSample};
use gpu_attest_shared::statement::memory_v3::{self, WalkSample};
use gpu_attest_shared::statement::memory_v4::{self, StepSample};
use gpu_attest_shared::statement::{Challenge, Commitment, MemoryPhase, open_request_bytes};
use gpu_attest_shared::{Backend, Work};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// Reasons the challenge stream gave (PROTOCOL.md 14.3): taken as stated from a transcript of a
/// release that did not record the stream.
const STREAM_REASONS: [ReasonCode; 6] = [
    ReasonCode::NotAccepted,
    ReasonCode::ImpossibleProgress,
    ReasonCode::StreamOutOfOrder,
    ReasonCode::MinerFailed,
    ReasonCode::NoCommitment,
    ReasonCode::CommitmentTimedOut,
];

/// Replays the attestation `opened` records, adding what it finds to `report`.
pub async fn replay(opened: &Opened, backend: Arc<dyn Backend>, options: Options, report: &mut Report) {
    let t = &opened.transcript;
    let stated: Verdict = match serde_json::from_str(&t.verdict_json) {
        Ok(v) => v,
        Err(e) => return report.differ(format!("the stated verdict is not a verdict's JSON: {e}")),
    };
    report.verdict = format!(
        "verdict {} ({}, {} at {})",
        stated.id,
        if stated.passed { "PASS" } else { "FAIL" },
        stated.miner_url,
        gpu_attest_daemon::command::utc(stated.created_at_ms)
    );
    let planned: RecordedPlan = match serde_json::from_str(&t.plan_json) {
        Ok(p) => p,
        Err(e) => return report.differ(format!("the recorded plan does not read: {e}")),
    };
    if t.miner_url != stated.miner_url {
        report.differ(format!(
            "the transcript is of {}, the verdict of {}",
            t.miner_url, stated.miner_url
        ));
    }
    let Some((challenge, validator_key)) = check_challenge(t, opened.signer, &planned, &stated, report) else {
        return;
    };
    let Some(mut replayed) = Replay::new(&challenge, &planned, &stated, validator_key, t.format, report) else {
        return;
    };
    replayed.reexecute = options.reexecute;
    replayed.anchors = options.anchors;
    if !options.trusted {
        // Checked so far: the cheap parts, which name what changed. Recomputing openings of a
        // file nobody vouches for would only spend this machine's time for its author.
        let _ = replayed.commitment(t, &challenge, report);
        return report.differ("not re-derived further: the transcript is not signed by the validator it must be");
    }
    let derived = replayed.run(t, &challenge, backend, report).await;
    compare(&stated, derived, report);
}

/// The signed challenge: decoded, signed by the transcript's signer, and what the plan and the
/// verdict say of it. Returns it and the validator's key.
fn check_challenge(
    t: &v1::Transcript,
    signer: Option<PublicKey>,
    planned: &RecordedPlan,
    stated: &Verdict,
    report: &mut Report,
) -> Option<(Challenge, PublicKey)> {
    let Some(wire) = &t.challenge else {
        report.differ("the transcript holds no challenge");
        return None;
    };
    let (challenge, signature) = match challenge_from_wire(wire) {
        Ok(c) => c,
        Err(e) => {
            report.differ(format!("the recorded challenge does not decode: {e}"));
            return None;
        }
    };
    if challenge.verify(&signature).is_err() {
        report.differ("the challenge's signature does not verify with the validator key it names");
    } else {
        report.confirm("the challenge is signed by the validator it names");
    }
    if Some(challenge.validator_key) != signer {
        report.differ(format!(
            "the challenge names validator {}, the transcript is signed by another key",
            challenge.validator_key
        ));
    }
    let claim = HardwareClaim {
        backend: planned.backend.clone(),
        kernel: planned.kernel.clone(),
        devices: planned.inventory.clone(),
    };
    let mut agree = true;
    let mut check = |ok: bool, what: String| {
        if !ok {
            agree = false;
            report.differ(what);
        }
    };
    check(
        claim.digest() == challenge.inventory_digest,
        "the plan's hardware is not the hardware the signed challenge was sized for".into(),
    );
    check(
        claim == stated.claim(),
        "the verdict names other hardware than the plan".into(),
    );
    check(
        crate::verdict::StoredParams::from(&challenge.params) == stated.params,
        "the verdict's challenge parameters are not the signed challenge's".into(),
    );
    let signed_deadline = challenge.deadline_ms.saturating_sub(challenge.issued_at_ms);
    check(
        signed_deadline == planned.deadline_ms && planned.deadline_ms == stated.deadline_ms,
        format!(
            "deadline: the signed challenge gives {signed_deadline} ms, the plan {} ms, the verdict {} ms",
            planned.deadline_ms, stated.deadline_ms
        ),
    );
    let signed_finish_by = challenge
        .finish_by_ms
        .map_or(0, |f| f.saturating_sub(challenge.issued_at_ms));
    check(
        signed_finish_by == planned.finish_by_ms && planned.finish_by_ms == stated.finish_by_ms,
        format!(
            "finish-by time: the signed challenge gives {signed_finish_by} ms, the plan {} ms, the verdict {} ms",
            planned.finish_by_ms, stated.finish_by_ms
        ),
    );
    let signed_version = match challenge.memory {
        Some(MemoryPhase::V4(_)) => 4,
        Some(MemoryPhase::V3(_)) => 3,
        None => 2,
    };
    check(
        signed_version == planned.protocol_version && planned.protocol_version == stated.protocol_version,
        format!(
            "protocol version: the signed challenge's is {signed_version}, the plan's {}, the verdict's {}",
            planned.protocol_version, stated.protocol_version
        ),
    );
    let derived_deadline = (planned.expected_ms as f64 * planned.expectation.slack).ceil() as u64;
    check(
        derived_deadline == planned.deadline_ms,
        format!(
            "deadline: the plan's {} ms is not its expected time ({} ms) times its slack ({})",
            planned.deadline_ms, planned.expected_ms, planned.expectation.slack
        ),
    );
    check(
        planned.expected_ms == stated.expected_ms
            && planned.samples == stated.samples
            && planned.policy == stated.policy,
        "the verdict's expected time, samples or policy are not the plan's".into(),
    );
    if agree {
        report.confirm(format!(
            "the verdict's hardware, parameters, deadline ({} ms), finish-by time and protocol version {} are the signed challenge's",
            planned.deadline_ms, planned.protocol_version
        ));
    }
    let validator_key = challenge.validator_key;
    Some((challenge, validator_key))
}

/// The replay's state: an outcome built from the recorded plan, as the live attestation's was.
struct Replay<'a> {
    outcome: Outcome,
    work: Work,
    stated: &'a Verdict,
    validator_key: PublicKey,
    /// Whether a full-policy verdict's chains are re-executed here.
    reexecute: bool,
    /// The roots device evidence must chain to: NVIDIA's, as shipped, unless a test's.
    anchors: Option<TrustAnchors>,
}

/// How far an audit goes.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The file's signature verifies, with the key the auditor gave where one was given: only
    /// then are openings recomputed.
    pub trusted: bool,
    /// Re-execute a full-policy verdict's every chain (as long as the miner's work took, on
    /// this CPU); otherwise that part is taken as stated.
    pub reexecute: bool,
    /// Evidence roots other than NVIDIA's (the test PKI's), for tests.
    pub anchors: Option<TrustAnchors>,
}

impl<'a> Replay<'a> {
    fn new(
        challenge: &Challenge,
        planned: &RecordedPlan,
        stated: &'a Verdict,
        validator_key: PublicKey,
        format: u32,
        report: &mut Report,
    ) -> Option<Self> {
        let work = match Work::new(challenge.params) {
            Ok(w) => w,
            Err(e) => {
                report.differ(format!("the signed challenge's parameters are not valid: {e}"));
                return None;
            }
        };
        let memory = match &challenge.memory {
            Some(MemoryPhase::V4(params)) => MemoryPhasePlan::V4(sized_again(challenge, params, planned, report)?),
            Some(MemoryPhase::V3(params)) if format >= FORMAT_WITH_VERSION_3_WALK => {
                MemoryPhasePlan::V3(version_3_plan(params, planned, &stated.claim(), report)?)
            }
            // An earlier format did not record version 3's walk: its memory phase is taken as
            // stated (`after_commitment`).
            Some(MemoryPhase::V3(_)) => MemoryPhasePlan::Off,
            None => {
                if planned.memory.is_some() {
                    report.differ("the plan states a memory phase the signed challenge does not have");
                    return None;
                }
                MemoryPhasePlan::Off
            }
        };
        let plan = Plan {
            params: challenge.params,
            claim: stated.claim(),
            expectation: planned.expectation,
            expected_ms: planned.expected_ms,
            deadline_ms: planned.deadline_ms,
            finish_by_ms: planned.finish_by_ms,
            samples: planned.samples,
            memory,
        };
        let policy = if planned.policy == "full" {
            Policy::Full
        } else {
            Policy::Sampled
        };
        let outcome = Outcome::with_memory(
            &stated.miner_url,
            &plan,
            policy,
            planned.memory.clone(),
            planned.protocol_version,
        );
        Some(Replay {
            outcome,
            work,
            stated,
            validator_key,
            reexecute: false,
            anchors: None,
        })
    }

    /// The stated reasons of the kinds `which` picks, taken as stated (into the outcome, as the
    /// live attestation had them at this point) and listed in the report.
    fn take_stated(&mut self, which: impl Fn(ReasonCode) -> bool, why: &str, report: &mut Report) {
        for reason in self.stated.reasons.iter().filter(|r| which(r.code)) {
            report.take_as_stated(format!("{} ({why})", reason.code.as_str()));
            self.outcome.reasons.push(reason.clone());
        }
    }

    /// The challenge stream replayed from its reads: its failure's reason, or the commitment
    /// it ended in, at the time recorded for it.
    fn stream(&mut self, t: &v1::Transcript, stream: &v1::RecordedStream, report: &mut Report) {
        match replay_stream(t, stream, &self.outcome.plan, report) {
            StreamEnd::Failed { reason, after_ms } => {
                if t.commitment.is_some() {
                    report.differ(format!(
                        "the challenge stream ended without a commitment ({}), but one is recorded",
                        reason.code.as_str()
                    ));
                }
                self.outcome.reasons.push(reason);
                self.outcome.measured_ms = after_ms;
            }
            StreamEnd::Commitment { after_ms } => {
                let recorded = t.commitment.as_ref().map_or(0, |c| c.received_after_ms);
                if recorded != after_ms {
                    report.differ(format!(
                        "the commitment is recorded {recorded} ms after the challenge, its read of the stream {after_ms} ms"
                    ));
                }
            }
            StreamEnd::Broken => {}
        }
    }

    /// A transcript of a release that did not record the stream: its reasons as stated.
    fn stream_as_stated(&mut self, t: &v1::Transcript, report: &mut Report) {
        if t.commitment.is_some() {
            // A stream that ended in one of these reasons gave no commitment: with one recorded,
            // the verdict states what did not happen.
            for reason in self.stated.reasons.iter().filter(|r| STREAM_REASONS.contains(&r.code)) {
                report.differ(format!(
                    "the verdict states a reason of the stream's end, but a commitment is recorded: {reason}"
                ));
            }
        } else {
            // Before any commitment: `Accepted` naming other hardware, or a stream message this
            // validator could not decode, end the stream as its other reasons do.
            self.take_stated(
                |c| {
                    STREAM_REASONS.contains(&c)
                        || c == ReasonCode::HardwareMismatch
                        || c == ReasonCode::MalformedCommitment
                },
                "the challenge stream's events are not recorded in this transcript",
                report,
            );
        }
    }

    /// Runs the attestation's checks in their order and returns the verdict they come to.
    async fn run(
        mut self,
        t: &v1::Transcript,
        challenge: &Challenge,
        backend: Arc<dyn Backend>,
        report: &mut Report,
    ) -> Verdict {
        self.outcome.measured_ms = self.stated.measured_ms;
        match &t.stream {
            Some(stream) => self.stream(t, stream, report),
            // Format 1 did not record the stream; a later file without it has had it removed.
            None if t.format >= 2 => report.differ(format!(
                "the transcript is of format {}, which records the challenge stream, and holds none",
                t.format
            )),
            None => self.stream_as_stated(t, report),
        }
        if self.stated.first_run.is_some() {
            report.take_as_stated("the first run a retest replaced (its transcript is not kept)");
        }
        if let Some(commitment) = self.commitment(t, challenge, report) {
            self.after_commitment(t, challenge, &commitment, backend, report).await;
        } else if t.commitment.is_none() && self.outcome.reasons.is_empty() {
            report.differ("no commitment is recorded, and the verdict states no reason for its absence");
        }
        // A version 3 verdict of a format that did not record its walk.
        let memory_as_stated = self.stated.protocol_version == 3 && self.outcome.plan.memory.v3().is_none();
        let mut derived = self.outcome.into_verdict(self.stated.created_at_ms);
        derived.id = self.stated.id;
        derived.first_run = self.stated.first_run.clone();
        if memory_as_stated {
            derived.memory = self.stated.memory.clone();
        }
        derived
    }

    /// The recorded commitment, decoded and timed: `Some` when it is worth verifying further.
    fn commitment(
        &mut self,
        t: &v1::Transcript,
        challenge: &Challenge,
        report: &mut Report,
    ) -> Option<(Commitment, [u8; 64])> {
        let recorded = t.commitment.as_ref()?;
        self.outcome.measured_ms = recorded.received_after_ms;
        let wire = recorded.commitment.clone().unwrap_or_default();
        let (commitment, signature) = match commitment_from_wire(&wire) {
            Ok(c) => c,
            Err(e) => {
                self.outcome.reasons.push(malformed_commitment(&e));
                return None;
            }
        };
        let deadline_ms = self.outcome.plan.deadline_ms;
        if recorded.received_after_ms > deadline_ms {
            let why = late(recorded.received_after_ms, &self.outcome.plan);
            self.outcome.fail(ReasonCode::LateCommitment, why);
        }
        report.confirm(format!(
            "the commitment came {} ms after the challenge (deadline {deadline_ms} ms)",
            recorded.received_after_ms
        ));
        if !check_statement(challenge, &self.work, &commitment, &signature, &mut self.outcome) {
            return None;
        }
        report.confirm("the commitment's signature, bindings and structure (PROTOCOL.md 14.4)");
        Some((commitment, signature))
    }

    /// Evidence, the walk and the openings, as `Attestor::verify` runs them.
    async fn after_commitment(
        &mut self,
        t: &v1::Transcript,
        challenge: &Challenge,
        (commitment, _): &(Commitment, [u8; 64]),
        backend: Arc<dyn Backend>,
        report: &mut Report,
    ) {
        if self.outcome.may_prove() {
            self.evidence(t, challenge, commitment, report);
        }
        if self.outcome.plan.memory.protocol_version() == 2 && challenge.memory.is_some() {
            // Version 3, in a format before its walk was recorded.
            report.take_as_stated(
                "version 3's memory phase: this transcript's format does not record its walk and openings; its reasons and figures are as stated",
            );
            let already: Vec<ReasonCode> = self.outcome.reasons.iter().map(|r| r.code).collect();
            self.take_stated(|c| !already.contains(&c), "version 3's walk and openings", report);
            return;
        }
        if let Some(why) = pools_out_of_place(&self.outcome.plan.memory, commitment.pools.is_some()) {
            self.outcome.fail(ReasonCode::PoolNotCanonical, why);
            return;
        }
        let context = self.walk_v3(t, commitment, report);
        let segments = match &context {
            Some(context) => {
                let Some(samples) = self.recorded_walk_samples(t, context, report) else {
                    return;
                };
                Some(WalkOpenings { context, samples })
            }
            None => None,
        };
        let walked = self.walk(t, commitment, report);
        let memory_openings = match (segments, &walked) {
            (Some(segments), _) => Some(MemoryOpenings::Segments(segments)),
            (None, Some((walked, steps))) => Some(MemoryOpenings::Steps(StepOpenings {
                walked,
                steps: steps.clone(),
            })),
            (None, None) => None,
        };
        if self.outcome.policy == Policy::Full && !self.outcome.may_prove() {
            return self.expect_no_open(t, report);
        }
        let chains = match self.outcome.policy {
            Policy::Full if !self.reexecute => {
                // As long as the work took the miner's devices, on this CPU: only when asked.
                report.take_as_stated(format!(
                    "the full re-execution of {} chains of {} steps at n = {} (audit with --reexecute to repeat it here)",
                    self.work.num_chains(),
                    self.work.iterations(),
                    self.work.n()
                ));
                self.take_stated(|c| c == ReasonCode::ReexecutionMismatch, "not re-executed here", report);
                0
            }
            Policy::Full => {
                let started = std::time::Instant::now();
                match full(backend.clone(), &self.work, commitment, &mut self.outcome, &|_| {}).await {
                    Ok(()) => report.confirm(format!(
                        "every chain re-executed on this machine's CPU ({:.1} s)",
                        started.elapsed().as_secs_f64()
                    )),
                    Err(e) => report.differ(format!("this machine could not re-execute the chains: {e}")),
                }
                0
            }
            _ => self.outcome.plan.samples,
        };
        if chains == 0 && memory_openings.is_none() {
            return self.expect_no_open(t, report);
        }
        self.openings(t, commitment, chains, memory_openings.as_ref(), backend, report)
            .await;
    }

    /// The commitment's device evidence, checked again under the identity settings and at the
    /// time the transcript records (PROTOCOL.md 19.4), against NVIDIA's root as shipped. What
    /// rests on the validator's own history (a certified part seen for another key) is taken
    /// as stated.
    fn evidence(&mut self, t: &v1::Transcript, challenge: &Challenge, commitment: &Commitment, report: &mut Report) {
        let recorded: Option<RecordedEvidence> = (!t.evidence_json.is_empty())
            .then(|| serde_json::from_str(&t.evidence_json))
            .transpose()
            .unwrap_or_else(|e| {
                report.differ(format!("the recorded evidence settings do not read: {e}"));
                None
            });
        let Some(recorded) = recorded else {
            if self.stated.identity.is_some() {
                report.differ("the verdict states device evidence, but the transcript records no evidence check");
            }
            return;
        };
        let wire = t
            .commitment
            .as_ref()
            .and_then(|c| c.commitment.as_ref())
            .cloned()
            .unwrap_or_default();
        let evidence = evidence_from_wire(&wire.evidence, &wire.evidence_signature);
        let mut trust = recorded.config.trust();
        if let Some(anchors) = &self.anchors {
            trust.anchors = anchors.clone();
        }
        let (mut proof, mut reasons) = check_commitment_evidence(
            &recorded.config,
            &trust,
            challenge,
            commitment,
            &self.outcome.plan.claim.devices,
            &evidence,
            recorded.checked_at_ms / 1000,
        );
        if let Some(proof) = &mut proof
            && recorded.config.part_reuse_ms() > 0
        {
            reasons.extend(self.part_reuse_as_stated(proof, &challenge.params.miner_key, report));
        }
        report.confirm(format!(
            "device evidence checked again under the {} policy",
            recorded.config.policy.as_str()
        ));
        self.outcome.identity = proof;
        self.outcome.reasons.extend(reasons);
    }

    /// PROTOCOL.md 19.4 step 4 on `proof` (derived again): whether a certified part answered
    /// for another miner key lately is in the validator's database, which an audit does not
    /// have. A device the verdict refused for that is taken as stated (its entry and its
    /// reason), once they say what the check writes: this very part, another miner's key, one
    /// reason that is the line; that no other part was so seen, too. Everything else about each
    /// device is derived.
    fn part_reuse_as_stated(
        &self,
        proof: &mut IdentityProof,
        miner_key: &[u8; 32],
        report: &mut Report,
    ) -> Vec<Reason> {
        let mismatch = ReasonCode::IdentityDeviceMismatch;
        let stated_devices = self.stated.identity.as_ref().map_or(&[][..], |p| &p.devices[..]);
        let mut reasons = Vec::new();
        let mut unrefused = 0;
        for device in &mut proof.devices {
            let Some((chip, id)) = device.part.clone() else {
                continue;
            };
            unrefused += 1;
            let Some(stated) = stated_devices.iter().find(|s| {
                s.index == device.index
                    && s.status == IdentityStatus::Refused
                    && s.reason.as_deref() == Some(mismatch.as_str())
            }) else {
                continue;
            };
            // What the reuse check writes (19.4 step 4): this part, another miner's key, the
            // part itself no longer recorded, and one reason that is the line.
            let prefix = format!("part {chip}:{id} answered for miner ");
            let other_key = stated
                .line
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split(' ').next())
                .is_some_and(|key| key != PublicKey(*miner_key).to_string());
            let said = format!("device {}: {}", device.index, stated.line);
            let stated_reasons: Vec<&Reason> = self
                .stated
                .reasons
                .iter()
                .filter(|r| r.code == mismatch && r.message.starts_with(&format!("device {}: part ", device.index)))
                .collect();
            if !other_key || stated.part.is_some() || stated_reasons.len() != 1 || stated_reasons[0].message != said {
                report.differ(format!(
                    "device {}: the verdict refuses its certified part {chip}:{id} as seen for another miner, but not as the reuse check says it (PROTOCOL.md 19.4 step 4): {:?}",
                    device.index, stated.line
                ));
                continue;
            }
            reasons.push(stated_reasons[0].clone());
            report.take_as_stated(format!(
                "device {}: its certified part answered for another miner lately (identity-device-mismatch; the validator's part history)",
                device.index
            ));
            *device = stated.clone();
            unrefused -= 1;
        }
        if unrefused > 0 {
            report.take_as_stated(format!(
                "that {unrefused} certified part(s) had not answered for another miner within the reuse window (the validator's part history)"
            ));
        }
        reasons
    }

    fn expect_no_open(&self, t: &v1::Transcript, report: &mut Report) {
        if t.open.is_some() {
            report.differ("openings are recorded where the verdict could no longer prove anything and none should have been asked for");
        }
    }

    /// The recorded walk and its request, where a walk was due and its request is this
    /// challenge's, signed by its validator over `signed_bytes` (18.4's or 20.7's).
    fn walk_request<'t>(
        &self,
        t: &'t v1::Transcript,
        signed_bytes: fn(&[u8; 32], &[u8; 32], u64) -> Vec<u8>,
        report: &mut Report,
    ) -> Option<(&'t v1::RecordedWalk, WalkRequest)> {
        let Some(recorded) = &t.walk else {
            if self.outcome.may_prove() {
                report.differ("no walk is recorded, though the verdict could still prove its memory");
            }
            return None;
        };
        if !self.outcome.may_prove() {
            report
                .differ("a walk is recorded where the verdict had already failed and none should have been asked for");
        }
        let Some(Ok(request)) = recorded.request.as_ref().map(walk_request_from_wire) else {
            report.differ("the recorded walk request does not decode");
            return None;
        };
        let signed = signed_bytes(&request.nonce, &request.walk_seed, request.deadline_ms);
        if request.nonce != self.work.params().nonce || self.validator_key.verify(&signed, &request.signature).is_err()
        {
            report.differ("the recorded walk request is not this challenge's, signed by its validator");
            return None;
        }
        Some((recorded, request))
    }

    /// Version 3's walk from its recorded request and answer (PROTOCOL.md 18.4): the request
    /// this challenge's and signed by its validator, the answer judged as the attestation
    /// judged it, the statement timed at `statement_after_ms`. The context to check the walk
    /// openings against, where the statement passed; `None` under another version.
    fn walk_v3(&mut self, t: &v1::Transcript, commitment: &Commitment, report: &mut Report) -> Option<WalkContext> {
        let MemoryPhasePlan::V3(memory) = self.outcome.plan.memory.clone() else {
            return None;
        };
        if !check_pools(commitment, &memory, &mut self.outcome) {
            return None;
        }
        let (recorded, request) = self.walk_request(t, memory_v3::walk_request_bytes, report)?;
        let give_up_ms = whole_ms(walk_give_up(Duration::from_millis(memory.walk_deadline_ms)));
        let answer = match (&recorded.statement, &recorded.failure, recorded.timed_out_after_ms) {
            (Some(statement), None, 0) => WalkAnswer::Statement(statement.clone(), recorded.statement_after_ms),
            (None, Some(failure), 0) => WalkAnswer::Failed(status(failure)),
            (None, None, after_ms) if after_ms >= give_up_ms => WalkAnswer::TimedOut(after_ms),
            _ => {
                report.differ(format!(
                    "the recorded walk is answered by not exactly one of a statement, a status and a time-out read once the walk deadline and its grace had passed ({give_up_ms} ms)"
                ));
                return None;
            }
        };
        let (context, measured_ms) = judge_walk(&self.work, &request, commitment, &memory, answer, &mut self.outcome)?;
        self.outcome
            .memory
            .get_or_insert_with(|| memory.planned_proof())
            .walk_measured_ms = measured_ms;
        report.confirm(format!(
            "the walk statement, signed by the miner over this walk, came {measured_ms} ms after the request (walk deadline {} ms)",
            memory.walk_deadline_ms
        ));
        Some(context)
    }

    /// The walk segments the recorded open request asks for: ones the validator's draw could
    /// have made (as many as the plan's, each device in its turn, none twice). The draw's
    /// randomness is the validator's own, so the samples themselves are taken from the request.
    /// `None`, with the difference, where they could not have been drawn.
    fn recorded_walk_samples(
        &self,
        t: &v1::Transcript,
        context: &WalkContext,
        report: &mut Report,
    ) -> Option<Vec<WalkSample>> {
        // Without an open request, `openings` says what is missing.
        let Some(request) = t.open.as_ref().and_then(|open| open.request.as_ref()) else {
            return Some(Vec::new());
        };
        let samples: Vec<WalkSample> = request.walk_samples.iter().map(walk_sample_from_wire).collect();
        if !context.drawable(&samples) {
            report.differ(format!(
                "the open request's {} walk segment(s) are not a draw of the plan's: as many, each device in its turn, within the walk, none twice",
                samples.len()
            ));
            return None;
        }
        Some(samples)
    }

    /// Version 4's walk from its recorded roots (PROTOCOL.md 20.8): each root's signature and
    /// time, and the steps the validator drew to open. `None` when there is nothing to open.
    fn walk(
        &mut self,
        t: &v1::Transcript,
        commitment: &Commitment,
        report: &mut Report,
    ) -> Option<(StatesWalk, Vec<StepSample>)> {
        // Version 4's walk as sized again; none under another version.
        let MemoryPhasePlan::V4(pool) = self.outcome.plan.memory.clone() else {
            return None;
        };
        let (recorded, request) = self.walk_request(t, memory_v4::walk_request_bytes, report)?;
        let nonce = self.work.params().nonce;
        let walk = SliceWalk {
            nonce,
            walk_seed: request.walk_seed,
            global: commitment.work.global,
            walkers: pool.params.walkers,
            steps: pool.params.walk_steps,
        };
        let reasons = &mut self.outcome.reasons;
        let mut roots = Roots::new(pool.devices.len());
        let mut scratch = Recorder::default();
        let mut taken = true;
        for root in &recorded.roots {
            let message = root.root.clone().unwrap_or_default();
            if let Err((code, why)) =
                roots.take(&message, root.received_after_us, &walk, commitment, self.validator_key)
            {
                reasons.push(Reason::new(code, why));
                taken = false;
                break;
            }
        }
        let all = if !taken {
            None
        } else if let Some(failure) = &recorded.failure {
            roots.refused(&status(failure), reasons, &mut scratch)
        } else if recorded.timed_out_after_ms > 0 {
            let longest = pool.devices.iter().map(|d| d.deadline_ms).max().unwrap_or(0);
            let give_up_ms = whole_ms(walk_give_up(Duration::from_millis(longest)));
            if recorded.timed_out_after_ms < give_up_ms {
                report.differ(format!(
                    "the walk is recorded as timed out after {} ms, before the longest device deadline and its grace had passed ({give_up_ms} ms)",
                    recorded.timed_out_after_ms
                ));
                return None;
            }
            roots.timed_out(recorded.timed_out_after_ms, reasons, &mut scratch)
        } else {
            roots.all(reasons)
        };
        let devices = all.and_then(|roots| walked_devices(roots, &self.work, commitment, &pool, reasons))?;
        if let Some(proof) = self.outcome.memory.as_mut() {
            for (j, device) in devices.iter().enumerate() {
                proof.record_device_walk(j, device.measured_us.div_ceil(1000).max(1));
            }
        }
        report.confirm(format!(
            "{} walk root(s) signed by the miner over this walk, each timed against its device's deadline",
            devices.len()
        ));
        self.locality(t, commitment, &devices, report);
        let row_checked: HashSet<StepSample> = recorded.row_checked.iter().map(step_sample_from_wire).collect();
        let steps = self.drawn_steps(t, &pool, &row_checked, report);
        Some((StatesWalk::replayed(walk, devices, row_checked), steps))
    }

    /// The locality walk from its record (PROTOCOL.md 20.10), where one was asked for: each
    /// root's signature and time, the segments asked for and each opening replayed.
    fn locality(&mut self, t: &v1::Transcript, commitment: &Commitment, devices: &[WalkedDevice], report: &mut Report) {
        let Some(recorded) = &t.locality else {
            if self
                .stated
                .memory
                .iter()
                .flat_map(|m| &m.devices)
                .any(|d| d.locality.is_some())
            {
                report.differ("the verdict states a locality walk the transcript does not record");
            }
            return;
        };
        if !self.outcome.may_prove() {
            report.differ(
                "a locality walk is recorded where the verdict had already failed and none should have been asked for",
            );
            return;
        }
        let Ok(plan) = serde_json::from_str::<LocalityPlan>(&recorded.plan_json) else {
            return report.differ("the recorded locality plan does not decode");
        };
        if let Some(why) = plan.problem_for(&self.outcome.plan.claim) {
            return report.differ(format!(
                "the recorded locality plan is outside what this software may make for the claim: {why}"
            ));
        }
        report.confirm(format!(
            "the locality plan is within what this software may make for the claim: {} walker(s), {} generation(s) of {} steps",
            plan.walkers, plan.generations, plan.steps
        ));
        let Some(Ok(request)) = recorded
            .request
            .as_ref()
            .map(|r| locality_request_from_wire(r, commitment.work.global))
        else {
            return report.differ("the recorded locality request does not decode");
        };
        let nonce = self.work.params().nonce;
        let signed = locality_statement::request_bytes(&request.walk, request.deadline_ms);
        let shape = (request.walk.walkers, request.walk.generations, request.walk.steps);
        if request.walk.nonce != nonce
            || self.validator_key.verify(&signed, &request.signature).is_err()
            || shape != (plan.walkers, plan.generations, plan.steps)
        {
            return report
                .differ("the recorded locality request is not this challenge's plan, signed by its validator");
        }
        let pools = devices.iter().map(|d| (d.pool, d.committed)).collect();
        let mut judge = LocalityJudge::new(&plan, request.walk, commitment.miner_key, self.validator_key, pools);
        let walked = self.locality_walked(recorded, &mut judge, report);
        if let Ok(Some(figures)) = &walked {
            report.confirm(format!(
                "{} locality root(s) signed and timed, {} segment(s) of {} steps replayed on their proven lines",
                figures.len(),
                plan.segments as usize * figures.len(),
                plan.steps
            ));
        }
        record_locality(&mut self.outcome, walked, &|_| {});
    }

    /// The locality walk's outcome, judged again from its record.
    fn locality_walked(
        &self,
        recorded: &v1::RecordedLocality,
        judge: &mut LocalityJudge,
        report: &mut Report,
    ) -> Walked {
        for root in &recorded.roots {
            judge.take_root(&root.root.clone().unwrap_or_default(), root.received_after_us)?;
        }
        if let Some(failure) = &recorded.failure {
            return judge.stream_failed(&status(failure));
        }
        if recorded.timed_out_after_ms > 0 {
            let give_up_ms = whole_ms(walk_give_up(Duration::from_micros(judge.plan.deadline_us())));
            if recorded.timed_out_after_ms < give_up_ms {
                report.differ(format!(
                    "the locality walk is recorded as timed out after {} ms, before its deadline and grace had passed ({give_up_ms} ms)",
                    recorded.timed_out_after_ms
                ));
                return Ok(None);
            }
            return Err(judge.timed_out(recorded.timed_out_after_ms));
        }
        judge.all_roots()?;
        let Some(open) = &recorded.open_request else {
            report.differ("every locality root is recorded but no open request: the walk was never checked");
            return Ok(None);
        };
        let samples: Vec<SegmentSample> = open.samples.iter().map(locality_sample_from_wire).collect();
        let signed = locality_statement::open_request_bytes(&self.work.params().nonce, &samples);
        let signature = <[u8; 64]>::try_from(open.signature.as_slice()).unwrap_or([0; 64]);
        let per_device = judge.plan.segments as usize;
        let in_plan = samples.len() == per_device * judge.devices.len()
            && samples.iter().enumerate().all(|(i, s)| {
                s.device as usize == i / per_device
                    && s.generation < judge.plan.generations
                    && s.walker < judge.plan.walkers
            });
        if self.validator_key.verify(&signed, &signature).is_err() || !in_plan {
            report.differ("the recorded locality open request is not the plan's segments per device, signed by this challenge's validator");
            return Ok(None);
        }
        report.confirm(format!(
            "{} locality segment(s) asked for, the plan's count per device, each of the walk",
            samples.len()
        ));
        for (i, sample) in samples.iter().enumerate() {
            use v1::recorded_locality_opening::Received as Got;
            match recorded.openings.get(i).and_then(|o| o.received.as_ref()) {
                Some(Got::Opening(message)) => judge.check_opening(&self.work, *sample, message)?,
                Some(Got::Failure(failure)) => return Err(locality_opening_failed(&status(failure))),
                Some(Got::Ended(_)) => return Err(locality_ended_early()),
                Some(Got::TimedOut(_)) => return Err(locality_openings_timed_out()),
                None => {
                    report.differ(format!(
                        "the locality openings' record stops at {i} of {} without saying why",
                        samples.len()
                    ));
                    return Ok(None);
                }
            }
        }
        Ok(Some(judge.verdicts()))
    }

    /// The rows the validator drew for its row checks, by step.
    fn drawn_rows(&self, t: &v1::Transcript) -> HashMap<StepSample, u32> {
        t.open
            .iter()
            .flat_map(|o| &o.row_checks)
            .filter_map(|r| r.step.as_ref().map(|s| (step_sample_from_wire(s), r.row)))
            .collect()
    }

    /// The steps the open request asks for, checked against what the plan says the validator
    /// draws: each device's planned count, none twice, and its planned row checks among them.
    fn drawn_steps(
        &self,
        t: &v1::Transcript,
        pool: &ChainPoolPlan,
        row_checked: &HashSet<StepSample>,
        report: &mut Report,
    ) -> Vec<StepSample> {
        let Some(request) = t.open.as_ref().and_then(|o| o.request.as_ref()) else {
            // No open request (the verdict failed before it): nothing drawn was asked for.
            return Vec::new();
        };
        let steps: Vec<StepSample> = request.step_samples.iter().map(step_sample_from_wire).collect();
        let distinct: HashSet<&StepSample> = steps.iter().collect();
        let per_device = u64::from(pool.params.walkers) * u64::from(pool.params.walk_steps);
        let mut fair = distinct.len() == steps.len() && row_checked.iter().all(|s| distinct.contains(s));
        for (j, planned) in pool.devices.iter().enumerate() {
            let drawn = steps.iter().filter(|s| s.device as usize == j).count() as u64;
            let want = u64::from(planned.steps_opened).min(per_device);
            let checked = row_checked.iter().filter(|s| s.device as usize == j).count() as u64;
            fair &= drawn == want && checked == u64::from(planned.rows_checked).min(want);
        }
        if fair {
            report.confirm(format!(
                "{} walk steps opened and {} of them row-checked, as planned per device",
                steps.len(),
                row_checked.len()
            ));
        } else {
            report.differ("the walk steps opened or the steps row-checked are not the plan's counts per device");
        }
        steps
    }

    /// The open request and every opening as received (PROTOCOL.md 14.5, 20.5), each checked as
    /// the live attestation checked it.
    async fn openings(
        &mut self,
        t: &v1::Transcript,
        commitment: &Commitment,
        chains: u32,
        memory: Option<&MemoryOpenings<'_>>,
        backend: Arc<dyn Backend>,
        report: &mut Report,
    ) {
        let Some(open) = &t.open else {
            report.differ("no open request is recorded, though openings were due");
            return;
        };
        let Some(samples) = self.check_open_request(open, chains, memory, report) else {
            return;
        };
        if let Some(refusal) = &open.refused {
            refused(&status(refusal), &mut self.outcome);
            return;
        }
        if open.timed_out {
            openings_timed_out(&mut self.outcome);
            return;
        }
        let rows = self.drawn_rows(t);
        let due = owed(&samples, memory);
        let mut received = open.openings.iter();
        let mut steps = StepChecks::default();
        let (mut chains_checked, mut walks_checked, mut steps_checked) = (0, 0, 0);
        for sample in due {
            let recorded = received.next();
            let next = recorded.map(|o| restored_opening(open, o));
            let wire = match next {
                Some(Err(why)) => {
                    report.differ(why);
                    break;
                }
                Some(Ok(received)) => received,
                None => None,
            };
            let wire = match wire {
                Some(Received::Opening(wire)) => match received_opening(Ok(Some(wire)), sample, &mut self.outcome) {
                    Some(wire) => wire,
                    None => break,
                },
                Some(Received::Ended(_)) => {
                    received_opening(Ok(None), sample, &mut self.outcome);
                    break;
                }
                Some(Received::Failure(failure)) => {
                    received_opening(Err(status(&failure)), sample, &mut self.outcome);
                    break;
                }
                Some(Received::TimedOut(_)) => {
                    openings_timed_out(&mut self.outcome);
                    break;
                }
                None => {
                    report.differ(format!(
                        "the transcript ends before the opening of {sample} that was due"
                    ));
                    break;
                }
            };
            match sample {
                Due::Chain(chain) => {
                    if let Err(e) =
                        check_opening(backend.clone(), &self.work, commitment, chain, &wire, &mut self.outcome).await
                    {
                        report.differ(format!("this machine could not check an opening: {e}"));
                    }
                    chains_checked += 1;
                }
                Due::Walk(walk, context) => {
                    let rows = recorded.map_or_else(Vec::new, |o| o.walk_rows.clone());
                    let recorded_rows = rows.len();
                    let nonce = self.work.params().nonce;
                    match check_walk_opening(context, nonce, commitment, walk, &wire, WalkRows::Recorded(rows), &mut self.outcome)
                        .await
                    {
                        Ok(used) if used.not_a_draw => report.differ(format!(
                            "the transcript records {recorded_rows} rows for the opening of {sample}: not 8 distinct rows of an entry (0 to 255) for each entry its check takes"
                        )),
                        Ok(used) if used.rows.len() != recorded_rows => report.differ(format!(
                            "the transcript records {recorded_rows} rows for the opening of {sample}; its check takes {}",
                            used.rows.len()
                        )),
                        Ok(_) => {}
                        Err(e) => report.differ(format!("this machine could not check a walk opening: {e}")),
                    }
                    walks_checked += 1;
                }
                Due::Step(step, walked) => {
                    let row = rows.get(&step).copied();
                    if walked.row_checked(&step) && row.is_none() {
                        report.differ(format!(
                            "step {} of walker {} on device {} was to be row-checked, and no row is recorded for it",
                            step.step, step.walker, step.device
                        ));
                    }
                    if let Some(check) = walked.begin_check(
                        &self.work,
                        &commitment.miner_key,
                        step,
                        &wire,
                        row,
                        &mut self.outcome.reasons,
                    ) && let Err(e) = steps.push(check, &mut self.outcome.reasons).await
                    {
                        report.differ(format!("this machine could not check a step: {e}"));
                    }
                    steps_checked += 1;
                }
            }
        }
        if let Err(e) = steps.finish(&mut self.outcome.reasons).await {
            report.differ(format!("this machine could not check a step: {e}"));
        }
        let walks = if walks_checked > 0 {
            format!(", {walks_checked} walk segment(s) with the recorded rows")
        } else {
            String::new()
        };
        report.confirm(format!(
            "{chains_checked} chain opening(s) recomputed{walks} and {steps_checked} walk step(s) checked on this machine's CPU, each as received"
        ));
    }

    /// The recorded open request: this challenge's, signed by its validator over the version's
    /// bytes, with the planned number of chain samples. Returns its chain samples.
    fn check_open_request(
        &self,
        open: &v1::RecordedOpen,
        chains: u32,
        memory: Option<&MemoryOpenings<'_>>,
        report: &mut Report,
    ) -> Option<Vec<SampleRequest>> {
        let Some(request) = &open.request else {
            report.differ("the recorded open request is empty");
            return None;
        };
        let samples: Vec<SampleRequest> = request
            .samples
            .iter()
            .map(|s| SampleRequest {
                chain: s.chain,
                segment: s.segment,
            })
            .collect();
        let steps: Vec<StepSample> = request.step_samples.iter().map(step_sample_from_wire).collect();
        let walks: Vec<WalkSample> = request.walk_samples.iter().map(walk_sample_from_wire).collect();
        let nonce = self.work.params().nonce;
        let signed = match self.outcome.plan.memory {
            MemoryPhasePlan::V4(_) => memory_v4::open_request_bytes(&nonce, &samples, &steps),
            MemoryPhasePlan::V3(_) => memory_v3::open_request_bytes_v3(&nonce, &samples, &walks),
            MemoryPhasePlan::Off => open_request_bytes(&nonce, &samples),
        };
        if request.nonce != nonce || self.validator_key.verify(&signed, &request.signature).is_err() {
            report.differ("the recorded open request is not this challenge's, signed by its validator");
            return None;
        }
        let (drawn_walks, drawn_steps) = match memory {
            Some(MemoryOpenings::Segments(w)) => (w.samples.clone(), Vec::new()),
            Some(MemoryOpenings::Steps(s)) => (Vec::new(), s.steps.clone()),
            None => (Vec::new(), Vec::new()),
        };
        if samples.len() != chains as usize || steps != drawn_steps || walks != drawn_walks {
            report.differ(format!(
                "the open request asks for {} chain samples, {} walk segments and {} steps; the plan says {chains} and the walk {} and {}",
                samples.len(),
                walks.len(),
                steps.len(),
                drawn_walks.len(),
                drawn_steps.len()
            ));
            return None;
        }
        let ok = samples
            .iter()
            .all(|s| s.chain < self.work.num_chains() && s.segment < self.work.segments());
        if !ok {
            report.differ("the open request names chains or segments outside the challenge");
            return None;
        }
        report.confirm(format!(
            "the open request, signed by the validator, asks for {} chain sample(s), {} walk segment(s) and {} step(s)",
            samples.len(),
            walks.len(),
            steps.len()
        ));
        Some(samples)
    }
}

/// A recorded status as tonic's, so that it is judged as the live one was.
fn status(recorded: &v1::RecordedStatus) -> Status {
    Status::new(tonic::Code::from(recorded.code), recorded.message.clone())
}

/// Version 3's memory phase as the plan states it (PROTOCOL.md 18.6), checked against what
/// the audit can derive: the walk's parameters are the signed challenge's, and each device's
/// pool is `pool_permille` of its claimed memory. Its sizing from the validator's rates and
/// settings (the walk's expected time, deadline, openings, rate and source), which version 3's
/// plan does not record, is the plan's. `None` (with the difference) where they disagree.
fn version_3_plan(
    params: &MemoryParams,
    planned: &RecordedPlan,
    claim: &HardwareClaim,
    report: &mut Report,
) -> Option<MemoryPlan> {
    let Some(memory) = planned.memory.as_ref() else {
        report.differ("the plan states no memory phase for a version 3 challenge");
        return None;
    };
    let stated = MemoryParams {
        pool_permille: memory.pool_permille,
        walkers: memory.walkers,
        walk_steps: memory.walk_steps,
        walk_checkpoint_every: memory.walk_checkpoint_every,
    };
    if stated != *params {
        report.differ("the plan's walk parameters are not the signed challenge's");
        return None;
    }
    let pools = match planned_pools(claim, params.pool_permille) {
        Ok(pools) => pools,
        Err(e) => {
            report.differ(format!("the claim's pools cannot be planned: {e}"));
            return None;
        }
    };
    let stated_pools: Vec<(u64, u64)> = memory
        .devices
        .iter()
        .map(|d| (d.claimed_bytes, d.pool_entries))
        .collect();
    let derived_pools: Vec<(u64, u64)> = pools.iter().map(|p| (p.memory_bytes, p.entries)).collect();
    let Some(source) = RateSource::parse(&memory.bandwidth_source) else {
        report.differ(format!(
            "the plan's walk rate source {:?} is not one",
            memory.bandwidth_source
        ));
        return None;
    };
    if stated_pools != derived_pools || memory.walk_bytes != params.walk_bytes() {
        report.differ("the plan's pools or walk size are not the claim's and the signed challenge's");
        return None;
    }
    report.take_as_stated(format!(
        "version 3's walk timing as planned: expected {} ms at {:.3e} bytes/s ({}), deadline {} ms, {} segments to open (from the validator's rates and settings)",
        memory.walk_expected_ms,
        memory.expected_walk_bytes_per_sec,
        memory.bandwidth_source,
        memory.walk_deadline_ms,
        memory.walk_samples
    ));
    Some(MemoryPlan {
        params: *params,
        bytes_per_sec: vec![memory.expected_walk_bytes_per_sec; pools.len()],
        pools,
        source,
        miners: memory.bandwidth_miners,
        slack: memory.slack,
        walk_expected_ms: memory.walk_expected_ms,
        walk_deadline_ms: memory.walk_deadline_ms,
        samples: memory.walk_samples,
        fill_weight: memory.fill_weight,
    })
}

/// Version 4's memory phase sized again (PROTOCOL.md 20.9) from the rates and settings the plan
/// states: the pools, the walk's shape, each device's deadline, openings and bound. It must be
/// the signed challenge's pools and walk, and the plan's stated figures; `None` (with the
/// difference) where it is not.
fn sized_again(
    challenge: &Challenge,
    params: &gpu_attest_shared::memory::chain_pool::ChainPoolParams,
    planned: &RecordedPlan,
    report: &mut Report,
) -> Option<ChainPoolPlan> {
    let (Some(memory), Some(settings)) = (planned.memory.as_ref(), planned.v4_settings) else {
        report.differ("the plan states no version 4 memory phase or settings for a version 4 challenge");
        return None;
    };
    let expected: Option<Vec<ExpectedWalk>> = memory
        .devices
        .iter()
        .map(|d| {
            let walk = d.walk.as_ref()?;
            Some(ExpectedWalk {
                bytes_per_sec: walk.expected_bytes_per_sec,
                source: RateSource::parse(&walk.bandwidth_source)?,
            })
        })
        .collect();
    let Some(expected) = expected else {
        report.differ("the plan's memory phase does not state each device's expected walk rate and its source");
        return None;
    };
    let sized = match plan_chain_pools(
        &planned.backend,
        &planned.inventory,
        &expected,
        challenge.params.n,
        challenge.params.checkpoint_every,
        &settings.into(),
    ) {
        Ok(sized) => sized,
        Err(e) => {
            report.differ(format!(
                "the plan's memory phase cannot be sized from the rates it states: {e}"
            ));
            return None;
        }
    };
    if &sized.params != params {
        report.differ("the signed challenge's pools and walk are not what the plan's rates and settings size");
        return None;
    }
    let claimed: Vec<u64> = planned.inventory.iter().map(|d| d.memory_bytes).collect();
    let figures = sized.planned_proof(challenge.params.n, &claimed);
    if serde_json::to_value(&figures).ok() != serde_json::to_value(memory).ok() {
        report
            .differ("the plan's memory figures (deadlines, openings, bounds) are not what its rates and settings give");
        return None;
    }
    report.confirm(format!(
        "the memory phase (pools, walk, each device's deadline, openings and bound) sized again from the expected walk rates the plan states ({})",
        memory.bandwidth_source
    ));
    Some(sized)
}

/// The derived verdict against the stated one, field by field; the reasons one by one.
fn compare(stated: &Verdict, derived: Verdict, report: &mut Report) {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(stated), serde_json::to_value(&derived))
    else {
        return report.differ("the verdicts could not be compared");
    };
    let mut fields: Vec<&String> = a.keys().chain(b.keys()).collect::<Vec<_>>();
    fields.sort();
    fields.dedup();
    let differing: Vec<&String> = fields.into_iter().filter(|k| a.get(*k) != b.get(*k)).collect();
    for field in &differing {
        if field.as_str() == "reasons" {
            compare_reasons(&stated.reasons, &derived.reasons, report);
        } else {
            report.differ(format!(
                "verdict field `{field}`: stated {}, re-derived {}",
                shown(a.get(*field)),
                shown(b.get(*field))
            ));
        }
    }
    if differing.is_empty() {
        report.confirm(format!(
            "the verdict re-derived from the transcript is the stated one: {}, {} reason(s), every rate and memory figure",
            if stated.passed { "PASS" } else { "FAIL" },
            stated.reasons.len()
        ));
    }
}

fn compare_reasons(stated: &[Reason], derived: &[Reason], report: &mut Report) {
    for reason in stated.iter().filter(|r| !derived.contains(r)) {
        report.differ(format!(
            "the verdict states a reason the transcript does not show: {reason}"
        ));
    }
    for reason in derived.iter().filter(|r| !stated.contains(r)) {
        report.differ(format!(
            "the transcript shows a reason the verdict does not state: {reason}"
        ));
    }
}

/// A JSON value for a person, cut short.
fn shown(value: Option<&serde_json::Value>) -> String {
    let text = value.map_or_else(|| "nothing".into(), |v| v.to_string());
    if text.len() > 200 {
        format!("{}...", &text[..text.floor_char_boundary(200)])
    } else {
        text
    }
}

/// A wait in whole milliseconds, as a transcript records it: the validator reads its clock no
/// sooner than the wait ends, so a recorded time-out is never below this.
fn whole_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
}
