//! Daemons as an operator runs them: the real binaries with their logs in files, their
//! listening and metrics addresses read from their first lines, and the validator's API called
//! as a client would.

use super::process::{Daemon, cmd};
use gpu_attest_proto::v1::{self, attest_event::Event, validator_client::ValidatorClient};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A daemon started with its stderr in a log file, the addresses it printed, and the log.
pub struct Started {
    pub daemon: Daemon,
    pub url: String,
    pub metrics: Option<String>,
    pub log: PathBuf,
}

impl Started {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.daemon.0.id() as i32
    }
}

/// Starts `command`, logging to `log`, and reads the `listening on` line (and the `metrics on`
/// line when `metrics`).
pub fn start_logged(mut command: Command, log: PathBuf, metrics: bool) -> Started {
    if metrics {
        command.args(["--metrics-listen", "127.0.0.1:0"]);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut line = || lines.next().and_then(Result::ok).unwrap_or_default();
    let first = line();
    let daemon = Daemon(child);
    let Some(address) = first.strip_prefix("listening on ") else {
        panic!(
            "unexpected first line {first:?}; log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let metrics = metrics.then(|| {
        let second = line();
        second
            .strip_prefix("metrics on http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("unexpected second line {second:?}"))
            .to_string()
    });
    Started {
        daemon,
        url: format!("http://{address}"),
        metrics,
        log,
    }
}

pub fn validator_serve(dir: &Path, database: &Path) -> Command {
    let mut serve = cmd("validator");
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--no-schedule", "--config"])
        .arg(dir.join("validator.toml"))
        .arg("--database")
        .arg(database);
    serve
}

/// Attests `miner` through the running validator's API: the verdict, or the status it gave.
/// `on_progress` runs on the first progress event the miner reports (it is computing then).
pub async fn attest_via_api(api: &str, miner: &str, on_progress: impl FnOnce()) -> Result<v1::Verdict, tonic::Status> {
    let mut client = ValidatorClient::connect(api.to_string()).await.unwrap();
    let mut events = client
        .attest_miner(v1::AttestMinerRequest { url: miner.into() })
        .await?
        .into_inner();
    let mut on_progress = Some(on_progress);
    while let Some(event) = events.message().await? {
        match event.event {
            Some(Event::Progress(_)) => {
                if let Some(f) = on_progress.take() {
                    f();
                }
            }
            Some(Event::Verdict(verdict)) => return Ok(verdict),
            _ => {}
        }
    }
    Err(tonic::Status::unknown("the stream ended without a verdict"))
}
