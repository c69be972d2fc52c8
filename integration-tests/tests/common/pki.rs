//! A throwaway PKI for the TLS tests: one CA, a server certificate for localhost, and a client
//! certificate, written as PEM files.

use super::TempDir;
use gpu_attest_daemon::tls::TlsFiles;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair};

pub struct Pki {
    pub dir: TempDir,
}

impl Pki {
    pub fn new() -> Self {
        let dir = TempDir::new("pki");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.path("ca.pem"), ca.pem()).unwrap();
        for (name, usage) in [
            ("server", ExtendedKeyUsagePurpose::ServerAuth),
            ("client", ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca).unwrap();
            std::fs::write(dir.path(&format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.path(&format!("{name}.key")), key.serialize_pem()).unwrap();
        }
        Pki { dir }
    }

    /// Server side: TLS, and mutual TLS (client certificates required) when `require_client`.
    pub fn server(&self, require_client: bool) -> TlsFiles {
        TlsFiles {
            cert: Some(self.dir.path("server.pem")),
            key: Some(self.dir.path("server.key")),
            ca: require_client.then(|| self.dir.path("ca.pem")),
        }
    }

    /// Client side: trusts the CA, and presents the client certificate when `with_cert`.
    pub fn client(&self, with_cert: bool) -> TlsFiles {
        TlsFiles {
            cert: with_cert.then(|| self.dir.path("client.pem")),
            key: with_cert.then(|| self.dir.path("client.key")),
            ca: Some(self.dir.path("ca.pem")),
        }
    }
}
