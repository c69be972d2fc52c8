//! What the installed NVIDIA driver can do, asked before anything is run on it.
//!
//! cudarc resolves every driver entry point the first time it is called and panics when the
//! library lacks it, and its bindings (built for CUDA 13) call the newest variant of a function
//! (`cuEventElapsedTime_v2`, present from CUDA 12.8). NVRTC's PTX carries the PTX ISA of its own
//! CUDA version, which a driver for an older CUDA refuses at module load. So before the first
//! driver call that could fail that way, the miner reads the driver's CUDA version, checks that
//! every entry point it will call is exported, and checks NVRTC against the driver. Each check
//! that fails gives one line naming what was found and what is needed, never a panic.

use super::raw;
use std::fmt;

/// The CUDA version a driver supports, as `cuDriverGetVersion` reports it (12040 is 12.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub const fn new(major: u32, minor: u32) -> Self {
        CudaVersion { major, minor }
    }

    /// From the driver API's encoding, `1000 * major + 10 * minor`.
    pub fn from_driver_int(version: i32) -> Option<Self> {
        let version = u32::try_from(version).ok().filter(|&v| v > 0)?;
        Some(CudaVersion::new(version / 1000, (version % 1000) / 10))
    }

    /// The first Linux driver branch that supports this CUDA version (CUDA's release notes,
    /// table 3), for messages: a user upgrades a driver by its branch.
    pub fn driver_branch(self) -> Option<u32> {
        const BRANCHES: [((u32, u32), u32); 11] = [
            ((12, 0), 525),
            ((12, 1), 530),
            ((12, 2), 535),
            ((12, 3), 545),
            ((12, 4), 550),
            ((12, 5), 555),
            ((12, 6), 560),
            ((12, 8), 570),
            ((12, 9), 575),
            ((13, 0), 580),
            ((13, 1), 590),
        ];
        BRANCHES
            .iter()
            .rev()
            .find(|&&(version, _)| version <= (self.major, self.minor))
            .map(|&(_, branch)| branch)
    }

    /// "CUDA 12.4 or newer (driver R550 or newer)", for what a check needs.
    pub fn needed(self) -> String {
        match self.driver_branch() {
            Some(branch) => format!("CUDA {self} or newer (driver R{branch} or newer)"),
            None => format!("CUDA {self} or newer"),
        }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The oldest driver the miner runs on: the kernels need PTX ISA 8.0 (wgmma, sm_90a) and the
/// NVRTC of CUDA 12.0 or later to write it.
pub const MIN_DRIVER: CudaVersion = CudaVersion::new(12, 0);

/// Every driver entry point the CUDA backend reaches through cudarc, by the name cudarc's
/// CUDA 13 bindings resolve. All of them exist in drivers for CUDA 12.0 and later; the list is
/// checked anyway, because a driver that lacks one would otherwise panic on first use.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetUuid_v2",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxGetState",
    "cuDevicePrimaryCtxReset_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
    // The TMA kernel's tensor maps (CUDA 12.0 and later).
    "cuTensorMapEncodeTiled",
];

/// The entry point event timing needs under cudarc's CUDA 13 bindings (CUDA 12.8 and later).
/// Without it `miner bench` times with the host clock instead.
pub const EVENT_TIMING_SYMBOL: &str = "cuEventElapsedTime_v2";

/// Whether the loaded driver library exports `symbol`. Call only when
/// [`super::detect::driver_present`] is true: cudarc panics when there is no library at all.
pub fn exports(symbol: &str) -> bool {
    raw::driver::exports(symbol)
}

/// The entry points of [`REQUIRED_SYMBOLS`] the driver lacks.
pub fn missing_symbols() -> Vec<&'static str> {
    REQUIRED_SYMBOLS.iter().copied().filter(|s| !exports(s)).collect()
}

