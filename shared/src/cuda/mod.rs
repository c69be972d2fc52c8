//! The CUDA backend: GPU detection, the kernels, NVRTC compilation and caching, and the
//! [`Backend`](crate::Backend) implementation that runs chains on GPUs.
//!
//! Everything the CUDA libraries provide is loaded at run time, so this compiles and runs on
//! hosts without CUDA: detection then says why there is no GPU, and nothing panics.
//!
//! - [`driver`]: the installed driver's CUDA version and entry points, checked before use.
//! - [`detect`]: the CUDA driver's devices (CUDA_VISIBLE_DEVICES applied) matched to NVML's facts.
//! - [`kernels`]: the `.cu` sources and the choice between the tiled and tensor-core kernels.
//! - [`compile`]: NVRTC, with a memory and a disk cache.
//! - [`plan`]: chains per batch from free memory.
//! - [`device`], [`backend`]: launches on one GPU; the backend over all of them.

pub mod backend;
pub mod bench;
pub mod compile;
pub mod detect;
pub mod device;
pub mod driver;
pub mod kernels;
pub mod plan;

pub use backend::{CudaBackend, CudaInitError, CudaOptions};
pub use detect::{Detection, GpuDetectError, GpuInfo};
pub use kernels::GpuKernel;
