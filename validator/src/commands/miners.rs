//! `validator miners ...`: one call to a running validator's API, printed for a person or, with
//! `--json`, for a script.

use super::{Answer, CommandError, print_json, runtime};
use crate::cli::{ApiArgs, MinersAction};
use crate::operator::{Operator, Registration, RegistrationChange};
use crate::show;

/// Runs `action` against the API `api` names. `attest` answers no on a fail verdict; every other
/// action answers yes once the API has done it.
pub(super) fn miners(api: &ApiArgs, action: MinersAction) -> Result<Answer, CommandError> {
    runtime()?.block_on(async {
        let mut operator = Operator::connect(&api.address()?, &api.tls()?).await?;
        run_action(&mut operator, action, api.json).await
    })
}

async fn run_action(operator: &mut Operator, action: MinersAction, json: bool) -> Result<Answer, CommandError> {
    match action {
        MinersAction::Add { url, name, replace_key } => add(operator, &url, &name, replace_key, json).await?,
        MinersAction::List => shown(json, &operator.list().await?, |miners| {
            if miners.is_empty() {
                println!("no miners registered");
            }
            miners.iter().for_each(show::print_miner);
        })?,
        MinersAction::Remove { url } => {
            let removed = operator.remove(&url).await?;
            let answer = serde_json::json!({ "url": url, "removed": removed });
            shown(json, &answer, |_| {
                println!("{}", if removed { "removed" } else { "was not registered" })
            })?;
        }
        MinersAction::Rates => shown(json, &operator.rates().await?, show::print_rate_table)?,
        MinersAction::Revoked => shown(json, &operator.revoked().await?, |keys| show::print_revoked(keys))?,
        MinersAction::Attest { url } => return attest(operator, &url, json).await,
        MinersAction::Verdicts { filter } if filter.follow => {
            let miner = filter.filter().miner_url;
            operator
                .follow(filter.after, miner, |v| show::print_followed_verdict(&v, json))
                .await?;
        }
        MinersAction::Verdicts { filter } => shown(json, &operator.verdicts(&filter.filter()).await?, |verdicts| {
            show::print_stored_verdicts(verdicts)
        })?,
        MinersAction::Transcript { id, out } => {
            let bytes = operator.transcript(id).await?;
            let wrote = super::write_transcript(id, &out, &bytes)?;
            let answer = serde_json::json!({ "verdict": id, "path": out, "bytes": bytes.len() });
            shown(json, &answer, |_| println!("{wrote}"))?;
        }
        MinersAction::Revoke { key, reason } => {
            let newly_revoked = operator.revoke(&key, &reason).await?;
            let answer = serde_json::json!({ "miner_key": key, "newly_revoked": newly_revoked });
            shown(json, &answer, |_| {
                println!(
                    "{}",
                    if newly_revoked {
                        "revoked"
                    } else {
                        "was already revoked"
                    }
                )
            })?;
        }
    }
    Ok(Answer::Yes)
}

/// Prints `value` as JSON for a script, or as `for_a_person` shows it.
fn shown<T: serde::Serialize>(json: bool, value: &T, for_a_person: impl FnOnce(&T)) -> Result<(), CommandError> {
    if json {
        print_json(value)
    } else {
        for_a_person(value);
        Ok(())
    }
}

/// `miners add`: registers (or renames, or replaces the key of) a miner, and warns when the
/// miner says it will refuse this validator.
async fn add(
    operator: &mut Operator,
    url: &str,
    name: &str,
    replace_key: bool,
    json: bool,
) -> Result<(), CommandError> {
    let registration = operator.add(url, name, replace_key).await?;
    shown(json, &registration, print_registration)?;
    if registration.allows_this_validator == Some(false) {
        eprintln!(
            "warning: {} says it does not allow this validator: it will refuse every challenge until its operator adds this validator's public key (`validator public-key`) to the miner's allowed_validators and reloads it",
            registration.miner.url
        );
    }
    Ok(())
}

/// `miners attest`: the attestation's events as they come (for a person), then its verdict;
/// answers no on a fail.
async fn attest(operator: &mut Operator, url: &str, json: bool) -> Result<Answer, CommandError> {
    let mut lines = show::ProgressLines::new();
    let verdict = operator
        .attest(url, |event| {
            if !json {
                show::print_attest_event(event, &mut lines);
            }
        })
        .await?;
    shown(json, &verdict, |v| show::print_stored_verdicts(std::slice::from_ref(v)))?;
    Ok(Answer::from_passed(verdict.passed))
}

/// What `miners add` changed, in one line.
fn print_registration(registration: &Registration) {
    let miner = &registration.miner;
    match &registration.change {
        RegistrationChange::New => println!("registered {} ({}) with key {}", miner.url, miner.name, miner.miner_key),
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
