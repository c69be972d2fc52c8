//! The challenge stream again, from its recorded reads (PROTOCOL.md 21.2, 21.3 step 3): the
//! attestation's own [`StreamJudge`] on each read, in order, so that the reason a stream ended
//! in (or its commitment) is derived, not taken as stated.

use super::Report;
use crate::attest::exchange::{ACCEPT_FLOOR_MS, Judged, Received, StreamJudge, StreamRead, time_allowed_ms};
use crate::planner::Plan;
use crate::verdict::reason::Reason;
use gpu_attest_proto::v1;

/// What the recorded stream came to.
pub(super) enum StreamEnd {
    /// The recorded commitment, read `after_ms` after the challenge was sent.
    Commitment { after_ms: u64 },
    /// A failure: the reason, and when the read that decided it was made.
    Failed { reason: Reason, after_ms: u64 },
    /// The record does not replay to an outcome (the report says why).
    Broken,
}

/// Replays `stream`, the reads `t` records, under `plan`.
pub(super) fn replay_stream(
    t: &v1::Transcript,
    stream: &v1::RecordedStream,
    plan: &Plan,
    report: &mut Report,
) -> StreamEnd {
    let commitment = t.commitment.as_ref().and_then(|c| c.commitment.as_ref());
    let allowed_ms = time_allowed_ms(plan.deadline_ms, plan.finish_by_ms);
    if stream.allowed_ms != allowed_ms {
        report.differ(format!(
            "the miner was allowed {} ms for its commitment; its deadline and grace (PROTOCOL.md 14.4) give {allowed_ms} ms",
            stream.allowed_ms
        ));
        return StreamEnd::Broken;
    }
    if stream.accept_window_ms < ACCEPT_FLOOR_MS {
        report.differ(format!(
            "the miner had {} ms to accept the challenge, under the {ACCEPT_FLOOR_MS} ms every miner is given (PROTOCOL.md 14.3)",
            stream.accept_window_ms
        ));
        return StreamEnd::Broken;
    }
    report.confirm(format!(
        "the miner had {} ms to accept (the validator's setting) and {allowed_ms} ms for its commitment (its deadline and grace)",
        stream.accept_window_ms
    ));
    let mut judge = StreamJudge::new(plan, stream.accept_window_ms);
    let url = t.miner_url.as_str();
    let mut last_us = 0;
    let count = stream.reads.len();
    for (i, recorded) in stream.reads.iter().enumerate() {
        let place = format!("read {} of {count} of the challenge stream", i + 1);
        if recorded.after_us < last_us {
            report.differ(format!("{place} is recorded before the read ahead of it"));
            return StreamEnd::Broken;
        }
        last_us = recorded.after_us;
        let Some(read) = StreamRead::from_recorded(recorded, commitment) else {
            report.differ(format!("{place} records nothing"));
            return StreamEnd::Broken;
        };
        if read == StreamRead::WindowPassed && judge.answered() {
            report.differ(format!(
                "{place} says the accept window passed, after the miner had answered"
            ));
            return StreamEnd::Broken;
        }
        if let Some(why) = early(&read, recorded.after_us, stream) {
            report.differ(format!("{place}: {why}"));
            return StreamEnd::Broken;
        }
        let after_ms = recorded.after_us / 1000;
        let judged = judge.judge(read.clone(), after_ms, url, &|_| {});
        let last = i + 1 == count;
        match judged {
            Judged::ReadOn if last => {
                report.differ(format!(
                    "the challenge stream's record ends at {place} without an outcome"
                ));
                return StreamEnd::Broken;
            }
            Judged::ReadOn => {}
            Judged::Done(_) if !last => {
                report.differ(format!(
                    "the challenge stream came to its outcome at {place}, yet the record goes on"
                ));
                return StreamEnd::Broken;
            }
            Judged::Done(Err(e)) => {
                report.differ(format!(
                    "the challenge stream's record ends in a refusal, which gives no verdict: {e}"
                ));
                return StreamEnd::Broken;
            }
            Judged::Done(Ok(Received::Failed(reason))) => {
                report.confirm(format!(
                    "the challenge stream, {count} read(s) replayed{}, ended in {} after {after_ms} ms",
                    left_out(stream),
                    reason.code.as_str()
                ));
                return StreamEnd::Failed { reason, after_ms };
            }
            Judged::Done(Ok(Received::Commitment(_) | Received::Unreadable(..))) if commitment.is_none() => {
                report.differ(format!(
                    "the challenge stream ends in a commitment at {place}, which the transcript does not hold"
                ));
                return StreamEnd::Broken;
            }
            Judged::Done(Ok(Received::Commitment(_) | Received::Unreadable(..))) => {
                report.confirm(format!(
                    "the challenge stream, {count} read(s) replayed{}, ended in the commitment after {after_ms} ms",
                    left_out(stream)
                ));
                return StreamEnd::Commitment { after_ms };
            }
        }
    }
    report.differ("the challenge stream's record holds no read");
    StreamEnd::Broken
}

/// Why a read that says the miner's time ran out was recorded before it had.
fn early(read: &StreamRead, after_us: u64, stream: &v1::RecordedStream) -> Option<String> {
    let (bound_ms, what) = match read {
        StreamRead::WindowPassed => (stream.accept_window_ms, "the accept window"),
        StreamRead::TimedOut => (stream.allowed_ms, "the time allowed"),
        _ => return None,
    };
    (after_us < bound_ms.saturating_mul(1000)).then(|| {
        format!(
            "it says {what} ({bound_ms} ms) passed, {} us after the challenge was sent",
            after_us
        )
    })
}

/// The routine reads the record counts and does not list, for the report.
fn left_out(stream: &v1::RecordedStream) -> String {
    match stream.passed_reads_left_out {
        0 => String::new(),
        n => format!(" ({n} routine read(s) that passed not listed)"),
    }
}
