//! Hardware identity where the GPU can sign (PROTOCOL.md 19): how the validator checks a
//! commitment's evidence under its policy ([`check`]). What it asks of evidence is
//! `config::identity`; what a verdict states of it is `verdict::identity`; the evidence itself is
//! `shared::evidence`.

pub mod check;

pub use check::{check_commitment_evidence, check_part_reuse};
