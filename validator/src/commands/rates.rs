//! `validator rates`: the expected rate of each hardware class. It works on the database file,
//! like `verdicts`, so it runs beside a serving validator (SQLite's WAL lets both open it).

use super::{Answer, CommandError, print_json, require_database, runtime};
use crate::cli::RatesAction;
use crate::rates::report;
use crate::store::Store;
use crate::{ValidatorConfig, show};
use std::path::{Path, PathBuf};

/// Shows, exports or imports the rate table of the validator `config` (and `database`, when
/// given) describe.
pub(super) fn rates(
    config: Option<&Path>,
    database: Option<PathBuf>,
    action: RatesAction,
) -> Result<Answer, CommandError> {
    let mut config = ValidatorConfig::load(config)?;
    if let Some(database) = database {
        config.database = database;
    }
    config.validate()?;
    // Only importing writes, and it may prepare a validator's database before its first run;
    // showing and exporting read, so they need a database and work on a read-only file.
    let importing = matches!(action, RatesAction::Import { .. });
    let database = config.database.as_path();
    if !importing {
        require_database(database)?;
    }
    let runtime = runtime()?;
    let store = runtime.block_on(async {
        if importing {
            Store::open(database).await
        } else {
            Store::open_for_reading(database).await
        }
    })?;
    let outcome = runtime.block_on(act(&store, &config, action));
    // Closed, so that what an import wrote is checkpointed into the file itself.
    runtime.block_on(store.close());
    outcome.map(|()| Answer::Yes)
}

async fn act(store: &Store, config: &ValidatorConfig, action: RatesAction) -> Result<(), CommandError> {
    let now = crate::attest::now_ms();
    match action {
        RatesAction::Show { json } => {
            let table = report::table(store, config, now).await?;
            if json {
                print_json(&table)?;
            } else {
                show::print_rate_table(&table);
            }
        }
        RatesAction::Export { output } => {
            let file = report::export(store, config, now).await?;
            let text = file.to_toml();
            match output {
                Some(path) => {
                    gpu_attest_daemon::command::write_file(&path, text)?;
                    eprintln!("wrote {} classes to {}", file.classes.len(), path.display());
                }
                None => print!("{text}"),
            }
        }
        RatesAction::Import { file } => {
            let text = gpu_attest_daemon::command::read_text(&file)?;
            let imported = report::import(store, &text, now)
                .await
                .map_err(|source| CommandError::Import {
                    path: file.clone(),
                    source,
                })?;
            println!("imported {} classes from {}", imported.len(), file.display());
            let min_miners = config.calibration.min_miners;
            for class in imported.iter().filter(|c| c.miners < min_miners) {
                println!(
                    "  not used until it has {min_miners} miners behind it (calibration.min_miners): {} ({} miners)",
                    class.class(),
                    class.miners
                );
            }
        }
    }
    Ok(())
}
