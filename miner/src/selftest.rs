//! The miner's self-check (`miner selftest`, and the GPU check at the start of `miner serve`):
//! the checks themselves, their cache and the choice of kernel are
//! [`gpu_attest_kernels::checks`], which the validator runs too; here is what only the
//! miner does with them: the `miner selftest` report and the inventory's copy.
//!
//! Under `auto`, when no GPU kernel passed, the miner falls back to the CPU with the reason; a
//! kernel forced by the configuration that failed stops the miner. What the check found is
//! information for operators; a validator never trusts it.

use crate::config::MinerConfig;
use gpu_attest_kernels::GpuKernel;
pub use gpu_attest_kernels::checks::{KernelCheck, Outcome};
use gpu_attest_kernels::checks::{LazySuite, cpu_kernels, gpu_kernels};
use gpu_attest_kernels::detect::Detection;
use gpu_attest_shared::selftest::MID_N;
use serde::Serialize;

/// The self-check as GetInventory reports it: information for operators, under no signature.
pub fn to_wire(checks: &[KernelCheck]) -> Vec<gpu_attest_proto::v1::SelfCheck> {
    checks
        .iter()
        .map(|c| gpu_attest_proto::v1::SelfCheck {
            device: c.index,
            kernel: c.kernel.clone(),
            passed: c.outcome.passed(),
            ops_per_sec: match c.outcome {
                Outcome::Passed { ops_per_sec } => ops_per_sec,
                Outcome::Failed { .. } => 0.0,
            },
            detail: match &c.outcome {
                Outcome::Passed { .. } => String::new(),
                Outcome::Failed { reason } => reason.clone(),
            },
        })
        .collect()
}

/// What `miner selftest` found, for the JSON output.
#[derive(Serialize)]
pub struct Report {
    pub cases: String,
    /// Why there are no GPU checks, when there are none.
    pub gpu_note: Option<String>,
    pub checks: Vec<KernelCheck>,
}

/// `miner selftest`: every GPU kernel (or the reason there is none), then the CPU kernels.
/// `say` receives each line as it is known, for a person watching.
pub fn run(
    config: &MinerConfig,
    detection: &Result<Detection, gpu_attest_kernels::GpuDetectError>,
    mid_n: u32,
    fresh: bool,
    say: impl Fn(&str),
) -> Report {
    let mut suite = LazySuite::new(mid_n, config.cpu_threads);
    let mut checks = Vec::new();
    let mut gpu_note = None;
    if config.backend != crate::config::BackendChoice::Cpu {
        let options = config.cuda_options();
        let gpu = match detection {
            Ok(d) => gpu_kernels(&mut suite, d, &options, &GpuKernel::ALL, fresh),
            Err(e) => Err(format!("no GPU: {e}")),
        };
        match gpu {
            Ok(gpu) => checks.extend(gpu),
            Err(note) => {
                say(&note);
                gpu_note = Some(note);
            }
        }
        checks.iter().for_each(|c| say(&c.to_string()));
    }
    let cpu = cpu_kernels(&mut suite, config.cpu_threads);
    cpu.iter().for_each(|c| say(&c.to_string()));
    checks.extend(cpu);
    let cases = suite.get().map(|s| s.describe()).unwrap_or_else(|e| e);
    Report {
        cases,
        gpu_note,
        checks,
    }
}

/// The default mid-sized case.
pub const DEFAULT_MID_N: u32 = MID_N;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cpu_kernel_here_passes_its_self_check() {
        let mut suite = LazySuite::new(128, 0);
        let checks = cpu_kernels(&mut suite, 0);
        assert!(!checks.is_empty());
        for c in &checks {
            assert!(c.outcome.passed(), "{c}");
        }
        assert!(checks.iter().any(|c| c.kernel == "portable"));
    }
}
