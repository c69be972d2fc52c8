//! What one attestation records while it runs: each message as sent or received, in order, with
//! the validator's clock readings, and the plan it ran under. Turned into a transcript
//! (PROTOCOL.md 21.2) once the verdict is known.

use crate::config::identity::IdentityConfig;
use crate::memory::plan_v4::V4Settings;
use crate::verdict::Verdict;
use crate::verdict::memory::MemoryProof;
use crate::verdict::throughput::Expectation;
use gpu_attest_proto::v1;
use gpu_attest_shared::device::DeviceInfo;
use gpu_attest_shared::statement::memory_v4::StepSample;
use serde::{Deserialize, Serialize};
use tonic::Status;

/// What the plan fixed before the challenge was sent (PROTOCOL.md 21.2): a transcript's
/// `plan_json`. The audit re-derives the verdict from these and the messages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedPlan {
    /// `full` or `sampled`.
    pub policy: String,
    /// Chain openings to ask for under the sampled policy.
    pub samples: u32,
    pub expected_ms: u64,
    pub deadline_ms: u64,
    pub finish_by_ms: u64,
    /// The expected rate, where it came from, and the slack the deadline was set with.
    pub expectation: Expectation,
    /// The hardware the challenge was sized for (its digest is in the signed challenge).
    pub backend: String,
    pub kernel: String,
    pub inventory: Vec<DeviceInfo>,
    /// 2, 3 or 4 (PROTOCOL.md 16.1).
    pub protocol_version: u32,
    /// The memory phase as planned, before the walk: each device's expected walk rate and its
    /// source, slack, deadline, openings and the bound they prove. `None` without one.
    pub memory: Option<MemoryProof>,
    /// Version 4: the settings the planner sized the pool, the walk and the openings with
    /// (with the expected walk rates above, all it needs to size them again).
    #[serde(default)]
    pub v4_settings: Option<RecordedV4Settings>,
}

/// `V4Settings` as a transcript states them; the design (pool share, kappa, the pass
/// probability) is this release's version 4 (PROTOCOL.md 20.9).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedV4Settings {
    pub calibrated_slack: f64,
    pub first_contact_slack: f64,
    pub walkers_per_gpu: u32,
    pub walkers_per_core: u32,
    pub walk_target_ms: u64,
}

impl From<&V4Settings> for RecordedV4Settings {
    fn from(s: &V4Settings) -> Self {
        RecordedV4Settings {
            calibrated_slack: s.calibrated_slack,
            first_contact_slack: s.first_contact_slack,
            walkers_per_gpu: s.walkers_per_gpu,
            walkers_per_core: s.walkers_per_core,
            walk_target_ms: s.walk_target_ms,
        }
    }
}

impl From<RecordedV4Settings> for V4Settings {
    fn from(s: RecordedV4Settings) -> Self {
        V4Settings {
            calibrated_slack: s.calibrated_slack,
            first_contact_slack: s.first_contact_slack,
            walkers_per_gpu: s.walkers_per_gpu,
            walkers_per_core: s.walkers_per_core,
            walk_target_ms: s.walk_target_ms,
            ..V4Settings::default()
        }
    }
}

/// Where device evidence was checked: a transcript's `evidence_json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvidence {
    pub config: IdentityConfig,
    pub checked_at_ms: u64,
}

/// The messages of one attestation, as they went. (Boxed: it travels inside the outcome of
/// every attestation in flight, whose futures stay small.)
/// How many routine reads of the challenge stream (progress, empty events) a transcript lists
/// before it only counts them: about 30 KB of them.
pub const ROUTINE_READS_LISTED: u64 = 1024;

#[derive(Clone, Debug, Default)]
pub struct Recorder(Box<Records>);

