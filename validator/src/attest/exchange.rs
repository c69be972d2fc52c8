//! The challenge stream (PROTOCOL.md 14.3): `Accepted`, then `Progress`, then the signed
//! `Commitment`. Every event is checked against the plan before anything is relayed, so an API
//! client never sees a miner's impossible claims as if they were facts.

use super::decoding::{could_not_decode, own_decode_failure};
use super::{AttestError, AttestEvent};
use crate::device_identity::check::WireEvidence;
use crate::planner::Plan;
use crate::transcript::Recorder;
use crate::untrusted::miner_text;
use crate::verdict::reason::{Reason, ReasonCode};
use gpu_attest_daemon::dial::made_by_the_connection;
use gpu_attest_proto::convert::commitment_from_wire;
use gpu_attest_proto::evidence::evidence_from_wire;
use gpu_attest_proto::v1::{self, challenge_event::Event};
use gpu_attest_shared::engine::DeviceProgress;
use gpu_attest_shared::partition::{DeviceSlice, canonical_partition};
use gpu_attest_shared::statement::Commitment;
use std::time::{Duration, Instant};
use tonic::Streaming;

/// What the stream may contain, given the plan: `Accepted` once and first, naming the planned
/// device count and backend; progress only for devices of the canonical partition, with the
/// device's own chain count as its total and never more done than that.
pub struct StreamCheck {
    backend: String,
    partition: Vec<DeviceSlice>,
    accepted: bool,
}

impl StreamCheck {
    pub fn new(plan: &Plan) -> Self {
        let devices = plan.claim.devices.len() as u32;
        StreamCheck {
            backend: plan.claim.backend.clone(),
            // The planner guarantees 1..=64 devices, so the partition exists.
            partition: canonical_partition(plan.params.num_chains, devices).unwrap_or_default(),
            accepted: false,
        }
    }

    pub fn accepted(&mut self, a: &v1::Accepted) -> Result<(), Reason> {
        if self.accepted {
            return Err(Reason::new(ReasonCode::StreamOutOfOrder, "miner sent Accepted twice"));
        }
        self.accepted = true;
        let planned = self.partition.len();
        if a.devices as usize != planned || a.backend != self.backend {
            return Err(Reason::new(
                ReasonCode::HardwareMismatch,
                format!(
                    "miner accepted on {} device(s) with the {:?} backend; the challenge was sized for {planned} with {:?}",
                    a.devices, a.backend, self.backend
                ),
            ));
        }
        Ok(())
    }

    pub fn progress(&self, p: &v1::Progress) -> Result<DeviceProgress, Reason> {
        if !self.accepted {
            return Err(Reason::new(
                ReasonCode::StreamOutOfOrder,
                "miner sent progress before accepting the challenge",
            ));
        }
        let impossible = |why: String| Err(Reason::new(ReasonCode::ImpossibleProgress, why));
        let Some(slice) = self.partition.get(p.device as usize) else {
            return impossible(format!(
                "progress for device {}, but the challenge has {} device(s), numbered from 0",
                p.device,
                self.partition.len()
            ));
        };
        if p.total != slice.count {
            return impossible(format!(
                "device {} reports {} chains in all; its share of the partition is {}",
                p.device, p.total, slice.count
            ));
        }
        if p.done > p.total {
            return impossible(format!(
                "device {} reports {} of {} chains done",
                p.device, p.done, p.total
            ));
        }
        Ok(DeviceProgress {
            device: p.device,
            done: p.done,
            total: p.total,
        })
    }
}

/// The time a miner has to accept or refuse a challenge, from its sending (PROTOCOL.md 14.3).
/// An honest miner answers at once; one that answers later could have computed first and
/// refused only the runs it would fail, so past the window the challenge stands issued.
pub struct AcceptWindow {
    length: Duration,
    ends: tokio::time::Instant,
}

