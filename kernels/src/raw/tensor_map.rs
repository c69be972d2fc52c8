//! The TMA kernels' tensor maps as the driver encodes them (`cuTensorMapEncodeTiled`) and as a
//! kernel takes them, by value. What a map describes, and the rules checked before the driver
//! is asked, are [`crate::tma`]'s.

use cudarc::driver::{DeviceRepr, DriverError, sys};

/// An encoded tensor map, passed to the kernel by value (`const __grid_constant__
/// ga_tensor_map`).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct TensorMap(sys::CUtensorMap);

// SAFETY: a plain 128-byte, 64-byte-aligned (or more) C struct, the layout of the kernel's
// `ga_tensor_map` parameter: the driver copies its bytes into the launch's parameter space.
unsafe impl DeviceRepr for TensorMap {}

/// `cuTensorMapEncodeTiled` of a 3-d tensor of unsigned bytes at device address `base`: `dims`
/// elements per dimension (innermost first), `strides` bytes between consecutive entries of
/// the outer two, boxes of `box_dims`, read in 128-byte swizzle with 256-byte L2 promotion and
/// no fill but zeros. Encoding only records the address: it reads no device memory.
pub(crate) fn encode_tiled_u8(
    base: u64,
    dims: &[u64; 3],
    strides: &[u64; 2],
    box_dims: &[u32; 3],
) -> Result<TensorMap, DriverError> {
    let element_strides = [1u32; 3];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::uninit();
    // SAFETY: every pointer is to a live array of the rank's length (strides: rank - 1), and
    // `map` is written by the call before it is read (on success only); encoding only reads
    // these and writes the map, it touches no device memory.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            3,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_dims.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()?;
        Ok(TensorMap(map.assume_init()))
    }
}