#[derive(Clone, Debug, Default)]
struct Records {
    challenge: Option<v1::Challenge>,
    evidence: Option<RecordedEvidence>,
    commitment: Option<v1::RecordedCommitment>,
    stream: Option<v1::RecordedStream>,
    /// Routine reads listed so far (`ROUTINE_READS_LISTED` at most).
    routine_reads: u64,
    walk: Option<v1::RecordedWalk>,
    locality: Option<v1::RecordedLocality>,
    open: Option<v1::RecordedOpen>,
    /// Where each distinct slice of the step openings is in `open.slices`, by its hash.
    slice_refs: std::collections::HashMap<[u8; 32], u32>,
    /// Records nothing (`[transcripts] keep = "none"`): the openings are not held twice.
    off: bool,
}

/// A status as a transcript records it.
pub fn recorded_status(s: &Status) -> v1::RecordedStatus {
    status(s)
}

fn status(s: &Status) -> v1::RecordedStatus {
    v1::RecordedStatus {
        code: s.code() as i32,
        message: s.message().to_string(),
    }
}

impl Recorder {
    /// A recorder that records nothing: for a validator that keeps no transcript, which then
    /// holds no attestation's openings past their checks.
    pub fn off() -> Self {
        Recorder(Box::new(Records {
            off: true,
            ..Default::default()
        }))
    }

    pub fn challenge(&mut self, sent: v1::Challenge) {
        if self.0.off {
            return;
        }
        self.0.challenge = Some(sent);
    }

    /// The challenge went: the miner has `accept_window_ms` to accept and `allowed_ms` for its
    /// commitment.
    pub fn stream_started(&mut self, accept_window_ms: u64, allowed_ms: u64) {
        if self.0.off {
            return;
        }
        self.0.stream = Some(v1::RecordedStream {
            accept_window_ms,
            allowed_ms,
            ..Default::default()
        });
    }

    /// One read of the challenge stream. A `routine` one (progress, or an empty event, that
    /// passed) is only counted once `ROUTINE_READS_LISTED` have been listed: a miner sending
    /// events as fast as it can must not grow the record without bound, and none of them
    /// decides anything.
    pub fn stream_read(&mut self, read: v1::RecordedStreamRead, routine: bool) {
        if self.0.off {
            return;
        }
        let records = &mut *self.0;
        let stream = records.stream.get_or_insert_with(Default::default);
        if routine {
            if records.routine_reads >= ROUTINE_READS_LISTED {
                stream.passed_reads_left_out += 1;
                return;
            }
            records.routine_reads += 1;
        }
        stream.reads.push(read);
    }

    pub fn commitment(&mut self, received: v1::Commitment, received_after_ms: u64) {
        if self.0.off {
            return;
        }
        self.0.commitment = Some(v1::RecordedCommitment {
            commitment: Some(received),
            received_after_ms,
        });
    }

    /// The commitment's device evidence was checked under `config` at `checked_at_ms`.
    pub fn evidence_checked(&mut self, config: &IdentityConfig, checked_at_ms: u64) {
        if self.0.off {
            return;
        }
        self.0.evidence = Some(RecordedEvidence {
            config: config.clone(),
            checked_at_ms,
        });
    }

    pub fn walk_request(&mut self, sent: v1::WalkRequest) {
        if self.0.off {
            return;
        }
        self.0.walk = Some(v1::RecordedWalk {
            request: Some(sent),
            ..Default::default()
        });
    }

    pub fn walk_root(&mut self, received: &v1::DeviceWalkRoot, received_after_us: u64) {
        if let Some(walk) = self.0.walk.as_mut() {
            walk.roots.push(v1::RecordedWalkRoot {
                root: Some(received.clone()),
                received_after_us,
            });
        }
    }

    /// Version 3's walk statement, `received_after_ms` after the request.
    pub fn walk_statement(&mut self, received: &v1::WalkStatement, received_after_ms: u64) {
        if let Some(walk) = self.0.walk.as_mut() {
            walk.statement = Some(received.clone());
            walk.statement_after_ms = received_after_ms;
        }
    }

