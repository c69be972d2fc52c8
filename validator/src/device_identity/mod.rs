//! Hardware identity where the GPU can sign (PROTOCOL.md 19): what the validator asks of device
//! evidence ([`config`]), how it checks a commitment's evidence under its policy ([`check`]),
//! and what a verdict states of it ([`proof`]). The evidence itself is `shared::evidence`.

pub mod check;
pub mod config;
pub mod proof;

pub use check::{check_commitment_evidence, check_part_reuse};
pub use config::{IdentityConfig, IdentityPolicy};
pub use proof::{DeviceIdentity, IdentityProof, IdentityStatus};
