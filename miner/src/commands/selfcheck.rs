//! `miner selftest`: every kernel this host would run, checked against the portable CPU kernel.

use super::{Answer, CommandError, check_size, print_json};
use crate::cli::Settings;
use crate::config::BackendChoice;
use gpu_attest_kernels::detect::detect;

/// Yes when every kernel checked passed; no when one failed. Asked for the GPU by name, a host
/// whose GPU kernels could not be checked is an error, not a yes.
pub(super) fn selftest(settings: &Settings, mid_n: u32, fresh: bool, json: bool) -> Result<Answer, CommandError> {
    let config = settings.resolve()?;
    check_size("--mid-n", mid_n as usize)?;
    let detection = detect();
    let report = crate::selftest::run(&config, &detection, mid_n, fresh, |line| {
        if !json {
            println!("{line}");
        }
    });
    let failed = report.checks.iter().filter(|c| !c.outcome.passed()).count();
    if json {
        print_json(&report)?;
    } else {
        println!("checked against the portable CPU kernel: {}", report.cases);
    }
    if failed > 0 {
        eprintln!(
            "error: {failed} of {} kernels failed their self-check",
            report.checks.len()
        );
        return Ok(Answer::No);
    }
    if config.backend == BackendChoice::Cuda
        && let Some(note) = &report.gpu_note
    {
        return Err(CommandError::GpuNotChecked(note.clone()));
    }
    Ok(Answer::Yes)
}
