//! The daemon's gRPC listening socket.

use std::net::SocketAddr;
use thiserror::Error;
use tokio::net::TcpListener;

#[derive(Debug, Error)]
#[error("cannot listen on {address}: {source}")]
pub struct BindError {
    pub address: SocketAddr,
    pub source: std::io::Error,
}

/// The daemon's listener on `address`, and the address it got (the real port when `address`
/// asks for port 0). Prints `listening on ADDRESS` on stdout, the line scripts and tests read
/// to learn a port-0 address.
pub async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), BindError> {
    let bind_error = |source| BindError { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    say(&format!("listening on {bound}"));
    Ok((listener, bound))
}

/// One line on stdout for scripts and tests to read. A reader that has gone away (a pipe
/// closed after reading the address) must not bring the daemon down, so errors are ignored.
pub fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn bind_reports_the_port_it_got_and_a_taken_port_plainly() {
        let (listener, bound) = super::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        assert_ne!(bound.port(), 0, "port 0 must come back as the real port");
        assert_eq!(listener.local_addr().unwrap(), bound);
        let err = super::bind(bound).await.unwrap_err();
        assert!(
            err.to_string().starts_with(&format!("cannot listen on {bound}: ")),
            "{err}"
        );
    }
}
