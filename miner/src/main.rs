//! `miner`: the thin binary over the gpu-attest-miner library.

use anyhow::{Context, Result, bail};
use clap::Parser;
use gpu_attest_daemon::run::Stopped;
use gpu_attest_miner::backends;
use gpu_attest_miner::cli::{Cli, Command, ServeArgs};
use gpu_attest_miner::config::BackendChoice;
use gpu_attest_miner::{bench, daemon, selftest, show};
use gpu_attest_shared::cuda::detect::detect;
use gpu_attest_shared::gemm::KernelKind;
use gpu_attest_shared::identity::Identity;
use std::process::ExitCode;
use std::time::Duration;

/// A self-check that a kernel failed: the command's answer is no, not an error.
#[derive(Debug, thiserror::Error)]
#[error("{failed} of {checked} kernels failed their self-check")]
struct SelfCheckFailed {
    failed: usize,
    checked: usize,
}

/// Errors end the process with one line on stderr, whatever RUST_BACKTRACE says, and the exit
/// statuses both binaries share (`gpu_attest_daemon::exit`): a device fault has one of its own,
/// so that a supervisor can tell it from a bad config.
fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        gpu_attest_daemon::signals::end_quietly_when_output_closes();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Each cause once: most of our errors already print their cause themselves.
            eprintln!("error: {}", gpu_attest_daemon::errors::error_chain(e.as_ref()));
            let device_fault = match e.downcast_ref::<daemon::DaemonError>() {
                Some(daemon::DaemonError::Stopped(Stopped::DevicesOutOfService { .. })) => true,
                Some(daemon::DaemonError::Backend(backends::BackendSelectError::GpuFaulted(_))) => true,
                _ => matches!(
                    e.downcast_ref::<backends::BackendSelectError>(),
                    Some(backends::BackendSelectError::GpuFaulted(_))
                ),
            };
            if device_fault {
                ExitCode::from(gpu_attest_daemon::exit::DEVICE_FAULT)
            } else if e.downcast_ref::<SelfCheckFailed>().is_some() {
                ExitCode::from(gpu_attest_daemon::exit::ANSWER_NO)
            } else {
                ExitCode::from(gpu_attest_daemon::exit::ERROR)
            }
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::PublicKey { key_file } => {
            println!("{}", Identity::load_file(&key_file)?.public_key());
            Ok(())
        }
        Command::Keygen { key_file } => {
            let identity = Identity::create_file(&key_file)?;
            println!("wrote {} (owner-only)", key_file.display());
            println!("public key: {}", identity.public_key());
            Ok(())
        }
        Command::Evidence { roots, json } => {
            let nvml = gpu_attest_shared::cuda::evidence::NvmlEvidence::open()
                .map_err(|why| anyhow::anyhow!("no NVIDIA driver to ask for evidence ({why})"))?;
            let anchors = match roots {
                None => gpu_attest_shared::evidence::TrustAnchors::nvidia(),
                Some(path) => {
                    let pem = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                    let roots = gpu_attest_shared::evidence::DeviceChain::pem_to_der(&pem)
                        .with_context(|| format!("{} holds no PEM certificates", path.display()))?;
                    gpu_attest_shared::evidence::TrustAnchors::from_der(roots)
                }
            };
            let trust = gpu_attest_shared::evidence::EvidenceTrust {
                anchors,
                table: Default::default(),
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs();
            let found = gpu_attest_miner::evidence::check_own_evidence(&nvml, &trust, now)
                .map_err(|why| anyhow::anyhow!(why))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&found)?);
            } else if found.is_empty() {
                println!("NVML sees no GPU");
            } else {
                println!(
                    "checked against the root(s) with SHA-256 {}",
                    trust.anchors.sha256_fingerprints().join(", ")
                );
                for device in &found {
                    println!(
                        "GPU {} {} ({}): {}; {}",
                        device.index, device.name, device.uuid, device.cc_state, device.verdict
                    );
                }
            }
            Ok(())
        }
        Command::Info { settings, json } => {
            let config = settings.resolve()?;
            let detection = detect();
            let selected = backends::select_detected(&config, &detection)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&show::info_json(&selected, &detection))?
                );
            } else {
                show::print_info(&selected, &detection);
            }
            Ok(())
        }
        Command::Bench {
            settings,
            sizes,
            seconds,
            sampled_verify,
            memory_mib,
            json,
        } => {
            let config = settings.resolve()?;
            let selected = backends::select(&config)?;
            let sizes = match (sizes.is_empty(), selected.is_cuda()) {
                (false, _) => sizes,
                (true, true) => vec![1024, 2048, 4096],
                (true, false) => vec![256, 1024, 2048],
            };
            if let Some(bad) = sizes.iter().find(|&&n| n == 0 || n % 64 != 0 || n > 8192) {
                bail!("size {bad} is not a valid challenge size (a multiple of 64 in 64..=8192)");
            }
            let budget = Duration::from_secs_f64(seconds);
            if selected.is_cuda() {
                return show::bench_gpus(&config, &sizes, budget, memory_mib, json).map_err(anyhow::Error::msg);
            }
            let device = selected.devices().first().map(|d| d.name.clone()).unwrap_or_default();
            // Every kernel this CPU runs, unless one was chosen.
            let chosen = config.cpu_kernel.resolve()?;
            let kernels = match chosen {
                Some(k) => vec![k],
                None => KernelKind::ALL.into_iter().filter(|k| k.is_available()).collect(),
            };
            let rows = bench::cpu(&sizes, &kernels, config.cpu_threads, budget, &device)?;
            let sampled_verify = sampled_verify
                .then(|| bench::sampled_verify(chosen, config.cpu_threads))
                .transpose()
                .map_err(anyhow::Error::msg)?;
            // The ceilings on the threads the rows ran on (with `cpu_threads = 0`, the pool's
            // choice, which RAYON_NUM_THREADS can change).
            let threads = rows.first().map_or(config.cpu_threads, |r| r.threads);
            let memory = (memory_mib > 0)
                .then(|| bench::memory(chosen, config.cpu_threads, memory_mib, budget))
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let report = bench::CpuReport::new(rows, bench::ceilings(threads, &kernels), sampled_verify, memory);
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                show::print_cpu_report(&report);
            }
            Ok(())
        }
        Command::Selftest {
            settings,
            mid_n,
            fresh,
            json,
        } => {
            let config = settings.resolve()?;
            if mid_n == 0 || mid_n % 64 != 0 || mid_n > 8192 {
                bail!("--mid-n {mid_n} is not a valid challenge size (a multiple of 64 in 64..=8192)");
            }
            let detection = detect();
            let report = selftest::run(&config, &detection, mid_n, fresh, |line| {
                if !json {
                    println!("{line}");
                }
            });
            let failed = report.checks.iter().filter(|c| !c.outcome.passed()).count();
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("checked against the portable CPU kernel: {}", report.cases);
            }
            if failed > 0 {
                return Err(SelfCheckFailed {
                    failed,
                    checked: report.checks.len(),
                }
                .into());
            }
            // Asked for the GPU by name, checking the CPU alone is no answer: a deploy script
            // that gates on this must not go ahead on a host without one (as `serve` would not).
            if config.backend == BackendChoice::Cuda
                && let Some(note) = &report.gpu_note
            {
                bail!(
                    "--backend cuda was asked for, but no GPU kernel could be checked ({note}); the CPU kernels passed"
                );
            }
            Ok(())
        }
        Command::Serve(args) => serve(args),
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    let config = args.resolve()?;
    if args.print_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    gpu_attest_daemon::logging::init_logging()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(daemon::run(
        config,
        move || args.resolve(),
        gpu_attest_daemon::signals::shutdown_signal(),
    ))?;
    Ok(())
}
