//! Transport policy: TLS and mutual TLS from PEM files, and plaintext only where it cannot leave
//! the machine (or when explicitly allowed). Servers and clients (the validator dialling miners,
//! the operator's CLI dialling a validator) follow the same rule.

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use thiserror::Error;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// PEM files for one side of a TLS connection.
///
/// As a server: `cert` + `key` turn TLS on; `ca` additionally requires clients to present a
/// certificate signed by it (mutual TLS). As a client: `ca` is the root the server's certificate
/// must chain to; `cert` + `key` are presented to servers that require client certificates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
}

/// What to do about a file the daemon's user may not read: name that user, since under
/// systemd's DynamicUser= or in a container it is not the operator's.
fn read_hint(source: &std::io::Error) -> String {
    if source.kind() != std::io::ErrorKind::PermissionDenied {
        return String::new();
    }
    // /proc/self belongs to the process's effective user.
    #[cfg(unix)]
    let uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").ok().map(|m| m.uid())
    };
    #[cfg(not(unix))]
    let uid: Option<u32> = None;
    match uid {
        Some(uid) => {
            format!(" (this daemon runs as uid {uid}: make the file readable by it, e.g. owned by it with mode 600)")
        }
        None => " (make the file readable by the daemon's user)".to_owned(),
    }
}

#[derive(Debug, Error)]
pub enum TransportError {
    #[error("cannot read {what} {path}: {source}{}", read_hint(source))]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("tls: `cert` and `key` must be given together")]
    HalfIdentity,
    #[error(
        "[tls] ca is set without cert and key: requiring client certificates needs this server's own certificate and key too (without them it would serve plaintext and check nobody)"
    )]
    ClientCaWithoutIdentity,
    #[error(
        "refusing to serve plaintext on {0}: configure [tls] cert and key, or set allow_plaintext = true to accept the risk"
    )]
    PlaintextServer(SocketAddr),
    #[error(
        "refusing plaintext to {0}: use an https:// URL with a CA configured, or set allow_plaintext_miners = true to accept the risk"
    )]
    PlaintextClient(String),
    #[error(
        "https:// URL {0} needs a CA certificate to check the server against: [miner_tls] ca for miners, --api-ca for the validator API"
    )]
    NoCa(String),
    #[error("{what} {path} holds no {expected} in PEM form ({detail})")]
    NotPem {
        what: &'static str,
        path: String,
        expected: &'static str,
        detail: String,
    },
    // Said without naming a setting: the same pair comes from [tls], [miner_tls] or the
    // operator commands' --api-cert and --api-key, and the two paths say which.
    #[error(
        "the TLS key {key} is not the key of the certificate {cert} ({detail}): name, beside that certificate, the key that was made with it"
    )]
    KeyMismatch { cert: String, key: String, detail: String },
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TransportError> {
    std::fs::read(path).map_err(|source| TransportError::Read {
        what,
        path: path.display().to_string(),
        source,
    })
}

impl TlsFiles {
    fn identity(&self) -> Result<Option<Identity>, TransportError> {
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Ok(Some(Identity::from_pem(read("certificate", cert)?, read("key", key)?))),
            (None, None) => Ok(None),
            _ => Err(TransportError::HalfIdentity),
        }
    }

    /// As [`identity`](Self::identity), with the key checked against the certificate as rustls
    /// checks it when a server starts, so that a mismatch is named with both files before a
    /// daemon says it listens (tonic finds it only as it starts serving, or at each dial).
    fn checked_identity(&self) -> Result<Option<Identity>, TransportError> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return self.identity();
        };
        let (cert_pem, key_pem) = (read("certificate", cert)?, read("key", key)?);
        check_key_matches_certificate(&cert_pem, cert, &key_pem, key)?;
        Ok(Some(Identity::from_pem(cert_pem, key_pem)))
    }

    /// The server TLS config, or `None` for plaintext. The certificate and key are checked
    /// against each other here, so that a daemon refuses to start, naming both files, before it
    /// says it listens; a key that group or others may read is logged as a warning.
    pub fn server_config(&self) -> Result<Option<ServerTlsConfig>, TransportError> {
        let Some(identity) = self.checked_identity()? else {
            return match self.ca {
                Some(_) => Err(TransportError::ClientCaWithoutIdentity),
                None => Ok(None),
            };
        };
        if let Some(key) = &self.key {
            warn_if_exposed(key);
        }
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.ca {
            config = config.client_ca_root(Certificate::from_pem(read("client CA", ca)?));
        }
        Ok(Some(config))
    }

    /// Reads every file named, and checks the certificate against its key, so that a daemon (or
    /// a command) refuses to start with a missing, unreadable or mismatched one instead of
    /// failing later, at each connection that needs it.
    pub fn check_readable(&self) -> Result<(), TransportError> {
        self.checked_identity()?;
        if let Some(ca) = &self.ca {
            read("CA", ca)?;
        }
        Ok(())
    }

    /// The client TLS config for `https://` URLs.
    pub fn client_config(&self, url: &str) -> Result<ClientTlsConfig, TransportError> {
        let ca = self.ca.as_ref().ok_or_else(|| TransportError::NoCa(url.to_string()))?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("CA", ca)?));
        if let Some(identity) = self.identity()? {
            config = config.identity(identity);
        }
        Ok(config)
    }
}

