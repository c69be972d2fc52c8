//! The CUDA driver calls cudarc leaves `unsafe` (its raw `sys` bindings and the `result`
//! functions that take a device handle), each behind a safe function that returns plain Rust
//! values. What the driver can do and whether it is good enough is [`crate::driver`]'s to
//! decide; detection ([`crate::detect`]) and device resets ([`crate::device`]) call these.

use cudarc::driver::{DriverError, result, sys};

/// Whether the CUDA driver library (libcuda) can be loaded. cudarc panics on the first driver
/// call when it cannot, so this is asked before any.
pub(crate) fn library_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names; nothing it loads is
    // called here.
    unsafe { sys::is_culib_present() }
}

/// Whether the loaded driver library exports `symbol`. Call only when [`library_present`] is
/// true: cudarc panics when there is no library at all.
pub(crate) fn exports(symbol: &str) -> bool {
    // SAFETY: only looks the symbol up; it is not called, and the pointer type is never used.
    unsafe { sys::culib().get::<*const ()>(symbol.as_bytes()).is_ok() }
}

/// `cuDriverGetVersion`: the CUDA version the driver supports, in the driver API's encoding
/// (`1000 * major + 10 * minor`). Needs no `cuInit`.
pub(crate) fn version() -> Result<i32, DriverError> {
    let mut raw = 0;
    // SAFETY: `raw` is a live local the call writes one int to.
    unsafe { sys::cuDriverGetVersion(&mut raw) }.result()?;
    Ok(raw)
}

/// `cuDeviceGetAttribute`: one attribute of device `device`.
pub(crate) fn device_attribute(device: sys::CUdevice, attribute: sys::CUdevice_attribute) -> Result<i32, DriverError> {
    // SAFETY: the call writes one int to a local of cudarc's; a handle that names no device
    // (not from cuDeviceGet, or before cuInit) is an error code from the driver, not undefined
    // behaviour.
    unsafe { result::device::get_attribute(device, attribute) }
}

/// `cuDeviceTotalMem`: device `device`'s memory in bytes.
pub(crate) fn total_memory(device: sys::CUdevice) -> Result<usize, DriverError> {
    // SAFETY: as in `device_attribute`: one size_t written to cudarc's local, and a handle that
    // names no device is an error code.
    unsafe { result::device::total_mem(device) }
}

/// `cuDevicePrimaryCtxGetState`: whether device `device`'s primary context is active.
pub(crate) fn primary_context_active(device: sys::CUdevice) -> Result<bool, DriverError> {
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: both out-pointers are live locals the call writes one int each to; a handle that
    // names no device is an error code.
    unsafe { sys::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) }.result()?;
    Ok(active != 0)
}

/// `cuDevicePrimaryCtxReset`: destroys device `device`'s primary context and everything in it.
/// The backend calls it only once its own runtime for the device is dropped
/// ([`crate::device::reset_primary_context_if_active`]).
pub(crate) fn reset_primary_context(device: sys::CUdevice) -> Result<(), DriverError> {
    // SAFETY: the call takes a device handle and touches no host memory of this process. A
    // context it destroys under someone still holding it (another of this process's handles)
    // leaves them stale handles, on which the driver returns errors, not undefined behaviour.
    unsafe { sys::cuDevicePrimaryCtxReset_v2(device) }.result()
}
