//! Logs: structured, to stderr, the level from the environment.

/// Structured logs to stderr; the level comes from `GPU_ATTEST_LOG` (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPU_ATTEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}
