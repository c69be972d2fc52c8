//! `miner`: the thin binary over the gpu-attest-miner library.

use anyhow::{Context, Result, bail};
use clap::Parser;
use gpu_attest_miner::backends;
use gpu_attest_miner::cli::{Cli, Command, ServeArgs};
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_miner::server::ServeOptions;
use gpu_attest_miner::{MinerCore, bench, server};
use gpu_attest_proto::transport;
use gpu_attest_shared::identity::{Identity, PublicKey};
use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Errors end the process with one line on stderr, whatever RUST_BACKTRACE says.
fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
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
        Command::Info { settings, json } => {
            let config = settings.resolve()?;
            let selected = backends::select(&config)?;
            if json {
                let devices: Vec<_> = selected
                    .devices
                    .iter()
                    .map(gpu_attest_proto::convert::device_to_wire)
                    .collect();
                let value = serde_json::json!({
                    "backend": selected.name,
                    "kernel": selected.kernel,
                    "note": selected.note,
                    "gpus": 0,
                    "devices": devices.iter().map(|d| serde_json::json!({
                        "index": d.index, "name": d.name, "memory_bytes": d.memory_bytes, "cores": d.sm_count,
                    })).collect::<Vec<_>>(),
                });
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                println!("GPUs: none usable (this build has no CUDA backend)");
                println!("backend: {} ({} kernel)", selected.name, selected.kernel);
                if let Some(note) = &selected.note {
                    println!("note: {note}");
                }
                for d in &selected.devices {
                    println!(
                        "device {}: {}, {} logical cores, {:.1} GiB memory",
                        d.index,
                        d.name,
                        d.sm_count,
                        d.memory_bytes as f64 / (1u64 << 30) as f64
                    );
                }
            }
            Ok(())
        }
        Command::Bench {
            settings,
            sizes,
            seconds,
            json,
        } => {
            let config = settings.resolve()?;
            let selected = backends::select(&config)?;
            if let Some(bad) = sizes.iter().find(|&&n| n == 0 || n % 64 != 0 || n > 8192) {
                bail!("size {bad} is not a valid challenge size (a multiple of 64 in 64..=8192)");
            }
            let device = selected.devices.first().map(|d| d.name.clone()).unwrap_or_default();
            let rows = bench::cpu(&sizes, config.cpu_threads, Duration::from_secs_f64(seconds), &device);
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:<6} {:<12} {:>6} {:>12} {:>10}  device",
                    "backend", "kernel", "n", "ms/step", "TOPS"
                );
                for r in rows {
                    println!(
                        "{:<6} {:<12} {:>6} {:>12.3} {:>10.3}  {}",
                        r.backend,
                        r.kernel,
                        r.n,
                        r.seconds * 1e3,
                        r.tops,
                        r.device
                    );
                }
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
    let selected = backends::select(&config)?;
    let tls = config.tls.server_config()?;
    let plaintext_warning = transport::check_plaintext_server(config.listen, tls.is_some(), config.allow_plaintext)?;
    gpu_attest_proto::daemon::init_logging();
    if let Some(warning) = plaintext_warning {
        warn!("{warning}");
    }
    let identity = Identity::load_file(&config.key_file)
        .with_context(|| format!("run `miner keygen --key-file {}` first", config.key_file.display()))?;
    let allowed = parse_allowed(&config.allowed_validators)?;
    if allowed.is_empty() {
        warn!("no validator is allowed (allowed_validators is empty): every challenge will be refused");
    }
    if let Some(note) = &selected.note {
        info!("{note}");
    }
    let nonces = NonceLog::open(&config.nonce_file, gpu_attest_miner::core::now_ms())?;
    let options = ServeOptions {
        tls,
        ..ServeOptions::plaintext(&config.limits)
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let address = listener.local_addr()?;
        info!(
            %address,
            miner_key = %identity.public_key(),
            backend = %selected.name,
            kernel = %selected.kernel,
            validators = allowed.len(),
            tls = options.tls.is_some(),
            "miner listening"
        );
        // Scripts read this line to learn a port-0 address.
        println!("listening on {address}");
        let core = Arc::new(MinerCore::new(
            identity,
            allowed,
            config.limits.clone(),
            selected,
            Duration::from_secs(config.keep_commitments_secs),
            nonces,
        ));
        tokio::spawn(reload_on_hangup(core.clone(), args));
        server::serve(core, listener, options, gpu_attest_proto::daemon::shutdown_signal()).await?;
        info!("miner stopped");
        Ok(())
    })
}

fn parse_allowed(keys: &[String]) -> Result<HashSet<PublicKey>> {
    keys.iter()
        .map(|key| {
            PublicKey::from_hex(key).with_context(|| format!("allowed validator {key:?} is not a 64-hex-digit key"))
        })
        .collect()
}

/// SIGHUP re-reads the configuration's allow-list: adding or revoking a validator needs no
/// restart, and a revoked validator can no longer open its earlier commitments either.
async fn reload_on_hangup(core: Arc<MinerCore>, args: ServeArgs) {
    #[cfg(unix)]
    {
        let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            return;
        };
        while hangups.recv().await.is_some() {
            match args
                .resolve()
                .map_err(anyhow::Error::from)
                .and_then(|c| parse_allowed(&c.allowed_validators))
            {
                Ok(allowed) => info!(validators = core.set_allowed(allowed), "allow-list reloaded"),
                Err(e) => warn!(error = %format!("{e:#}"), "allow-list not reloaded; keeping the current one"),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (core, args);
}
