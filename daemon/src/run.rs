//! How a daemon's run ends, the same for both: the gRPC server's result, then any device that
//! went out of service while it served, as the error the daemon exits with.

use crate::devices::{EXIT_DEVICE_FAULT, describe};
use thiserror::Error;

/// Why a daemon that was serving stopped, other than being asked to.
#[derive(Debug, Error)]
pub enum Stopped {
    #[error("the gRPC server stopped: {0}")]
    Server(String),
    #[error(
        "stopped because {}; a CUDA fault cannot be cleared inside the process, so the {daemon} exits for its supervisor to restart it (exit status {EXIT_DEVICE_FAULT})",
        describe(.devices)
    )]
    DevicesOutOfService {
        daemon: &'static str,
        devices: Vec<(u32, String)>,
    },
}

/// The end of `daemon`'s run: the server's result `served`, then the devices `out_of_service`
/// (index and why) that ended it.
pub fn finish(
    daemon: &'static str,
    served: Result<(), tonic::transport::Error>,
    out_of_service: Vec<(u32, String)>,
) -> Result<(), Stopped> {
    served.map_err(|e| Stopped::Server(crate::errors::error_chain(&e)))?;
    if !out_of_service.is_empty() {
        return Err(Stopped::DevicesOutOfService {
            daemon,
            devices: out_of_service,
        });
    }
    tracing::info!("{daemon} stopped");
    Ok(())
}
