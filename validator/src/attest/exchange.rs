//! The challenge stream (PROTOCOL.md 14.3): `Accepted`, then `Progress`, then the signed
//! `Commitment`. Every event is checked against the plan before anything is relayed, so an API
//! client never sees a miner's impossible claims as if they were facts.

use super::decoding::own_decode_failure;
use super::{AttestError, AttestEvent};
use crate::device_identity::check::WireEvidence;
use crate::planner::Plan;
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
const ACCEPT_FLOOR_MS: u64 = 250;

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

    /// What `answer` gave, if it came within the window; `None` once the window has passed.
    pub async fn bound<F: Future>(&self, answer: F) -> Option<F::Output> {
        tokio::time::timeout_at(self.ends, answer).await.ok()
    }

    /// Why an attestation whose miner let the window pass has failed.
    pub fn missed(&self) -> Reason {
        Reason::new(
            ReasonCode::NotAccepted,
            format!(
                "the miner neither accepted nor refused the challenge within {} ms of its sending; past that a refusal no longer withdraws an issued challenge (a miner that is down or cannot be reached fails the same way)",
                self.length.as_millis()
            ),
        )
    }
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

/// Reads the challenge stream until the commitment or `until`, relaying checked events. `Err`
/// means the miner refused, or ended the stream, within the accept window (no verdict); every
/// other outcome, from its first event on or once the window has passed, is a [`Received`].
pub async fn await_commitment(
    url: &str,
    stream: &mut Streaming<v1::ChallengeEvent>,
    plan: &Plan,
    until: tokio::time::Instant,
    window: &AcceptWindow,
    on_event: &(dyn Fn(AttestEvent) + Send + Sync),
) -> Result<Received, AttestError> {
    let mut check = StreamCheck::new(plan);
    let mut answered = false;
    let started = Instant::now();
    let read = async {
        loop {
            let next = if answered {
                stream.message().await
            } else {
                match window.bound(stream.message()).await {
                    Some(next) => next,
                    None => return Ok(Received::Failed(window.missed())),
                }
            };
            let event = match classify(next, answered, url, plan, started) {
                Read::Event(event) => event,
                Read::Skip => continue,
                Read::Done(done) => return done,
            };
            answered = true;
            if let Some(received) = handle(&mut check, event, on_event) {
                return Ok(received);
            }
        }
    };
    match tokio::time::timeout_at(until, read).await {
        Ok(received) => received,
        Err(_) if !answered => Ok(Received::Failed(window.missed())),
        Err(_) => Ok(Received::Failed(Reason::new(
            ReasonCode::CommitmentTimedOut,
            format!(
                "no commitment within {} ms ({})",
                started.elapsed().as_millis(),
                time_allowed(plan)
            ),
        ))),
    }
}

/// What one read of the challenge stream came to.
enum Read {
    Event(Event),
    /// An empty event (a oneof this version does not know) says nothing: skipped.
    Skip,
    /// The stream ended, or failed: the attestation's outcome, or no verdict at all.
    Done(Result<Received, AttestError>),
}

/// One read of the stream, `answered` saying whether the miner has sent an event yet: before
/// that, an end or an error is a refusal (no verdict); after it, a failure.
fn classify(
    next: Result<Option<v1::ChallengeEvent>, tonic::Status>,
    answered: bool,
    url: &str,
    plan: &Plan,
    started: Instant,
) -> Read {
    let failed = |code, message: String| Read::Done(Ok(Received::Failed(Reason::new(code, message))));
    // What this validator could not decode was sent, not refused: a verdict, whenever it came
    // (PROTOCOL.md 14.1). The events lead to the commitment, whose reason it takes.
    if let Err(status) = &next
        && let Some(why) = own_decode_failure(status)
    {
        return failed(
            ReasonCode::MalformedCommitment,
            format!("a message of the challenge stream: {why}"),
        );
    }
    match next {
        Ok(Some(v1::ChallengeEvent { event: Some(event) })) => Read::Event(event),
        Ok(Some(v1::ChallengeEvent { event: None })) => Read::Skip,
        Ok(None) if !answered => Read::Done(Err(AttestError::NotAMiner {
            url: url.into(),
            detail: "it ended the challenge stream without accepting or refusing".into(),
        })),
        Ok(None) => failed(
            ReasonCode::NoCommitment,
            "miner ended the stream without a commitment".into(),
        ),
        Err(status) if !answered => Read::Done(Err(super::client::refused(url, status))),
        // The miner gave up at the deadline (or the finish-by time): it could not do the work
        // in time, which is what the deadline tests. Named as such, not as a generic failure.
        Err(status) if status.code() == tonic::Code::DeadlineExceeded => failed(
            ReasonCode::CommitmentTimedOut,
            format!(
                "no commitment by the {}: the miner stopped after {} ms ({})",
                time_allowed(plan),
                started.elapsed().as_millis(),
                miner_text(status.message())
            ),
        ),
        // Not the miner's word: the connection went (it shut down or crashed, or the network
        // failed).
        Err(status) if made_by_the_connection(&status) => failed(
            ReasonCode::MinerFailed,
            format!(
                "the miner's connection closed after it accepted the challenge, without a word from the miner: it shut down, crashed or lost its network ({})",
                miner_text(status.message())
            ),
        ),
        Err(status) => failed(
            ReasonCode::MinerFailed,
            format!(
                "miner failed after accepting the challenge ({:?}): {}",
                status.code(),
                miner_text(status.message())
            ),
        ),
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
