//! The `validator` subcommands: what each does, so that the binary only parses its command line
//! and dispatches here. Each command answers yes or no (an exit status of 0 or 1), or fails with
//! a [`CommandError`] that knows its own exit status.

mod attest;
mod audit;
mod certs;
mod miners;
mod rates;
mod serve;
mod verdicts;

use crate::cli::{Command, RatesAction, VerdictsAction};
use crate::daemon::DaemonError;
use crate::operator::OperatorError;
use crate::rates::report::RatesError;
use crate::store::StoreError;
use gpu_attest_daemon::certs::CertsError;
use gpu_attest_daemon::command::{CommandFailure, CommonError};
use gpu_attest_daemon::key_files;
use gpu_attest_daemon::run::{ServeError, Stopped};
use std::path::PathBuf;
use thiserror::Error;

pub use gpu_attest_daemon::exit::Answer;

/// Why a command could not do what was asked: what any command of either daemon can fail with
/// ([`CommonError`]), or a reason of the validator's own.
#[derive(Debug, Error)]
pub enum CommandError {
    #[error(transparent)]
    Common(#[from] CommonError),
    #[error(transparent)]
    Certs(#[from] CertsError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error(transparent)]
    Attest(#[from] crate::attest::AttestError),
    #[error(transparent)]
    Operator(#[from] OperatorError),
    #[error("importing {}", path.display())]
    Import { path: PathBuf, source: RatesError },
    #[error("no database at {}; run `validator attest` or `validator serve` first", .0.display())]
    NoDatabase(PathBuf),
    /// Ctrl-C or SIGTERM during a one-shot attestation: what was stored by then.
    #[error("interrupted: {0}")]
    Interrupted(String),
    #[error(
        "verdict {0} has no kept transcript: [transcripts] keep = \"failures\" (the default) keeps failing verdicts' only, \"all\" every verdict's, each within budget_mib (the oldest go first); verdicts stored before this release have none"
    )]
    NoTranscript(u64),
    #[error("no verdict {0} in this database (`validator verdicts` lists them)")]
    NoVerdict(u64),
    #[error("{}: {source}", path.display())]
    Transcript {
        path: PathBuf,
        source: crate::transcript::TranscriptError,
    },
    #[error("--validator-key {0:?} is not a public key (64 hex digits, as `validator public-key` prints)")]
    BadKey(String),
}

gpu_attest_daemon::command_error_from_common!(CommandError);

impl CommandFailure for CommandError {
    /// A device fault (a GPU this validator verifies on) has a status of its own, so that a
    /// supervisor restarts the daemon.
    fn is_device_fault(&self) -> bool {
        matches!(
            self,
            CommandError::Daemon(
                DaemonError::Serve(ServeError::Stopped(Stopped::DevicesOutOfService { .. }))
                    | DaemonError::GpuFaulted(_),
            )
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
        Command::TlsCerts {
            out,
            validator_hosts,
            miner_hosts,
            days,
        } => certs::tls_certs(
            &out,
            gpu_attest_daemon::certs::CertsRequest {
                validator_hosts,
                miner_hosts,
                days,
            },
        ),
        Command::Verdicts {
            database,
            filter,
            json,
            action: None,
        } => verdicts::list_or_follow(&database, &filter, json),
        Command::Verdicts {
            database,
            action: Some(VerdictsAction::Export { id, out }),
            ..
        } => verdicts::export(&database, id, &out),
        Command::Audit {
            file,
            validator_key,
            threads,
            reexecute,
            json,
        } => audit::audit(&file, validator_key.as_deref(), threads, reexecute, json),
        Command::Attest { settings, miner, json } => attest::attest_once(&settings, &miner, json),
        Command::Rates {
            config,
            database,
            action,
        } => rates::rates(
            config.as_deref(),
            database,
            action.unwrap_or(RatesAction::Show { json: false }),
        ),
        Command::Miners { api, action } => miners::miners(&api, action),
        Command::Health { config, address } => health(config.as_deref(), address),
        Command::Serve {
            settings,
            listen,
            no_schedule,
            metrics_listen,
            print_config,
        } => serve::serve(
            &settings,
            serve::Overrides {
                listen,
                no_schedule,
                metrics_listen,
            },
            print_config,
        ),
    }
}

/// The runtime a one-shot command's calls run on.
fn runtime() -> Result<tokio::runtime::Runtime, CommandError> {
    Ok(gpu_attest_daemon::command::runtime()?)
}

/// Prints `value` as pretty JSON on stdout.
/// Writes verdict `id`'s transcript, `bytes`, to a new file at `out`; returns what to tell the
/// operator.
fn write_transcript(id: u64, out: &std::path::Path, bytes: &[u8]) -> Result<String, CommandError> {
    gpu_attest_daemon::command::write_new_file(out, bytes)?;
    Ok(format!(
        "wrote verdict {id}'s transcript to {} ({} bytes); check it with `validator audit {}`",
        out.display(),
        bytes.len(),
        out.display()
    ))
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CommandError> {
    Ok(gpu_attest_daemon::command::print_json(value)?)
}

/// Refuses a SQLite database file that is not there, for the commands that only read one.
fn require_database(database: &std::path::Path) -> Result<(), CommandError> {
    if !crate::store::is_postgres(database) && !database.exists() {
        return Err(CommandError::NoDatabase(database.to_path_buf()));
    }
    Ok(())
}

/// `health`: the running validator's probe, at `address` or the config's `[health] listen`.
fn health(config: Option<&std::path::Path>, address: Option<std::net::SocketAddr>) -> Result<Answer, CommandError> {
    use gpu_attest_daemon::health_probe;
    let config: crate::config::ValidatorConfig = gpu_attest_daemon::config::load_config(config)?;
    let address = health_probe::probe_address(address, &config.health)?;
    Ok(health_probe::check(address, crate::server::SERVICE_NAME)?)
}
