//! The memory phase as the validator sees it (PROTOCOL.md 18): what the fill costs in chain
//! operations ([`fill`]), how it sizes and times the walk from bandwidth classes ([`plan`]), and
//! version 4's sizing ([`plan_v4`], PROTOCOL.md 20). What it asks for is `config::memory`; what a
//! verdict states of it is `verdict::memory`, which the plans fill in; the exchange itself is
//! `attest::walk` and `attest::walk_v4`.

pub mod fill;
pub mod plan;
pub mod plan_v4;

pub use plan::{MemoryPlan, PlannedPool};
