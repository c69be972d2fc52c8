//! The end-to-end and document tests that need no quiet machine, in one binary: one link of the
//! whole stack instead of one per file, which is most of what a clean build of the tests costs
//! in time and disk. Each module is one area; `cargo test --test integration AREA::` runs one.
//!
//! Tests that time a miner against this machine live elsewhere, because a binary's tests run
//! side by side: `timed` (walks timed against the machine's own rate, taking turns), `deadlines`
//! (a binary alone) and `host_memory` (measures the process's own resident memory).

#[path = "../common/mod.rs"]
mod common;

mod adversarial;
mod attestation;
mod binaries;
mod bounds;
mod claims;
mod dashboard;
mod documents;
mod evidence;
mod fake_driver;
mod first_hour;
mod fuzz_corpus;
mod hostile_inputs;
mod identity;
mod layers;
mod miner_service;
mod operations;
mod validator_api;
mod validator_fleet;
