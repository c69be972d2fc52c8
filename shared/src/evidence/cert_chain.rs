//! A GPU's certificate chain, leaf first and root last, checked without a network up to a root
//! that the validator pins by its exact bytes.
//!
//! For NVIDIA's Hopper parts the chain is five certificates: the attestation key (`GH100 A01 GSP
//! FMC LF`, which signs reports), the device's boot ROM key (`GH100 A01 GSP BROM`), NVIDIA's
//! provisioner and architecture CAs, and `NVIDIA Device Identity CA`. The leaf names the device
//! in a subject-alternative-name `otherName` (OID 1.3.6.1.4.1.412.274.1) as
//! `NVIDIA:<chip>:<device id>`, and its firmware in the TCG DICE FWID extension (2.23.133.5.4.1).

use super::fault::EvidenceFault;
use p384::ecdsa::signature::Verifier;
use p384::ecdsa::{DerSignature, VerifyingKey};
use x509_cert::Certificate;
use x509_cert::der::asn1::Utf8StringRef;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::referenced::OwnedToRef;
use x509_cert::der::{Decode, Encode};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage, SubjectAltName};

/// ecdsa-with-SHA384 (RFC 5758).
const ECDSA_WITH_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.3");
/// NVIDIA's device-identity otherName in the leaf's subject alternative name.
const NVIDIA_DEVICE_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.412.274.1");
/// TCG DICE TcbInfo (FWID) extension.
const TCG_DICE_FWID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.23.133.5.4.1");
/// Bytes of a SHA-384 FWID: the last bytes of the FWID extension.
const FWID_BYTES: usize = 48;

/// The most certificates a chain may hold (NVIDIA's Hopper chains hold 5), and the most bytes
/// one certificate may take.
pub const MAX_CERTIFICATES: usize = 10;
pub const MAX_CERTIFICATE_BYTES: usize = 8 * 1024;

/// NVIDIA's device root, `CN = NVIDIA Device Identity CA, O = NVIDIA`, valid from 2021-11-05 to
/// 9999-12-31 (SHA-256 of its DER: `102bf659...0b167b48`). Source: NVIDIA's public nvtrust
/// repository, `guest_tools/gpu_verifiers/local_gpu_verifier/src/verifier/certs/verifier_device_root.pem`.
pub const NVIDIA_DEVICE_ROOT_PEM: &str = include_str!("nvidia-device-root.pem");

/// The roots a chain may end at, each compared byte for byte with the chain's last certificate.
#[derive(Clone, Debug)]
pub struct TrustAnchors {
    roots_der: Vec<Vec<u8>>,
}

impl TrustAnchors {
    /// NVIDIA's device root alone: what a validator trusts unless its tests say otherwise.
    pub fn nvidia() -> Self {
        let root = Certificate::load_pem_chain(NVIDIA_DEVICE_ROOT_PEM.as_bytes())
            .ok()
            .and_then(|certs| certs.into_iter().next())
            .and_then(|cert| cert.to_der().ok())
            .expect("the pinned NVIDIA device root is a valid PEM certificate");
        Self { roots_der: vec![root] }
    }

    /// The given DER certificates (a test PKI's root, say).
    pub fn from_der(roots_der: Vec<Vec<u8>>) -> Self {
        Self { roots_der }
    }

    /// The SHA-256 of each pinned root's DER, in hex: how PROTOCOL.md and an operator name a
    /// root.
    pub fn sha256_fingerprints(&self) -> Vec<String> {
        use sha2::Digest as _;
        self.roots_der
            .iter()
            .map(|der| hex::encode(sha2::Sha256::digest(der)))
            .collect()
    }

    fn pins(&self, der: &[u8]) -> bool {
        self.roots_der.iter().any(|root| root.as_slice() == der)
    }
}

/// What a verified chain says of its device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafIdentity {
    /// The chip, as the leaf names it (`GH100`).
    pub chip: String,
    /// The device's own id, as the leaf names it (16 hex digits on Hopper).
    pub device_id: String,
    /// The FWID the leaf was issued for, when it has the extension.
    pub fwid: Option<Vec<u8>>,
    /// The attestation key that signs reports.
    pub key: VerifyingKey,
    /// blake3 of the DER of the leaf's issuer. On NVIDIA's chains that is the device's own boot
    /// ROM certificate, which NVIDIA provisions once per part: a second leaf under it is the
    /// same part, whatever device id that leaf names.
    pub issuer_fingerprint: [u8; 32],
}

/// A decoded chain, not yet trusted.
#[derive(Clone, Debug)]
pub struct DeviceChain {
    certificates: Vec<Certificate>,
    ders: Vec<Vec<u8>>,
}

