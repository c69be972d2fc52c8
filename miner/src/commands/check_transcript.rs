//! `miner check-transcript FILE`: a validator's transcript of an attestation of this miner
//! (PROTOCOL.md 21) held against this miner's own record of what it answered
//! (`crate::answers`): what the validator says it received from this miner must be what this
//! miner sent, and what it says it sent must be what this miner received.

use super::{Answer, CommandError};
use crate::answers::{AnswerLog, Entry, Kind, digest};
use crate::config::MinerConfig;
use gpu_attest_daemon::command::utc as time;
use gpu_attest_proto::transcript::{open, restored_opening};
use gpu_attest_proto::v1;
use gpu_attest_proto::v1::recorded_opening::Received;
use std::path::{Path, PathBuf};

pub(super) fn check(
    file: &Path,
    answers: Option<PathBuf>,
    config: Option<&Path>,
    key_file: Option<PathBuf>,
) -> Result<Answer, CommandError> {
    let dir = match answers {
        Some(dir) => dir,
        None => {
            let mut config: MinerConfig = gpu_attest_daemon::config::load_config(config)?;
            if let Some(key_file) = key_file {
                config.key_file = key_file;
            }
            config.answers_dir()
        }
    };
    let bytes =
        gpu_attest_daemon::command::read_file_at_most(file, gpu_attest_proto::transcript::MAX_TRANSCRIPT_BYTES as u64)?;
    let opened = open(&bytes).map_err(|source| CommandError::Transcript {
        path: file.to_path_buf(),
        source,
    })?;
    let t = &opened.transcript;
    let challenge = t.challenge.as_ref().ok_or(CommandError::NoChallenge)?;
    let nonce = challenge.params.as_ref().map(|p| p.nonce.clone()).unwrap_or_default();
    let record = AnswerLog::read(&dir, &nonce)?;
    let mut report = Comparison::default();
    if opened.signature_valid {
        let signer = opened.signer.map(|k| k.to_string()).unwrap_or_default();
        report.held(format!("the transcript is signed by validator {signer}"));
        if opened.signer.map(|k| k.0.to_vec()) != Some(challenge.validator_key.clone()) {
            report.differ("the transcript is signed by another key than the validator its challenge names");
        }
    } else {
        report.differ("the transcript's signature does not verify: it was changed after the validator signed it");
    }
    compare(t, challenge, &record, &mut report);
    for line in &report.held {
        println!("  matches: {line}");
    }
    for line in &report.differs {
        println!("  DIFFERS: {line}");
    }
    if report.differs.is_empty() {
        println!("MATCHES this miner's record of challenge {}", hex::encode(&nonce));
        Ok(Answer::Yes)
    } else {
        println!("DIFFERS from this miner's record in {} part(s)", report.differs.len());
        Ok(Answer::No)
    }
}

#[derive(Default)]
struct Comparison {
    held: Vec<String>,
    differs: Vec<String>,
}

impl Comparison {
    fn held(&mut self, line: impl Into<String>) {
        self.held.push(line.into());
    }

    fn differ(&mut self, line: impl Into<String>) {
        self.differs.push(line.into());
    }
}

fn entries(record: &[Entry], kind: Kind) -> Vec<&Entry> {
    record.iter().filter(|e| e.kind == kind).collect()
}

