//! The NVRTC calls cudarc leaves `unsafe` (its raw `sys` bindings), each behind a safe function
//! that returns plain Rust values. Compiling, and what to compile for, is [`crate::compile`]'s.

use cudarc::nvrtc::result::NvrtcError;
use cudarc::nvrtc::sys;

/// Whether libnvrtc can be loaded. cudarc panics on the first NVRTC call when it cannot, so this
/// is asked before any.
pub(crate) fn library_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names; nothing it loads is
    // called here.
    unsafe { sys::is_culib_present() }
}

/// `nvrtcVersion`: NVRTC's (major, minor) version.
pub(crate) fn version() -> Result<(i32, i32), NvrtcError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are live locals the call writes one int each to.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

/// `nvrtcGetSupportedArchs`: the architectures NVRTC can target, as NVRTC lists them
/// (10 * major + minor).
pub(crate) fn supported_archs() -> Result<Vec<i32>, NvrtcError> {
    let mut count = 0;
    // SAFETY: `count` is a live local the call writes one int to.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut count) }.result()?;
    let mut archs = vec![0i32; count.max(0) as usize];
    if !archs.is_empty() {
        // SAFETY: the call writes `count` ints, and `archs` holds `count` of them.
        unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }.result()?;
    }
    Ok(archs)
}