    /// The steps drawn for a row check, with the steps to open.
    pub fn walk_row_checked(&mut self, steps: impl IntoIterator<Item = StepSample>) {
        if let Some(walk) = self.0.walk.as_mut() {
            walk.row_checked = steps
                .into_iter()
                .map(|s| gpu_attest_proto::memory_v4::step_sample_to_wire(&s))
                .collect();
        }
    }

    pub fn walk_failed(&mut self, failure: &Status) {
        if let Some(walk) = self.0.walk.as_mut() {
            walk.failure = Some(status(failure));
        }
    }

    /// No (further) root within the walk's time, `after_ms` after the request.
    pub fn walk_timed_out(&mut self, after_ms: u64) {
        if let Some(walk) = self.0.walk.as_mut() {
            walk.timed_out_after_ms = after_ms.max(1);
        }
    }

    /// The locality walk was asked for under `plan_json` (its plan as JSON).
    pub fn locality_request(&mut self, sent: v1::LocalityRequest, plan_json: String) {
        if self.0.off {
            return;
        }
        self.0.locality = Some(v1::RecordedLocality {
            plan_json,
            request: Some(sent),
            ..Default::default()
        });
    }

    pub fn locality_root(&mut self, received: &v1::DeviceWalkRoot, received_after_us: u64) {
        if let Some(locality) = self.0.locality.as_mut() {
            locality.roots.push(v1::RecordedWalkRoot {
                root: Some(received.clone()),
                received_after_us,
            });
        }
    }

    pub fn locality_failed(&mut self, failure: &Status) {
        if let Some(locality) = self.0.locality.as_mut() {
            locality.failure = Some(status(failure));
        }
    }

    pub fn locality_timed_out(&mut self, after_ms: u64) {
        if let Some(locality) = self.0.locality.as_mut() {
            locality.timed_out_after_ms = after_ms.max(1);
        }
    }

    pub fn locality_open_request(&mut self, sent: &v1::OpenLinesRequest) {
        if let Some(locality) = self.0.locality.as_mut() {
            locality.open_request = Some(sent.clone());
        }
    }

    pub fn locality_opening(&mut self, received: v1::recorded_locality_opening::Received) {
        if let Some(locality) = self.0.locality.as_mut() {
            locality.openings.push(v1::RecordedLocalityOpening {
                received: Some(received),
            });
        }
    }

    pub fn open_request(&mut self, sent: &v1::OpenChainsRequest) {
        if self.0.off {
            return;
        }
        self.0.open = Some(v1::RecordedOpen {
            request: Some(sent.clone()),
            ..Default::default()
        });
    }

    fn opened(&mut self, received: v1::recorded_opening::Received) {
        let records = &mut *self.0;
        let Some(open) = records.open.as_mut() else {
            return;
        };
        let mut received = received;
        let mut slice_ref = 0;
        if let v1::recorded_opening::Received::Opening(v1::ChainOpening { step: Some(step), .. }) = &mut received
            && !step.slice.is_empty()
        {
            // Each distinct slice once: a small pool's few slices are read by every step.
            let slice = std::mem::take(&mut step.slice);
            let hash = *blake3::hash(&slice).as_bytes();
            slice_ref = *records.slice_refs.entry(hash).or_insert_with(|| {
                open.slices.push(slice);
                open.slices.len() as u32
            });
        }
        open.openings.push(v1::RecordedOpening {
            received: Some(received),
            slice_ref,
            walk_rows: Vec::new(),
        });
    }

    pub fn open_refused(&mut self, refusal: &Status) {
        if let Some(open) = self.0.open.as_mut() {
            open.refused = Some(status(refusal));
        }
    }

    pub fn open_timed_out(&mut self) {
        if let Some(open) = self.0.open.as_mut() {
            open.timed_out = true;
        }
    }

