//! `validator serve`: the daemon, with the command line's overrides of its config.

use super::{Answer, CommandError};
use crate::cli::Settings;
use crate::daemon;
use std::net::SocketAddr;

/// What `serve`'s own flags change in the config the settings resolve to.
pub(super) struct Overrides {
    pub listen: Option<SocketAddr>,
    pub no_schedule: bool,
    pub metrics_listen: Option<SocketAddr>,
}

/// Serves until SIGINT or SIGTERM, or with `print_config` prints the effective config instead.
pub(super) fn serve(settings: &Settings, overrides: Overrides, print_config: bool) -> Result<Answer, CommandError> {
    let mut config = settings.resolve()?;
    if let Some(listen) = overrides.listen {
        config.listen = listen;
    }
    if overrides.no_schedule {
        config.schedule.enabled = false;
    }
    if let Some(metrics) = overrides.metrics_listen {
        config.metrics.listen = Some(metrics);
    }
    if print_config {
        print!("{}", config.to_toml());
        return Ok(Answer::Yes);
    }
    gpu_attest_daemon::logging::init_logging()?;
    let runtime = tokio::runtime::Runtime::new().map_err(gpu_attest_daemon::command::CommonError::Runtime)?;
    runtime.block_on(daemon::run(config, gpu_attest_daemon::signals::shutdown_signal()))?;
    Ok(Answer::Yes)
}
