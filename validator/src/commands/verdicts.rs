//! `validator verdicts`: the stored verdicts, read from the database file (or PostgreSQL)
//! directly, so that it works beside a serving validator and without one.

use super::{Answer, CommandError, print_json, require_database, runtime};
use crate::cli::VerdictFilterArgs;
use crate::show;
use crate::store::Store;
use std::path::Path;

/// Lists the newest verdicts `filter` selects, or with `--follow` prints each one as it is
/// stored until stopped.
pub(super) fn list_or_follow(database: &Path, filter: &VerdictFilterArgs, json: bool) -> Result<Answer, CommandError> {
    require_database(database)?;
    let runtime = runtime()?;
    if filter.follow {
        runtime.block_on(async {
            let store = Store::open_for_reading(database).await?;
            let miner = filter.filter().miner_url;
            crate::watch::follow_store(&store, filter.after, miner, |v| show::print_followed_verdict(v, json)).await
        })?;
        return Ok(Answer::Yes);
    }
    let verdicts = runtime.block_on(async {
        let store = Store::open_for_reading(database).await?;
        let verdicts = store.verdicts(&filter.filter()).await;
        store.close().await;
        verdicts
    })?;
    if json {
        print_json(&verdicts)?;
    } else {
        show::print_stored_verdicts(&verdicts);
    }
    Ok(Answer::Yes)
}
