//! The tests whose verdicts rest on a walk's clock, timed against this machine's own rate: one
//! binary, so that they take turns on one lock (`TIMED`) instead of timing each other's load.
//! Their untimed neighbours (refusals, checks on recorded bytes) run beside them.

#[path = "../common/mod.rs"]
mod common;

mod locality;
mod memory;
mod transcripts;
mod walk_v4;

/// Held by every test while it times a walk, so that no two timed attestations share the cores.
static TIMED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
