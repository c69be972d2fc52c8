//! What a miner says it has, as the engine sees it: the hardware it claims and the limits it
//! sets (PROTOCOL.md sections 13.5 and 15).
//!
//! A validator sizes a challenge from one [`Inventory`]. The hardware part of it, a
//! [`HardwareClaim`], is bound into the signed challenge by its digest, and a commitment must
//! name exactly the same hardware: otherwise a miner could be sized as one CPU and be recorded
//! as eight GPUs.

use crate::digest::Digest;
use crate::identity::PublicKey;
use crate::params::PROTOCOL_VERSION;
use crate::partition::MAX_DEVICES;
use crate::statement::{DeviceInfo, claim_bytes};

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
                "backend: challenge sized for {:?}, commitment names {:?}",
                self.backend, other.backend
            ));
        }
        if self.kernel != other.kernel {
            return Some(format!(
                "kernel: challenge sized for {:?}, commitment names {:?}",
                self.kernel, other.kernel
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
    ("name", |d| format!("{:?}", d.name)),
    ("uuid", |d| format!("{:?}", d.uuid)),
    ("memory_bytes", |d| d.memory_bytes.to_string()),
    ("sm_count", |d| d.sm_count.to_string()),
    ("compute capability", |d| {
        format!("{}.{}", d.compute_capability.0, d.compute_capability.1)
    }),
    ("pci_bus_id", |d| format!("{:?}", d.pci_bus_id)),
    ("driver_version", |d| format!("{:?}", d.driver_version)),
];

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
    /// Longest deadline window (deadline minus the miner's clock at arrival) it accepts.
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
}

/// An inventory no challenge may be planned from.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum InventoryError {
    #[error(
        "miner speaks protocol version {theirs}; this software speaks version {ours} only. Run the same protocol version on both sides"
    )]
    ProtocolVersion { theirs: u32, ours: u32 },
    #[error("miner reports no devices")]
    NoDevices,
    #[error("miner reports {0} devices; the protocol allows 1..={MAX_DEVICES}")]
    TooManyDevices(usize),
    #[error("device entry {position} has index {index}; entry j of the inventory must be device j")]
    DeviceIndex { position: usize, index: u32 },
    #[error("device uuid {0:?} is listed more than once: one device cannot be claimed twice")]
    DuplicateDevice(String),
}

impl Inventory {
    /// The checks every inventory must pass before anything is planned or registered from it.
    pub fn check(&self) -> Result<(), InventoryError> {
        if self.protocol_version != PROTOCOL_VERSION {
            return Err(InventoryError::ProtocolVersion {
                theirs: self.protocol_version,
                ours: PROTOCOL_VERSION,
            });
        }
        let devices = &self.claim.devices;
        match devices.len() {
            0 => return Err(InventoryError::NoDevices),
            d if d > MAX_DEVICES as usize => return Err(InventoryError::TooManyDevices(d)),
            _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A version-1 inventory of the two GPUs of [`claim`].
    fn inventory() -> Inventory {
        Inventory {
            miner_key: PublicKey([1; 32]),
            claim: claim(),
            protocol_version: PROTOCOL_VERSION,
            software_version: "test".into(),
            limits: MinerLimits::default(),
        }
    }

    #[test]
    fn inventory_checks_name_both_versions_and_the_device_limit() {
        let mut inventory = inventory();
        inventory.check().unwrap();
        inventory.protocol_version = 1;
        let err = inventory.check().unwrap_err();
        assert_eq!(err, InventoryError::ProtocolVersion { theirs: 1, ours: 2 });
        assert!(err.to_string().contains("version 2") && err.to_string().contains("version 1"));
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
}