/// The shortest accept window: a slow network's round trip or two.
pub const ACCEPT_FLOOR_MS: u64 = 250;

/// The time a miner has for its commitment from the challenge's sending (PROTOCOL.md 14.4): its
/// deadline, or finish-by time, and a grace of a tenth of the deadline and 2 s for a miner that
/// does not stop itself.
pub fn time_allowed_ms(deadline_ms: u64, finish_by_ms: u64) -> u64 {
    deadline_ms.max(finish_by_ms) + deadline_ms / 10 + 2_000
}

/// How long after a walk request the validator waits for an answer before it records that none
/// came: the walk's deadline and the commitment's grace (PROTOCOL.md 14.4), for a miner that
/// does not stop itself. The audit holds a recorded time-out to the same figure, so a
/// transcript cannot fail a miner by saying it gave up sooner.
pub fn walk_give_up(deadline: Duration) -> Duration {
    deadline + deadline / 10 + Duration::from_secs(2)
}

impl AcceptWindow {
    /// The window from now, for a challenge with a deadline `deadline_ms` away: create it as the
    /// challenge is sent. `accept_ms` (the configuration's), but never more than a quarter of
    /// the deadline, or a miner allowed a short deadline could compute most of it before
    /// deciding whether to accept; and never under 250 ms.
    pub fn new(accept_ms: u64, deadline_ms: u64) -> Self {
        let length = Duration::from_millis(accept_ms.min((deadline_ms / 4).max(ACCEPT_FLOOR_MS)));
        AcceptWindow {
            length,
            ends: tokio::time::Instant::now() + length,
        }
    }

    pub fn length_ms(&self) -> u64 {
        self.length.as_millis() as u64
    }

    /// What `answer` gave, if it came within the window; `None` once the window has passed.
    pub async fn bound<F: Future>(&self, answer: F) -> Option<F::Output> {
        tokio::time::timeout_at(self.ends, answer).await.ok()
    }
}

/// Why an attestation whose miner let an accept window of `window_ms` pass has failed.
pub fn window_missed(window_ms: u64) -> Reason {
    Reason::new(
        ReasonCode::NotAccepted,
        format!(
            "the miner neither accepted nor refused the challenge within {window_ms} ms of its sending; past that a refusal no longer withdraws an issued challenge (a miner that is down or cannot be reached fails the same way)"
        ),
    )
}

/// A commitment as received: converted from the wire, nothing checked yet.
pub struct Committed {
    /// As received, for the transcript.
    pub wire: v1::Commitment,
    pub commitment: Commitment,
    pub signature: [u8; 64],
    /// The device evidence beside it (PROTOCOL.md 19.3), read only under an identity policy.
    pub evidence: WireEvidence,
}

/// How the challenge stream ended, from the validator's side.
pub enum Received {
    Commitment(Box<Committed>),
    /// A commitment that does not decode: as received (for the transcript), and why.
    Unreadable(Box<v1::Commitment>, Reason),
    /// The attestation has failed; the outcome says why.
    Failed(Reason),
}

/// One read of the challenge stream as this validator made it: what [`StreamJudge`] acts on,
/// and what a transcript records (PROTOCOL.md 21.2), so that an audit acts on it again.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamRead {
    /// A message (one of a kind this version does not know has no `event`).
    Message(Box<v1::ChallengeEvent>),
    /// The miner ended the stream.
    Ended,
    /// The stream failed with this status. `by_connection`: made by this side's transport (the
    /// connection went), not sent by the miner; `undecodable`: this side could not decode what
    /// the miner sent (PROTOCOL.md 14.1), which is the miner's doing whatever came before it.
    Failed {
        code: tonic::Code,
        message: String,
        by_connection: bool,
        undecodable: bool,
    },
    /// Nothing within the accept window.
    WindowPassed,
    /// Nothing more by the time the miner had (its deadline, or finish-by time, and the grace).
    TimedOut,
}

