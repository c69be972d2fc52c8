//! Compiling the kernels with NVRTC, once per process and architecture, cached in memory and on
//! disk.
//!
//! The disk cache is keyed by everything that changes the PTX: the kernel, the target
//! architecture, the NVRTC version and a hash of the source. Entries are written to a temporary
//! file and renamed, so a crash never leaves half a file under a real name; an entry that does
//! not look like this kernel's PTX is ignored and rebuilt, and one the driver rejects is removed
//! by [`forget`].

use super::driver::{self, CudaVersion};
use super::kernels::{AuxModule, GpuKernel};
use super::raw;
use cudarc::nvrtc;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use thiserror::Error;

/// Where the kernels come from this time, for logs and `miner info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleOrigin {
    Memory,
    Disk,
    Compiled,
}

#[derive(Clone, Debug)]
pub struct CompiledModule {
    pub kernel: GpuKernel,
    /// The PTX target, e.g. `compute_90`.
    pub arch: String,
    pub ptx: Arc<str>,
    pub origin: ModuleOrigin,
    /// Set when the disk cache could not be written; the module is still usable.
    pub cache_warning: Option<String>,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KernelBuildError {
    #[error(
        "NVRTC (libnvrtc) was not found: install the CUDA toolkit's runtime compiler (libnvrtc.so.13, \
         from CUDA 13 or the Python package nvidia-cuda-nvrtc) on the library path, or run the CPU backend"
    )]
    NvrtcMissing,
    #[error("NVRTC {version} supports no architecture at or below compute capability {major}.{minor}")]
    NoArchitecture { version: String, major: u32, minor: u32 },
    #[error("NVRTC could not compile the {kernel} kernel for {arch}: {log}")]
    Compile {
        kernel: GpuKernel,
        arch: String,
        log: String,
    },
    #[error("NVRTC could not compile the {module} module for {arch}: {log}")]
    CompileAux {
        module: AuxModule,
        arch: String,
        log: String,
    },
    #[error("{0}")]
    NvrtcNewerThanDriver(String),
    #[error("NVRTC failed: {0}")]
    Nvrtc(String),
}

/// Whether libnvrtc can be loaded. Asked before any NVRTC call: cudarc panics when the library is
/// missing.
pub fn nvrtc_present() -> bool {
    raw::nvrtc::library_present()
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32), KernelBuildError> {
    if !nvrtc_present() {
        return Err(KernelBuildError::NvrtcMissing);
    }
    raw::nvrtc::version().map_err(|e| KernelBuildError::Nvrtc(format!("{e:?}")))
}

/// Whether the PTX this NVRTC writes loads on a driver for CUDA `driver` (see
/// [`driver::check_nvrtc`]). Asked before the first compile, so a CUDA 12 driver with NVRTC 13
/// is one clear line, not a module-load error per device.
pub fn check_against_driver(driver: CudaVersion) -> Result<(), KernelBuildError> {
    let (major, minor) = nvrtc_version()?;
    let nvrtc = CudaVersion::new(major.max(0) as u32, minor.max(0) as u32);
    driver::check_nvrtc(nvrtc, driver).map_err(KernelBuildError::NvrtcNewerThanDriver)
}

/// The architectures this NVRTC can target, as 10 * major + minor (75, 80, 90, ...).
pub fn supported_archs() -> Result<Vec<u32>, KernelBuildError> {
    if !nvrtc_present() {
        return Err(KernelBuildError::NvrtcMissing);
    }
    let archs = raw::nvrtc::supported_archs().map_err(|e| KernelBuildError::Nvrtc(format!("{e:?}")))?;
    Ok(archs.into_iter().filter_map(|a| u32::try_from(a).ok()).collect())
}

/// The PTX target for a device: the newest architecture NVRTC knows at or below the device's.
/// PTX is forward compatible, so a device newer than NVRTC still runs it (the driver JITs it).
pub fn target_arch(supported: &[u32], compute_capability: (u32, u32)) -> Option<u32> {
    let device = compute_capability.0 * 10 + compute_capability.1;
    supported.iter().copied().filter(|&a| a <= device).max()
}

