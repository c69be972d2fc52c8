//! The memory phase's parameters (PROTOCOL.md 18.1) and the pool each device must hold.

use crate::params::Work;
use thiserror::Error;

/// A pool entry is an `ENTRY_N x ENTRY_N` int8 matrix: 64 KiB, one walk step's read.
pub const ENTRY_N: usize = 256;
/// Bytes in one pool entry.
pub const ENTRY_BYTES: usize = ENTRY_N * ENTRY_N;
/// Chain steps that make one entry: `X_64` of a chain of size 256.
pub const ENTRY_STEPS: u32 = 64;
/// Integer operations that make one entry: `2 * 256^3 * 64`, 32768 per byte.
pub const ENTRY_OPS: u64 = 2 * (ENTRY_N as u64).pow(3) * ENTRY_STEPS as u64;

/// Most walkers per device.
pub const MAX_WALKERS: u32 = 1 << 16;
/// Most checkpoints (segments) per walker: a walk opening carries `L/c_w + 1` states.
pub const MAX_WALK_SEGMENTS: u32 = 4096;
/// Most steps between walk checkpoints: a walk opening carries one entry per step, and 8
/// entries (512 KiB) keep it under the 1 MiB message limit of PROTOCOL.md 14.5.
pub const MAX_WALK_CHECKPOINT_EVERY: u32 = 8;
/// Most walk segments one open request asks for: 128 openings of at most 512 KiB of entries
/// each are 64 MiB, what an attestation may ship (PROTOCOL.md 18.4).
pub const MAX_WALK_SAMPLES: u32 = 128;
/// Most entries in one device's pool: 2^24 entries are 1 TiB.
pub const MAX_POOL_ENTRIES: u64 = 1 << 24;

const POOL_KEY_CONTEXT: &str = "gpu-attest v3 pool key";

/// The memory phase of one challenge, as the validator sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryParams {
    /// Thousandths of each device's claimed memory that its pool fills (900 by default).
    pub pool_permille: u32,
    /// W: walkers per device.
    pub walkers: u32,
    /// L: steps per walker.
    pub walk_steps: u32,
    /// c_w: steps between a walker's checkpoints; divides L.
    pub walk_checkpoint_every: u32,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MemoryError {
    #[error("pool_permille {0} is outside 1..=1000")]
    PermilleOutOfRange(u32),
    #[error("walkers {0} is outside 1..={MAX_WALKERS}")]
    WalkersOutOfRange(u32),
    #[error(
        "walk checkpoint interval {every} must be in 1..={MAX_WALK_CHECKPOINT_EVERY} and divide walk_steps {steps}"
    )]
    CheckpointEvery { every: u32, steps: u32 },
    #[error("walk_steps {steps} over checkpoint interval {every} is more than {MAX_WALK_SEGMENTS} segments (or none)")]
    WalkSegments { steps: u32, every: u32 },
    #[error(
        "device {device} claims {memory_bytes} bytes, a pool of {entries} entries at {permille} permille: \
         it must hold 1..={MAX_POOL_ENTRIES} entries of 64 KiB"
    )]
    PoolSize {
        device: u32,
        memory_bytes: u64,
        permille: u32,
        entries: u64,
    },
}

impl MemoryParams {
    /// Checks every limit of PROTOCOL.md 18.1.
    pub fn validate(&self) -> Result<(), MemoryError> {
        if !(1..=1000).contains(&self.pool_permille) {
            return Err(MemoryError::PermilleOutOfRange(self.pool_permille));
        }
        if !(1..=MAX_WALKERS).contains(&self.walkers) {
            return Err(MemoryError::WalkersOutOfRange(self.walkers));
        }
        let (every, steps) = (self.walk_checkpoint_every, self.walk_steps);
        if !(1..=MAX_WALK_CHECKPOINT_EVERY).contains(&every) || steps % every != 0 {
            return Err(MemoryError::CheckpointEvery { every, steps });
        }
        if !(1..=MAX_WALK_SEGMENTS).contains(&(steps / every)) {
            return Err(MemoryError::WalkSegments { steps, every });
        }
        Ok(())
    }

    /// L / c_w: the segments a walker's trace is cut into.
    pub fn walk_segments(&self) -> u32 {
        self.walk_steps / self.walk_checkpoint_every
    }

    /// Bytes one device's walk reads: `W * L * 65536`.
    pub fn walk_bytes(&self) -> u64 {
        u64::from(self.walkers) * u64::from(self.walk_steps) * ENTRY_BYTES as u64
    }
}

/// `P = floor(memory_bytes * permille / 1000 / 65536)`, in exact integers.
pub fn pool_entries(memory_bytes: u64, permille: u32) -> u64 {
    (u128::from(memory_bytes) * u128::from(permille) / 1000 / ENTRY_BYTES as u128) as u64
}

/// One device's pool: which entries it holds and the key they come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    device: u32,
    entries: u64,
    key: [u8; 32],
}

