//! What the `miner` commands print: `info` (text and JSON), `bench` tables. Kept apart from the
//! binary so that it stays a thin dispatch over the library, and from the work itself.

use crate::backends::SelectedBackend;
use crate::bench;
use crate::config::MinerConfig;
use gpu_attest_kernels::detect::{Detection, GpuDetectError};
use gpu_attest_kernels::walk_bench::WalkBench;
use gpu_attest_shared::gemm::KernelKind;
use std::time::Duration;

pub fn print_info(selected: &SelectedBackend, detection: &Result<Detection, GpuDetectError>) {
    match detection {
        Ok(d) => {
            println!("CUDA driver: supports CUDA {}", d.driver);
            println!("GPUs: {}", d.gpus.len());
            if let Some(visible) = &d.visible_devices {
                println!("CUDA_VISIBLE_DEVICES: {visible}");
            }
            for g in &d.gpus {
                println!(
                    "gpu {}: {}, compute capability {}.{}, {} SMs, {:.1} GiB, PCI {}, {}, driver {}",
                    g.ordinal,
                    g.name,
                    g.compute_capability.0,
                    g.compute_capability.1,
                    g.sm_count,
                    g.memory_bytes as f64 / (1u64 << 30) as f64,
                    g.pci_bus_id,
                    g.uuid,
                    g.driver_version
                );
                if let Some(nvml) = &g.nvml {
                    println!(
                        "  free {:.1} GiB, power limit {} W, max clocks {} MHz SM / {} MHz memory",
                        nvml.memory_free as f64 / (1u64 << 30) as f64,
                        nvml.power_limit_mw.map_or("?".into(), |mw| (mw / 1000).to_string()),
                        nvml.max_sm_clock_mhz.map_or("?".into(), |v| v.to_string()),
                        nvml.max_memory_clock_mhz.map_or("?".into(), |v| v.to_string()),
                    );
                }
            }
            if let Some(note) = &d.nvml_note {
                println!("note: {note}");
            }
        }
        Err(e) => println!("GPUs: none usable ({e})"),
    }
    println!("backend: {} ({} kernel)", selected.name, selected.kernel);
    for note in &selected.notes {
        println!("note: {note}");
    }
    for d in &selected.devices() {
        println!(
            "device {}: {}, {:.1} GiB memory",
            d.index,
            d.name,
            d.memory_bytes as f64 / (1u64 << 30) as f64
        );
    }
    for kernel in KernelKind::ALL {
        match kernel.unavailable_reason() {
            None => println!("cpu kernel {kernel}: runs here"),
            Some(why) => println!("cpu kernel {kernel}: not here (it {why})"),
        }
    }
}

/// A share as a percentage with one decimal, or "-" where there is none.
fn pct(share: Option<f64>) -> String {
    share.map_or("-".to_string(), |v| format!("{:.1}", v * 100.0))
}

pub fn print_cpu_report(report: &bench::CpuReport) {
    println!(
        "{:<6} {:<12} {:>6} {:>8} {:>6} {:>12} {:>10} {:>9}  device",
        "backend", "kernel", "n", "k block", "hints", "ms/step", "TOPS", "% ceiling"
    );
    for r in &report.rows {
        println!(
            "{:<6} {:<12} {:>6} {:>8} {:>6} {:>12.3} {:>10.3} {:>9}  {}",
            r.backend,
            r.kernel,
            r.n,
            r.k_block,
            if r.cache_hints { "on" } else { "off" },
            r.seconds * 1e3,
            r.tops,
            pct(r.share_of_ceiling),
            r.device
        );
    }
    // The fastest kernel's ceiling is this CPU's limit for int8 products.
    let fastest = KernelKind::best_available().to_string();
    for c in &report.ceilings {
        let limit = if c.kernel == fastest { ", this CPU's limit" } else { "" };
        println!(
            "register-only ceiling of the {} kernel on these threads: {:.2} TOPS ({}{limit})",
            c.kernel, c.tops, c.instructions
        );
    }
    if let Some(s) = &report.sampled_verify {
        println!(
            "sampled verification, n={}, {} samples of {} steps: {:.2} s on the {} kernel",
            s.n, s.samples, s.steps, s.seconds, s.kernel
        );
    }
    if let Some(m) = &report.memory {
        let gb = |bytes_per_sec: f64| bytes_per_sec / 1e9;
        println!(
            "memory, {} MiB buffers, {} threads: read {:.1} GB/s, copy {:.1} GB/s (read + written)",
            m.bytes >> 20,
            m.threads,
            gb(m.read_bytes_per_sec),
            gb(m.copy_bytes_per_sec)
        );
        println!(
            "memory walk: {:.1} GB/s, {:.0}% of read, {:.0}% of copy; pool fill: {:.1} entries/s ({:.3} TOPS)",
            gb(m.walk_bytes_per_sec),
            100.0 * m.walk_share_of_read,
            100.0 * m.walk_share_of_copy,
            m.fill_entries_per_sec,
            m.fill_tops
        );
        println!(
            "version 4 walk (every state in its walker's tree): {:.1} GB/s, {:.0}% of read",
            gb(m.walk_v4_bytes_per_sec),
            100.0 * m.walk_v4_share_of_read
        );
    }
}

