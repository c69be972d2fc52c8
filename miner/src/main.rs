//! `miner`: the thin binary over the gpu-attest-miner library. It parses the command line and
//! dispatches to `gpu_attest_miner::commands`, which does the work.

use clap::Parser;
use gpu_attest_miner::cli::{Cli, Command};
use gpu_attest_miner::commands;
use std::process::ExitCode;

/// Errors end the process with one line on stderr, whatever RUST_BACKTRACE says, and the exit
/// statuses both binaries share (`gpu_attest_daemon::exit`): 1 when a kernel failed its
/// self-check, 2 when a command could not do what was asked, and a status of its own for a
/// device fault, so that a supervisor can tell it from a bad config.
fn main() -> ExitCode {
    gpu_attest_daemon::allocator::return_freed_memory();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        gpu_attest_daemon::signals::end_quietly_when_output_closes();
    }
    gpu_attest_daemon::command::exit_code(commands::run(cli.command))
}
