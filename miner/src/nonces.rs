//! Nonces this miner has accepted, kept until their challenge's deadline, on disk, so that a
//! challenge cannot be replayed after a restart either.
//!
//! The file holds one `hex-nonce deadline-ms` line per accepted challenge, appended and synced
//! before the challenge is accepted. At start, and while running once expired lines make up
//! most of a file over 64 KiB, expired lines are dropped and the file rewritten (to a temporary
//! file, then renamed over it); a torn last line from a crash is skipped.
//!
//! Before each append the log checks that its path still names the file it holds open, at the
//! length this process wrote. If the file or its directory was removed or replaced while the
//! miner ran, appending to the old handle would write to a file no restart will read; if it was
//! truncated in place, nonces already on disk are gone. Either way the log is written anew at its
//! path from the nonces in memory. Until that succeeds every claim fails, and so every challenge
//! is refused.
//!
//! One process holds a log at a time: it locks `<log>.lock` beside it for as long as it runs.
//! Two miners sharing a log would each accept what the other had (each knows only its own
//! nonces), and each rewrite would drop the other's lines.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum NonceLogError {
    #[error("nonce log {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error(
        "nonce log {path} is in use by another process{holder} (it holds {lock}); two miners sharing a nonce log would accept each other's replays: give each miner its own nonce_file"
    )]
    InUse { path: String, lock: String, holder: String },
    #[error(
        "nonce log {path} was removed or replaced while the miner ran, and it cannot be written again there ({source}); challenges are refused until that path is writable"
    )]
    Replaced { path: String, source: std::io::Error },
}

/// A line of the log: 64 hex digits, a space, a deadline of up to 20 digits, a newline (an
/// upper bound, so that the live nonces' share of the file is never overestimated).
const LINE_BYTES: u64 = 64 + 1 + 20 + 1;

/// The log is compacted only once it is this long and four times what its live nonces need.
const COMPACT_FROM_BYTES: u64 = 64 << 10;

pub struct NonceLog {
    file: Option<LogFile>,
    seen: HashMap<[u8; 32], u64>,
    /// The lock on `<log>.lock`, held while this log lives.
    _lock: Option<File>,
}

struct LogFile {
    path: PathBuf,
    file: File,
    /// Bytes written through `file`; the file at `path` must be this long.
    len: u64,
}

impl NonceLog {
    /// Remembers nonces only while the process runs (tests, and `miner` without a state file).
    pub fn in_memory() -> Self {
        NonceLog {
            file: None,
            seen: HashMap::new(),
            _lock: None,
        }
    }

    pub fn open(path: &Path, now_ms: u64) -> Result<Self, NonceLogError> {
        let err = |source| NonceLogError::Io {
            path: path.display().to_string(),
            source,
        };
        let lock = lock_beside(path)?;
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
        let (file, len) = write_fresh(path, &seen).map_err(err)?;
        Ok(NonceLog {
            file: Some(LogFile {
                path: path.to_path_buf(),
                file,
                len,
            }),
            seen,
            _lock: Some(lock),
        })
    }

    /// The open file, written anew at its path first if the path no longer names it whole.
    fn current_file(&mut self) -> Result<Option<&mut LogFile>, NonceLogError> {
        let Some(log) = &mut self.file else {
            return Ok(None);
        };
        if !still_at_path(log) {
            let (file, len) = write_fresh(&log.path, &self.seen).map_err(|source| NonceLogError::Replaced {
                path: log.path.display().to_string(),
                source,
            })?;
            tracing::warn!(
                path = %log.path.display(),
                nonces = self.seen.len(),
                "nonce log was removed, replaced or truncated; wrote it again from memory"
            );
            (log.file, log.len) = (file, len);
        }
        Ok(Some(log))
    }

    /// Writes the log anew without its expired lines once they make up most of it, so that a
    /// miner that runs for months does not grow it by a line per challenge. A failure leaves
    /// the old file in place, still appended to: it only costs disk.
    fn compact_if_mostly_expired(&mut self) {
        let live_bytes = self.seen.len() as u64 * LINE_BYTES;
        let Some(log) = &mut self.file else { return };
        if log.len < COMPACT_FROM_BYTES || log.len < 4 * live_bytes || !still_at_path(log) {
            return;
        }
        match write_fresh(&log.path, &self.seen) {
            Ok((file, len)) => (log.file, log.len) = (file, len),
            Err(e) => {
                tracing::warn!(path = %log.path.display(), error = %e, "cannot compact the nonce log; appending to it as it is")
            }
        }
    }