/// Each message of the transcript this miner took part in, against its record.
fn compare(t: &v1::Transcript, challenge: &v1::Challenge, record: &[Entry], report: &mut Comparison) {
    let received = entries(record, Kind::Challenge);
    let Some(accepted) = received.iter().find(|e| e.sha256 == digest(challenge)) else {
        return report.differ("the transcript's challenge is not the one this miner accepted");
    };
    report.held(format!("the challenge, accepted at {}", time(accepted.at_ms)));
    if let Some(recorded) = &t.commitment {
        let wire = recorded.commitment.clone().unwrap_or_default();
        match entries(record, Kind::Commitment).into_iter().find(|e| e.sha256 == digest(&wire)) {
            Some(sent) => report.held(format!(
                "the commitment, sent at {}, {} ms after this miner accepted the challenge; the validator read it {} ms after sending the challenge",
                time(sent.at_ms),
                sent.at_ms.saturating_sub(accepted.at_ms),
                recorded.received_after_ms
            )),
            None => report.differ("the transcript's commitment is not one this miner sent"),
        }
    }
    // What this miner answered that the transcript leaves out.
    let missing = |kind: Kind| entries(record, kind).first().map(|e| time(e.at_ms));
    if t.commitment.is_none()
        && let Some(at) = missing(Kind::Commitment)
    {
        report.differ(format!(
            "this miner sent a commitment at {at}; the transcript holds none"
        ));
    }
    match &t.walk {
        Some(walk) => compare_walk(walk, record, report),
        None => {
            if let Some(at) = missing(Kind::WalkRequest) {
                report.differ(format!(
                    "this miner received a walk request at {at}; the transcript holds no walk"
                ));
            }
        }
    }
    match &t.locality {
        Some(locality) => compare_locality(locality, record, report),
        None => {
            if let Some(at) = missing(Kind::LocalityRequest) {
                report.differ(format!(
                    "this miner received a locality request at {at}; the transcript holds no locality walk"
                ));
            }
        }
    }
    match &t.open {
        Some(open) => compare_openings(open, record, report),
        None => {
            if let Some(at) = missing(Kind::OpenRequest) {
                report.differ(format!(
                    "this miner received an open request at {at}; the transcript holds none"
                ));
            }
        }
    }
}

fn compare_walk(walk: &v1::RecordedWalk, record: &[Entry], report: &mut Comparison) {
    let request = digest(&walk.request.clone().unwrap_or_default());
    if let Some(statement) = &walk.statement {
        return compare_statement(&request, statement, walk.statement_after_ms, record, report);
    }
    let roots = Roots {
        name: "walk",
        request: (Kind::WalkRequest, request),
        sent: Kind::WalkRoot,
        recorded: &walk.roots,
        timed_out_after_ms: walk.timed_out_after_ms,
    };
    compare_roots(&roots, record, report);
}

/// Version 3's walk: one request, one signed statement.
fn compare_statement(
    request: &str,
    statement: &v1::WalkStatement,
    statement_after_ms: u64,
    record: &[Entry],
    report: &mut Comparison,
) {
    let Some(asked) = entries(record, Kind::WalkRequest)
        .into_iter()
        .find(|e| e.sha256 == request)
    else {
        return report.differ("the transcript's walk request is not one this miner received");
    };
    match entries(record, Kind::WalkStatement)
        .into_iter()
        .find(|e| e.sha256 == digest(statement))
    {
        Some(sent) => report.held(format!(
            "the walk statement, sent {} ms after this miner received the request; the validator read it {statement_after_ms} ms after sending it",
            sent.at_ms.saturating_sub(asked.at_ms)
        )),
        None => report.differ("the transcript's walk statement is not one this miner sent"),
    }
}

/// A walk whose signed roots stream out one per device (version 4's walk, the locality walk),
/// as a transcript records it and this miner's record names its messages.
struct Roots<'a> {
    name: &'static str,
    request: (Kind, String),
    sent: Kind,
    recorded: &'a [v1::RecordedWalkRoot],
    timed_out_after_ms: u64,
}

fn compare_roots(roots: &Roots, record: &[Entry], report: &mut Comparison) {
    let name = roots.name;
    let Some(asked) = entries(record, roots.request.0)
        .into_iter()
        .find(|e| e.sha256 == roots.request.1)
    else {
        return report.differ(format!(
            "the transcript's {name} request is not one this miner received"
        ));
    };
    let sent = entries(record, roots.sent);
    for root in roots.recorded {
        let wire = root.root.clone().unwrap_or_default();
        match sent.iter().find(|e| e.sha256 == digest(&wire)) {
            Some(entry) => {
                report.held(format!(
                    "device {}'s {name} root, sent {} ms after this miner received the request; the validator read it {} ms after sending it",
                    wire.device,
                    entry.at_ms.saturating_sub(asked.at_ms),
                    root.received_after_us / 1000
                ));
            }
            None => report.differ(format!(
                "the transcript's {name} root of device {} is not one this miner sent",
                wire.device
            )),
        }
    }
    let recorded: Vec<String> = roots
        .recorded
        .iter()
        .map(|r| digest(&r.root.clone().unwrap_or_default()))
        .collect();
    let left_out = sent.iter().filter(|e| !recorded.contains(&e.sha256)).count();
    if left_out > 0 && roots.timed_out_after_ms > 0 {
        report.held(format!(
            "this miner sent {left_out} more {name} root(s) after the validator stopped waiting ({} ms after its request)",
            roots.timed_out_after_ms
        ));
    } else if left_out > 0 {
        report.differ(format!(
            "this miner sent {left_out} {name} root(s) the transcript does not hold, where it records the walk's end"
        ));
    }
}