impl StreamRead {
    /// What a read of the stream gave, as this side saw it.
    pub fn of(next: Result<Option<v1::ChallengeEvent>, tonic::Status>) -> Self {
        match next {
            Ok(Some(event)) => StreamRead::Message(Box::new(event)),
            Ok(None) => StreamRead::Ended,
            Err(status) => StreamRead::Failed {
                code: status.code(),
                message: status.message().to_string(),
                by_connection: made_by_the_connection(&status),
                undecodable: own_decode_failure(&status).is_some(),
            },
        }
    }

    /// As a transcript records it (PROTOCOL.md 21.2): a commitment by a mark, since the
    /// transcript holds it whole beside the reads.
    pub fn recorded(&self, after_us: u64) -> v1::RecordedStreamRead {
        use v1::recorded_stream_read::Read;
        let read = match self {
            StreamRead::Message(message) => match &message.event {
                Some(Event::Accepted(a)) => Read::Accepted(a.clone()),
                Some(Event::Progress(p)) => Read::Progress(*p),
                Some(Event::Commitment(_)) => Read::Commitment(true),
                None => Read::Empty(true),
            },
            StreamRead::Ended => Read::Ended(true),
            StreamRead::Failed { code, message, .. } => Read::Failed(v1::RecordedStatus {
                code: *code as i32,
                message: message.clone(),
            }),
            StreamRead::WindowPassed => Read::WindowPassed(true),
            StreamRead::TimedOut => Read::TimedOut(true),
        };
        let (by_connection, undecodable) = match self {
            StreamRead::Failed {
                by_connection,
                undecodable,
                ..
            } => (*by_connection, *undecodable),
            _ => (false, false),
        };
        v1::RecordedStreamRead {
            after_us,
            read: Some(read),
            by_connection,
            undecodable,
        }
    }

    /// A recorded read again, its commitment mark replaced by `commitment` (the transcript's,
    /// or an empty one where none is recorded: a commitment sent before `Accepted` ends the
    /// stream unread); `None` for a read with nothing set.
    pub fn from_recorded(recorded: &v1::RecordedStreamRead, commitment: Option<&v1::Commitment>) -> Option<Self> {
        use v1::recorded_stream_read::Read;
        let message = |event| StreamRead::Message(Box::new(v1::ChallengeEvent { event }));
        Some(match recorded.read.as_ref()? {
            Read::Accepted(a) => message(Some(Event::Accepted(a.clone()))),
            Read::Progress(p) => message(Some(Event::Progress(*p))),
            Read::Commitment(_) => message(Some(Event::Commitment(commitment.cloned().unwrap_or_default()))),
            Read::Empty(_) => message(None),
            Read::Ended(_) => StreamRead::Ended,
            Read::Failed(status) => StreamRead::Failed {
                code: tonic::Code::from_i32(status.code),
                message: status.message.clone(),
                by_connection: recorded.by_connection,
                undecodable: recorded.undecodable,
            },
            Read::WindowPassed(_) => StreamRead::WindowPassed,
            Read::TimedOut(_) => StreamRead::TimedOut,
        })
    }

    /// A read that, having passed, changes nothing the stream's judgement rests on: progress and
    /// empty events, of which a transcript lists only the first ones.
    pub fn is_routine(&self) -> bool {
        matches!(self, StreamRead::Message(message)
            if matches!(message.event, Some(Event::Progress(_)) | None))
    }
}

/// What one read of the stream came to.
pub enum Judged {
    /// The event passed its checks: read on.
    ReadOn,
    /// The stream's outcome. `Err`: the miner refused, or ended the stream, within the accept
    /// window (no verdict); every other outcome is a [`Received`].
    Done(Result<Received, AttestError>),
}

impl Judged {
    /// The stream has failed, with the reason `code` and `message` give.
    fn failed(code: ReasonCode, message: String) -> Self {
        Judged::Done(Ok(Received::Failed(Reason::new(code, message))))
    }
}

