//! The `miner` subcommands: what each does, so that the binary only parses its command line and
//! dispatches here. Each command answers yes or no (an exit status of 0 or 1), or fails with a
//! [`CommandError`] that knows its own exit status.

mod benchmark;
mod evidence;
mod info;
mod selfcheck;
mod serve;

use crate::backends::BackendSelectError;
use crate::cli::Command;
use crate::daemon::DaemonError;
use gpu_attest_daemon::config::ConfigError;
use gpu_attest_daemon::key_files;
use gpu_attest_daemon::logging::UnknownLogFormat;
use gpu_attest_daemon::run::{ServeError, Stopped};
use gpu_attest_shared::gemm::{GemmError, UnknownKernel};
use gpu_attest_shared::keys::KeyError;
use std::path::PathBuf;
use thiserror::Error;

pub use gpu_attest_daemon::exit::Answer;

/// Why a command could not do what was asked.
#[derive(Debug, Error)]
pub enum CommandError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Backend(#[from] BackendSelectError),
    #[error(transparent)]
    Kernel(#[from] UnknownKernel),
    #[error(transparent)]
    Gemm(#[from] GemmError),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error(transparent)]
    Logging(#[from] UnknownLogFormat),
    #[error("{what} {size} is not a valid challenge size (a multiple of 64 in 64..=8192)")]
    InvalidSize { what: &'static str, size: usize },
    /// The GPU was asked for by name and could not be checked: checking the CPU alone is no
    /// answer, since a deploy script that gates on the self-check must not go ahead on a host
    /// without one (as `serve` would not).
    #[error("--backend cuda was asked for, but no GPU kernel could be checked ({0}); the CPU kernels passed")]
    GpuNotChecked(String),
    #[error("{0}")]
    Bench(String),
    #[error("no NVIDIA driver to ask for evidence ({0})")]
    NoDriver(String),
    #[error("{0}")]
    Evidence(String),
    #[error("{action} {}", path.display())]
    File {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} holds no PEM certificates", path.display())]
    NotPem {
        path: PathBuf,
        source: gpu_attest_shared::evidence::EvidenceFault,
    },
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot write the output as JSON")]
    Json(#[from] serde_json::Error),
}

impl CommandError {
    /// A device fault has a status of its own, so that a supervisor restarts the daemon; every
    /// other error is the shared "could not do it" status.
    pub fn exit_status(&self) -> u8 {
        let faulted = matches!(
            self,
            CommandError::Daemon(
                DaemonError::Serve(ServeError::Stopped(Stopped::DevicesOutOfService { .. }))
                    | DaemonError::Backend(BackendSelectError::GpuFaulted(_))
            ) | CommandError::Backend(BackendSelectError::GpuFaulted(_))
        );
        if faulted {
            gpu_attest_daemon::exit::DEVICE_FAULT
        } else {
            gpu_attest_daemon::exit::ERROR
        }
    }
}

/// Runs `command` to its end (`serve` until SIGINT or SIGTERM).
pub fn run(command: Command) -> Result<Answer, CommandError> {
    match command {
        Command::PublicKey { key_file } => Ok(key_files::print_public_key(&key_file).map(|()| Answer::Yes)?),
        Command::Keygen { key_file } => Ok(key_files::create_and_print(&key_file).map(|()| Answer::Yes)?),
        Command::Evidence { roots, json } => evidence::check(roots.as_deref(), json),
        Command::Info { settings, json } => info::info(&settings, json),
        Command::Bench {
            settings,
            sizes,
            seconds,
            sampled_verify,
            memory_mib,
            json,
        } => benchmark::bench(
            &settings,
            benchmark::Request {
                sizes,
                seconds,
                sampled_verify,
                memory_mib,
                json,
            },
        ),
        Command::Selftest {
            settings,
            mid_n,
            fresh,
            json,
        } => selfcheck::selftest(&settings, mid_n, fresh, json),
        Command::Serve(args) => serve::serve(args),
    }
}

/// Refuses a matrix size no challenge can have.
fn check_size(what: &'static str, size: usize) -> Result<(), CommandError> {
    if size == 0 || !size.is_multiple_of(64) || size > 8192 {
        return Err(CommandError::InvalidSize { what, size });
    }
    Ok(())
}

/// Prints `value` as pretty JSON on stdout.
fn print_json(value: &impl serde::Serialize) -> Result<(), CommandError> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
