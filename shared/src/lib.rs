//! The gpu-attest engine: the v1 work function and everything that commits to it and checks it.
//!
//! PROTOCOL.md is the normative definition; this crate is its reference implementation. It knows
//! nothing of gRPC, databases or command lines: the miner and validator daemons build on it.
//!
//! - [`params`]: challenge parameters, limits, the matrix key.
//! - [`matrix`], [`mix`], [`gemm`]: the matrices, the non-linear step, exact int8 products.
//! - [`chain`], [`merkle`], [`partition`], [`commitment`]: what a miner commits to.
//! - [`backend`], [`cpu`], [`engine`]: who computes it, and how devices split the work;
//!   [`failure`]: how that work is stopped, and fails.
//! - [`opening`], [`verify`]: sampled openings and the validator's checks.
//! - [`keys`], [`statement`]: ed25519 keys and the canonical encodings they sign.
//! - [`inventory`]: the hardware a miner claims and the limits it sets.
//! - [`memory`]: the memory proof: version 3's filled pool and walk, version 4's pool of chain
//!   states, its walk, and the bound a verdict states.
//! - [`reference`]: the work function written out plainly, the oracle every fast path is
//!   tested against; [`vectors`]: PROTOCOL.md's vector challenge; [`selftest`]: a backend
//!   checked against both before anyone relies on it.
//!
//! No GPU code lives here: the CUDA backend is the `gpu-attest-kernels` crate, one more
//! implementation of [`Backend`]. So a peer that needs only the protocol builds no cudarc and
//! no NVML. (This project's validator does link the kernels crate: it re-executes on a GPU
//! where it has one, and sizes version 4's pools with the miner's own buffer arithmetic.)

// Page-aligned, mmap-backed buffers: the pool's memory and the GEMMs' operands.
#[allow(unsafe_code)]
pub mod aligned;
pub mod backend;
pub mod chain;
pub mod commitment;
pub mod cpu;
pub mod device;
pub mod digest;
mod encoding;
pub mod engine;
pub mod evidence;
pub mod failure;
// The SIMD kernels (AVX2, AVX-512 VNNI, AVX-VNNI, AMX) are intrinsics behind CPU-feature checks.
#[allow(unsafe_code)]
pub mod gemm;
pub mod inventory;
pub mod keys;
pub mod matrix;
// The pool and the walk read the aligned buffers as the walk's hashing lanes need them.
#[allow(unsafe_code)]
pub mod memory;
pub mod merkle;
pub mod mix;
pub mod opening;
pub mod params;
pub mod partition;
#[doc(hidden)]
pub mod prerequisite;
pub mod reference;
pub mod selftest;
pub mod statement;
pub mod vectors;
pub mod verify;

pub use backend::{Backend, BackendError, CancelToken};
pub use digest::Digest;
pub use params::{ChallengeParams, Work};