impl DeviceChain {
    /// Decodes DER certificates, leaf first. Each must be canonical DER (it re-encodes to the
    /// same bytes), so that no certificate has two encodings a check could disagree on.
    pub fn decode(ders: &[Vec<u8>]) -> Result<Self, EvidenceFault> {
        if ders.len() < 2 || ders.len() > MAX_CERTIFICATES {
            return Err(EvidenceFault::Chain(format!(
                "a chain holds 2 to {MAX_CERTIFICATES} certificates, this one {}",
                ders.len()
            )));
        }
        let mut certificates = Vec::with_capacity(ders.len());
        for (position, der) in ders.iter().enumerate() {
            if der.len() > MAX_CERTIFICATE_BYTES {
                return Err(EvidenceFault::Chain(format!(
                    "certificate {position} is {} bytes, more than {MAX_CERTIFICATE_BYTES}",
                    der.len()
                )));
            }
            let cert = Certificate::from_der(der)
                .map_err(|error| EvidenceFault::Chain(format!("certificate {position} does not decode: {error}")))?;
            if cert.to_der().ok().as_deref() != Some(der.as_slice()) {
                return Err(EvidenceFault::Chain(format!(
                    "certificate {position} is not in canonical DER"
                )));
            }
            certificates.push(cert);
        }
        Ok(Self {
            certificates,
            ders: ders.to_vec(),
        })
    }

    /// Decodes a PEM chain (as NVML hands it out) into DER certificates, leaf first: each
    /// `CERTIFICATE` block's bytes as they are, not re-encoded, so that the validator's
    /// canonical-DER check sees what the GPU's driver gave.
    pub fn pem_to_der(pem: &[u8]) -> Result<Vec<Vec<u8>>, EvidenceFault> {
        const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
        const END: &str = "-----END CERTIFICATE-----";
        let text = std::str::from_utf8(pem)
            .map_err(|_| EvidenceFault::Chain("the PEM chain is not text".into()))?
            .trim_end_matches('\0');
        let mut ders = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find(BEGIN) {
            let after = &rest[start..];
            let Some(end) = after.find(END) else {
                return Err(EvidenceFault::Chain("a PEM certificate has no END line".into()));
            };
            let block = &after[..end + END.len()];
            let (label, der) = x509_cert::der::pem::decode_vec(block.as_bytes())
                .map_err(|error| EvidenceFault::Chain(format!("a PEM certificate does not decode: {error}")))?;
            if label != "CERTIFICATE" {
                return Err(EvidenceFault::Chain(format!(
                    "a PEM block is a {label}, not a CERTIFICATE"
                )));
            }
            ders.push(der);
            rest = &after[end + END.len()..];
        }
        if ders.is_empty() {
            return Err(EvidenceFault::Chain("the PEM chain holds no certificate".into()));
        }
        Ok(ders)
    }

    /// Checks the chain at `now_unix_secs` and returns what its leaf says of the device:
    /// the root is pinned; each certificate names the next as its issuer, which is a CA and
    /// signed it (ECDSA P-384 with SHA-384); every certificate is within its validity period.
    pub fn verify(&self, anchors: &TrustAnchors, now_unix_secs: u64) -> Result<LeafIdentity, EvidenceFault> {
        let last = self.ders.len() - 1;
        if !anchors.pins(&self.ders[last]) {
            return Err(EvidenceFault::UntrustedRoot(format!(
                "the chain ends at `{}`, which is not a pinned root",
                self.certificates[last].tbs_certificate().subject()
            )));
        }
        for (position, cert) in self.certificates.iter().enumerate() {
            let validity = cert.tbs_certificate().validity();
            let not_before = validity.not_before.to_unix_duration().as_secs();
            let not_after = validity.not_after.to_unix_duration().as_secs();
            if now_unix_secs < not_before || now_unix_secs > not_after {
                return Err(EvidenceFault::ChainExpired(format!(
                    "certificate {position} (`{}`) is valid from {} to {}, not now",
                    cert.tbs_certificate().subject(),
                    validity.not_before,
                    validity.not_after
                )));
            }
        }
        for position in 0..last {
            let child = &self.certificates[position];
            let issuer = &self.certificates[position + 1];
            if child.tbs_certificate().issuer() != issuer.tbs_certificate().subject() {
                return Err(EvidenceFault::Chain(format!(
                    "certificate {position} names `{}` as its issuer, but the next is `{}`",
                    child.tbs_certificate().issuer(),
                    issuer.tbs_certificate().subject()
                )));
            }
            if !is_ca(issuer) {
                return Err(EvidenceFault::Chain(format!(
                    "certificate {} (`{}`) signs another but is not a CA",
                    position + 1,
                    issuer.tbs_certificate().subject()
                )));
            }
            verify_signed_by(child, issuer)
                .map_err(|why| EvidenceFault::Chain(format!("certificate {position}: {why}")))?;
        }
        let mut identity = leaf_identity(&self.certificates[0])?;
        identity.issuer_fingerprint = *blake3::hash(&self.ders[1]).as_bytes();
        Ok(identity)
    }
}

