//! `validator audit FILE`: a verdict checked again from its transcript, offline, on this
//! machine's CPU (`crate::audit`).

use super::{Answer, CommandError, print_json, runtime};
use crate::audit::{Finding, Report};
use crate::daemon::DaemonError;
use gpu_attest_daemon::command::read_file_at_most;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::gemm::KernelChoice;
use gpu_attest_shared::keys::PublicKey;
use std::path::Path;
use std::sync::Arc;

/// A transcript this large takes long enough to audit that the command says it has started.
const LARGE_TRANSCRIPT_BYTES: u64 = 16 << 20;

/// Audits `file`; `validator_key`, where given, is the key it must be signed by.
pub(super) fn audit(
    file: &Path,
    validator_key: Option<&str>,
    threads: usize,
    reexecute: bool,
    json: bool,
) -> Result<Answer, CommandError> {
    let signer = validator_key
        .map(|k| PublicKey::from_hex(k.trim()).ok_or_else(|| CommandError::BadKey(k.into())))
        .transpose()?;
    let bytes = read_file_at_most(file, crate::transcript::MAX_TRANSCRIPT_BYTES as u64)?;
    let size = bytes.len() as u64;
    let kernel = KernelChoice::Auto.resolve().map_err(DaemonError::from)?;
    let backend = CpuBackend::new(threads, kernel).map_err(DaemonError::from)?;
    if !json && size > LARGE_TRANSCRIPT_BYTES {
        // A GPU verdict's openings take a while to recompute: say what is happening.
        eprintln!(
            "auditing {} ({} MiB) on this machine's CPU: its openings are recomputed, which takes a while",
            file.display(),
            size >> 20
        );
    }
    let report = runtime()?
        .block_on(crate::audit::audit(&bytes, signer, Arc::new(backend), reexecute))
        .map_err(|source| CommandError::Transcript {
            path: file.to_path_buf(),
            source,
        })?;
    if json {
        print_json(&report.to_json())?;
    } else {
        println!("{report}");
    }
    Ok(answer(&report))
}

fn answer(report: &Report) -> Answer {
    match report.finding() {
        Finding::Confirmed => Answer::Yes,
        Finding::ConfirmedInPart => Answer::InPart,
        Finding::Differs => Answer::No,
    }
}