/// The kernel's PTX for `arch` (e.g. 90 for compute_90), straight from NVRTC, no cache.
pub fn compile_ptx(kernel: GpuKernel, arch: u32) -> Result<String, KernelBuildError> {
    let arch_name = format!("compute_{arch}{}", kernel.arch_suffix());
    nvrtc_ptx(
        kernel.module_source(),
        &arch_name,
        format!("gpu-attest-{kernel}.cu"),
        |log| KernelBuildError::Compile {
            kernel,
            arch: arch_name.clone(),
            log,
        },
    )
}

/// An [`AuxModule`]'s PTX for `arch` (e.g. 90 for compute_90), straight from NVRTC, no cache.
pub fn compile_aux_ptx(module: AuxModule, arch: u32) -> Result<String, KernelBuildError> {
    let arch_name = format!("compute_{arch}");
    nvrtc_ptx(
        module.module_source(),
        &arch_name,
        format!("gpu-attest-{module}.cu"),
        |log| KernelBuildError::CompileAux {
            module,
            arch: arch_name.clone(),
            log,
        },
    )
}

/// `source` compiled by NVRTC for `arch_name` under the file name `name`; a compile error's log
/// goes to `compile_error`.
fn nvrtc_ptx(
    source: String,
    arch_name: &str,
    name: String,
    compile_error: impl FnOnce(String) -> KernelBuildError,
) -> Result<String, KernelBuildError> {
    if !nvrtc_present() {
        return Err(KernelBuildError::NvrtcMissing);
    }
    let options = nvrtc::CompileOptions {
        options: vec![
            format!("--gpu-architecture={arch_name}"),
            "--std=c++17".into(),
            "-lineinfo".into(),
        ],
        name: Some(name),
        ..Default::default()
    };
    let ptx = nvrtc::compile_ptx_with_opts(source, options).map_err(|e| match e {
        nvrtc::CompileError::CompileError { log, .. } => compile_error(log.to_string_lossy().trim().to_string()),
        other => KernelBuildError::Nvrtc(format!("{other:?}")),
    })?;
    Ok(ptx.to_src())
}

/// The cache's file name for one build: everything that changes the PTX is in it.
pub fn cache_file_name(kernel: GpuKernel, arch: u32, nvrtc: (i32, i32), source: &str) -> String {
    let hash = blake3::hash(source.as_bytes()).to_hex();
    format!(
        "{kernel}-compute_{arch}{}-nvrtc{}.{}-{}.ptx",
        kernel.arch_suffix(),
        nvrtc.0,
        nvrtc.1,
        &hash[..32]
    )
}

/// `$GPU_ATTEST_KERNEL_CACHE`, else `$XDG_CACHE_HOME/gpu-attest/kernels`, else
/// `$HOME/.cache/gpu-attest/kernels`; `None` when none is set (memory cache only).
pub fn default_cache_dir() -> Option<PathBuf> {
    let env = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("GPU_ATTEST_KERNEL_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("gpu-attest/kernels")))
        .or_else(|| env("HOME").map(|d| d.join(".cache/gpu-attest/kernels")))
}

fn memory_cache() -> &'static Mutex<HashMap<String, Arc<str>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<str>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Whether `ptx` looks like a complete build of `kernel`: a truncated or foreign file is not.
fn looks_like_module(ptx: &str, kernel: GpuKernel) -> bool {
    ptx.contains(".version") && ptx.contains(&format!(".entry {}(", kernel.gemm_fn())) && ptx.trim_end().ends_with('}')
}

/// The kernel's module for a device of `compute_capability`, from the memory cache, the disk
/// cache under `cache_dir`, or NVRTC, in that order.
pub fn load_or_compile(
    kernel: GpuKernel,
    compute_capability: (u32, u32),
    cache_dir: Option<&Path>,
) -> Result<CompiledModule, KernelBuildError> {
    let version = nvrtc_version()?;
    let arch = target_arch(&supported_archs()?, compute_capability).ok_or(KernelBuildError::NoArchitecture {
        version: format!("{}.{}", version.0, version.1),
        major: compute_capability.0,
        minor: compute_capability.1,
    })?;
    let name = cache_file_name(kernel, arch, version, &kernel.module_source());
    let module = |ptx: Arc<str>, origin, cache_warning| CompiledModule {
        kernel,
        arch: format!("compute_{arch}{}", kernel.arch_suffix()),
        ptx,
        origin,
        cache_warning,
    };
    let mut memory = memory_cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ptx) = memory.get(&name) {
        return Ok(module(ptx.clone(), ModuleOrigin::Memory, None));
    }
    if let Some(dir) = cache_dir
        && let Ok(ptx) = std::fs::read_to_string(dir.join(&name))
        && looks_like_module(&ptx, kernel)
    {
        let ptx: Arc<str> = ptx.into();
        memory.insert(name, ptx.clone());
        return Ok(module(ptx, ModuleOrigin::Disk, None));
    }
    let ptx: Arc<str> = compile_ptx(kernel, arch)?.into();
    let cache_warning = cache_dir.and_then(|dir| {
        write_atomically(dir, &name, &ptx)
            .err()
            .map(|e| format!("cannot cache the {kernel} kernel in {}: {e}", dir.display()))
    });
    memory.insert(name, ptx.clone());
    Ok(module(ptx, ModuleOrigin::Compiled, cache_warning))
}

