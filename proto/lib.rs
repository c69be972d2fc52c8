//! Wire types for gpu-attest, generated from the `.proto` files beside this one, and their
//! conversions to and from the engine's types: all a peer needs to speak the protocol. (What the
//! daemons share beyond the wire lives in `gpu-attest-daemon`.) Every conversion from the wire
//! checks lengths and ranges and returns a [`WireError`] naming the field, never panics: wire
//! input is hostile.

pub mod convert;
pub mod evidence;
mod fields;
pub mod locality;
pub mod memory_v4;
pub mod transcript;

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("gpu_attest.v1");

    /// The encoded descriptors of every message and service here, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpu_attest_descriptor.bin"));
}

pub use fields::WireError;
