//! Which TCP connection a request came on, whether it was plain or TLS.
//!
//! tonic puts a plain connection's addresses in the request's extensions as a
//! `TcpConnectInfo`, and a TLS one's as a `TlsConnectInfo` wrapping it. Everything that needs
//! the peer's address (the rate limiter, the refusal log) or both ends (the connection table)
//! asks here, so a new transport is taught in one place.

use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

/// The addresses of the connection a request came on, if the server recorded them.
pub(crate) fn tcp_connect_info(extensions: &http::Extensions) -> Option<&TcpConnectInfo> {
    extensions.get::<TcpConnectInfo>().or_else(|| {
        extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .map(TlsConnectInfo::get_ref)
    })
}

/// The remote address of the connection a request came on.
pub(crate) fn peer_address(extensions: &http::Extensions) -> Option<std::net::SocketAddr> {
    tcp_connect_info(extensions)?.remote_addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(remote: &str, local: &str) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: Some(local.parse().unwrap()),
            remote_addr: Some(remote.parse().unwrap()),
        }
    }

    #[test]
    fn the_peer_of_a_plain_connection_is_found() {
        let mut extensions = http::Extensions::new();
        extensions.insert(plain("192.0.2.7:4000", "192.0.2.1:8091"));
        assert_eq!(peer_address(&extensions), Some("192.0.2.7:4000".parse().unwrap()));
        let info = tcp_connect_info(&extensions).unwrap();
        assert_eq!(info.local_addr(), Some("192.0.2.1:8091".parse().unwrap()));
    }

    #[test]
    fn a_request_without_connect_info_has_no_peer() {
        assert_eq!(peer_address(&http::Extensions::new()), None);
    }
}