impl PoolSpec {
    /// The pool of `device` (its index in the partition) that claims `memory_bytes`.
    pub fn new(work: &Work, device: u32, memory_bytes: u64, permille: u32) -> Result<Self, MemoryError> {
        let entries = pool_entries(memory_bytes, permille);
        if !(1..=MAX_POOL_ENTRIES).contains(&entries) {
            return Err(MemoryError::PoolSize {
                device,
                memory_bytes,
                permille,
                entries,
            });
        }
        Ok(Self::with_entries(work, device, entries))
    }

    /// The pool of `device` with exactly `entries` entries (PROTOCOL.md 18.2):
    /// `key_j = blake3::derive_key("gpu-attest v3 pool key", key || le32(j) || le64(P_j))`.
    pub fn with_entries(work: &Work, device: u32, entries: u64) -> Self {
        let mut material = Vec::with_capacity(44);
        material.extend_from_slice(work.key());
        material.extend_from_slice(&device.to_le_bytes());
        material.extend_from_slice(&entries.to_le_bytes());
        PoolSpec {
            device,
            entries,
            key: blake3::derive_key(POOL_KEY_CONTEXT, &material),
        }
    }

    pub fn device(&self) -> u32 {
        self.device
    }

    /// P: the number of entries.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// The ChaCha8 key the pool's matrices come from.
    pub fn key(&self) -> &[u8; 32] {
        &self.key
    }

    /// The pool's size in bytes: `P * 65536`.
    pub fn bytes(&self) -> u64 {
        self.entries * ENTRY_BYTES as u64
    }

    /// Integer operations that fill the pool: `P * 2 * 256^3 * 32`.
    pub fn fill_ops(&self) -> u128 {
        u128::from(self.entries) * u128::from(ENTRY_OPS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> MemoryParams {
        MemoryParams {
            pool_permille: 900,
            walkers: 64,
            walk_steps: 64,
            walk_checkpoint_every: 8,
        }
    }

    #[test]
    fn accepts_valid_and_rejects_each_limit() {
        assert_eq!(ok().validate(), Ok(()));
        let cases = [
            (
                MemoryParams {
                    pool_permille: 0,
                    ..ok()
                },
                MemoryError::PermilleOutOfRange(0),
            ),
            (
                MemoryParams {
                    pool_permille: 1001,
                    ..ok()
                },
                MemoryError::PermilleOutOfRange(1001),
            ),
            (MemoryParams { walkers: 0, ..ok() }, MemoryError::WalkersOutOfRange(0)),
            (
                MemoryParams {
                    walkers: MAX_WALKERS + 1,
                    ..ok()
                },
                MemoryError::WalkersOutOfRange(MAX_WALKERS + 1),
            ),
            (
                MemoryParams {
                    walk_checkpoint_every: 0,
                    ..ok()
                },
                MemoryError::CheckpointEvery { every: 0, steps: 64 },
            ),
            (
                MemoryParams {
                    walk_checkpoint_every: 9,
                    walk_steps: 72,
                    ..ok()
                },
                MemoryError::CheckpointEvery { every: 9, steps: 72 },
            ),
            (
                MemoryParams { walk_steps: 60, ..ok() },
                MemoryError::CheckpointEvery { every: 8, steps: 60 },
            ),
            (
                MemoryParams { walk_steps: 0, ..ok() },
                MemoryError::WalkSegments { steps: 0, every: 8 },
            ),
            (
                MemoryParams {
                    walk_steps: 8 * 4097,
                    ..ok()
                },
                MemoryError::WalkSegments {
                    steps: 8 * 4097,
                    every: 8,
                },
            ),
        ];
        for (params, want) in cases {
            assert_eq!(params.validate(), Err(want), "{params:?}");
        }
    }

    #[test]
    fn pool_size_is_exact_integer_arithmetic() {
        // An H100's NVML total (80 GiB) at 90%: floor(85899345920 * 900 / 1000 / 65536).
        assert_eq!(pool_entries(80 << 30, 900), 1_179_648);
        // Below one entry there is no pool.
        assert_eq!(pool_entries(65535, 1000), 0);
        assert_eq!(pool_entries(u64::MAX, 1000), u64::MAX / 65536);
    }

    #[test]
    fn a_pool_too_small_or_too_large_is_refused() {
        let work = crate::params::Work::new(crate::vectors::vector_params()).unwrap();
        assert!(matches!(
            PoolSpec::new(&work, 0, 1000, 900),
            Err(MemoryError::PoolSize { entries: 0, .. })
        ));
        assert!(matches!(
            PoolSpec::new(&work, 0, u64::MAX, 1000),
            Err(MemoryError::PoolSize { .. })
        ));
        let spec = PoolSpec::new(&work, 1, 64 << 20, 1000).unwrap();
        assert_eq!((spec.device(), spec.entries(), spec.bytes()), (1, 1024, 64 << 20));
    }

    #[test]
    fn every_device_and_size_has_its_own_key() {
        let work = crate::params::Work::new(crate::vectors::vector_params()).unwrap();
        let keys = [
            PoolSpec::with_entries(&work, 0, 16),
            PoolSpec::with_entries(&work, 1, 16),
            PoolSpec::with_entries(&work, 0, 17),
        ]
        .map(|s| *s.key());
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
        assert_ne!(keys[0], *work.key());
    }
}
