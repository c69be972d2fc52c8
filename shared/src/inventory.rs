//! What a miner says it has, as the engine sees it: the hardware it claims and the limits it
//! sets (PROTOCOL.md sections 13.5 and 15).
//!
//! A validator sizes a challenge from one [`Inventory`]. The hardware part of it, a
//! [`HardwareClaim`], is bound into the signed challenge by its digest, and a commitment must
//! name exactly the same hardware: otherwise a miner could be sized as one CPU and be recorded
//! as eight GPUs.

use crate::device::DeviceInfo;
use crate::digest::Digest;
use crate::encoding::{put_inventory, put_str};
use crate::keys::{PublicKey, SignatureError};
use crate::params::{MIN_PROTOCOL_VERSION, NEWEST_PROTOCOL_VERSION};
use crate::partition::MAX_DEVICES;

/// The backends this protocol version defines (PROTOCOL.md 14.2).
pub const BACKENDS: [&str; 2] = ["cpu", "cuda"];

/// A text field of an inventory and the most bytes it may hold (PROTOCOL.md 14.2). Every one is
/// printable ASCII: they are stored with every verdict and shown to operators, so a miner's text
/// must not be able to grow the database without bound, rewrite a terminal line, or pass for
/// another model's name in look-alike letters.
struct TextField {
    name: &'static str,
    max_bytes: usize,
}

const KERNEL: TextField = TextField {
    name: "kernel",
    max_bytes: 32,
};
const SOFTWARE_VERSION: TextField = TextField {
    name: "software_version",
    max_bytes: 64,
};

impl TextField {
    /// Why `text` cannot be this field, if it cannot.
    fn problem(&self, text: &str) -> Option<String> {
        let max = self.max_bytes;
        if text.len() > max {
            return Some(format!(
                "is {} bytes long; the protocol allows at most {max}",
                text.len()
            ));
        }
        text.bytes().position(|b| !(b' '..=b'~').contains(&b)).map(|at| {
            format!("has a byte outside printable ASCII at byte {at}; the protocol allows printable ASCII only")
        })
    }

    /// `text` made fit for this field: every character outside printable ASCII becomes `?`,
    /// and the end is cut at the field's limit.
    fn fit(&self, text: &str) -> String {
        text.chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
            .take(self.max_bytes)
            .collect()
    }
}

/// A device's text field and where it is held: one list for the check and for the fitting.
struct DeviceText {
    field: TextField,
    get: fn(&DeviceInfo) -> &String,
    get_mut: fn(&mut DeviceInfo) -> &mut String,
}

/// A device's text fields, in the order they are checked.
const DEVICE_TEXT: [DeviceText; 4] = [
    DeviceText::new("name", 128, |d| &d.name, |d| &mut d.name),
    DeviceText::new("uuid", 96, |d| &d.uuid, |d| &mut d.uuid),
    DeviceText::new("pci_bus_id", 32, |d| &d.pci_bus_id, |d| &mut d.pci_bus_id),
    DeviceText::new("driver_version", 32, |d| &d.driver_version, |d| &mut d.driver_version),
];

impl DeviceText {
    const fn new(
        name: &'static str,
        max_bytes: usize,
        get: fn(&DeviceInfo) -> &String,
        get_mut: fn(&mut DeviceInfo) -> &mut String,
    ) -> Self {
        DeviceText {
            field: TextField { name, max_bytes },
            get,
            get_mut,
        }
    }
}

impl DeviceInfo {
    /// This device with every text field made fit for an inventory: what a miner applies to
    /// what its hardware reports (a CPU model name from the kernel, a GPU name from the driver)
    /// before it claims it.
    pub fn fitted(mut self) -> Self {
        for text in &DEVICE_TEXT {
            let value = (text.get_mut)(&mut self);
            *value = text.field.fit(value);
        }
        self
    }
}

/// The hardware a miner claims: backend, kernel and devices in partition order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HardwareClaim {
    pub backend: String,
    pub kernel: String,
    pub devices: Vec<DeviceInfo>,
}

impl HardwareClaim {
    /// The digest a challenge carries (PROTOCOL.md 13.5).
    pub fn digest(&self) -> Digest {
        Digest::hash(&claim_bytes(self))
    }

