//! The gpu-attest miner daemon as a library: the `miner` binary is a thin command line over it,
//! and the integration tests run the same server in-process on port-0 listeners.

pub mod answers;
pub mod backends;
pub mod bench;
pub mod cli;
pub mod commands;
pub mod config;
pub mod core;
pub mod daemon;
pub mod error;
pub mod evidence;
pub mod memory;
pub mod memory_v4;
pub mod metrics;
pub mod nonces;
pub mod openings;
pub mod selftest;
pub mod server;
pub mod service;
pub mod show;
pub mod wire;

pub use crate::core::MinerCore;
pub use config::MinerConfig;
