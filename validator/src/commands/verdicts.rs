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

/// `verdicts export ID --out FILE`: verdict `id`'s kept transcript, written to `out` (never
/// over a file already there), for `validator audit`.
pub(super) fn export(database: &Path, id: u64, out: &Path) -> Result<Answer, CommandError> {
    require_database(database)?;
    let bytes = runtime()?.block_on(async {
        let store = Store::open_for_reading(database).await?;
        let found = store.transcript(id).await;
        let exists = match &found {
            Ok(None) => {
                let filter = crate::store::VerdictFilter {
                    before_id: Some(id.saturating_add(1)),
                    limit: 1,
                    ..Default::default()
                };
                store
                    .verdicts(&filter)
                    .await
                    .map(|v| v.first().is_some_and(|v| v.id == id))
            }
            _ => Ok(true),
        };
        store.close().await;
        Ok::<_, CommandError>((found?, exists?))
    })?;
    let bytes = match bytes {
        (Some(bytes), _) => bytes,
        (None, true) => return Err(CommandError::NoTranscript(id)),
        (None, false) => return Err(CommandError::NoVerdict(id)),
    };
    eprintln!("{}", super::write_transcript(id, out, &bytes)?);
    Ok(Answer::Yes)
}