/// The locality walk (PROTOCOL.md 20.10): its request and roots as a walk's, then its open
/// request and each opening in its place.
fn compare_locality(locality: &v1::RecordedLocality, record: &[Entry], report: &mut Comparison) {
    let roots = Roots {
        name: "locality",
        request: (
            Kind::LocalityRequest,
            digest(&locality.request.clone().unwrap_or_default()),
        ),
        sent: Kind::LocalityRoot,
        recorded: &locality.roots,
        timed_out_after_ms: locality.timed_out_after_ms,
    };
    compare_roots(&roots, record, report);
    let Some(request) = &locality.open_request else {
        return;
    };
    if !entries(record, Kind::LocalityOpenRequest)
        .into_iter()
        .any(|e| e.sha256 == digest(request))
    {
        return report.differ("the transcript's locality open request is not one this miner received");
    }
    let sent: Vec<&str> = entries(record, Kind::LocalityOpening)
        .iter()
        .map(|e| e.sha256.as_str())
        .collect();
    let mut matched = 0;
    for (i, recorded) in locality.openings.iter().enumerate() {
        if let Some(v1::recorded_locality_opening::Received::Opening(opening)) = &recorded.received {
            if sent.get(i).is_some_and(|d| *d == digest(opening)) {
                matched += 1;
            } else {
                report.differ(format!(
                    "locality opening {} of the transcript is not the one this miner sent in that place",
                    i + 1
                ));
            }
        }
    }
    report.held(format!(
        "{matched} locality opening(s), each the one this miner sent in its place"
    ));
}

fn compare_openings(open: &v1::RecordedOpen, record: &[Entry], report: &mut Comparison) {
    let request = open.request.clone().unwrap_or_default();
    if !entries(record, Kind::OpenRequest)
        .into_iter()
        .any(|e| e.sha256 == digest(&request))
    {
        return report.differ("the transcript's open request is not one this miner received");
    }
    let sent: Vec<&str> = entries(record, Kind::Opening)
        .iter()
        .map(|e| e.sha256.as_str())
        .collect();
    let mut matched = 0;
    for (i, recorded) in open.openings.iter().enumerate() {
        match restored_opening(open, recorded) {
            Ok(Some(Received::Opening(opening))) => {
                if sent.get(i).is_some_and(|d| *d == digest(&opening)) {
                    matched += 1;
                } else {
                    report.differ(format!(
                        "opening {} of the transcript is not the one this miner sent in that place",
                        i + 1
                    ));
                }
            }
            Ok(_) => {}
            Err(why) => report.differ(why),
        }
    }
    report.held(format!(
        "{matched} opening(s), each the one this miner sent in its place"
    ));
    let more = sent.len().saturating_sub(matched);
    if more > 0 {
        // This miner sent openings the validator did not record: after it stopped waiting (a
        // timeout, the validator's budget), or where it says the stream ended or failed.
        let last = open.openings.last().and_then(|o| o.received.as_ref());
        match last {
            Some(Received::TimedOut(_)) => report.held(format!(
                "this miner sent {more} more opening(s) after the validator stopped waiting (its opening budget)"
            )),
            _ => report.differ(format!(
                "this miner sent {more} opening(s) the transcript does not hold, where it records {}",
                match last {
                    Some(Received::Ended(_)) => "the stream ending",
                    Some(Received::Failure(_)) => "an error from this miner",
                    _ => "nothing",
                }
            )),
        }
    }
}