pub fn info_json(selected: &SelectedBackend, detection: &Result<Detection, GpuDetectError>) -> serde_json::Value {
    let gpus: Vec<_> = detection
        .as_ref()
        .map(|d| {
            d.gpus
                .iter()
                .map(|g| {
                    serde_json::json!({
                        "ordinal": g.ordinal, "name": g.name, "uuid": g.uuid, "memory_bytes": g.memory_bytes,
                        "sm_count": g.sm_count, "compute_capability": [g.compute_capability.0, g.compute_capability.1],
                        "pci_bus_id": g.pci_bus_id, "driver_version": g.driver_version,
                        "power_limit_mw": g.nvml.as_ref().and_then(|n| n.power_limit_mw),
                        "max_sm_clock_mhz": g.nvml.as_ref().and_then(|n| n.max_sm_clock_mhz),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    serde_json::json!({
        "backend": selected.name,
        "kernel": selected.kernel,
        "notes": selected.notes,
        "gpus": gpus.len(),
        "gpu_devices": gpus,
        "gpu_error": detection.as_ref().err().map(|e| e.to_string()),
        "cuda_driver": detection.as_ref().ok().map(|d| d.driver.to_string()),
        "self_checks": selected.self_checks,
        "devices": selected.devices(),
        "cpu_kernels": KernelKind::ALL.map(|k| serde_json::json!({
            "name": k.name(), "available": k.is_available(), "unavailable_reason": k.unavailable_reason(),
        })),
    })
}

/// `miner bench` on GPUs: one row per kernel (every kernel, or the one `--gpu-kernel` names),
/// device and size, printed as each is measured; a kernel that could not be timed is named after
/// the rows, and fails the command once the memory walks have run.
pub fn bench_gpus(
    config: &MinerConfig,
    sizes: &[usize],
    budget: Duration,
    memory_mib: usize,
    json: bool,
) -> Result<(), String> {
    let options = config.cuda_options();
    if !json {
        println!(
            "{:<9} {:>3} {:>5} {:>5} {:>10} {:>8} {:>7} {:>9} {:>10} {:>9} {:>9}  device",
            "kernel", "dev", "n", "batch", "us/step", "TOPS", "%peak", "%floor", "cuBLASLt", "vs lt+mix", "chal/gemm"
        );
    }
    let kernels = bench::gpu_kernels_to_time(options.kernel);
    let bench::GpuBench { rows, kernel_errors } = bench::gpu(&options, &kernels, sizes, budget, |r| {
        if !json {
            print_gemm_row(r);
        }
    });
    if !json {
        for e in &kernel_errors {
            println!("not timed: {e}");
        }
    }
    // The memory walks (protocol versions 3 and 4) on each device, against its copy bandwidth. A walk
    // that cannot run leaves the GEMM rows reported, and fails the command after them.
    let pool_bytes = (memory_mib as u64).saturating_mul(1 << 20);
    let walks = (memory_mib > 0).then(|| {
        bench::gpu_walks(&options, pool_bytes, budget, |w| {
            if !json {
                print_walks(w);
            }
        })
    });
    let (memory, walk_error) = match walks {
        None => (Vec::new(), None),
        Some(Ok(memory)) => (memory, None),
        Some(Err(e)) => (Vec::new(), Some(format!("the memory walk did not run: {e}"))),
    };
    if json {
        let report = serde_json::json!({
            "rows": rows,
            "kernel_errors": kernel_errors,
            "memory": memory,
            "memory_error": walk_error,
        });
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    }
    gpu_bench_verdict(&kernel_errors, walk_error, &memory)
}

/// One GEMM row of `miner bench` on a GPU, under the header `bench_gpus` prints.
fn print_gemm_row(r: &bench::GpuBenchRow) {
    println!(
        "{:<9} {:>3} {:>5} {:>5} {:>10.2} {:>8.1} {:>7} {:>9} {:>10} {:>9} {:>9.3}  {}",
        r.kernel,
        r.device,
        r.n,
        r.batch,
        r.seconds * 1e6,
        r.tops,
        pct(r.peak_tops.map(|p| r.tops / p)),
        pct(r.share_of_floor),
        r.cublaslt_tops.map_or("-".to_string(), |t| format!("{t:.1}")),
        r.cublaslt_seconds
            .map_or("-".to_string(), |s| format!("{:.2}x", s / r.seconds)),
        r.challenge_over_gemm,
        r.name
    );
    if let Some(e) = &r.cublaslt_error {
        println!("        cuBLASLt baseline did not run: {e}");
    }
}

/// One device's memory walks, both versions, each against the CPU's.
fn print_walks(w: &WalkBench) {
    println!(
        "memory walk, device {} ({}): {:.0} GB/s, {:.0}% of copy ({:.0} GB/s); pool {} MiB, {} walkers x {} steps; \
         pool fill: {:.1} s, {:.0} entries/s ({:.1} TOPS); {}",
        w.device,
        w.name,
        w.walk_bytes_per_sec / 1e9,
        100.0 * w.walk_share_of_copy,
        w.copy_bytes_per_sec / 1e9,
        w.pool_bytes >> 20,
        w.walkers,
        w.steps,
        w.fill_seconds,
        w.fill_entries_per_sec,
        w.fill_tops,
        if w.matches_cpu {
            "the CPU walk's checkpoints, every one"
        } else {
            "NOT the CPU walk's checkpoints"
        }
    );
    if let Some(e) = &w.walk_v4_error {
        println!("memory walk v4, device {} ({}): did not run: {e}", w.device, w.name);
        return;
    }
    println!(
        "memory walk v4, device {} ({}): {:.0} GB/s to the walk root, {:.0}% of the v3 walk; {} walkers x {} \
         steps, every state in its walker's tree on the device; {}",
        w.device,
        w.name,
        w.walk_v4_bytes_per_sec / 1e9,
        100.0 * w.walk_v4_share_of_walk,
        w.walkers,
        w.walk_v4_steps,
        if w.v4_matches_cpu {
            "the CPU's trees and openings, every one"
        } else {
            "NOT the CPU's trees and openings"
        }
    );
    match &w.locality_error {
        Some(e) => println!("locality walk, device {} ({}): did not run: {e}", w.device, w.name),
        None => println!(
            "locality walk, device {} ({}): {:.0} ns a step with one walker, {:.0} ns with one an SM \
             (a validator's gpu_step_ns), {:.0} ns with {} side by side, to the last generation's digest \
             on the host; {}",
            w.device,
            w.name,
            w.locality_step_ns,
            w.locality_per_sm_step_ns,
            w.locality_loaded_step_ns,
            gpu_attest_kernels::walk_bench::LOCALITY_LOADED_WALKERS,
            if w.locality_matches_cpu {
                "the CPU's walk and openings, every one"
            } else {
                "NOT the CPU's walk and openings"
            }
        ),
    }
    if w.locality_error.is_none() {
        let long = gpu_attest_kernels::walk_bench::LOCALITY_LONG_STEPS;
        let split = match (w.locality_long_generation_step_ns > 0.0, w.locality_split()) {
            (false, _) => format!("did not run in generations of {long}"),
            (true, None) => format!(
                "{:.0} ns a step with one walker an SM in generations of {long}: not separable from the \
                 walks' noise",
                w.locality_long_generation_step_ns
            ),
            (true, Some(split)) => format!(
                "{:.0} ns a step with one walker an SM in generations of {long}; so {:.0} ns a step and \
                 {:.1} us a generation (its slowest walker, digest, push and starts)",
                w.locality_long_generation_step_ns, split.step_ns, split.generation_us
            ),
        };
        println!(
            "locality walk, device {} ({}), the split (not a gpu_step_ns): {split}",
            w.device, w.name
        );
    }
}

/// Whether the GPU bench passed: every kernel timed, both walks run, and each device's walks
/// the CPU's to the bit.
fn gpu_bench_verdict(kernel_errors: &[String], walk_error: Option<String>, memory: &[WalkBench]) -> Result<(), String> {
    if !kernel_errors.is_empty() {
        return Err(format!("not every kernel was timed: {}", kernel_errors.join("; ")));
    }
    if let Some(e) = walk_error {
        return Err(e);
    }
    if let Some(e) = memory.iter().find_map(|w| w.walk_v4_error.as_ref()) {
        return Err(format!("the version 4 walk did not run: {e}"));
    }
    if let Some(e) = memory.iter().find_map(|w| w.locality_error.as_ref()) {
        return Err(format!("the locality walk did not run: {e}"));
    }
    if memory
        .iter()
        .any(|w| !w.matches_cpu || !w.v4_matches_cpu || !w.locality_matches_cpu)
    {
        return Err("the device walk differs from the CPU walk: report this with `miner info`".into());
    }
    Ok(())
}
