//! `validator`: the thin binary over the gpu-attest-validator library.

use anyhow::{Context, Result, bail};
use clap::Parser;
use gpu_attest_shared::identity::Identity;
use gpu_attest_validator::attest::AttestEvent;
use gpu_attest_validator::cli::{ApiArgs, Cli, Command, MinersAction, RatesAction, Settings};
use gpu_attest_validator::operator::Operator;
use gpu_attest_validator::rates::report;
use gpu_attest_validator::store::{self, Store, Verdict};
use gpu_attest_validator::throughput::show_rate;
use gpu_attest_validator::{ValidatorConfig, daemon};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

/// `attest` exit codes: 0 pass, 1 fail verdict, 2 could not attest.
const EXIT_FAIL: u8 = 1;
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::PublicKey { key_file } => {
            println!("{}", Identity::load_file(&key_file)?.public_key());
            Ok(ExitCode::SUCCESS)
        }
        Command::Keygen { key_file } => {
            let identity = Identity::create_file(&key_file)?;
            println!("wrote {} (owner-only)", key_file.display());
            println!("public key: {}", identity.public_key());
            Ok(ExitCode::SUCCESS)
        }
        Command::Verdicts { database, filter, json } => {
            if !store::is_postgres(&database) && !database.exists() {
                bail!(
                    "no database at {}; run `validator attest` or `validator serve` first",
                    database.display()
                );
            }
            let runtime = tokio::runtime::Runtime::new()?;
            let verdicts = runtime.block_on(async {
                let store = Store::open(&database).await?;
                let verdicts = store.verdicts(&filter.filter()).await;
                store.close().await;
                verdicts
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&verdicts)?);
            } else if verdicts.is_empty() {
                println!("no verdicts");
            } else {
                for v in &verdicts {
                    println!(
                        "#{:<5} {}  {}  {} ms (deadline {} ms)  {}",
                        v.id,
                        if v.passed { "PASS" } else { "FAIL" },
                        v.miner_url,
                        v.measured_ms,
                        v.deadline_ms,
                        if v.passed {
                            v.throughput.to_string()
                        } else {
                            v.reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; ")
                        }
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Attest { settings, miner, json } => attest(&settings, &miner, json),
        Command::Rates {
            config,
            database,
            action,
        } => rates(
            config.as_deref(),
            database,
            action.unwrap_or(RatesAction::Show { json: false }),
        ),
        Command::Miners { api, action } => miners(&api, action),
        Command::Serve {
            settings,
            listen,
            no_schedule,
            metrics_listen,
            print_config,
        } => {
            let mut config = settings.resolve()?;
            if let Some(l) = listen {
                config.listen = l;
            }
            if no_schedule {
                config.schedule.enabled = false;
            }
            if let Some(m) = metrics_listen {
                config.metrics.listen = Some(m);
            }
            if print_config {
                print!("{}", config.to_toml());
                return Ok(ExitCode::SUCCESS);
            }
            serve(config)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn attest(settings: &Settings, miner: &str, json: bool) -> Result<ExitCode> {
    let config = settings.resolve()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let attestor = runtime.block_on(daemon::attestor(&config))?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} chains").expect("template"));
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let on_event = |e: AttestEvent| match (&bar, e) {
        (Some(bar), AttestEvent::Phase { name, detail }) => bar.set_message(format!("{name}: {detail}")),
        (Some(bar), AttestEvent::Progress(p)) => {
            bar.set_length(p.total);
            bar.set_position(p.done);
        }
        (None, AttestEvent::Phase { name, detail }) if !json => eprintln!("{name}: {detail}"),
        (None, _) => {}
    };
    let verdict = runtime.block_on(async {
        let verdict = attestor.attest(miner, &on_event).await;
        attestor.store().close().await;
        verdict
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let verdict = verdict?;
    if json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        print_verdict(&verdict, attestor.store().location());
    }
    Ok(if verdict.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAIL)
    })
}

/// `validator miners ...`: one call to a running validator's API.
fn miners(api: &ApiArgs, action: MinersAction) -> Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let mut operator = Operator::connect(&api.api, &api.tls()).await?;
        let json = |value: serde_json::Value| -> Result<ExitCode> {
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(ExitCode::SUCCESS)
        };
        match action {
            MinersAction::Add { url, name, replace_key } => {
                let miner = operator.add(&url, &name, replace_key).await?;
                if api.json {
                    return json(serde_json::to_value(&miner)?);
                }
                println!("registered {} ({}) with key {}", miner.url, miner.name, miner.miner_key);
            }
            MinersAction::List => {
                let miners = operator.list().await?;
                if api.json {
                    return json(serde_json::to_value(&miners)?);
                }
                if miners.is_empty() {
                    println!("no miners registered");
                }
                for m in &miners {
                    println!("{}  {}  key {}", m.url, m.name, m.miner_key);
                }
            }
            MinersAction::Remove { url } => {
                let removed = operator.remove(&url).await?;
                if api.json {
                    return json(serde_json::json!({ "url": url, "removed": removed }));
                }
                println!("{}", if removed { "removed" } else { "was not registered" });
            }
            MinersAction::Verdicts { filter } => {
                let verdicts = operator.verdicts(&filter.filter()).await?;
                if api.json {
                    return json(serde_json::to_value(&verdicts)?);
                }
                if verdicts.is_empty() {
                    println!("no verdicts");
                }
                for v in &verdicts {
                    let detail = if v.passed {
                        format!(
                            "proved {:.2e} op/s, expected {:.2e} ({}, slack {:.2})",
                            v.proven_ops_per_sec, v.expected_ops_per_sec, v.rate_source, v.slack
                        )
                    } else {
                        let reasons: Vec<String> = v
                            .reasons
                            .iter()
                            .map(|r| format!("{} ({})", r.message, r.code))
                            .collect();
                        reasons.join("; ")
                    };
                    println!(
                        "#{:<5} {}  {}  {} ms (deadline {} ms)  {detail}",
                        v.id,
                        if v.passed { "PASS" } else { "FAIL" },
                        v.miner_url,
                        v.measured_ms,
                        v.deadline_ms
                    );
                }
            }
            MinersAction::Revoke { key, reason } => {
                let newly_revoked = operator.revoke(&key, &reason).await?;
                if api.json {
                    return json(serde_json::json!({ "miner_key": key, "newly_revoked": newly_revoked }));
                }
                println!(
                    "{}",
                    if newly_revoked {
                        "revoked"
                    } else {
                        "was already revoked"
                    }
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn print_verdict(v: &Verdict, database: &str) {
    println!(
        "{}  miner {} (key {})",
        if v.passed { "PASS" } else { "FAIL" },
        v.miner_url,
        v.miner_key
    );
    let samples = if v.policy == "full" {
        String::new()
    } else {
        format!(", {} samples", v.samples)
    };
    println!(
        "  challenge n={} chains={} iterations={} checkpoint every {}; policy {}{}",
        v.params.n, v.params.num_chains, v.params.iterations, v.params.checkpoint_every, v.policy, samples
    );
    println!(
        "  answered in {} ms (expected {} ms, deadline {} ms)",
        v.measured_ms, v.expected_ms, v.deadline_ms
    );
    println!("  {}", v.throughput);
    println!("  backend {} ({} kernel)", v.backend, v.kernel);
    for d in &v.inventory {
        println!("  device {}: {}", d.index, d.name);
    }
    for r in &v.reasons {
        println!("  reason: {r}");
    }
    println!("  verdict #{} stored in {database}", v.id);
}

fn serve(config: ValidatorConfig) -> Result<()> {
    gpu_attest_daemon::logging::init_logging();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(daemon::run(config, gpu_attest_daemon::signals::shutdown_signal()))?;
    Ok(())
}

/// `validator rates`: works on the database file, like `verdicts`, so it runs beside a serving
/// validator (SQLite's WAL lets both open it).
fn rates(
    config: Option<&std::path::Path>,
    database: Option<std::path::PathBuf>,
    action: RatesAction,
) -> Result<ExitCode> {
    let mut config = ValidatorConfig::load(config)?;
    if let Some(database) = database {
        config.database = database;
    }
    config.validate()?;
    let database = config.database.as_path();
    // Importing may prepare a validator's database before its first run; reading needs one.
    if !store::is_postgres(database) && !database.exists() && !matches!(action, RatesAction::Import { .. }) {
        bail!(
            "no database at {}; run `validator attest` or `validator serve` first",
            database.display()
        );
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let store = runtime.block_on(Store::open(database))?;
    let now = gpu_attest_validator::attest::now_ms();
    match action {
        RatesAction::Show { json } => {
            let table = runtime.block_on(report::table(&store, &config, now))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&table)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "observed classes (a class is calibrated once {} distinct miners have passed):",
                config.calibration.min_miners
            );
            if table.classes.is_empty() {
                println!("  none yet");
            }
            for c in &table.classes {
                println!(
                    "  {:<10} {}/{}  {} per {}  {} miners, {} observations{}  (ceiling {})",
                    c.source,
                    c.class,
                    c.unit,
                    show_rate(c.ops_per_sec),
                    c.unit,
                    c.miners,
                    c.observations,
                    if c.capped { ", capped at the ceiling" } else { "" },
                    show_rate(c.ceiling)
                );
            }
            println!("shipped table (first contact; first matching row wins):");
            for r in &table.shipped {
                let kernel = if r.kernel.is_empty() { "*" } else { &r.kernel };
                let model = if r.model.is_empty() { "*" } else { &r.model };
                println!(
                    "  {:<5} {:<12} {:<10} {:>14}  ceiling {:>14}  {}",
                    r.backend,
                    kernel,
                    model,
                    show_rate(r.ops_per_sec),
                    if r.peak_ops_per_sec > 0.0 {
                        show_rate(r.peak_ops_per_sec)
                    } else {
                        "backend's".into()
                    },
                    r.source
                );
            }
        }
        RatesAction::Export { output } => {
            let file = runtime.block_on(report::export(&store, &config, now))?;
            let text = file.to_toml();
            match output {
                Some(path) => {
                    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
                    eprintln!("wrote {} classes to {}", file.classes.len(), path.display());
                }
                None => print!("{text}"),
            }
        }
        RatesAction::Import { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let imported = runtime
                .block_on(report::import(&store, &text, now))
                .with_context(|| format!("importing {}", file.display()))?;
            println!("imported {} classes from {}", imported.len(), file.display());
            for class in imported.iter().filter(|c| c.miners < config.calibration.min_miners) {
                println!(
                    "  not used until it has {} miners behind it (calibration.min_miners): {} ({} miners)",
                    config.calibration.min_miners,
                    class.class(),
                    class.miners
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