/// The challenge stream's rules (PROTOCOL.md 14.3), applied one read at a time: by the
/// attestation as it reads, and by an audit on the reads a transcript recorded.
pub struct StreamJudge<'a> {
    check: StreamCheck,
    /// The miner has sent an event: from here an end or an error is a failure, not a refusal.
    answered: bool,
    plan: &'a Plan,
    window_ms: u64,
}

impl<'a> StreamJudge<'a> {
    pub fn new(plan: &'a Plan, window_ms: u64) -> Self {
        StreamJudge {
            check: StreamCheck::new(plan),
            answered: false,
            plan,
            window_ms,
        }
    }

    pub fn answered(&self) -> bool {
        self.answered
    }

    /// Judges `read`, made `after_ms` after the challenge was sent, relaying a checked event.
    pub fn judge(
        &mut self,
        read: StreamRead,
        after_ms: u64,
        url: &str,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Judged {
        match read {
            StreamRead::Message(message) => match message.event {
                Some(event) => {
                    self.answered = true;
                    match handle(&mut self.check, event, on_event) {
                        Some(received) => Judged::Done(Ok(received)),
                        None => Judged::ReadOn,
                    }
                }
                // An empty event (a oneof this version does not know) says nothing.
                None => Judged::ReadOn,
            },
            StreamRead::WindowPassed => Judged::Done(Ok(Received::Failed(window_missed(self.window_ms)))),
            StreamRead::TimedOut if !self.answered => Judged::Done(Ok(Received::Failed(window_missed(self.window_ms)))),
            StreamRead::TimedOut => Judged::failed(
                ReasonCode::CommitmentTimedOut,
                format!("no commitment within {after_ms} ms ({})", time_allowed(self.plan)),
            ),
            StreamRead::Ended if !self.answered => Judged::Done(Err(AttestError::NotAMiner {
                url: url.into(),
                detail: "it ended the challenge stream without accepting or refusing".into(),
            })),
            StreamRead::Ended => Judged::failed(
                ReasonCode::NoCommitment,
                "miner ended the stream without a commitment".into(),
            ),
            StreamRead::Failed {
                code,
                message,
                by_connection,
                undecodable,
            } => self.failure(
                tonic::Status::new(code, message),
                by_connection,
                undecodable,
                after_ms,
                url,
            ),
        }
    }

    /// A stream that failed with `status`: before the miner answered, a refusal (no verdict);
    /// after, a failure.
    fn failure(
        &self,
        status: tonic::Status,
        by_connection: bool,
        undecodable: bool,
        after_ms: u64,
        url: &str,
    ) -> Judged {
        // What this validator could not decode was sent, not refused: a verdict, whenever it
        // came (PROTOCOL.md 14.1). The events lead to the commitment, whose reason it takes.
        if undecodable {
            return Judged::failed(
                ReasonCode::MalformedCommitment,
                format!(
                    "a message of the challenge stream: {}",
                    could_not_decode(status.message())
                ),
            );
        }
        if !self.answered {
            return Judged::Done(Err(super::client::refused(url, status)));
        }
        if status.code() == tonic::Code::DeadlineExceeded {
            // The miner gave up at the deadline (or the finish-by time): it could not do the
            // work in time, which is what the deadline tests. Named as such, not as a generic
            // failure.
            return Judged::failed(
                ReasonCode::CommitmentTimedOut,
                format!(
                    "no commitment by the {}: the miner stopped after {after_ms} ms ({})",
                    time_allowed(self.plan),
                    miner_text(status.message())
                ),
            );
        }
        if by_connection {
            // Not the miner's word: the connection went (it shut down or crashed, or the
            // network failed).
            return Judged::failed(
                ReasonCode::MinerFailed,
                format!(
                    "the miner's connection closed after it accepted the challenge, without a word from the miner: it shut down, crashed or lost its network ({})",
                    miner_text(status.message())
                ),
            );
        }
        Judged::failed(
            ReasonCode::MinerFailed,
            format!(
                "miner failed after accepting the challenge ({:?}): {}",
                status.code(),
                miner_text(status.message())
            ),
        )
    }
}

/// Reads the challenge stream until its outcome, judging and recording each read, and relaying
/// checked events. Returns the outcome and when it was read (milliseconds from `sent`). `Err`
/// means the miner refused, or ended the stream, within the accept window (no verdict).
#[allow(clippy::too_many_arguments)]
pub async fn await_commitment(
    url: &str,
    stream: &mut Streaming<v1::ChallengeEvent>,
    plan: &Plan,
    sent: Instant,
    until: tokio::time::Instant,
    window: &AcceptWindow,
    recorder: &mut Recorder,
    on_event: &(dyn Fn(AttestEvent) + Send + Sync),
) -> Result<(Received, u64), AttestError> {
    let mut judge = StreamJudge::new(plan, window.length_ms());
    loop {
        // The window ends before `until` (it is at most a quarter of the deadline).
        let read = if judge.answered() {
            match tokio::time::timeout_at(until, stream.message()).await {
                Ok(next) => StreamRead::of(next),
                Err(_) => StreamRead::TimedOut,
            }
        } else {
            match window.bound(tokio::time::timeout_at(until, stream.message())).await {
                Some(Ok(next)) => StreamRead::of(next),
                Some(Err(_)) => StreamRead::TimedOut,
                None => StreamRead::WindowPassed,
            }
        };
        let after_us = sent.elapsed().as_micros() as u64;
        let judged = judge.judge(read.clone(), after_us / 1000, url, on_event);
        recorder.stream_read(
            read.recorded(after_us),
            read.is_routine() && matches!(judged, Judged::ReadOn),
        );
        if let Judged::Done(done) = judged {
            return done.map(|received| (received, after_us / 1000));
        }
    }
}

/// Checks one event against the plan and relays it; `Some` once the stream has given its
/// outcome (the commitment, or a failure).
fn handle(check: &mut StreamCheck, event: Event, on_event: &(dyn Fn(AttestEvent) + Send + Sync)) -> Option<Received> {
    match event {
        Event::Accepted(a) => {
            if let Err(reason) = check.accepted(&a) {
                return Some(Received::Failed(reason));
            }
            on_event(AttestEvent::Phase {
                name: "computing",
                detail: format!("miner accepted: {} device(s), {} backend", a.devices, a.backend),
            });
            None
        }
        Event::Progress(p) => match check.progress(&p) {
            Ok(progress) => {
                on_event(AttestEvent::Progress(progress));
                None
            }
            Err(reason) => Some(Received::Failed(reason)),
        },
        Event::Commitment(c) if check.accepted => Some(match commitment_from_wire(&c) {
            Ok((commitment, signature)) => Received::Commitment(Box::new(Committed {
                commitment,
                signature,
                evidence: evidence_from_wire(&c.evidence, &c.evidence_signature),
                wire: c,
            })),
            Err(e) => {
                let reason = malformed_commitment(&e);
                Received::Unreadable(Box::new(c), reason)
            }
        }),
        Event::Commitment(_) => Some(Received::Failed(Reason::new(
            ReasonCode::StreamOutOfOrder,
            "miner sent a commitment before accepting the challenge",
        ))),
    }
}

/// Why a commitment that does not decode fails (PROTOCOL.md 14.4 step 1).
pub fn malformed_commitment(error: &gpu_attest_proto::WireError) -> Reason {
    Reason::new(
        ReasonCode::MalformedCommitment,
        format!("malformed commitment: {error}"),
    )
}

/// The time a miner had, for people: "deadline 4000 ms", with the finish-by time if any.
fn time_allowed(plan: &Plan) -> String {
    match plan.finish_by_ms {
        0 => format!("deadline {} ms", plan.deadline_ms),
        f => format!("deadline {} ms, finish-by time {f} ms", plan.deadline_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::MemoryPhasePlan;
    use gpu_attest_shared::ChallengeParams;
    use gpu_attest_shared::inventory::HardwareClaim;
    use gpu_attest_shared::statement::DeviceInfo;

    /// 5 chains on 2 devices: device 0 has 3, device 1 has 2.
    fn plan() -> Plan {
        Plan {
            params: ChallengeParams {
                nonce: [0; 32],
                seed: [0; 32],
                miner_key: [0; 32],
                n: 64,
                num_chains: 5,
                iterations: 2,
                checkpoint_every: 1,
            },
            claim: HardwareClaim {
                backend: "cpu".into(),
                kernel: "portable".into(),
                devices: vec![DeviceInfo::default(); 2],
            },
            expectation: crate::verdict::throughput::Expectation {
                ops_per_sec: 1.0,
                source: Some(crate::verdict::class::RateSource::Shipped),
                miners: 0,
                slack: 2.0,
                peak_ops_per_sec: 0.0,
            },
            expected_ms: 1,
            deadline_ms: 1,
            finish_by_ms: 0,
            samples: 1,
            memory: MemoryPhasePlan::Off,
        }
    }

    #[tokio::test]
    async fn the_accept_window_is_at_most_a_quarter_of_the_deadline() {
        let ms = |accept_ms, deadline_ms| AcceptWindow::new(accept_ms, deadline_ms).length.as_millis();
        assert_eq!(ms(2_000, 60_000), 2_000);
        // A miner that asks for short deadlines cannot use most of one to decide.
        assert_eq!(ms(2_000, 2_000), 500);
        assert_eq!(ms(2_000, 400), 250, "a round trip is always allowed");
        assert_eq!(ms(300, 1_500), 300);
    }

    fn progress(device: u32, done: u64, total: u64) -> v1::Progress {
        v1::Progress { device, done, total }
    }

    fn code<T>(r: Result<T, Reason>) -> Option<ReasonCode> {
        r.err().map(|r| r.code)
    }

    #[test]
    fn progress_must_fit_the_accepted_partition() {
        let mut check = StreamCheck::new(&plan());
        assert_eq!(
            code(check.progress(&progress(0, 1, 3))),
            Some(ReasonCode::StreamOutOfOrder)
        );
        let accepted = v1::Accepted {
            devices: 2,
            backend: "cpu".into(),
        };
        check.accepted(&accepted).unwrap();
        assert_eq!(check.progress(&progress(0, 3, 3)).unwrap().done, 3);
        assert_eq!(check.progress(&progress(1, 0, 2)).unwrap().total, 2);
        for (p, why) in [
            (progress(2, 1, 2), "device past d"),
            (progress(0, 4, 3), "done beyond the device's chains"),
            (progress(0, 0, 0), "total of zero"),
            (progress(1, 1, 3), "another device's total"),
        ] {
            assert_eq!(code(check.progress(&p)), Some(ReasonCode::ImpossibleProgress), "{why}");
        }
        assert_eq!(code(check.accepted(&accepted)), Some(ReasonCode::StreamOutOfOrder));
    }

    /// Every kind of read comes back from its record as it was; a commitment by its mark, put
    /// back from the transcript's.
    #[test]
    fn a_recorded_read_comes_back_as_it_was_read() {
        let commitment = v1::Commitment {
            nonce: vec![7; 32],
            ..Default::default()
        };
        let event = |event| StreamRead::Message(Box::new(v1::ChallengeEvent { event: Some(event) }));
        for read in [
            event(Event::Accepted(v1::Accepted {
                devices: 2,
                backend: "cpu".into(),
            })),
            event(Event::Progress(progress(1, 2, 3))),
            event(Event::Commitment(commitment.clone())),
            StreamRead::Message(Box::default()),
            StreamRead::Ended,
            StreamRead::Failed {
                code: tonic::Code::Unavailable,
                message: "gone".into(),
                by_connection: true,
                undecodable: false,
            },
            StreamRead::Failed {
                code: tonic::Code::Internal,
                message: "failed to decode Protobuf message: x".into(),
                by_connection: false,
                undecodable: true,
            },
            StreamRead::WindowPassed,
            StreamRead::TimedOut,
        ] {
            let recorded = read.recorded(1234);
            assert_eq!(recorded.after_us, 1234);
            assert_eq!(StreamRead::from_recorded(&recorded, Some(&commitment)), Some(read));
        }
        let mark = event(Event::Commitment(commitment)).recorded(0);
        assert_eq!(
            StreamRead::from_recorded(&mark, None),
            Some(event(Event::Commitment(v1::Commitment::default()))),
            "a commitment not kept (sent before Accepted) reads as an empty one"
        );
        assert_eq!(
            StreamRead::from_recorded(&v1::RecordedStreamRead::default(), None),
            None
        );
    }

    fn judged_reason(judged: Judged) -> Option<ReasonCode> {
        match judged {
            Judged::Done(Ok(Received::Failed(reason))) => Some(reason.code),
            _ => None,
        }
    }

    /// The stream's rules one read at a time: before the miner answers, an end or an error is
    /// a refusal (no verdict) and silence the window's reason; after, each is a failure of its
    /// own.
    #[test]
    fn each_read_is_judged_by_whether_the_miner_has_answered() {
        let plan = plan();
        let accepted = StreamRead::Message(Box::new(v1::ChallengeEvent {
            event: Some(Event::Accepted(v1::Accepted {
                devices: 2,
                backend: "cpu".into(),
            })),
        }));
        let failed = |code, by_connection| StreamRead::Failed {
            code,
            message: "m".into(),
            by_connection,
            undecodable: false,
        };
        let unanswered = |read| StreamJudge::new(&plan, 300).judge(read, 5, "u", &|_| {});
        assert!(matches!(unanswered(StreamRead::Ended), Judged::Done(Err(_))));
        assert!(matches!(
            unanswered(failed(tonic::Code::Unavailable, false)),
            Judged::Done(Err(_))
        ));
        assert_eq!(
            judged_reason(unanswered(StreamRead::WindowPassed)),
            Some(ReasonCode::NotAccepted)
        );
        assert!(matches!(
            unanswered(StreamRead::Message(Box::default())),
            Judged::ReadOn
        ));
        for (read, code) in [
            (StreamRead::Ended, ReasonCode::NoCommitment),
            (StreamRead::TimedOut, ReasonCode::CommitmentTimedOut),
            (
                failed(tonic::Code::DeadlineExceeded, false),
                ReasonCode::CommitmentTimedOut,
            ),
            (failed(tonic::Code::Unavailable, true), ReasonCode::MinerFailed),
            (failed(tonic::Code::Internal, false), ReasonCode::MinerFailed),
            (accepted.clone(), ReasonCode::StreamOutOfOrder),
        ] {
            let mut judge = StreamJudge::new(&plan, 300);
            assert!(matches!(judge.judge(accepted.clone(), 1, "u", &|_| {}), Judged::ReadOn));
            assert_eq!(
                judged_reason(judge.judge(read.clone(), 2, "u", &|_| {})),
                Some(code),
                "{read:?}"
            );
        }
    }

    #[test]
    fn accepted_must_name_the_planned_devices_and_backend() {
        for (devices, backend) in [(8, "cpu"), (2, "cuda")] {
            let mut check = StreamCheck::new(&plan());
            let a = v1::Accepted {
                devices,
                backend: backend.into(),
            };
            assert_eq!(code(check.accepted(&a)), Some(ReasonCode::HardwareMismatch));
        }
    }
}
