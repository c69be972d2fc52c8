//! A test PKI of the project's own, shaped like NVIDIA's: a root, an intermediate CA and a device
//! leaf, all on P-384, and SPDM reports signed by the leaf's key. Nothing here is NVIDIA's; the
//! validator trusts it only where a test pins its root.

use p384::ecdsa::signature::Signer;
use p384::ecdsa::{DerSignature, Signature, SigningKey};
use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};
use x509_cert::TbsCertificate;
use x509_cert::builder::profile::BuilderProfile;
use x509_cert::builder::{Builder, CertificateBuilder};
use x509_cert::der::asn1::{OctetString, Utf8StringRef};
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Any, Encode};
use x509_cert::ext::Extension;
use x509_cert::ext::pkix::name::{GeneralName, OtherName};
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage, KeyUsages, SubjectAltName};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::{SubjectPublicKeyInfo, SubjectPublicKeyInfoRef};
use x509_cert::time::{Time, Validity};

use gpu_attest_shared::evidence::TrustAnchors;

/// 2020-01-01 and 2099-01-01: the default validity of every test certificate.
pub const NOT_BEFORE: u64 = 1_577_836_800;
pub const NOT_AFTER: u64 = 4_070_908_800;
/// A time inside every default validity period.
pub const NOW: u64 = 1_764_000_000;

/// Who a certificate is and what it may do.
struct Profile {
    subject: Name,
    issuer: Name,
    ca: bool,
    extra: Vec<Extension>,
}

impl BuilderProfile for Profile {
    fn get_issuer(&self, _subject: &Name) -> Name {
        self.issuer.clone()
    }

    fn get_subject(&self) -> Name {
        self.subject.clone()
    }

    fn build_extensions(
        &self,
        _spk: SubjectPublicKeyInfoRef<'_>,
        _issuer_spk: SubjectPublicKeyInfoRef<'_>,
        _tbs: &TbsCertificate,
    ) -> x509_cert::builder::Result<Vec<Extension>> {
        let mut extensions = Vec::new();
        if self.ca {
            extensions.push(extension(
                BasicConstraints {
                    ca: true,
                    path_len_constraint: None,
                },
                true,
            ));
            extensions.push(extension(KeyUsage(KeyUsages::KeyCertSign.into()), true));
        } else {
            extensions.push(extension(KeyUsage(KeyUsages::DigitalSignature.into()), true));
        }
        extensions.extend(self.extra.iter().cloned());
        Ok(extensions)
    }
}

fn extension<T: Encode + x509_cert::der::oid::AssociatedOid>(value: T, critical: bool) -> Extension {
    Extension {
        extn_id: T::OID,
        critical,
        extn_value: OctetString::new(value.to_der().expect("extension encodes")).expect("octets"),
    }
}

/// A P-384 key from a one-byte seed: every byte of the scalar is `seed`, well below the order.
pub fn key(seed: u8) -> SigningKey {
    SigningKey::from_slice(&[seed; 48]).expect("a valid P-384 scalar")
}

fn time(unix_secs: u64) -> Time {
    Time::try_from(UNIX_EPOCH + Duration::from_secs(unix_secs)).expect("a representable time")
}

/// Issues a certificate for `subject_key`, named `subject`, signed by `issuer_key` as `issuer`.
pub fn issue(
    subject: &str,
    subject_key: &SigningKey,
    issuer: &str,
    issuer_key: &SigningKey,
    ca: bool,
    validity: (u64, u64),
    extra: Vec<Extension>,
) -> Vec<u8> {
    let profile = Profile {
        subject: Name::from_str(subject).expect("a subject name"),
        issuer: Name::from_str(issuer).expect("an issuer name"),
        ca,
        extra,
    };
    let spki = SubjectPublicKeyInfo::from_key(subject_key.verifying_key()).expect("a public key");
    let builder = CertificateBuilder::new(
        profile,
        SerialNumber::from(u32::from(subject_key.to_bytes()[0]) + 1),
        Validity::new(time(validity.0), time(validity.1)),
        spki,
    )
    .expect("a certificate builder");
    let cert = builder
        .build::<_, DerSignature>(issuer_key)
        .expect("a signed certificate");
    cert.to_der().expect("a DER certificate")
}