    /// One read of the opening stream, as it came.
    pub fn opening(&mut self, received: &Result<Option<v1::ChainOpening>, Status>) {
        use v1::recorded_opening::Received;
        self.opened(match received {
            Ok(Some(opening)) => Received::Opening(opening.clone()),
            Ok(None) => Received::Ended(true),
            Err(s) => Received::Failure(status(s)),
        });
    }

    pub fn opening_timed_out(&mut self) {
        self.opened(v1::recorded_opening::Received::TimedOut(true));
    }

    /// The rows drawn for the checks of the version 3 walk opening read last, entry by entry.
    pub fn walk_rows(&mut self, rows: &[u32]) {
        if let Some(last) = self.0.open.as_mut().and_then(|open| open.openings.last_mut()) {
            last.walk_rows = rows.to_vec();
        }
    }

    /// The row drawn for `step`'s row check, after its opening arrived.
    pub fn row_check(&mut self, step: StepSample, row: u32) {
        if let Some(open) = self.0.open.as_mut() {
            open.row_checks.push(v1::RowCheck {
                step: Some(gpu_attest_proto::memory_v4::step_sample_to_wire(&step)),
                row,
            });
        }
    }

    /// The transcript of the attestation that reached `verdict` (as stored, with its id).
    pub fn into_transcript(self, verdict: &Verdict, plan: &RecordedPlan) -> Result<v1::Transcript, serde_json::Error> {
        let records = *self.0;
        Ok(v1::Transcript {
            format: super::FORMAT,
            verdict_json: serde_json::to_string(verdict)?,
            plan_json: serde_json::to_string(plan)?,
            challenge: records.challenge,
            commitment: records.commitment,
            stream: records.stream,
            walk: records.walk,
            locality: records.locality,
            open: records.open,
            miner_url: verdict.miner_url.clone(),
            evidence_json: match &records.evidence {
                Some(e) => serde_json::to_string(e)?,
                None => String::new(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routine reads past the first `ROUTINE_READS_LISTED` are counted, not listed; every
    /// other read is listed however many came before it.
    #[test]
    fn routine_stream_reads_are_listed_up_to_their_cap_and_counted_after() {
        let mut recorder = Recorder::default();
        recorder.stream_started(250, 10_000);
        let read = |after_us| v1::RecordedStreamRead {
            after_us,
            ..Default::default()
        };
        for i in 0..ROUTINE_READS_LISTED + 10 {
            recorder.stream_read(read(i), true);
        }
        recorder.stream_read(read(9_999), false);
        let stream = recorder.0.stream.unwrap();
        assert_eq!(stream.reads.len() as u64, ROUTINE_READS_LISTED + 1);
        assert_eq!(stream.passed_reads_left_out, 10);
        assert_eq!(
            stream.reads.last().unwrap().after_us,
            9_999,
            "the deciding read is listed"
        );
        assert_eq!((stream.accept_window_ms, stream.allowed_ms), (250, 10_000));
    }

    /// A recorder that is off holds nothing of what passes through it.
    #[test]
    fn a_recorder_that_is_off_records_nothing() {
        let opening = v1::ChainOpening {
            start_matrix: vec![1; 4096],
            ..Default::default()
        };
        for (mut recorder, on) in [(Recorder::default(), true), (Recorder::off(), false)] {
            recorder.challenge(v1::Challenge::default());
            recorder.commitment(v1::Commitment::default(), 5);
            recorder.open_request(&v1::OpenChainsRequest::default());
            recorder.opening(&Ok(Some(opening.clone())));
            recorder.stream_started(250, 10_000);
            recorder.stream_read(v1::RecordedStreamRead::default(), false);
            let records = &recorder.0;
            assert_eq!(records.stream.is_some(), on);
            assert_eq!(records.challenge.is_some(), on);
            assert_eq!(records.commitment.is_some(), on);
            assert_eq!(records.open.as_ref().map_or(0, |o| o.openings.len()), usize::from(on));
        }
    }
}
