//! Nonces this miner has accepted, kept until their challenge's deadline, on disk, so that a
//! challenge cannot be replayed after a restart either.
//!
//! The file holds one `hex-nonce deadline-ms` line per accepted challenge, appended and synced
//! before the challenge is accepted. At start expired lines are dropped and the file rewritten
//! (to a temporary file, then renamed over it); a torn last line from a crash is skipped.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("nonce log {path}: {source}")]
pub struct NonceLogError {
    pub path: String,
    pub source: std::io::Error,
}

pub struct NonceLog {
    file: Option<(PathBuf, File)>,
    seen: HashMap<[u8; 32], u64>,
}

impl NonceLog {
    /// Remembers nonces only while the process runs (tests, and `miner` without a state file).
    pub fn in_memory() -> Self {
        NonceLog {
            file: None,
            seen: HashMap::new(),
        }
    }

    pub fn open(path: &Path, now_ms: u64) -> Result<Self, NonceLogError> {
        let err = |source| NonceLogError {
            path: path.display().to_string(),
            source,
        };
        let mut seen = HashMap::new();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                for line in text.lines() {
                    let Some((nonce, deadline)) = line.split_once(' ') else {
                        continue;
                    };
                    let (Ok(bytes), Ok(deadline)) = (hex::decode(nonce), deadline.parse::<u64>()) else {
                        continue;
                    };
                    if let Ok(nonce) = <[u8; 32]>::try_from(bytes.as_slice())
                        && deadline > now_ms
                    {
                        seen.insert(nonce, deadline);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        let temporary = path.with_extension("compacting");
        let mut compacted = File::create(&temporary).map_err(err)?;
        for (nonce, deadline) in &seen {
            writeln!(compacted, "{} {deadline}", hex::encode(nonce)).map_err(err)?;
        }
        compacted.sync_all().map_err(err)?;
        std::fs::rename(&temporary, path).map_err(err)?;
        let file = OpenOptions::new().append(true).open(path).map_err(err)?;
        Ok(NonceLog {
            file: Some((path.to_path_buf(), file)),
            seen,
        })
    }

    /// Records `nonce` until `deadline_ms`; `Ok(false)` if it was already recorded.
    pub fn claim(&mut self, nonce: [u8; 32], deadline_ms: u64, now_ms: u64) -> Result<bool, NonceLogError> {
        self.seen.retain(|_, deadline| *deadline > now_ms);
        if self.seen.contains_key(&nonce) {
            return Ok(false);
        }
        if let Some((path, file)) = &mut self.file {
            writeln!(file, "{} {deadline_ms}", hex::encode(nonce))
                .and_then(|_| file.sync_data())
                .map_err(|source| NonceLogError {
                    path: path.display().to_string(),
                    source,
                })?;
        }
        self.seen.insert(nonce, deadline_ms);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_survive_reopening_until_their_deadline() {
        let dir = std::env::temp_dir().join(format!("gpu-attest-nonces-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nonces.log");
        let _ = std::fs::remove_file(&path);
        {
            let mut log = NonceLog::open(&path, 1_000).unwrap();
            assert!(log.claim([1; 32], 5_000, 1_000).unwrap());
            assert!(log.claim([2; 32], 2_000, 1_000).unwrap());
            assert!(!log.claim([1; 32], 5_000, 1_000).unwrap());
        }
        // A torn line from a crash is skipped, not fatal.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"abcd")
            .unwrap();
        let mut log = NonceLog::open(&path, 3_000).unwrap();
        assert!(!log.claim([1; 32], 5_000, 3_000).unwrap(), "replayed after restart");
        assert!(log.claim([2; 32], 9_000, 3_000).unwrap(), "expired nonce kept forever");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