    /// Records `nonce` until `deadline_ms`; `Ok(false)` if it was already recorded.
    pub fn claim(&mut self, nonce: [u8; 32], deadline_ms: u64, now_ms: u64) -> Result<bool, NonceLogError> {
        self.seen.retain(|_, deadline| *deadline > now_ms);
        if self.seen.contains_key(&nonce) {
            return Ok(false);
        }
        self.compact_if_mostly_expired();
        if let Some(log) = self.current_file()? {
            let line = format!("{} {deadline_ms}\n", hex::encode(nonce));
            let written = log.file.write_all(line.as_bytes()).and_then(|_| log.file.sync_data());
            if let Err(source) = written {
                // A part of the line may be on disk (a full disk): cut it off, so that the file
                // is again what this process wrote and the next line is not glued to it. (If
                // even that fails, the next claim finds the length wrong and writes it anew.)
                let _ = log.file.set_len(log.len);
                return Err(NonceLogError::Io {
                    path: log.path.display().to_string(),
                    source,
                });
            }
            log.len += line.len() as u64;
        }
        self.seen.insert(nonce, deadline_ms);
        Ok(true)
    }
}

/// Locks `<path>.lock` for this process, writing its id there for whoever finds it held.
fn lock_beside(path: &Path) -> Result<File, NonceLogError> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    let lock_path = path.with_file_name(name);
    let err = |source| NonceLogError::Io {
        path: lock_path.display().to_string(),
        source,
    };
    let mut lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(err)?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&lock_path)
                .ok()
                .and_then(|text| text.trim().parse::<u32>().ok())
                .map(|pid| format!(" (process {pid})"))
                .unwrap_or_default();
            return Err(NonceLogError::InUse {
                path: path.display().to_string(),
                lock: lock_path.display().to_string(),
                holder,
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(err(e)),
    }
    lock.set_len(0).map_err(err)?;
    writeln!(lock, "{}", std::process::id()).map_err(err)?;
    Ok(lock)
}

/// Writes `seen` to a temporary file beside `path`, renames it over `path` and syncs the
/// directory, so the log is whole or absent after a crash; returns it opened for appending,
/// with its length. The temporary file is created anew (`create_new` does not follow a link
/// planted in its place), so the rewrite cannot be pointed at another file.
fn write_fresh(path: &Path, seen: &HashMap<[u8; 32], u64>) -> std::io::Result<(File, u64)> {
    let temporary = path.with_extension("compacting");
    match std::fs::remove_file(&temporary) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut compacted = OpenOptions::new().write(true).create_new(true).open(&temporary)?;
    let mut text = String::new();
    for (nonce, deadline) in seen {
        text.push_str(&format!("{} {deadline}\n", hex::encode(nonce)));
    }
    compacted.write_all(text.as_bytes())?;
    compacted.sync_all()?;
    std::fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok((OpenOptions::new().append(true).open(path)?, text.len() as u64))
}

/// Whether the log's path still names the file it has open (same device and inode), as long as
/// this process wrote it.
#[cfg(unix)]
fn still_at_path(log: &LogFile) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(&log.path), log.file.metadata()) {
        (Ok(at_path), Ok(open)) => {
            at_path.dev() == open.dev() && at_path.ino() == open.ino() && at_path.len() == log.len
        }
        _ => false,
    }
}

