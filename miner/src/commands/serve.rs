//! `miner serve`: the daemon, which reads its config again on `systemctl reload`.

use super::{Answer, CommandError};
use crate::cli::ServeArgs;
use crate::daemon;

/// Serves until SIGINT or SIGTERM, or with `--print-config` prints the effective config instead.
pub(super) fn serve(args: ServeArgs) -> Result<Answer, CommandError> {
    let config = args.resolve()?;
    if args.print_config {
        print!("{}", config.to_toml());
        return Ok(Answer::Yes);
    }
    gpu_attest_daemon::logging::init_logging()?;
    let runtime = tokio::runtime::Runtime::new().map_err(gpu_attest_daemon::command::CommonError::Runtime)?;
    runtime.block_on(daemon::run(
        config,
        move || args.resolve(),
        gpu_attest_daemon::signals::shutdown_signal(),
    ))?;
    Ok(Answer::Yes)
}