/// The CUDA version the loaded driver supports. `cuDriverGetVersion` needs no `cuInit`: it is
/// the first call the miner makes into a driver.
pub fn version() -> Result<CudaVersion, String> {
    if !exports("cuDriverGetVersion") {
        return Err("the library loaded as libcuda does not export cuDriverGetVersion".into());
    }
    let reported = raw::driver::version().map_err(|e| format!("cuDriverGetVersion failed: {e:?}"))?;
    CudaVersion::from_driver_int(reported).ok_or_else(|| format!("cuDriverGetVersion reported {reported}"))
}

/// Whether PTX from an NVRTC of `nvrtc`'s version loads on a driver for `driver`: the driver
/// JIT-compiles PTX of its own CUDA version or older only (minor-version compatibility covers
/// SASS, not PTX). Err is the one line to print.
pub fn check_nvrtc(nvrtc: CudaVersion, driver: CudaVersion) -> Result<(), String> {
    if nvrtc <= driver {
        return Ok(());
    }
    let older = if driver.major == nvrtc.major {
        format!("NVRTC {driver} or older")
    } else {
        format!(
            "NVRTC {}.x no newer than {driver} (for example the Python package nvidia-cuda-nvrtc-cu{})",
            driver.major, driver.major
        )
    };
    Err(format!(
        "the NVIDIA driver here supports CUDA {driver}, but the NVRTC found is {nvrtc}, whose PTX needs {}: \
         upgrade the driver, or install {older} and make libnvrtc.so resolve to it",
        nvrtc.needed()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_versions_decode_like_the_driver_api() {
        assert_eq!(CudaVersion::from_driver_int(12040), Some(CudaVersion::new(12, 4)));
        assert_eq!(CudaVersion::from_driver_int(13000), Some(CudaVersion::new(13, 0)));
        assert_eq!(CudaVersion::from_driver_int(12090), Some(CudaVersion::new(12, 9)));
        assert_eq!(CudaVersion::from_driver_int(0), None);
        assert_eq!(CudaVersion::from_driver_int(-1), None);
        assert_eq!(CudaVersion::new(12, 4).to_string(), "12.4");
    }

    #[test]
    fn branches_name_the_first_driver_of_each_cuda_version() {
        assert_eq!(CudaVersion::new(12, 2).driver_branch(), Some(535));
        assert_eq!(
            CudaVersion::new(12, 7).driver_branch(),
            Some(560),
            "no 12.7 release: 12.6's"
        );
        assert_eq!(CudaVersion::new(13, 0).driver_branch(), Some(580));
        assert_eq!(CudaVersion::new(11, 8).driver_branch(), None);
        assert_eq!(
            CudaVersion::new(13, 0).needed(),
            "CUDA 13.0 or newer (driver R580 or newer)"
        );
    }

    /// The case most GPU hosts are in today: a CUDA 12 driver, and NVRTC 13 from a new toolkit.
    #[test]
    fn nvrtc_newer_than_the_driver_is_refused_with_what_to_do() {
        let err = check_nvrtc(CudaVersion::new(13, 0), CudaVersion::new(12, 4)).unwrap_err();
        assert!(err.contains("supports CUDA 12.4"), "{err}");
        assert!(err.contains("NVRTC found is 13.0"), "{err}");
        assert!(err.contains("R580"), "{err}");
        assert!(err.contains("nvidia-cuda-nvrtc-cu12"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
        // Within one major version the minor counts too: PTX 8.4 does not load on a 12.2 driver.
        let err = check_nvrtc(CudaVersion::new(12, 4), CudaVersion::new(12, 2)).unwrap_err();
        assert!(err.contains("NVRTC 12.2 or older"), "{err}");
        assert_eq!(check_nvrtc(CudaVersion::new(12, 4), CudaVersion::new(12, 4)), Ok(()));
        assert_eq!(check_nvrtc(CudaVersion::new(12, 4), CudaVersion::new(13, 0)), Ok(()));
    }
}
