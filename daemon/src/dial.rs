//! Dialling a gRPC peer with one bound on the whole of it.
//!
//! `Endpoint::connect_timeout` bounds the TCP connect alone. The name lookup before it and the
//! TLS handshake after it have no bound of their own: a listener that accepts and never speaks,
//! or a host stopped with SIGSTOP (its kernel still completes the TCP handshake from the listen
//! backlog), held the caller for as long as the socket stayed open. [`dial`] bounds lookup,
//! connect and handshake together, and says which of them the time ran out in where it can.

use std::time::Duration;
use thiserror::Error;
use tonic::transport::{Channel, Endpoint};

/// Whether `status` was made on this side from the connection's own error (it has a source: an
/// HTTP/2 or transport error), rather than sent by the peer, whose statuses arrive without one.
/// A peer's message may well say "transport error" when it relays what it met further on, so the
/// words alone cannot tell the two apart.
pub fn made_by_the_connection(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// Why a peer could not be dialled.
#[derive(Debug, Error)]
pub enum DialError {
    /// The bound passed before the connection was ready.
    #[error(
        "no connection within {} ms: the TCP connect and the {} together took longer (a host that accepts connections and never answers, one that is stopped or overloaded, or something that is not a gRPC server)",
        bound.as_millis(),
        if *tls { "TLS handshake" } else { "HTTP/2 set-up" }
    )]
    TimedOut { bound: Duration, tls: bool },
    /// The transport failed: refused, reset, a certificate that does not verify.
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

/// Connects `endpoint` (its `connect_timeout` still bounds the TCP connect within) and gives up
/// once `bound` has passed, whatever step it was in.
pub async fn dial(endpoint: &Endpoint, bound: Duration) -> Result<Channel, DialError> {
    let tls = endpoint.uri().scheme_str() == Some("https");
    match tokio::time::timeout(bound, endpoint.connect()).await {
        Ok(connected) => Ok(connected?),
        Err(_) => Err(DialError::TimedOut { bound, tls }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A listener that accepts every connection, reads what it is sent and never answers.
    async fn silent_listener() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut sink = [0u8; 1024];
                let _ = socket.read(&mut sink).await;
                held.push(socket);
            }
        });
        address.to_string()
    }

    #[tokio::test]
    async fn a_tls_handshake_that_never_ends_is_cut_off_at_the_bound() {
        let address = silent_listener().await;
        let endpoint = Endpoint::from_shared(format!("https://{address}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .tls_config(tonic::transport::ClientTlsConfig::new().domain_name("localhost"))
            .unwrap();
        let bound = Duration::from_millis(300);
        let error = dial(&endpoint, bound).await.unwrap_err();
        assert!(matches!(error, DialError::TimedOut { tls: true, .. }), "{error}");
        assert!(error.to_string().contains("TLS handshake"), "{error}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_transport_error_not_a_time_out() {
        // Bound and closed at once: nothing listens on the port any more.
        let address = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let endpoint = Endpoint::from_shared(format!("http://{address}")).unwrap();
        let error = dial(&endpoint, Duration::from_secs(10)).await.unwrap_err();
        assert!(matches!(error, DialError::Transport(_)), "{error}");
    }
}
