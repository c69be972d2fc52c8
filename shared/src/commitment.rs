//! Device roots and the global checksum G that a miner commits to (PROTOCOL.md "Commitment").

use crate::chain::ChainResult;
use crate::digest::Digest;
use crate::merkle::MerkleTree;
use crate::partition::DeviceSlice;
use thiserror::Error;

const COMMITMENT_CONTEXT: &[u8] = b"gpu-attest v1 commitment";

/// One device's entry: its slice of the chains and the Merkle root over their leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRoot {
    pub slice: DeviceSlice,
    pub root: Digest,
}

/// The work part of a miner's commitment: what G covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkCommitment {
    pub nonce: [u8; 32],
    /// In ascending device index.
    pub devices: Vec<DeviceRoot>,
    pub global: Digest,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AssembleError {
    #[error("chain results cover {got} chains, the partition {want}")]
    ChainCountMismatch { got: u64, want: u64 },
    #[error("chain result at position {position} is for chain {got}, expected chain {position}")]
    OutOfOrder { position: u64, got: u64 },
}

/// `blake3("gpu-attest v1 commitment" || nonce || le32(d) || per device: le32(index) ||
/// le64(offset) || le64(count) || root)`.
pub fn global_checksum(nonce: &[u8; 32], devices: &[DeviceRoot]) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(COMMITMENT_CONTEXT);
    h.update(nonce);
    h.update(&(devices.len() as u32).to_le_bytes());
    for d in devices {
        h.update(&d.slice.index.to_le_bytes());
        h.update(&d.slice.offset.to_le_bytes());
        h.update(&d.slice.count.to_le_bytes());
        h.update(d.root.as_bytes());
    }
    h.finalize().into()
}

/// One Merkle tree per device, kept by the miner to answer openings.
#[derive(Clone, Debug)]
pub struct DeviceTree {
    pub slice: DeviceSlice,
    pub tree: MerkleTree,
}

/// Builds each device's tree from all chain results (ordered by chain index) and the partition.
pub fn device_trees(partition: &[DeviceSlice], chains: &[ChainResult]) -> Result<Vec<DeviceTree>, AssembleError> {
    let want: u64 = partition.iter().map(|s| s.count).sum();
    if chains.len() as u64 != want {
        return Err(AssembleError::ChainCountMismatch {
            got: chains.len() as u64,
            want,
        });
    }
    if let Some((position, c)) = chains.iter().enumerate().find(|(i, c)| c.index != *i as u64) {
        return Err(AssembleError::OutOfOrder {
            position: position as u64,
            got: c.index,
        });
    }
    Ok(partition
        .iter()
        .map(|slice| {
            let range = slice.offset as usize..(slice.offset + slice.count) as usize;
            let leaves: Vec<Digest> = chains[range].iter().map(ChainResult::leaf).collect();
            DeviceTree {
                slice: *slice,
                tree: MerkleTree::new(&leaves),
            }
        })
        .collect())
}

impl WorkCommitment {
    pub fn from_trees(nonce: [u8; 32], trees: &[DeviceTree]) -> Self {
        let devices: Vec<DeviceRoot> = trees
            .iter()
            .map(|t| DeviceRoot {
                slice: t.slice,
                root: t.tree.root(),
            })
            .collect();
        let global = global_checksum(&nonce, &devices);
        WorkCommitment { nonce, devices, global }
    }

    /// The slice and root of the device that holds `chain`.
    pub fn device_of(&self, chain: u64) -> Option<&DeviceRoot> {
        self.devices.iter().find(|d| d.slice.contains(chain))
    }
}
