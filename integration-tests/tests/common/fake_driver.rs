//! Stand-ins for the NVIDIA libraries (`integration-tests/fake-driver/*.c`), built with the C
//! compiler into a directory of the test's own. The miner loads them in place of the real ones
//! when that directory comes first on LD_LIBRARY_PATH, so "a CUDA 12 driver", "no GPU" or "NVML
//! without libcuda" can be staged on a machine that has no GPU at all.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One library to build: its source in `fake-driver/`, the file name the loader looks for, and
/// any `-D` defines.
#[derive(Clone, Copy)]
pub enum FakeLib {
    /// libcuda, answering queries as FAKE_CUDA_* say, refusing everything that would run.
    Cuda,
    /// libcuda without cuLaunchKernel: a driver library that lacks an entry point.
    CudaWithoutLaunch,
    /// NVRTC reporting FAKE_NVRTC_VERSION and compiling nothing.
    Nvrtc,
    /// NVML that starts and counts FAKE_NVML_DEVICES GPUs.
    Nvml,
}

impl FakeLib {
    fn parts(self) -> (&'static str, &'static str, &'static [&'static str]) {
        match self {
            FakeLib::Cuda => ("libcuda.c", "libcuda.so", &[]),
            FakeLib::CudaWithoutLaunch => ("libcuda.c", "libcuda.so", &["-DFAKE_CUDA_OMIT_LAUNCH"]),
            FakeLib::Nvrtc => ("libnvrtc.c", "libnvrtc.so", &[]),
            FakeLib::Nvml => ("libnvidia-ml.c", "libnvidia-ml.so.1", &[]),
        }
    }
}

/// Builds `libs` into `dir` with `cc`. Panics with the compiler's output if a build fails: the
/// C compiler is part of this project's build requirements (rusqlite's bundled SQLite needs it).
pub fn build(dir: &Path, libs: &[FakeLib]) -> PathBuf {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("fake-driver");
    for lib in libs {
        let (source, name, defines) = lib.parts();
        let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(dir.join(name))
            .args(defines)
            .arg(sources.join(source))
            .output()
            .expect("the C compiler (cc) runs");
        assert!(
            out.status.success(),
            "building the fake {name} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir.to_path_buf()
}

/// LD_LIBRARY_PATH with `dir` first.
pub fn library_path(dir: &Path) -> std::ffi::OsString {
    let mut path = dir.as_os_str().to_os_string();
    if let Some(rest) = std::env::var_os("LD_LIBRARY_PATH").filter(|r| !r.is_empty()) {
        path.push(":");
        path.push(rest);
    }
    path
}
