//! `validator`: the thin binary over the gpu-attest-validator library. It parses the command
//! line and dispatches to `gpu_attest_validator::commands`, which does the work.

use clap::Parser;
use gpu_attest_validator::cli::{Cli, Command};
use gpu_attest_validator::commands;
use std::process::ExitCode;

/// Errors end the process with one line on stderr and the exit statuses both binaries share
/// (`gpu_attest_daemon::exit`): 0 yes, 1 no (a fail verdict), 2 could not do it, 75 a GPU the
/// validator verifies on faulted (a fresh process can use it again).
fn main() -> ExitCode {
    gpu_attest_daemon::allocator::return_freed_memory();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. }) {
        gpu_attest_daemon::signals::end_quietly_when_output_closes();
    }
    gpu_attest_daemon::command::exit_code(commands::run(cli.command))
}