fn is_ca(cert: &Certificate) -> bool {
    matches!(cert.tbs_certificate().get_extension::<BasicConstraints>(), Ok(Some((_, bc))) if bc.ca)
}

fn public_key(cert: &Certificate) -> Result<VerifyingKey, String> {
    VerifyingKey::try_from(cert.tbs_certificate().subject_public_key_info().owned_to_ref())
        .map_err(|_| "its key is not an ECDSA P-384 key".to_string())
}

fn verify_signed_by(child: &Certificate, issuer: &Certificate) -> Result<(), String> {
    if child.signature_algorithm().oid != ECDSA_WITH_SHA384
        || child.tbs_certificate().signature().oid != ECDSA_WITH_SHA384
    {
        return Err(format!(
            "signed with {}, not ecdsa-with-SHA384",
            child.signature_algorithm().oid
        ));
    }
    let key = public_key(issuer).map_err(|why| format!("the issuer's key: {why}"))?;
    let tbs = child.tbs_certificate().to_der().map_err(|error| error.to_string())?;
    let signature = child
        .signature()
        .as_bytes()
        .and_then(|bytes| DerSignature::from_bytes(bytes).ok())
        .ok_or("its signature is not a DER ECDSA signature")?;
    key.verify(&tbs, &signature)
        .map_err(|_| "its issuer's signature does not verify".to_string())
}

fn leaf_identity(leaf: &Certificate) -> Result<LeafIdentity, EvidenceFault> {
    let key = public_key(leaf).map_err(|why| EvidenceFault::Chain(format!("the leaf: {why}")))?;
    match leaf.tbs_certificate().get_extension::<KeyUsage>() {
        Ok(None) => {}
        Ok(Some((_, usage))) if usage.digital_signature() => {}
        Ok(Some(_)) => return Err(EvidenceFault::Chain("the leaf's key may not sign".into())),
        Err(error) => {
            return Err(EvidenceFault::Chain(format!(
                "the leaf's key usage does not decode: {error}"
            )));
        }
    }
    let names = match leaf.tbs_certificate().get_extension::<SubjectAltName>() {
        Ok(Some((_, names))) => names.0,
        Ok(None) => Vec::new(),
        Err(error) => {
            return Err(EvidenceFault::Chain(format!(
                "the leaf's alternative names do not decode: {error}"
            )));
        }
    };
    let device_name = names.iter().find_map(|name| match name {
        GeneralName::OtherName(other) if other.type_id == NVIDIA_DEVICE_NAME => other
            .value
            .decode_as::<Utf8StringRef<'_>>()
            .ok()
            .map(|text| text.as_str().to_string()),
        _ => None,
    });
    let Some(device_name) = device_name else {
        return Err(EvidenceFault::Chain(
            "the leaf certificate names no NVIDIA device".into(),
        ));
    };
    let mut parts = device_name.split(':');
    let (Some("NVIDIA"), Some(chip), Some(device_id), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(EvidenceFault::Chain(format!(
            "the leaf names its device `{device_name}`, not `NVIDIA:<chip>:<id>`"
        )));
    };
    if chip.is_empty() || device_id.is_empty() {
        return Err(EvidenceFault::Chain(format!(
            "the leaf names its device `{device_name}`"
        )));
    }
    let fwid = leaf
        .tbs_certificate()
        .extensions()
        .and_then(|extensions| extensions.iter().find(|ext| ext.extn_id == TCG_DICE_FWID))
        .map(|ext| ext.extn_value.as_bytes())
        .filter(|value| value.len() >= FWID_BYTES)
        .map(|value| value[value.len() - FWID_BYTES..].to_vec());
    Ok(LeafIdentity {
        chip: chip.to_string(),
        device_id: device_id.to_string(),
        fwid,
        key,
        issuer_fingerprint: [0; 32],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The root the validator pins is the one PROTOCOL.md 19.4 names by its SHA-256.
    #[test]
    fn the_pinned_root_is_the_one_protocol_md_names() {
        let fingerprint = "102bf659d5419614c9d8e6aecebc80454eb26b1df6a769ac720b9a690b167b48";
        assert_eq!(
            TrustAnchors::nvidia().sha256_fingerprints(),
            vec![fingerprint.to_string()]
        );
        assert!(include_str!("../../../PROTOCOL.md").contains(fingerprint));
    }
}
