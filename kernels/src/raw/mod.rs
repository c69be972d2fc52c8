//! The crate's `unsafe` code, and the only place it is allowed: the calls into the CUDA
//! libraries that Rust cannot check, each behind a safe function or type whose `// SAFETY:`
//! comment says why it is sound. cudarc's own layering, one step up: its raw bindings below
//! these, the rest of the crate above them, under the workspace's `unsafe_code = "deny"`.
//!
//! - [`driver`]: driver queries (library, version, entry points, device attributes) and the
//!   primary context's state and reset.
//! - [`nvrtc`]: NVRTC's library, version and architectures.
//! - [`cublaslt`]: `miner bench`'s cuBLASLt int8 GEMM.
//! - [`device_memory`]: device buffers whose contents start undefined.
//! - [`tensor_map`]: the TMA kernels' tensor maps, encoded by the driver and passed by value.
//! - [`launch`]: the kernels' entry points, each launched through a function whose Rust
//!   signature is the kernel's CUDA one.

pub(crate) mod cublaslt;
pub(crate) mod device_memory;
pub(crate) mod driver;
pub(crate) mod launch;
pub(crate) mod nvrtc;
pub(crate) mod tensor_map;