/// Whether the private key `key_pem` (read from `key`) is the key of the first certificate in
/// `cert_pem` (read from `cert`), as rustls checks it when a server starts.
fn check_key_matches_certificate(
    cert_pem: &[u8],
    cert: &Path,
    key_pem: &[u8],
    key: &Path,
) -> Result<(), TransportError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let not_pem = |what, path: &Path, expected, detail: String| TransportError::NotPem {
        what,
        path: path.display().to_string(),
        expected,
        detail,
    };
    let certificates = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem("certificate", cert, "certificate", e.to_string()))?;
    if certificates.is_empty() {
        return Err(not_pem("certificate", cert, "certificate", "none found".into()));
    }
    let private_key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| not_pem("key", key, "private key", e.to_string()))?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(certificates, private_key, &provider)
        .map(|_| ())
        .map_err(|e| TransportError::KeyMismatch {
            cert: cert.display().to_string(),
            key: key.display().to_string(),
            detail: e.to_string(),
        })
}

/// Logs a warning when group or others may read the TLS private key at `key`: unlike the
/// ed25519 key (refused), it may be shared with a group the daemon's user is in on purpose.
fn warn_if_exposed(key: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(key)
            && meta.permissions().mode() & 0o004 != 0
        {
            tracing::warn!(
                key = %key.display(),
                mode = format!("{:o}", meta.permissions().mode() & 0o777),
                "the TLS private key is readable by every user of this host; run `chmod o-r` on it (and g-r unless a group shares it on purpose)"
            );
        }
    }
}

/// Whether a server may listen without TLS: always on loopback, elsewhere only when allowed
/// (then `Ok(Some(warning))`).
pub fn check_plaintext_server(addr: SocketAddr, tls: bool, allow: bool) -> Result<Option<String>, TransportError> {
    if tls || addr.ip().is_loopback() {
        Ok(None)
    } else if allow {
        Ok(Some(format!(
            "serving PLAINTEXT on {addr}: challenges, keys' signatures and verdicts travel unencrypted"
        )))
    } else {
        Err(TransportError::PlaintextServer(addr))
    }
}

/// Whether a client may connect to `url` without TLS; same rule as servers.
pub fn check_plaintext_client(url: &str, allow: bool) -> Result<Option<String>, TransportError> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Ok(None);
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(None)
    } else if allow {
        Ok(Some(format!("connecting to {url} in PLAINTEXT")))
    } else {
        Err(TransportError::PlaintextClient(url.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_only_on_loopback_unless_allowed() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert!(check_plaintext_server(lo, false, false).unwrap().is_none());
        assert!(check_plaintext_server(any, true, false).unwrap().is_none());
        assert!(matches!(
            check_plaintext_server(any, false, false),
            Err(TransportError::PlaintextServer(_))
        ));
        assert!(check_plaintext_server(any, false, true).unwrap().is_some());
        for ok in [
            "http://127.0.0.1:7070",
            "http://localhost:1",
            "http://[::1]:7070/x",
            "https://gpu-host:7070",
        ] {
            assert!(check_plaintext_client(ok, false).unwrap().is_none(), "{ok}");
        }
        assert!(check_plaintext_client("http://gpu-host:7070", false).is_err());
        assert!(check_plaintext_client("http://10.0.0.8:7070", true).unwrap().is_some());
    }

    #[test]
    fn a_client_ca_without_a_server_identity_is_refused_not_served_plaintext() {
        let files = TlsFiles {
            ca: Some(PathBuf::from("/nonexistent/ca.pem")),
            ..TlsFiles::default()
        };
        assert!(matches!(
            files.server_config(),
            Err(TransportError::ClientCaWithoutIdentity)
        ));
        assert!(matches!(
            files.check_readable(),
            Err(TransportError::Read { what: "CA", .. })
        ));
        TlsFiles::default().check_readable().unwrap();
    }

    /// A key the daemon's user may not read says which user that is; other failures do not
    /// guess.
    #[test]
    fn an_unreadable_file_names_the_user_that_must_read_it() {
        let denied = TransportError::Read {
            what: "key",
            path: "/run/secrets/miner_key".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        let text = denied.to_string();
        assert!(text.starts_with("cannot read key /run/secrets/miner_key: "), "{text}");
        assert!(text.contains("this daemon runs as uid "), "{text}");
        let missing = TransportError::Read {
            what: "key",
            path: "/run/secrets/miner_key".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert!(!missing.to_string().contains("uid"), "{missing}");
    }
}
