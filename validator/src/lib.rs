//! The gpu-attest validator daemon as a library: the `validator` binary is a thin command line
//! over it, and the integration tests run the same server in-process on port-0 listeners.

pub mod attest;
pub mod audit;
pub mod backoffs;
pub mod cli;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod device_identity;
pub mod in_flight;
pub mod memory;
pub mod metrics;
pub mod operator;
pub mod planner;
pub mod rates;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod show;
pub mod store;
pub mod transcript;
pub mod untrusted;
pub mod verdict;
pub mod verdict_wire;
pub mod watch;

pub use attest::Attestor;
pub use config::ValidatorConfig;
