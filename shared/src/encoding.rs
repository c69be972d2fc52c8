//! The byte encoding of signed statements (PROTOCOL.md 13): little-endian integers, and
//! strings and lists each after their length as a u32. Every statement the protocol signs or
//! hashes is built from these.

use crate::device::DeviceInfo;
use crate::digest::Digest;

pub(crate) fn put_u32(out: &mut Vec<u8>, len: usize) {
    out.extend(
        u32::try_from(len)
            .expect("lengths in a statement fit in u32")
            .to_le_bytes(),
    );
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len());
    out.extend(s.as_bytes());
}

pub(crate) fn put_digests(out: &mut Vec<u8>, digests: &[Digest]) {
    put_u32(out, digests.len());
    for d in digests {
        out.extend(d.0);
    }
}

/// A BLAKE3 path's sibling chaining values (a slice's or a chunk's), as `list(32 bytes)`.
pub(crate) fn put_path(out: &mut Vec<u8>, path: &crate::memory::slice::SlicePath) {
    put_u32(out, path.siblings.len());
    for sibling in &path.siblings {
        out.extend(sibling);
    }
}

/// A device list as the inventory digest and the commitment statement carry it.
pub(crate) fn put_inventory(out: &mut Vec<u8>, devices: &[DeviceInfo]) {
    put_u32(out, devices.len());
    for d in devices {
        out.extend(d.index.to_le_bytes());
        put_str(out, &d.name);
        put_str(out, &d.uuid);
        out.extend(d.memory_bytes.to_le_bytes());
        out.extend(d.sm_count.to_le_bytes());
        out.extend(d.compute_capability.0.to_le_bytes());
        out.extend(d.compute_capability.1.to_le_bytes());
        put_str(out, &d.pci_bus_id);
        put_str(out, &d.driver_version);
    }
}
