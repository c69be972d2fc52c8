//! `validator attest`: one attestation by this process (not through a running validator),
//! its phases on stderr, the verdict stored and printed.

use super::{Answer, CommandError, print_json, runtime};
use crate::attest::AttestEvent;
use crate::cli::Settings;
use crate::{daemon, show};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// Attests the miner at `miner` once: yes on a pass, no on a fail verdict.
pub(super) fn attest_once(settings: &Settings, miner: &str, json: bool) -> Result<Answer, CommandError> {
    let config = settings.resolve()?;
    let runtime = runtime()?;
    let attestor = runtime.block_on(daemon::attestor(&config))?;
    let bar = std::io::stderr().is_terminal().then(progress_bar);
    let on_event = |e: AttestEvent| match (&bar, e) {
        (Some(bar), AttestEvent::Phase { name, detail }) => bar.set_message(format!("{name}: {detail}")),
        (Some(bar), AttestEvent::Progress(p)) => {
            bar.set_length(p.total);
            bar.set_position(p.done);
        }
        (None, AttestEvent::Phase { name, detail }) if !json => eprintln!("{name}: {detail}"),
        (None, _) => {}
    };
    let verdict = runtime.block_on(async {
        let verdict = attestor.attest(miner, &on_event).await;
        attestor.store().close().await;
        verdict
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let verdict = verdict?;
    if json {
        print_json(&verdict)?;
    } else {
        show::print_verdict(&verdict, attestor.store().location());
    }
    Ok(Answer::from_passed(verdict.passed))
}

/// A spinner with the phase and a bar of chains done, for a terminal.
fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} chains").expect("template"));
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}
