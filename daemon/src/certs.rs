//! A private CA and the certificates a small deployment needs, made in one go: the first hour
//! of an operator who has no PKI yet (`validator tls-certs`). A deployment with a PKI of its
//! own uses that instead; these are ordinary PEM files either way.
//!
//! What it makes, all signed by one new CA (ECDSA P-256, valid for `days`):
//! - `ca.pem` (every daemon's `tls.ca` / `miner_tls.ca` / `--api-ca`) and `ca.key`;
//! - `validator.pem`/`validator.key`: the validator API's server certificate for its hosts (and
//!   localhost, 127.0.0.1 and ::1), also good as its client certificate towards miners that
//!   require mutual TLS;
//! - `miner-<host>.pem`/`.key` for each miner host: its server certificate;
//! - `operator.pem`/`.key`: a client certificate for `validator miners` and API clients, for a
//!   validator API that requires mutual TLS.
//!
//! Keys are written owner-only, and nothing is ever overwritten: a directory that already holds
//! any of the files is refused.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CertsError {
    #[error("{0} exists already: tls-certs never overwrites a certificate or key; choose an empty directory")]
    Exists(PathBuf),
    #[error("{0:?} is not a host name or IP address a certificate can name")]
    BadHost(String),
    #[error("no host: name at least one miner host or validator host")]
    NoHosts,
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot make the certificates: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// What to make: the hosts each certificate names, and how long they are valid.
#[derive(Clone, Debug)]
pub struct CertsRequest {
    pub validator_hosts: Vec<String>,
    pub miner_hosts: Vec<String>,
    pub days: u32,
}

/// The files made, in the order written.
pub fn make(dir: &Path, request: &CertsRequest) -> Result<Vec<PathBuf>, CertsError> {
    if request.validator_hosts.is_empty() && request.miner_hosts.is_empty() {
        return Err(CertsError::NoHosts);
    }
    for host in request.validator_hosts.iter().chain(&request.miner_hosts) {
        if !is_host(host) {
            return Err(CertsError::BadHost(host.clone()));
        }
    }
    let mut names = vec!["ca".to_string(), "validator".into(), "operator".into()];
    names.extend(request.miner_hosts.iter().map(|h| format!("miner-{h}")));
    for name in &names {
        for ext in ["pem", "key"] {
            let path = dir.join(format!("{name}.{ext}"));
            if path.exists() {
                return Err(CertsError::Exists(path));
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.to_path_buf(),
        source,
    })?;

    let now = time::OffsetDateTime::now_utc();
    let validity = |params: &mut CertificateParams| {
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(i64::from(request.days));
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.distinguished_name = named("gpu-attest CA");
    validity(&mut ca_params);
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let mut written = Vec::new();
    write(dir, "ca.pem", &ca.pem(), false, &mut written)?;
    write(dir, "ca.key", &ca_key_pem, true, &mut written)?;
    let issue = |name: &str, hosts: &[String], usages: Vec<ExtendedKeyUsagePurpose>, written: &mut Vec<PathBuf>| {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(hosts.to_vec())?;
        params.distinguished_name = named(name);
        params.extended_key_usages = usages;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        validity(&mut params);
        let cert = params.signed_by(&key, &ca)?;
        write(dir, &format!("{name}.pem"), &cert.pem(), false, written)?;
        write(dir, &format!("{name}.key"), &key.serialize_pem(), true, written)
    };
    use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    // Operators on the validator's own host reach its API on loopback, as `validator miners`
    // does by default: those names are always on its certificate.
    let mut validator_hosts = request.validator_hosts.clone();
    for local in ["localhost", "127.0.0.1", "::1"] {
        if !validator_hosts.iter().any(|h| h == local) {
            validator_hosts.push(local.to_string());
        }
    }
    issue(
        "validator",
        &validator_hosts,
        vec![ServerAuth, ClientAuth],
        &mut written,
    )?;
    for host in &request.miner_hosts {
        issue(
            &format!("miner-{host}"),
            std::slice::from_ref(host),
            vec![ServerAuth],
            &mut written,
        )?;
    }
    issue("operator", &[], vec![ClientAuth], &mut written)?;
    Ok(written)
}

fn named(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// A DNS name or an IP address.
fn is_host(host: &str) -> bool {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn write(dir: &Path, name: &str, text: &str, secret: bool, written: &mut Vec<PathBuf>) -> Result<(), CertsError> {
    let path = dir.join(name);
    let failed = |source| CertsError::Write {
        path: path.clone(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&path).map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)?;
    written.push(path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CertsRequest {
        CertsRequest {
            validator_hosts: vec!["validator.example".into()],
            miner_hosts: vec!["gpu-1.example".into(), "10.0.0.7".into()],
            days: 30,
        }
    }

    #[test]
    fn makes_a_ca_and_every_certificate_and_never_overwrites() {
        let dir = std::env::temp_dir().join(format!("gpu-attest-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let written = make(&dir, &request()).unwrap();
        let names: Vec<_> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "ca.pem",
                "ca.key",
                "validator.pem",
                "validator.key",
                "miner-gpu-1.example.pem",
                "miner-gpu-1.example.key",
                "miner-10.0.0.7.pem",
                "miner-10.0.0.7.key",
                "operator.pem",
                "operator.key"
            ]
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("ca.key")).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "keys are owner-only: {mode:o}");
        }
        let before = std::fs::read(dir.join("ca.key")).unwrap();
        assert!(matches!(make(&dir, &request()), Err(CertsError::Exists(_))));
        assert_eq!(
            std::fs::read(dir.join("ca.key")).unwrap(),
            before,
            "nothing overwritten"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_what_no_certificate_can_name() {
        let dir = std::env::temp_dir().join("gpu-attest-certs-never-made");
        for bad in ["", "-x.example", "a b", "x..y", "http://x"] {
            let mut r = request();
            r.miner_hosts = vec![bad.into()];
            assert!(matches!(make(&dir, &r), Err(CertsError::BadHost(_))), "{bad:?}");
        }
        let none = CertsRequest {
            validator_hosts: vec![],
            miner_hosts: vec![],
            days: 1,
        };
        assert!(matches!(make(&dir, &none), Err(CertsError::NoHosts)));
        assert!(!dir.exists());
    }
}
