//! The memory phase as the validator sees it (PROTOCOL.md 18): what it asks for
//! ([`config`]), what the fill costs in chain operations ([`fill`]), how it sizes and times the
//! walk from bandwidth classes ([`plan`]), and what a verdict states of it ([`proof`]). The
//! exchange itself is `attest::walk`. Version 4's sizing ([`plan_v4`], PROTOCOL.md 20) is
//! built ahead of the exchange that will use it.

pub mod config;
pub mod fill;
pub mod plan;
pub mod plan_v4;
pub mod proof;

pub use config::MemoryConfig;
pub use fill::FillWork;
pub use plan::{MemoryPlan, PlannedPool};
pub use proof::{DeviceMemory, MemoryProof};
