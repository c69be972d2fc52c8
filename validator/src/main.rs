//! `validator`: the thin binary over the gpu-attest-validator library.

use anyhow::{Context, Result, bail};
use clap::Parser;
use gpu_attest_daemon::run::Stopped;
use gpu_attest_shared::identity::Identity;
use gpu_attest_validator::attest::AttestEvent;
use gpu_attest_validator::cli::{ApiArgs, Cli, Command, MinersAction, RatesAction, Settings};
use gpu_attest_validator::operator::{Operator, RegistrationChange};
use gpu_attest_validator::rates::report;
use gpu_attest_validator::store::{self, Store};
use gpu_attest_validator::{ValidatorConfig, daemon, show};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

/// `attest` exits 0 on a pass, 1 on a fail verdict, 2 when it could not attest, and 75 when a
/// GPU the validator verifies on faulted (a fresh process can use it again; one that faulted in
/// the self-check is skipped next time): see `gpu_attest_daemon::exit`.
const EXIT_FAIL: u8 = gpu_attest_daemon::exit::ANSWER_NO;
const EXIT_ERROR: u8 = gpu_attest_daemon::exit::ERROR;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. }) {
        gpu_attest_daemon::signals::end_quietly_when_output_closes();
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Each cause once: most of our errors already print their cause themselves.
            eprintln!("error: {}", gpu_attest_daemon::errors::error_chain(e.as_ref()));
            // A device fault has a status of its own, so that a supervisor restarts the daemon.
            match e.downcast_ref::<daemon::DaemonError>() {
                Some(
                    daemon::DaemonError::Stopped(Stopped::DevicesOutOfService { .. })
                    | daemon::DaemonError::GpuFaulted(_),
                ) => ExitCode::from(gpu_attest_daemon::devices::EXIT_DEVICE_FAULT),
                _ => ExitCode::from(EXIT_ERROR),
            }
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::PublicKey { key_file } => {
            println!("{}", Identity::load_file(&key_file)?.public_key());
            Ok(ExitCode::SUCCESS)
        }
        Command::TlsCerts {
            out,
            validator_hosts,
            miner_hosts,
            days,
        } => {
            let request = gpu_attest_daemon::certs::CertsRequest {
                validator_hosts,
                miner_hosts,
                days,
            };
            for path in gpu_attest_daemon::certs::make(&out, &request)? {
                println!("wrote {}", path.display());
            }
            println!(
                "validator: [tls] cert/key = validator.pem/validator.key, ca = ca.pem (mutual TLS); [miner_tls] ca = ca.pem, cert/key = validator.pem/validator.key"
            );
            println!(
                "each miner: [tls] cert/key = miner-HOST.pem/miner-HOST.key, ca = ca.pem to require the validator's certificate"
            );
            println!(
                "operators: --api https://HOST:PORT --api-ca ca.pem --api-cert operator.pem --api-key operator.key"
            );
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
            let runtime = gpu_attest_daemon::signals::one_shot_runtime()?;
            if filter.follow {
                runtime.block_on(async {
                    let store = Store::open_for_reading(&database).await?;
                    let miner = filter.filter().miner_url;
                    gpu_attest_validator::watch::follow_store(&store, filter.after, miner, |v| {
                        show::print_followed_verdict(v, json)
                    })
                    .await
                })?;
                return Ok(ExitCode::SUCCESS);
            }
            let verdicts = runtime.block_on(async {
                let store = Store::open_for_reading(&database).await?;
                let verdicts = store.verdicts(&filter.filter()).await;
                store.close().await;
                verdicts
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&verdicts)?);
            } else {
                show::print_stored_verdicts(&verdicts);
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
    let runtime = gpu_attest_daemon::signals::one_shot_runtime()?;
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
        show::print_verdict(&verdict, attestor.store().location());
    }
    Ok(if verdict.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAIL)
    })
}

/// `validator miners ...`: one call to a running validator's API.
fn miners(api: &ApiArgs, action: MinersAction) -> Result<ExitCode> {
    let runtime = gpu_attest_daemon::signals::one_shot_runtime()?;
    runtime.block_on(async {
        let address = api.address()?;
        let mut operator = Operator::connect(&address, &api.tls()).await?;
        let json = |value: serde_json::Value| -> Result<ExitCode> {
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(ExitCode::SUCCESS)
        };
        match action {
            MinersAction::Add { url, name, replace_key } => {
                let registration = operator.add(&url, &name, replace_key).await?;
                if api.json {
                    return json(serde_json::to_value(&registration)?);
                }
                let miner = &registration.miner;
                match &registration.change {
                    RegistrationChange::New => {
                        println!("registered {} ({}) with key {}", miner.url, miner.name, miner.miner_key)
                    }
                    RegistrationChange::Renamed { previous_name } => {
                        println!("renamed {} from {previous_name:?} to {:?}", miner.url, miner.name)
                    }
                    RegistrationChange::KeyReplaced { previous_key } => println!(
                        "replaced the key of {} ({}): {previous_key} -> {}",
                        miner.url, miner.name, miner.miner_key
                    ),
                    RegistrationChange::Unchanged => println!(
                        "already registered: {} ({}) with key {}; nothing changed",
                        miner.url, miner.name, miner.miner_key
                    ),
                }
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
                    show::print_miner(m);
                }
            }
            MinersAction::Remove { url } => {
                let removed = operator.remove(&url).await?;
                if api.json {
                    return json(serde_json::json!({ "url": url, "removed": removed }));
                }
                println!("{}", if removed { "removed" } else { "was not registered" });
            }
            MinersAction::Revoked => {
                let keys = operator.revoked().await?;
                if api.json {
                    return json(serde_json::to_value(&keys)?);
                }
                show::print_revoked(&keys);
            }
            MinersAction::Attest { url } => {
                let json = api.json;
                let verdict = operator
                    .attest(&url, |event| {
                        if !json {
                            show::print_attest_event(event);
                        }
                    })
                    .await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&verdict)?);
                } else {
                    show::print_verdict_summaries(std::slice::from_ref(&verdict));
                }
                return Ok(if verdict.passed {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(EXIT_FAIL)
                });
            }
            MinersAction::Verdicts { filter } if filter.follow => {
                let json = api.json;
                let miner = filter.filter().miner_url;
                operator
                    .follow(filter.after, miner, |v| show::print_followed_summary(&v, json))
                    .await?;
            }
            MinersAction::Verdicts { filter } => {
                let verdicts = operator.verdicts(&filter.filter()).await?;
                if api.json {
                    return json(serde_json::to_value(&verdicts)?);
                }
                show::print_verdict_summaries(&verdicts);
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

fn serve(config: ValidatorConfig) -> Result<()> {
    gpu_attest_daemon::logging::init_logging()?;
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
    let runtime = gpu_attest_daemon::signals::one_shot_runtime()?;
    // Only importing writes; showing and exporting read, and so work on a read-only file.
    let importing = matches!(action, RatesAction::Import { .. });
    let store = runtime.block_on(async {
        if importing {
            Store::open(database).await
        } else {
            Store::open_for_reading(database).await
        }
    })?;
    let now = gpu_attest_validator::attest::now_ms();
    let outcome = (|| -> Result<()> {
        match action {
            RatesAction::Show { json } => {
                let table = runtime.block_on(report::table(&store, &config, now))?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&table)?);
                } else {
                    show::print_rate_table(&table, &config);
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
        Ok(())
    })();
    // Closed, so that what an import wrote is checkpointed into the file itself.
    runtime.block_on(store.close());
    outcome?;
    Ok(ExitCode::SUCCESS)
}