    /// The first way `other` differs from `self`, for a verdict that names the mismatch.
    pub fn first_difference(&self, other: &HardwareClaim) -> Option<String> {
        if self.devices.len() != other.devices.len() {
            return Some(format!(
                "device count: challenge sized for {}, commitment names {}",
                self.devices.len(),
                other.devices.len()
            ));
        }
        if self.backend != other.backend {
            return Some(format!(
                "backend: challenge sized for {}, commitment names {}",
                quoted(&self.backend),
                quoted(&other.backend)
            ));
        }
        if self.kernel != other.kernel {
            return Some(format!(
                "kernel: challenge sized for {}, commitment names {}",
                quoted(&self.kernel),
                quoted(&other.kernel)
            ));
        }
        for (want, got) in self.devices.iter().zip(&other.devices) {
            if let Some((field, w, g)) = device_difference(want, got) {
                return Some(format!(
                    "device {} {field}: challenge sized for {w}, commitment names {g}",
                    want.index
                ));
            }
        }
        None
    }
}

/// Each fact of a device the claim binds, by name, in the order a mismatch is looked for.
type Fact = (&'static str, fn(&DeviceInfo) -> String);
const DEVICE_FACTS: [Fact; 8] = [
    ("index", |d| d.index.to_string()),
    ("name", |d| quoted(&d.name)),
    ("uuid", |d| quoted(&d.uuid)),
    ("memory_bytes", |d| d.memory_bytes.to_string()),
    ("sm_count", |d| d.sm_count.to_string()),
    ("compute capability", |d| {
        format!("{}.{}", d.compute_capability.0, d.compute_capability.1)
    }),
    ("pci_bus_id", |d| quoted(&d.pci_bus_id)),
    ("driver_version", |d| quoted(&d.driver_version)),
];

/// The most characters of a claim's text that a difference quotes.
const MAX_QUOTED_CHARS: usize = 128;

/// `text` quoted and escaped as Rust's `{:?}` does, and cut after [`MAX_QUOTED_CHARS`]
/// characters: a commitment's claim is the miner's, not yet held to any rule, and a mismatch
/// that quoted all of it could put megabytes into a stored reason.
fn quoted(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        None => format!("{text:?}"),
        Some((at, _)) => format!("{:?}... ({} more bytes)", &text[..at], text.len() - at),
    }
}

fn device_difference(want: &DeviceInfo, got: &DeviceInfo) -> Option<(&'static str, String, String)> {
    DEVICE_FACTS.iter().find_map(|(field, fact)| {
        let (w, g) = (fact(want), fact(got));
        (w != g).then_some((*field, w, g))
    })
}

/// The limits a miner advertises. Zero means "not stated": the protocol's own limit applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MinerLimits {
    pub max_n: u32,
    pub max_chains: u64,
    pub max_iterations: u32,
    /// Longest window (the deadline, or the finish-by time when the challenge has one, minus
    /// the miner's clock at arrival) it accepts.
    pub max_duration_ms: u64,
    /// Most samples one open request may ask for.
    pub max_samples: u32,
}

/// A miner's answer to `GetInventory`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inventory {
    pub miner_key: PublicKey,
    pub claim: HardwareClaim,
    pub protocol_version: u32,
    pub software_version: String,
    pub limits: MinerLimits,
    /// The miner takes a challenge's finish-by time (PROTOCOL.md 14.3): it works past the
    /// deadline until then, so that a late commitment still proves its rate.
    pub takes_finish_by: bool,
}

/// An inventory no challenge may be planned from.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum InventoryError {
    #[error(
        "miner speaks protocol version {theirs}; this software speaks versions {oldest} to {ours}. Run a release that speaks one of them on both sides"
    )]
    ProtocolVersion { theirs: u32, oldest: u32, ours: u32 },
    #[error("miner reports no devices")]
    NoDevices,
    #[error("miner reports {0} devices; the protocol allows 1..={MAX_DEVICES}")]
    TooManyDevices(usize),
    #[error("device entry {position} has index {index}; entry j of the inventory must be device j")]
    DeviceIndex { position: usize, index: u32 },
    #[error("device uuid {0:?} is listed more than once: one device cannot be claimed twice")]
    DuplicateDevice(String),
    #[error("miner reports backend {0:?}; this protocol version defines {backends}", backends = BACKENDS.join(" and "))]
    UnknownBackend(String),
    #[error("the inventory's {field} {problem}")]
    Text { field: String, problem: String },
    #[error("the miner's key {key} cannot sign anything: {problem}")]
    MinerKey { key: PublicKey, problem: SignatureError },
}