#[cfg(not(unix))]
fn still_at_path(log: &LogFile) -> bool {
    std::fs::metadata(&log.path).is_ok_and(|m| m.len() == log.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty directory of this test's own, and the log path in it.
    fn fresh_dir(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("gpu-attest-nonces-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nonces.log");
        (dir, path)
    }

    #[test]
    fn nonces_survive_reopening_until_their_deadline() {
        let (dir, path) = fresh_dir("reopen");
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

    #[test]
    fn expired_lines_are_dropped_while_the_miner_runs() {
        let (dir, path) = fresh_dir("compact");
        let mut log = NonceLog::open(&path, 0).unwrap();
        // A thousand challenges, each expired before the next one arrives.
        for i in 0..1000u32 {
            let mut nonce = [0u8; 32];
            nonce[..4].copy_from_slice(&i.to_le_bytes());
            let now = u64::from(i) * 10;
            assert!(log.claim(nonce, now + 5, now).unwrap());
        }
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(
            size <= COMPACT_FROM_BYTES + LINE_BYTES,
            "{size} bytes for one live nonce"
        );
        // What is on disk is still every live nonce: a reopened log refuses the last one.
        let mut last = [0u8; 32];
        last[..4].copy_from_slice(&999u32.to_le_bytes());
        drop(log); // the miner restarts
        let mut reopened = NonceLog::open(&path, 9_990).unwrap();
        assert!(
            !reopened.claim(last, 9_995, 9_991).unwrap(),
            "a live nonce was lost by compaction"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_replaced_directory_is_noticed_and_the_log_written_again() {
        let root = std::env::temp_dir().join(format!("gpu-attest-nonces-moved-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("state");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nonces.log");
        let mut log = NonceLog::open(&path, 1_000).unwrap();
        assert!(log.claim([1; 32], 9_000, 1_000).unwrap());
        // The directory is moved away and a file stands where it was: nothing can be written.
        std::fs::rename(&dir, root.join("moved")).unwrap();
        std::fs::write(&dir, b"not a directory").unwrap();
        let err = log.claim([2; 32], 9_000, 1_000).unwrap_err();
        assert!(matches!(err, NonceLogError::Replaced { .. }), "{err}");
        assert!(err.to_string().contains("refused until"), "{err}");
        // Refused nonces were not recorded, so they stay claimable.
        std::fs::remove_file(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        assert!(log.claim([2; 32], 9_000, 1_000).unwrap());
        // The new file holds both nonces: a restart still refuses them.
        let mut reopened = NonceLog::open(&path, 2_000).unwrap();
        assert!(!reopened.claim([1; 32], 9_000, 2_000).unwrap());
        assert!(!reopened.claim([2; 32], 9_000, 2_000).unwrap());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_log_truncated_in_place_is_written_again() {
        let (dir, path) = fresh_dir("truncated");
        let mut log = NonceLog::open(&path, 1_000).unwrap();
        assert!(log.claim([1; 32], 9_000, 1_000).unwrap());
        // What a log rotation with copy-and-truncate does: same file, now empty.
        OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        assert!(log.claim([2; 32], 9_000, 1_000).unwrap());
        drop(log); // the miner restarts
        let mut reopened = NonceLog::open(&path, 2_000).unwrap();
        assert!(
            !reopened.claim([1; 32], 9_000, 2_000).unwrap(),
            "nonce lost to the truncation"
        );
        assert!(!reopened.claim([2; 32], 9_000, 2_000).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn the_rewrite_does_not_follow_a_planted_link() {
        let (dir, path) = fresh_dir("link");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let mut log = NonceLog::open(&path, 1_000).unwrap();
        assert!(log.claim([1; 32], 9_000, 1_000).unwrap());
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, path.with_extension("compacting")).unwrap();
        assert!(log.claim([2; 32], 9_000, 1_000).unwrap());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        drop(log); // the miner restarts
        let mut reopened = NonceLog::open(&path, 2_000).unwrap();
        assert!(!reopened.claim([1; 32], 9_000, 2_000).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A second process (here, a second open) cannot take a log in use, and says which process
    /// holds it; once the first lets go, it can.
    #[test]
    fn a_log_in_use_is_refused_to_a_second_miner() {
        let (dir, path) = fresh_dir("in-use");
        let first = NonceLog::open(&path, 0).unwrap();
        let refused = NonceLog::open(&path, 0).err().expect("a second miner opened the log");
        let message = refused.to_string();
        assert!(matches!(refused, NonceLogError::InUse { .. }), "{message}");
        assert!(
            message.contains(&format!("process {}", std::process::id())),
            "{message}"
        );
        drop(first);
        drop(NonceLog::open(&path, 0).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
