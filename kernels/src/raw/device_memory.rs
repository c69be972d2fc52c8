//! Device buffers whose contents start undefined: cudarc's `alloc` without the memset that
//! `alloc_zeros` adds, for the buffers a kernel or a copy fills before anything reads them
//! (batches of matrices, hashing scratch, walk states and checkpoints), where a memset would be
//! a pass over the buffer for nothing.

use bytemuck::AnyBitPattern;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, DriverError};
use std::sync::Arc;

/// `len` elements of device memory on `stream`, contents undefined. Each caller says what
/// writes the buffer before it is read: stale bytes read back would be wrong numbers, not
/// undefined behaviour (see the comment inside), but they are still never wanted.
pub(crate) fn alloc_uninit<T: DeviceRepr + AnyBitPattern>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>, DriverError> {
    // SAFETY: cudarc marks `alloc` unsafe because the memory is unset. The memory is the
    // device's, never a Rust value: the host sees it only through copies, which write whatever
    // bytes it holds into host memory, and `T: AnyBitPattern` makes any bytes a valid `T`
    // (i8, i32, u32 here). So undefined contents can make a result wrong, never the program
    // unsound, and the callers write every element they read first.
    unsafe { stream.alloc::<T>(len) }
}
