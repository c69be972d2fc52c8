//! The `miner` subcommands: what each does, so that the binary only parses its command line and
//! dispatches here. Each command answers yes or no (an exit status of 0 or 1), or fails with a
//! [`CommandError`] that knows its own exit status.

mod benchmark;
mod check_transcript;
mod evidence;
mod info;
mod selfcheck;
mod serve;

use crate::backends::BackendSelectError;
use crate::cli::Command;
use crate::daemon::DaemonError;
use gpu_attest_daemon::command::{CommandFailure, CommonError};
use gpu_attest_daemon::key_files;
use gpu_attest_daemon::run::{ServeError, Stopped};
use gpu_attest_shared::gemm::{GemmError, UnknownKernel};
use std::path::PathBuf;
use thiserror::Error;

pub use gpu_attest_daemon::exit::Answer;

/// Why a command could not do what was asked: what any command of either daemon can fail with
/// ([`CommonError`]), or a reason of the miner's own.
#[derive(Debug, Error)]
pub enum CommandError {
    #[error(transparent)]
    Common(#[from] CommonError),
    #[error(transparent)]
    Backend(#[from] BackendSelectError),
    #[error(transparent)]
    Kernel(#[from] UnknownKernel),
    #[error(transparent)]
    Gemm(#[from] GemmError),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
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
    #[error(transparent)]
    Answers(#[from] crate::answers::AnswersError),
    #[error("{}: {source}", path.display())]
    Transcript {
        path: PathBuf,
        source: gpu_attest_proto::transcript::TranscriptError,
    },
    #[error("the transcript holds no challenge: it records no attestation")]
    NoChallenge,
    #[error("{} holds no PEM certificates", path.display())]
    NotPem {
        path: PathBuf,
        source: gpu_attest_shared::evidence::EvidenceFault,
    },
}

gpu_attest_daemon::command_error_from_common!(CommandError);

impl CommandFailure for CommandError {
    /// A device fault has a status of its own, so that a supervisor restarts the daemon.
    fn is_device_fault(&self) -> bool {
        matches!(
            self,
            CommandError::Daemon(
                DaemonError::Serve(ServeError::Stopped(Stopped::DevicesOutOfService { .. }))
                    | DaemonError::Backend(BackendSelectError::GpuFaulted(_))
            ) | CommandError::Backend(BackendSelectError::GpuFaulted(_))
        )
    }
}

/// Runs `command` to its end (`serve` until SIGINT or SIGTERM).
pub fn run(command: Command) -> Result<Answer, CommandError> {
    match command {
        Command::PublicKey { key_file } => Ok(key_files::print_public_key(&key_file).map(|()| Answer::Yes)?),
        Command::Keygen { key_file, if_missing } => {
            Ok(key_files::create_and_print(&key_file, if_missing).map(|()| Answer::Yes)?)
        }
        Command::Evidence { roots, json } => evidence::check(roots.as_deref(), json),
        Command::Health { config, address } => health(config.as_deref(), address),
        Command::CheckTranscript {
            file,
            answers,
            config,
            key_file,
        } => check_transcript::check(&file, answers, config.as_deref(), key_file),
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
    Ok(gpu_attest_daemon::command::print_json(value)?)
}

/// `health`: the running miner's probe, at `address` or the config's `[health] listen`.
fn health(config: Option<&std::path::Path>, address: Option<std::net::SocketAddr>) -> Result<Answer, CommandError> {
    use gpu_attest_daemon::health_probe;
    let config: crate::config::MinerConfig = gpu_attest_daemon::config::load_config(config)?;
    let address = health_probe::probe_address(address, &config.health)?;
    Ok(health_probe::check(address, crate::server::SERVICE_NAME)?)
}