/// The NVIDIA-style device name in the leaf: `NVIDIA:<chip>:<device id>`.
pub fn device_name(chip: &str, device_id: &str) -> Extension {
    let text = format!("NVIDIA:{chip}:{device_id}");
    let value = Any::encode_from(&Utf8StringRef::new(&text).expect("utf-8")).expect("any");
    let names = SubjectAltName(vec![GeneralName::OtherName(OtherName {
        type_id: ObjectIdentifier::new_unwrap("1.3.6.1.4.1.412.274.1"),
        value,
    })]);
    extension(names, false)
}

/// A TCG DICE FWID extension whose last 48 bytes are `fwid`.
pub fn fwid_extension(fwid: &[u8; 48]) -> Extension {
    let mut value = vec![0x30, 50, 0x04, 48];
    value.extend_from_slice(fwid);
    Extension {
        extn_id: ObjectIdentifier::new_unwrap("2.23.133.5.4.1"),
        critical: false,
        extn_value: OctetString::new(value).expect("octets"),
    }
}

pub const ROOT_NAME: &str = "CN=gpu-attest Test Device Root,O=gpu-attest tests";
pub const INTERMEDIATE_NAME: &str = "CN=gpu-attest Test GH100 CA,O=gpu-attest tests";
pub const LEAF_NAME: &str = "CN=GH100 Test FMC LF,O=gpu-attest tests";

/// The per-device CA's name, as NVIDIA's `GH100 A01 GSP BROM` is one per part.
pub fn brom_name(device_id: &str) -> String {
    format!("CN=GH100 Test BROM {device_id},O=gpu-attest tests")
}

/// The firmware id test reports and leaves name.
pub const FWID: [u8; 48] = [0x5a; 48];

/// A root, a shared CA, one device's own CA (its "boot ROM") and that device's leaf: NVIDIA's
/// shape, in four certificates instead of five.
pub struct TestPki {
    pub root: Vec<u8>,
    pub intermediate: Vec<u8>,
    /// The device's own CA, the leaf's issuer.
    pub brom: Vec<u8>,
    pub brom_key: SigningKey,
    pub leaf: Vec<u8>,
    /// The device's attestation key: it signs reports.
    pub leaf_key: SigningKey,
}

impl TestPki {
    /// A GH100 device with id `device_id`, its keys made from `seed` (one device, one seed).
    pub fn device(seed: u8, device_id: &str) -> Self {
        Self::device_with(seed, "GH100", device_id, (NOT_BEFORE, NOT_AFTER))
    }

    /// As [`TestPki::device`], with the chip and the leaf's validity chosen.
    pub fn device_with(seed: u8, chip: &str, device_id: &str, leaf_validity: (u64, u64)) -> Self {
        let root_key = key(1);
        let intermediate_key = key(2);
        let brom_key = key(seed ^ 0x80);
        let leaf_key = key(seed);
        let root = Self::anchors_der();
        let intermediate = issue(
            INTERMEDIATE_NAME,
            &intermediate_key,
            ROOT_NAME,
            &root_key,
            true,
            (NOT_BEFORE, NOT_AFTER),
            vec![],
        );
        let brom = issue(
            &brom_name(device_id),
            &brom_key,
            INTERMEDIATE_NAME,
            &intermediate_key,
            true,
            (NOT_BEFORE, NOT_AFTER),
            vec![],
        );
        let leaf = issue(
            LEAF_NAME,
            &leaf_key,
            &brom_name(device_id),
            &brom_key,
            false,
            leaf_validity,
            vec![device_name(chip, device_id), fwid_extension(&FWID)],
        );
        Self {
            root,
            intermediate,
            brom,
            brom_key,
            leaf,
            leaf_key,
        }
    }