/// Drops a module the driver would not load from both caches, so the next load recompiles it.
pub fn forget(module: &CompiledModule, cache_dir: Option<&Path>) {
    let mut memory = memory_cache().lock().unwrap_or_else(|p| p.into_inner());
    let names: Vec<String> = memory
        .iter()
        .filter(|(_, ptx)| Arc::ptr_eq(ptx, &module.ptx))
        .map(|(name, _)| name.clone())
        .collect();
    for name in names {
        memory.remove(&name);
        if let Some(dir) = cache_dir {
            let _ = std::fs::remove_file(dir.join(&name));
        }
    }
}

/// Writes `contents` to `dir/name` whole or not at all: a temporary file, then a rename, so a
/// crash never leaves half a file under the real name. Creates `dir` if needed.
pub fn write_atomically(dir: &Path, name: &str, contents: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_arch_is_the_newest_not_above_the_device() {
        let supported = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(target_arch(&supported, (9, 0)), Some(90));
        assert_eq!(target_arch(&supported, (8, 7)), Some(86));
        assert_eq!(target_arch(&supported, (12, 1)), Some(120));
        assert_eq!(target_arch(&supported, (7, 0)), None);
    }

    #[test]
    fn cache_name_changes_with_every_input() {
        let base = cache_file_name(GpuKernel::Tensor, 90, (13, 0), "src");
        assert_ne!(base, cache_file_name(GpuKernel::Tiled, 90, (13, 0), "src"));
        assert_ne!(base, cache_file_name(GpuKernel::Tensor, 80, (13, 0), "src"));
        assert_ne!(base, cache_file_name(GpuKernel::Tensor, 90, (12, 9), "src"));
        assert_ne!(base, cache_file_name(GpuKernel::Tensor, 90, (13, 0), "src "));
        assert_eq!(base, cache_file_name(GpuKernel::Tensor, 90, (13, 0), "src"));
    }

    #[test]
    fn truncated_or_foreign_ptx_is_not_taken_from_the_cache() {
        let good = ".version 9.0\n.target sm_90\n.visible .entry gemm_mix_tensor(\n .param .u64 x\n)\n{\n ret;\n}\n";
        assert!(looks_like_module(good, GpuKernel::Tensor));
        assert!(!looks_like_module(&good[..good.len() - 3], GpuKernel::Tensor));
        assert!(!looks_like_module(good, GpuKernel::Tiled));
        assert!(!looks_like_module("", GpuKernel::Tensor));
    }

    #[test]
    fn atomic_write_leaves_only_the_final_file() {
        let dir = std::env::temp_dir().join(format!("gpu-attest-cache-test-{}", std::process::id()));
        write_atomically(&dir, "k.ptx", "body").unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["k.ptx"]);
        assert_eq!(std::fs::read_to_string(dir.join("k.ptx")).unwrap(), "body");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
