//! How many chains a device runs at once, from its free memory.
//!
//! A chain resident on the device holds three n x n int8 matrices (X, the next X, and B
//! transposed), two hashing scratch buffers of n^2 / 32 bytes each, and `DIGEST_SLOTS`
//! checkpoint digests waiting to be copied to the host. Chains of a batch advance together, one
//! launch per step for the whole batch, so small matrices still fill the GPU.

use gpu_attest_shared::backend::BackendError;

/// Left free for the context, the module and the driver's own allocations.
pub const RESERVE_BYTES: u64 = 512 << 20;
/// Left free beside a memory-phase pool, whose size the challenge sets (95% of the device's
/// memory by default, PROTOCOL.md 18.6): the walk module is loaded before the pool is made, so
/// this covers the fill's batches (`FILL_RESERVE_BYTES` and at least 300 chains of n = 256),
/// the walk's states and checkpoints, and the driver's own small allocations. Version 4 keeps
/// it beside its states and the chains' batches, with its walk's buffers counted on their own
/// (`pool_states::walk_buffer_bytes`).
pub const POOL_RESERVE_BYTES: u64 = 128 << 20;
/// Left free by the fill's batches, beside the pool.
pub const FILL_RESERVE_BYTES: u64 = 64 << 20;
/// Matrices a chain keeps on the device.
pub const MATRICES_PER_CHAIN: u64 = 3;
/// The most chains in one launch (the grid's z extent is at most 65535).
pub const MAX_BATCH: u64 = 4096;
/// Checkpoint digests a batch keeps on the device before one copy to the host brings them all
/// back: a round trip per checkpoint would drain the device's queue each time.
pub const DIGEST_SLOTS: usize = 32;
/// Host memory for one batch's checkpoint copy (`gpu_hash_on_host`).
pub const MAX_HOST_STAGING_BYTES: u64 = 1 << 30;

/// Chains per batch on a device with `free_bytes` free, for `chains` chains of size `n`.
pub fn batch_size(device: u32, n: usize, chains: u64, free_bytes: u64) -> Result<u64, BackendError> {
    batch_size_beside(device, n, chains, free_bytes, RESERVE_BYTES)
}

/// As [`batch_size`], keeping `reserve` bytes free rather than [`RESERVE_BYTES`].
pub fn batch_size_beside(
    device: u32,
    n: usize,
    chains: u64,
    free_bytes: u64,
    reserve: u64,
) -> Result<u64, BackendError> {
    let matrix = (n as u64) * (n as u64);
    let per_chain = MATRICES_PER_CHAIN * matrix + matrix / 16 + DIGEST_SLOTS as u64 * 32;
    let usable = free_bytes.saturating_sub(reserve);
    let fit = usable / per_chain;
    if fit == 0 {
        return Err(BackendError::OutOfMemory {
            device,
            detail: format!(
                "one chain of n = {n} needs {} MiB and {} MiB are kept in reserve, but only {} MiB are free",
                per_chain >> 20,
                reserve >> 20,
                free_bytes >> 20
            ),
        });
    }
    Ok(fit
        .min(MAX_BATCH)
        .min(MAX_HOST_STAGING_BYTES / matrix)
        .min(chains)
        .max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn batch_fills_free_memory_without_exceeding_it() {
        // 80 GiB free, n = 8192: 196 MiB a chain, so (80 GiB - reserve) / 196 MiB chains fit,
        // and the host staging bound (1 GiB = 16 matrices) is the tighter one.
        assert_eq!(batch_size(0, 8192, 1000, 80 * GIB).unwrap(), 16);
        // n = 2048: 12.25 MiB a chain; staging allows 256.
        assert_eq!(batch_size(0, 2048, 1000, 80 * GIB).unwrap(), 256);
        // Small n: the launch bound.
        assert_eq!(batch_size(0, 64, 1 << 20, 80 * GIB).unwrap(), MAX_BATCH);
        // Never more than there are chains.
        assert_eq!(batch_size(0, 64, 3, 80 * GIB).unwrap(), 3);
        // A nearly full device still runs, a chain at a time.
        assert_eq!(batch_size(0, 8192, 10, RESERVE_BYTES + 200 * (1 << 20)).unwrap(), 1);
    }

    #[test]
    fn no_room_for_one_chain_is_out_of_memory_with_the_numbers() {
        let err = batch_size(3, 8192, 10, RESERVE_BYTES + (100 << 20)).unwrap_err();
        match &err {
            BackendError::OutOfMemory { device: 3, detail } => {
                assert!(detail.contains("196 MiB"), "{detail}");
                assert!(detail.contains("612 MiB are free"), "{detail}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
    }
}
