//! What a device states about itself: the facts a backend reports ([`crate::Backend::devices`]),
//! an inventory lists and a commitment signs.

/// One device as the miner reports it. Informational: signed, never inside G. Serialisable so
/// that a validator can store it as it arrived.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_bytes: u64,
    pub sm_count: u32,
    pub compute_capability: (u32, u32),
    pub pci_bus_id: String,
    pub driver_version: String,
}
