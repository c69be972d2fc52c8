//! The CUDA backend: GPU detection, the kernels (`cuda/*.cu` beside this crate's sources), NVRTC
//! compilation and caching, the self-checks, and the [`Backend`](gpu_attest_shared::Backend)
//! implementation that runs chains on GPUs. The engine (`gpu-attest-shared`) knows nothing of
//! it: this is one more backend behind its trait.
//!
//! Everything the CUDA libraries provide is loaded at run time, so this compiles and runs on
//! hosts without CUDA: detection then says why there is no GPU, and nothing panics.
//!
//! - [`driver`]: the installed driver's CUDA version and entry points, checked before use.
//! - [`detect`]: the CUDA driver's devices (CUDA_VISIBLE_DEVICES applied) matched to NVML's facts.
//! - [`kernels`]: the `.cu` sources and the choice between the tiled and tensor-core kernels.
//! - [`compile`]: NVRTC, with a memory and a disk cache.
//! - [`plan`]: chains per batch from free memory.
//! - [`options`]: what to run on: the selected GPUs, in partition order, and their kernel.
//! - [`device`]: one GPU's context, streams, kernels and launches; `pipeline` runs batches of
//!   chains on it and makes pool entries; `slots` resets a faulted device or takes it out of
//!   service; [`pool`] holds a device's pool of the memory phase (version 3), [`pool_states`]
//!   version 4's pool of its chains' final states, [`walk`] is the walk kernels' host side, and
//!   [`walk_bench`] `miner bench`'s walk.
//! - [`bench`](mod@bench): `miner bench`'s GPU figures, timed by `timing`.
//! - [`backend`]: the [`Backend`](gpu_attest_shared::Backend) over all of them.
//! - [`checks`]: each kernel's self-check on each device, cached, and the kernel chosen from them.
//! - `raw`: the only module allowed `unsafe`: the driver, NVRTC and cuBLASLt calls cudarc leaves
//!   unsafe, device buffers that start undefined, the tensor maps' encoding, and each kernel's
//!   launch through a function whose Rust signature is the kernel's CUDA one. Everything above
//!   it is safe Rust (the workspace denies `unsafe_code`).

// Every `unsafe` block says why it is sound; they are all in `raw`, the one module allowed them.
#![warn(clippy::undocumented_unsafe_blocks)]
pub mod backend;
pub mod bench;
pub mod checks;
pub mod compile;
pub mod detect;
pub mod device;
pub mod driver;
pub mod evidence;
pub mod kernels;
pub mod locality;
pub mod options;
mod pipeline;
pub mod plan;
pub mod pool;
pub mod pool_states;
pub mod states;
// The driver, NVRTC and cuBLASLt calls cudarc leaves unsafe, device buffers that start
// undefined, and the kernel launches: each behind a safe function or type.
#[allow(unsafe_code)]
mod raw;
mod slots;
pub mod telemetry;
mod timing;
pub mod tma;
pub mod walk;
pub mod walk_bench;
mod words;

pub use backend::CudaBackend;
pub use detect::{Detection, GpuDetectError, GpuInfo};
pub use kernels::GpuKernel;
pub use options::{CudaInitError, CudaOptions};
