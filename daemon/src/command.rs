//! The shape both daemons' commands share, so that `miner` and `validator` fail alike: what any
//! command can fail with ([`CommonError`]), the exit status a failure ends the process with
//! ([`CommandFailure`], [`exit_code`]), and the helpers every one-shot command uses. Each
//! daemon's own `CommandError` is `CommonError` plus the reasons only it has.

use crate::config::ConfigError;
use crate::exit::{self, Answer};
use crate::logging::UnknownLogFormat;
use gpu_attest_shared::keys::KeyError;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use thiserror::Error;

/// What a command of either daemon can fail with, whatever it does.
#[derive(Debug, Error)]
pub enum CommonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Logging(#[from] UnknownLogFormat),
    #[error("{action} {}", path.display())]
    File {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is {size} bytes; this reads at most {max}", path.display())]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{} already exists; choose another --out, or remove it first", .0.display())]
    Exists(PathBuf),
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot write the output as JSON")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Probe(#[from] crate::health_probe::ProbeError),
}

/// A command's failure, as the process ends with it.
pub trait CommandFailure: std::error::Error {
    /// Whether a device went out of service: such a failure has an exit status of its own, so
    /// that a supervisor restarts the daemon rather than waiting for its operator.
    fn is_device_fault(&self) -> bool;

    /// [`exit::DEVICE_FAULT`] for a device fault, else the shared "could not do it" status.
    fn exit_status(&self) -> u8 {
        if self.is_device_fault() {
            exit::DEVICE_FAULT
        } else {
            exit::ERROR
        }
    }
}

/// How a command's result ends the process: its answer's status, or one line on stderr (each
/// cause once: most errors already print their cause themselves) and the failure's status.
pub fn exit_code<E: CommandFailure + 'static>(result: Result<Answer, E>) -> ExitCode {
    match result {
        Ok(answer) => ExitCode::from(answer.exit_status()),
        Err(e) => {
            eprintln!("error: {}", crate::errors::error_chain(&e));
            ExitCode::from(e.exit_status())
        }
    }
}

/// The runtime a one-shot command's calls run on.
pub fn runtime() -> Result<tokio::runtime::Runtime, CommonError> {
    crate::signals::one_shot_runtime().map_err(CommonError::Runtime)
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> Result<(), CommonError> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Reads a file a command was given, naming it when it cannot.
pub fn read_file(path: &Path) -> Result<Vec<u8>, CommonError> {
    std::fs::read(path).map_err(|source| file_error("reading", path, source))
}

/// Reads a file a command was given, of at most `max` bytes: a larger one is refused before it
/// is read (a hostile file must not make the command allocate without bound), and reading stops
/// past `max` whatever the file's stated size (a device or a pipe states none).
pub fn read_file_at_most(path: &Path, max: u64) -> Result<Vec<u8>, CommonError> {
    use std::io::Read;
    let failed = |source| file_error("reading", path, source);
    let file = std::fs::File::open(path).map_err(failed)?;
    let size = file.metadata().map_err(failed)?.len();
    let too_large = |size| CommonError::TooLarge {
        path: path.to_path_buf(),
        size,
        max,
    };
    if size > max {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Writes a new file a command was asked for, never over one that exists, and syncs it.
pub fn write_new_file(path: &Path, contents: &[u8]) -> Result<(), CommonError> {
    use std::io::Write;
    let mut file = match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(CommonError::Exists(path.to_path_buf()));
        }
        Err(source) => return Err(file_error("creating", path, source)),
    };
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|source| file_error("writing", path, source))
}

/// A Unix time in milliseconds as UTC to the second, `2026-11-25T11:04:34Z`; one past the
/// year 9999 (which no clock reads, and RFC 3339 cannot show; a corrupted or hostile record
/// can hold it) as the number it is, never a panic.
pub fn utc(unix_ms: u64) -> String {
    const YEAR_10000_MS: u64 = 253_402_300_800_000;
    if unix_ms >= YEAR_10000_MS {
        return format!("{unix_ms} ms after 1970");
    }
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms)).to_string()
}

/// Reads a text file a command was given, naming it when it cannot.
pub fn read_text(path: &Path) -> Result<String, CommonError> {
    std::fs::read_to_string(path).map_err(|source| file_error("reading", path, source))
}

/// Writes a file a command was asked for, naming it when it cannot.
pub fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), CommonError> {
    std::fs::write(path, contents).map_err(|source| file_error("writing", path, source))
}

fn file_error(action: &'static str, path: &Path, source: std::io::Error) -> CommonError {
    CommonError::File {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Gives a daemon's `CommandError` (which must have a `Common(CommonError)` variant) every
/// conversion `CommonError` has, so that `?` takes a config, key, log-format or JSON error
/// straight into it.
#[macro_export]
macro_rules! command_error_from_common {
    ($target:ty) => {
        $crate::command_error_from_common!(@each $target,
            $crate::config::ConfigError,
            ::gpu_attest_shared::keys::KeyError,
            $crate::logging::UnknownLogFormat,
            $crate::health_probe::ProbeError,
            ::serde_json::Error);
    };
    (@each $target:ty, $($source:ty),+) => {
        $(
            impl From<$source> for $target {
                fn from(e: $source) -> Self {
                    Self::Common($crate::command::CommonError::from(e))
                }
            }
        )+
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon's error as the daemons build theirs: the common part and one reason of its own.
    #[derive(Debug, Error)]
    enum DaemonCommandError {
        #[error(transparent)]
        Common(#[from] CommonError),
        #[error("the device went away")]
        DeviceGone,
    }

    crate::command_error_from_common!(DaemonCommandError);

    impl CommandFailure for DaemonCommandError {
        fn is_device_fault(&self) -> bool {
            matches!(self, DaemonCommandError::DeviceGone)
        }
    }

    fn bad_json() -> Result<(), DaemonCommandError> {
        serde_json::from_str::<u32>("not json")?;
        Ok(())
    }

    #[test]
    fn a_common_failure_converts_straight_in_and_ends_with_the_shared_status() {
        let e = bad_json().expect_err("not JSON");
        assert!(matches!(e, DaemonCommandError::Common(CommonError::Json(_))), "{e:?}");
        assert_eq!(e.exit_status(), exit::ERROR);
        assert_eq!(DaemonCommandError::DeviceGone.exit_status(), exit::DEVICE_FAULT);
    }

    /// A file over the bound is refused on its stated size, and a source that states none (a
    /// device such as /dev/zero) is read only to one byte past it.
    #[test]
    fn a_file_is_read_only_up_to_its_bound() {
        let dir = std::env::temp_dir().join(format!("gpu-attest-read-at-most-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ten");
        std::fs::write(&file, [7u8; 10]).unwrap();
        assert_eq!(read_file_at_most(&file, 10).unwrap(), vec![7; 10]);
        assert!(matches!(
            read_file_at_most(&file, 9),
            Err(CommonError::TooLarge { size: 10, max: 9, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
        if Path::new("/dev/zero").exists() {
            assert!(matches!(
                read_file_at_most(Path::new("/dev/zero"), 1 << 20),
                Err(CommonError::TooLarge { size, .. }) if size == (1 << 20) + 1
            ));
        }
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named() {
        let missing = Path::new("no/such/file.pem");
        let e = read_file(missing).expect_err("no such file");
        assert_eq!(e.to_string(), "reading no/such/file.pem");
    }
}
