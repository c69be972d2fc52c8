//! The miner's own record of what it answered (`[answers] dir`, kept `keep_days`): per accepted challenge, one
//! JSON-lines file of every message the validator sent it and it sent back, each with this
//! miner's clock and the SHA-256 of the message's protobuf encoding; the small signed ones
//! (challenge, commitment, walk request and roots, open request) whole, the openings by digest
//! only. With it an operator can show what was answered and when, and `miner check-transcript`
//! can hold a validator's transcript (PROTOCOL.md 21) against it.
//!
//! Writing a line never holds up or fails an attestation: a write that fails is logged.

use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// What one line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Received: the signed challenge this miner accepted.
    Challenge,
    /// Sent: the commitment.
    Commitment,
    /// Received: a walk request (version 3's or 4's).
    WalkRequest,
    /// Sent: one device's walk root (version 4).
    WalkRoot,
    /// Sent: the walk statement (version 3).
    WalkStatement,
    /// Received: an open request this miner answered.
    OpenRequest,
    /// Sent: one opening.
    Opening,
    /// Received: a locality walk request (PROTOCOL.md 20.10).
    LocalityRequest,
    /// Sent: one device's locality root.
    LocalityRoot,
    /// Received: a locality open request this miner answered.
    LocalityOpenRequest,
    /// Sent: one opened locality segment.
    LocalityOpening,
}

impl Kind {
    /// Whether the message is kept whole (else by digest only: openings are large).
    fn whole(self) -> bool {
        !matches!(self, Kind::Opening | Kind::LocalityOpening)
    }
}

/// One line of a challenge's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// This miner's clock, Unix milliseconds, when it received or sent the message.
    pub at_ms: u64,
    pub kind: Kind,
    /// SHA-256 of the message's protobuf encoding, hex.
    pub sha256: String,
    /// The encoding itself, hex, for all but openings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// SHA-256 of `message`'s encoding, hex: how a record and a transcript name the same message.
pub fn digest(message: &impl Message) -> String {
    hex::encode(Sha256::digest(message.encode_to_vec()))
}

#[derive(Debug, thiserror::Error)]
pub enum AnswersError {
    #[error("cannot use the answer log directory {}: {source}", path.display())]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("this miner has no record of challenge {nonce} in {}: recording was off then, its file was removed after [answers] keep_days, or another miner answered it", dir.display())]
    NoRecord { nonce: String, dir: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} line {line} is not a record line: {source}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

/// The answer log: a directory of one file per challenge.
#[derive(Debug)]
pub struct AnswerLog {
    dir: PathBuf,
    keep: Duration,
}

impl AnswerLog {
    /// Opens (creating, owner-only) `dir`, and removes the files older than `keep_days`.
    pub fn open(dir: &Path, keep_days: u64) -> Result<Self, AnswersError> {
        let failed = |source| AnswersError::Dir {
            path: dir.to_path_buf(),
            source,
        };
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(failed)?;
        let log = AnswerLog {
            dir: dir.to_path_buf(),
            keep: Duration::from_secs(keep_days.saturating_mul(86_400)),
        };
        log.prune().map_err(failed)?;
        Ok(log)
    }

    /// Removes the records last written more than `keep` ago.
    fn prune(&self) -> std::io::Result<()> {
        let now = SystemTime::now();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            let modified = entry.metadata()?.modified()?;
            if now.duration_since(modified).is_ok_and(|age| age > self.keep) {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// The file of challenge `nonce`'s record in `dir`.
    pub fn path(dir: &Path, nonce: &[u8]) -> PathBuf {
        dir.join(format!("{}.jsonl", hex::encode(nonce)))
    }

    /// Appends a line for `message` of `kind` to challenge `nonce`'s record; a new challenge
    /// first removes the records past their time.
    pub fn record(&self, nonce: &[u8], kind: Kind, message: &impl Message) {
        if kind == Kind::Challenge
            && let Err(e) = self.prune()
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "old answer records not removed");
        }
        let bytes = message.encode_to_vec();
        let entry = Entry {
            // This miner's clock, read here: the core reads it too, and imports this module.
            at_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            kind,
            sha256: hex::encode(Sha256::digest(&bytes)),
            message: kind.whole().then(|| hex::encode(&bytes)),
        };
        let path = Self::path(&self.dir, nonce);
        let written = serde_json::to_string(&entry)
            .map_err(std::io::Error::other)
            .and_then(|line| {
                let mut options = std::fs::OpenOptions::new();
                options.create(true).append(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                let mut file = options.open(&path)?;
                writeln!(file, "{line}")
            });
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "answer log line not written");
        }
    }

    /// Challenge `nonce`'s record in `dir`, line by line.
    pub fn read(dir: &Path, nonce: &[u8]) -> Result<Vec<Entry>, AnswersError> {
        let path = Self::path(dir, nonce);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(AnswersError::NoRecord {
                    nonce: hex::encode(nonce),
                    dir: dir.to_path_buf(),
                });
            }
            Err(source) => return Err(AnswersError::Read { path, source }),
        };
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|source| AnswersError::Line {
                    path: path.clone(),
                    line: i + 1,
                    source,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_attest_proto::v1;

    #[test]
    fn a_record_reads_back_in_order_with_openings_by_digest_only() {
        let dir = std::env::temp_dir().join(format!("gpu-attest-answers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log = AnswerLog::open(&dir, 30).unwrap();
        let nonce = [7u8; 32];
        let request = v1::OpenChainsRequest {
            nonce: nonce.to_vec(),
            ..Default::default()
        };
        let opening = v1::ChainOpening {
            nonce: nonce.to_vec(),
            start_matrix: vec![9; 4096],
            ..Default::default()
        };
        log.record(&nonce, Kind::OpenRequest, &request);
        log.record(&nonce, Kind::Opening, &opening);
        let read = AnswerLog::read(&dir, &nonce).unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!((read[0].kind, read[1].kind), (Kind::OpenRequest, Kind::Opening));
        assert_eq!(
            read[0].message.as_deref(),
            Some(hex::encode(request.encode_to_vec()).as_str())
        );
        assert_eq!(read[1].message, None);
        assert_eq!(read[1].sha256, digest(&opening));
        assert!(matches!(
            AnswerLog::read(&dir, &[8u8; 32]),
            Err(AnswersError::NoRecord { .. })
        ));
        std::fs::write(AnswerLog::path(&dir, &[9u8; 32]), "not json\n").unwrap();
        assert!(matches!(
            AnswerLog::read(&dir, &[9u8; 32]),
            Err(AnswersError::Line { line: 1, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
