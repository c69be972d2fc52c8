//! `validator attest`: one attestation by this process (not through a running validator),
//! its phases on stderr, the verdict stored and printed.

use super::{Answer, CommandError, print_json, runtime};
use crate::attest::AttestEvent;
use crate::cli::Settings;
use crate::{daemon, show};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Attests the miner at `miner` once: yes on a pass, no on a fail verdict.
pub(super) fn attest_once(settings: &Settings, miner: &str, json: bool) -> Result<Answer, CommandError> {
    let config = settings.resolve()?;
    let runtime = runtime()?;
    let attestor = runtime.block_on(daemon::attestor(&config))?;
    let bar = std::io::stderr().is_terminal().then(progress_bar);
    // Off a terminal (a log, a pipe) progress is a line now and then, so that a long challenge
    // does not look hung between `computing:` and `commitment-received:`.
    let lines = Mutex::new(show::ProgressLines::new());
    let on_event = |e: AttestEvent| match (&bar, e) {
        (Some(bar), AttestEvent::Phase { name, detail }) => bar.set_message(format!("{name}: {detail}")),
        (Some(bar), AttestEvent::Progress(p)) => {
            bar.set_length(p.total);
            bar.set_position(p.done);
        }
        (None, AttestEvent::Phase { name, detail }) if !json => {
            lines.lock().unwrap_or_else(PoisonError::into_inner).printed();
            eprintln!("{name}: {detail}");
        }
        (None, AttestEvent::Progress(p)) if !json => {
            if p.done < p.total && lines.lock().unwrap_or_else(PoisonError::into_inner).due() {
                eprintln!("progress: {}/{} chains", p.done, p.total);
            }
        }
        (None, _) => {}
    };
    let stored = attestor.store().stored_verdicts();
    let challenged = AtomicBool::new(false);
    let on_event = |e: AttestEvent| {
        if matches!(
            e,
            AttestEvent::Phase {
                name: "challenge-sent",
                ..
            }
        ) {
            challenged.store(true, Ordering::Relaxed);
        }
        on_event(e);
    };
    // An interrupt ends the attestation where it stands (a verdict is written in one
    // transaction, so it is stored whole or not at all) and says which.
    let verdict = runtime.block_on(async {
        let verdict = tokio::select! {
            verdict = attestor.attest(miner, &on_event) => Some(verdict),
            () = gpu_attest_daemon::signals::interrupted() => None,
        };
        attestor.store().close().await;
        verdict
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let Some(verdict) = verdict else {
        return Err(CommandError::Interrupted(interrupted_at(
            *stored.borrow(),
            challenged.load(Ordering::Relaxed),
        )));
    };
    let verdict = verdict?;
    if json {
        print_json(&verdict)?;
    } else {
        show::print_verdict(&verdict, attestor.store().location());
    }
    Ok(Answer::from_passed(verdict.passed))
}

/// What an interrupted one-shot attestation left: `stored_id` is the newest verdict this
/// process stored (0: none).
fn interrupted_at(stored_id: u64, challenged: bool) -> String {
    match (stored_id, challenged) {
        (0, false) => "no challenge was sent and no verdict was stored".into(),
        (0, true) => "the challenge was sent and abandoned; no verdict was stored (its nonce is recorded as used, so it is never issued again)".into(),
        (id, _) => format!("after its verdict was stored, as #{id} (`validator verdicts` shows it)"),
    }
}

/// A spinner with the phase and a bar of chains done, for a terminal.
fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} chains").expect("template"));
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}
