//! Wire types for gpu-attest, generated from the `.proto` files beside this one, and their
//! conversions to and from the engine's types. Every conversion from the wire checks lengths and
//! ranges and returns a [`WireError`] naming the field, never panics: wire input is hostile.

pub mod convert;
pub mod transport;

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("gpu_attest.v1");
}

pub use convert::WireError;
