//! `miner bench`: the fused step's speed on every kernel this host runs (or the one chosen),
//! and on request the sampled verification and the memory phase.

use super::{Answer, CommandError, check_size, print_json};
use crate::cli::Settings;
use crate::{backends, bench, show};
use gpu_attest_shared::gemm::KernelKind;
use std::time::Duration;

/// `miner bench`'s flags.
pub(super) struct Request {
    pub sizes: Vec<usize>,
    pub seconds: f64,
    pub sampled_verify: bool,
    pub memory_mib: usize,
    pub json: bool,
}

pub(super) fn bench(settings: &Settings, request: Request) -> Result<Answer, CommandError> {
    let config = settings.resolve()?;
    let selected = backends::select(&config)?;
    let sizes = match (request.sizes.is_empty(), selected.is_cuda()) {
        (false, _) => request.sizes,
        (true, true) => vec![1024, 2048, 4096],
        (true, false) => vec![256, 1024, 2048],
    };
    for &n in &sizes {
        check_size("size", n)?;
    }
    let budget = Duration::from_secs_f64(request.seconds);
    if selected.is_cuda() {
        show::bench_gpus(&config, &sizes, budget, request.memory_mib, request.json).map_err(CommandError::Bench)?;
        return Ok(Answer::Yes);
    }
    let device = selected.devices().first().map(|d| d.name.clone()).unwrap_or_default();
    // Every kernel this CPU runs, unless one was chosen.
    let chosen = config.cpu_kernel.resolve()?;
    let kernels = match chosen {
        Some(k) => vec![k],
        None => KernelKind::ALL.into_iter().filter(|k| k.is_available()).collect(),
    };
    let rows = bench::cpu(&sizes, &kernels, config.cpu_threads, budget, &device)?;
    let sampled_verify = request
        .sampled_verify
        .then(|| bench::sampled_verify(chosen, config.cpu_threads))
        .transpose()
        .map_err(CommandError::Bench)?;
    // The ceilings on the threads the rows ran on (with `cpu_threads = 0`, the pool's choice,
    // which RAYON_NUM_THREADS can change).
    let threads = rows.first().map_or(config.cpu_threads, |r| r.threads);
    let memory = (request.memory_mib > 0)
        .then(|| bench::memory(chosen, config.cpu_threads, request.memory_mib, budget))
        .transpose()
        .map_err(CommandError::Bench)?;
    let report = bench::CpuReport::new(rows, bench::ceilings(threads, &kernels), sampled_verify, memory);
    if request.json {
        print_json(&report)?;
    } else {
        show::print_cpu_report(&report);
    }
    Ok(Answer::Yes)
}