impl Inventory {
    /// The checks every inventory must pass before anything is planned or registered from it.
    pub fn check(&self) -> Result<(), InventoryError> {
        if !(MIN_PROTOCOL_VERSION..=NEWEST_PROTOCOL_VERSION).contains(&self.protocol_version) {
            return Err(InventoryError::ProtocolVersion {
                theirs: self.protocol_version,
                oldest: MIN_PROTOCOL_VERSION,
                ours: NEWEST_PROTOCOL_VERSION,
            });
        }
        if let Err(problem) = self.miner_key.check_usable() {
            return Err(InventoryError::MinerKey {
                key: self.miner_key,
                problem,
            });
        }
        if !BACKENDS.contains(&self.claim.backend.as_str()) {
            // Printed with {:?}, so whatever it holds shows escaped.
            return Err(InventoryError::UnknownBackend(self.claim.backend.clone()));
        }
        let devices = &self.claim.devices;
        match devices.len() {
            0 => return Err(InventoryError::NoDevices),
            d if d > MAX_DEVICES as usize => return Err(InventoryError::TooManyDevices(d)),
            _ => {}
        }
        for (field, value) in [(KERNEL, &self.claim.kernel), (SOFTWARE_VERSION, &self.software_version)] {
            if let Some(problem) = field.problem(value) {
                let field = field.name.to_string();
                return Err(InventoryError::Text { field, problem });
            }
        }
        for (j, d) in devices.iter().enumerate() {
            for device_text in &DEVICE_TEXT {
                if let Some(problem) = device_text.field.problem((device_text.get)(d)) {
                    let field = format!("device {j} {}", device_text.field.name);
                    return Err(InventoryError::Text { field, problem });
                }
            }
        }
        if let Some((position, d)) = devices.iter().enumerate().find(|(j, d)| d.index as usize != *j) {
            return Err(InventoryError::DeviceIndex {
                position,
                index: d.index,
            });
        }
        // A device without a uuid (a CPU's logical devices) is not identified by one; every
        // uuid that is given names one device. MIG instances share a PCI bus id, not a uuid.
        let mut uuids = std::collections::HashSet::new();
        if let Some(d) = devices.iter().find(|d| !d.uuid.is_empty() && !uuids.insert(&d.uuid)) {
            return Err(InventoryError::DuplicateDevice(d.uuid.clone()));
        }
        Ok(())
    }
}

const INVENTORY_DOMAIN: &[u8] = b"gpu-attest v1 inventory";