    /// Leaf, device CA, shared CA, root: the order a miner ships.
    pub fn chain(&self) -> Vec<Vec<u8>> {
        vec![
            self.leaf.clone(),
            self.brom.clone(),
            self.intermediate.clone(),
            self.root.clone(),
        ]
    }

    /// The chain as PEM, the way NVML hands it out.
    pub fn chain_pem(&self) -> String {
        self.chain().iter().map(|der| pem(der)).collect()
    }

    /// This PKI's root as PEM: what an operator's roots file would hold.
    pub fn root_pem() -> String {
        pem(&Self::anchors_der())
    }

    fn anchors_der() -> Vec<u8> {
        let root_key = key(1);
        issue(
            ROOT_NAME,
            &root_key,
            ROOT_NAME,
            &root_key,
            true,
            (NOT_BEFORE, NOT_AFTER),
            vec![],
        )
    }

    /// Trust in this PKI's root alone.
    pub fn anchors() -> TrustAnchors {
        TrustAnchors::from_der(vec![Self::anchors_der()])
    }
}

/// A DER certificate as one PEM block.
pub fn pem(der: &[u8]) -> String {
    use x509_cert::der::{Decode, EncodePem, pem::LineEnding};
    x509_cert::Certificate::from_der(der)
        .expect("our own certificate")
        .to_pem(LineEnding::LF)
        .expect("PEM")
}

/// What a test report says.
#[derive(Clone, Debug)]
pub struct ReportSpec {
    pub nonce: [u8; 32],
    pub project: &'static str,
    pub project_sku: &'static str,
    pub fwid: Option<[u8; 48]>,
    /// The chip the opaque data names (field 35), if any.
    pub chip_info: Option<&'static str>,
}

impl ReportSpec {
    pub fn new(nonce: [u8; 32]) -> Self {
        Self {
            nonce,
            project: "G520",
            project_sku: "0200",
            fwid: Some(FWID),
            chip_info: None,
        }
    }
}

fn opaque_field(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(value.len() as u16).to_le_bytes());
    out.extend_from_slice(value);
}

fn padded(text: &str, len: usize) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.resize(len, 0);
    bytes
}

/// An SPDM 1.1 GET_MEASUREMENTS request and its MEASUREMENTS response, with two DMTF measurement
/// blocks and NVIDIA-style opaque data, signed by `key` over everything but the signature.
pub fn signed_report(key: &SigningKey, spec: &ReportSpec) -> Vec<u8> {
    let mut report = vec![0x11, 0xE0, 0x01, 0xFF];
    report.extend_from_slice(&spec.nonce);
    report.push(0); // slot 0

    let mut record = Vec::new();
    for index in 1u8..=2 {
        let value = [index; 48];
        record.extend_from_slice(&[index, 1]);
        record.extend_from_slice(&(3 + value.len() as u16).to_le_bytes());
        record.push(0x01); // DMTF value type
        record.extend_from_slice(&(value.len() as u16).to_le_bytes());
        record.extend_from_slice(&value);
    }
    let mut opaque = Vec::new();
    opaque_field(&mut opaque, 3, b"570.86.15\0");
    opaque_field(&mut opaque, 15, &padded("885", 9));
    opaque_field(&mut opaque, 17, &padded(spec.project, 5));
    opaque_field(&mut opaque, 18, &padded(spec.project_sku, 5));
    if let Some(fwid) = &spec.fwid {
        opaque_field(&mut opaque, 20, fwid);
    }
    if let Some(chip) = spec.chip_info {
        opaque_field(&mut opaque, 35, &padded(chip, 16));
    }

    report.extend_from_slice(&[0x11, 0x60, 0x00, 0x00, 2]);
    report.extend_from_slice(&(record.len() as u32).to_le_bytes()[..3]);
    report.extend_from_slice(&record);
    report.extend_from_slice(&[0xAB; 32]); // the responder's nonce
    report.extend_from_slice(&(opaque.len() as u16).to_le_bytes());
    report.extend_from_slice(&opaque);
    let signature: Signature = key.sign(&report);
    report.extend_from_slice(&signature.to_bytes());
    report
}
