//! The signals that stop a daemon gracefully, and the one that ends a command whose reader
//! has gone.

/// Lets SIGPIPE end the process, as it does any Unix command: `validator verdicts | head` then
/// stops quietly when `head` has read enough, instead of panicking on the closed pipe. Only for
/// the one-shot commands: a daemon must see a peer's closed socket as a write error instead.
pub fn end_quietly_when_output_closes() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal, before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Completes on SIGINT or SIGTERM, for a graceful shutdown.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutdown signal received; finishing in-flight calls");
}
