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

/// The runtime for a one-shot command that dials peers (`validator attest`, `validator
/// miners`): its worker threads, which drive the connections and so do the sockets' writes,
/// block SIGPIPE, so that writing to a peer that closed or reset its connection is an error for
/// the call rather than the end of the process (which [`end_quietly_when_output_closes`] would
/// otherwise make it: `attest` against a crowded miner exited with status 141, printing
/// nothing). The main thread, which prints, still ends quietly when its reader goes.
pub fn one_shot_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(block_sigpipe_on_this_thread)
        .build()
}

fn block_sigpipe_on_this_thread() {
    #[cfg(unix)]
    // SAFETY: the set is initialised by sigemptyset before use; pthread_sigmask only changes
    // this thread's mask. A SIGPIPE raised by a write on this thread then stays pending, and
    // the write fails with EPIPE instead.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Completes on SIGINT or SIGTERM, for a graceful shutdown.
pub async fn shutdown_signal() {
    interrupted().await;
    tracing::info!("shutdown signal received; finishing in-flight calls");
}

/// Completes on the next SIGINT or SIGTERM. Once tokio listens for a signal its default action
/// (stopping the process) is gone for good, so a daemon that is draining listens again for an
/// operator's second Ctrl-C.
pub async fn interrupted() {
    // A listener that cannot be set up (a runtime without signals) never completes: read as
    // an interrupt, it would stop a daemon, or end its drain, at once.
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
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
}
