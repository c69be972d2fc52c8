//! States of 64 KiB slices side by side in one device buffer, as the walks over them read
//! them: a version 4 pool's (`super::pool_states`), walked by version 4's walk there and by the
//! locality walk (`super::locality`), or `miner bench`'s filled buffer; and the buffers those
//! walks take on the pool's stream.

use super::device::backend_error;
use super::raw::device_memory::alloc_uninit;
use super::walk::DeviceWalker;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, sys};
use gpu_attest_shared::backend::BackendError;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice_walk::HeldStates;
use std::sync::Arc;

/// How a version 4 walk is cut into launches on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateWalkLimits {
    /// Most bytes one launch reads, `W * steps * 65536` (as version 3's walk: short of a display
    /// GPU's watchdog, and a cancel is seen within two launches).
    pub launch_bytes: u64,
    /// Most device memory one launch's states take (`W * steps * 32` bytes), and at most a
    /// quarter of what is free beside the pool: small, since the pool leaves little (4% of the
    /// claim, PROTOCOL.md 20.9), and enough for launches of 128 steps at 8192 walkers.
    pub states_bytes: u64,
}

impl Default for StateWalkLimits {
    fn default() -> Self {
        StateWalkLimits {
            launch_bytes: 1 << 38,
            states_bytes: 32 << 20,
        }
    }
}

/// States of 64 KiB slices side by side in one device buffer, walked and opened on its stream
/// (after anything queued there before): a version 4 pool's, or `miner bench`'s walk over a
/// filled buffer.
pub struct StatesOnDevice<'a> {
    pub stream: &'a Arc<CudaStream>,
    pub walker: &'a DeviceWalker,
    /// Slice `e` at byte `e * 65536`.
    pub states: &'a CudaSlice<i8>,
    pub pool: ChainPool,
    pub limits: StateWalkLimits,
}

impl StatesOnDevice<'_> {
    pub(crate) fn err(&self, e: cudarc::driver::DriverError) -> BackendError {
        backend_error(self.pool.device, e)
    }

    pub(crate) fn device_error(&self, detail: String) -> BackendError {
        BackendError::Device {
            device: self.pool.device,
            detail,
        }
    }

    pub(crate) fn alloc_words(&self, len: usize) -> Result<CudaSlice<u32>, BackendError> {
        // Undefined contents are enough: every buffer the walks take is written before it is read
        // (uploads, the walks' states and the tree kernels' outputs), as each use says.
        alloc_uninit::<u32>(self.stream, len).map_err(|e| self.err(e))
    }

    pub(crate) fn download_words(&self, src: &CudaSlice<u32>) -> Result<Vec<u32>, BackendError> {
        let mut words = vec![0u32; src.len()];
        self.stream.memcpy_dtoh(src, &mut words).map_err(|e| self.err(e))?;
        self.stream.synchronize().map_err(|e| self.err(e))?;
        Ok(words)
    }

    pub(crate) fn mark(&self) -> Result<CudaEvent, BackendError> {
        self.stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| self.err(e))
    }
}

/// A self-check's pool of `pool.chains` states of `pool.n`: the first all -128 and the second all
/// 127 (the int8 extremes), the rest bytes that reach every value and differ from slice to
/// slice; as bytes for the device and as the CPU's states.
pub(crate) fn self_check_states(pool: ChainPool) -> (Vec<u8>, HeldStates) {
    let state = pool.n * pool.n;
    let mut bytes = vec![0u8; pool.chains as usize * state];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_right(29) as u8;
    }
    bytes[..state].fill(0x80);
    bytes[state..2 * state].fill(0x7F);
    let matrices = bytes
        .chunks(state)
        .map(|s| Matrix::from_bytes(pool.n, s).expect("whole states"))
        .collect();
    let held = HeldStates::new(pool, matrices).expect("one state per chain");
    (bytes, held)
}