/// The bytes an inventory digest hashes (PROTOCOL.md 13.5): backend, kernel, devices.
pub fn claim_bytes(claim: &HardwareClaim) -> Vec<u8> {
    let mut out = INVENTORY_DOMAIN.to_vec();
    put_str(&mut out, &claim.backend);
    put_str(&mut out, &claim.kernel);
    put_inventory(&mut out, &claim.devices);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::PROTOCOL_VERSION;

    fn claim() -> HardwareClaim {
        HardwareClaim {
            backend: "cuda".into(),
            kernel: "tensor".into(),
            devices: (0..2)
                .map(|i| DeviceInfo {
                    index: i,
                    name: "NVIDIA H100 80GB HBM3".into(),
                    uuid: format!("GPU-{i}"),
                    memory_bytes: 80 << 30,
                    sm_count: 132,
                    compute_capability: (9, 0),
                    pci_bus_id: format!("00000000:0{i}:00.0"),
                    driver_version: "570.86.15".into(),
                })
                .collect(),
        }
    }

    /// One change to a claim, and the words its difference must start with.
    type Change = (&'static str, fn(&mut HardwareClaim));

    #[test]
    fn every_fact_changes_the_digest_and_is_named() {
        let base = claim();
        let changes: Vec<Change> = vec![
            ("device count", |c| c.devices.truncate(1)),
            ("backend", |c| c.backend = "cpu".into()),
            ("kernel", |c| c.kernel = "tiled".into()),
            ("device 1 name", |c| c.devices[1].name = "NVIDIA H200".into()),
            ("device 0 uuid", |c| c.devices[0].uuid = "GPU-x".into()),
            ("device 0 memory_bytes", |c| c.devices[0].memory_bytes += 1),
            ("device 0 sm_count", |c| c.devices[0].sm_count = 114),
            ("device 0 compute capability", |c| {
                c.devices[0].compute_capability = (8, 0)
            }),
            ("device 0 pci_bus_id", |c| c.devices[0].pci_bus_id.push('1')),
            ("device 0 driver_version", |c| c.devices[0].driver_version.clear()),
            ("device 0 index", |c| c.devices[0].index = 7),
        ];
        for (what, change) in changes {
            let mut other = base.clone();
            change(&mut other);
            assert_ne!(other.digest(), base.digest(), "{what} is not in the digest");
            let named = base.first_difference(&other).unwrap();
            assert!(named.starts_with(what), "{what}: {named}");
        }
        assert_eq!(base.first_difference(&base.clone()), None);
    }

    /// A commitment's claim is not held to the inventory's text rules; what a mismatch quotes
    /// of it is escaped and bounded all the same.
    #[test]
    fn a_difference_quotes_at_most_a_line_of_the_commitments_text() {
        let base = claim();
        let mut other = base.clone();
        other.devices[0].name = format!("\n  device 1: NVIDIA H100\u{1b}[0m{}", "x".repeat(1 << 20));
        let named = base.first_difference(&other).unwrap();
        assert!(named.len() < 400, "{} bytes", named.len());
        assert!(named.contains(r"\n  device 1: NVIDIA H100\u{1b}[0m"), "{named}");
        assert!(
            named.ends_with(&format!("... ({} more bytes)", (1 << 20) + 28 - 128)),
            "{named}"
        );
    }

    /// An inventory, of this protocol version, of the two GPUs of [`claim`].
    fn inventory() -> Inventory {
        Inventory {
            takes_finish_by: false,
            miner_key: PublicKey([1; 32]),
            claim: claim(),
            protocol_version: PROTOCOL_VERSION,
            software_version: "test".into(),
            limits: MinerLimits::default(),
        }
    }

    /// Small-order points (the identity, its negation, the order-4 and order-8 points) and
    /// bytes that are no point at all: no commitment could ever verify under them, so the miner
    /// is refused at its inventory instead of being given work the validator must then fail.
    #[test]
    fn a_miner_key_that_cannot_sign_is_refused() {
        let identity = {
            let mut k = [0u8; 32];
            k[0] = 1;
            k
        };
        let mut negated_identity = [0xffu8; 32];
        negated_identity[0] = 0xec;
        negated_identity[31] = 0x7f;
        let mut not_a_point = [0u8; 32];
        not_a_point[0] = 2;
        for (key, problem) in [
            (identity, SignatureError::KeyWeak),
            (negated_identity, SignatureError::KeyWeak),
            ([0; 32], SignatureError::KeyWeak),
            (not_a_point, SignatureError::KeyInvalid),
        ] {
            let inventory = Inventory {
                miner_key: PublicKey(key),
                ..inventory()
            };
            let err = inventory.check().unwrap_err();
            assert_eq!(
                err,
                InventoryError::MinerKey {
                    key: PublicKey(key),
                    problem
                }
            );
            assert!(err.to_string().contains(&hex::encode(key)), "{err}");
        }
        let real = crate::keys::KeyPair::from_seed([9; 32]).public_key();
        Inventory {
            miner_key: real,
            ..inventory()
        }
        .check()
        .unwrap();
    }

    #[test]
    fn inventory_checks_name_both_versions_and_the_device_limit() {
        let mut inventory = inventory();
        inventory.check().unwrap();
        inventory.protocol_version = 1;
        let err = inventory.check().unwrap_err();
        assert_eq!(
            err,
            InventoryError::ProtocolVersion {
                theirs: 1,
                oldest: 2,
                ours: 4
            }
        );
        assert!(err.to_string().contains("versions 2 to 4") && err.to_string().contains("version 1"));
        inventory.protocol_version = 5;
        assert!(inventory.check().is_err());
        inventory.protocol_version = 2;
        inventory.check().unwrap();
        inventory.protocol_version = PROTOCOL_VERSION;
        let device = |index| DeviceInfo {
            index,
            ..Default::default()
        };
        inventory.claim.devices = (0..65).map(device).collect();
        assert_eq!(inventory.check(), Err(InventoryError::TooManyDevices(65)));
        inventory.claim.devices.truncate(64);
        inventory.check().unwrap();
        inventory.claim.devices.clear();
        assert_eq!(inventory.check(), Err(InventoryError::NoDevices));
    }

    #[test]
    fn one_device_cannot_be_claimed_twice() {
        let mut inventory = inventory();
        inventory.claim.devices[1].uuid = inventory.claim.devices[0].uuid.clone();
        assert_eq!(inventory.check(), Err(InventoryError::DuplicateDevice("GPU-0".into())));
        inventory.claim.devices[1] = inventory.claim.devices[0].clone();
        assert_eq!(
            inventory.check(),
            Err(InventoryError::DeviceIndex { position: 1, index: 0 })
        );
        // Devices without a uuid (the CPU's logical devices) are told apart by index alone.
        for (j, d) in inventory.claim.devices.iter_mut().enumerate() {
            d.uuid.clear();
            d.index = j as u32;
        }
        inventory.check().unwrap();
    }

    /// Text a miner could use to grow a validator's database, rewrite an operator's terminal or
    /// pass a look-alike name is refused, naming the field; a backend outside the protocol too.
    #[test]
    fn inventory_text_is_printable_ascii_within_limits() {
        type Breaks = fn(&mut Inventory);
        let refused: [(&str, Breaks); 7] = [
            ("device 1 name", |i| i.claim.devices[1].name = "x".repeat(129)),
            ("device 0 name", |i| {
                i.claim.devices[0].name = "NVIDIA \u{41d}100 80GB HBM3".into()
            }),
            ("device 0 name", |i| {
                i.claim.devices[0].name.push_str("\n  device 1: NVIDIA H100")
            }),
            ("device 0 driver_version", |i| {
                i.claim.devices[0].driver_version.push('\0')
            }),
            ("device 1 uuid", |i| i.claim.devices[1].uuid = "\x1b[2K".into()),
            ("kernel", |i| i.claim.kernel = "k".repeat(33)),
            ("software_version", |i| i.software_version = "1.0\r".into()),
        ];
        for (field, change) in refused {
            let mut bad = inventory();
            change(&mut bad);
            match bad.check() {
                Err(InventoryError::Text { field: named, .. }) => assert_eq!(named, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        let mut at_the_limit = inventory();
        at_the_limit.claim.devices[0].name = "~".repeat(128);
        at_the_limit.check().unwrap();

        let mut rocm = inventory();
        rocm.claim.backend = "rocm".into();
        let err = rocm.check().unwrap_err();
        assert_eq!(err, InventoryError::UnknownBackend("rocm".into()));
        assert!(err.to_string().contains("cpu and cuda"), "{err}");
    }

    /// What a miner claims passes the checks whatever its hardware reported.
    #[test]
    fn fitted_text_passes_the_checks() {
        let mut fitted = inventory();
        let raw = DeviceInfo {
            name: format!("cpu: Vendor\u{ae} Model\n{}", "9".repeat(300)),
            uuid: "\x1b".into(),
            pci_bus_id: "\t".repeat(40),
            driver_version: "\u{2163}".into(),
            ..fitted.claim.devices[0].clone()
        };
        let device = raw.fitted();
        assert!(device.name.starts_with("cpu: Vendor? Model?999"), "{}", device.name);
        assert_eq!(device.name.len(), 128);
        assert_eq!((device.uuid.as_str(), device.driver_version.as_str()), ("?", "?"));
        assert_eq!(device.pci_bus_id, "?".repeat(32));
        fitted.claim.devices[0] = device;
        fitted.check().unwrap();
    }
}
