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
        let address = api.address()?;
        let mut operator = Operator::connect(&address, &api.tls()?).await?;
        let json = api.json;
        match action {
            MinersAction::Add { url, name, replace_key } => {
                let registration = operator.add(&url, &name, replace_key).await?;
                if json {
                    print_json(&registration)?;
                } else {
                    print_registration(&registration);
                }
                if registration.allows_this_validator == Some(false) {
                    eprintln!(
                        "warning: {} says it does not allow this validator: it will refuse every challenge until its operator adds this validator's public key (`validator public-key`) to the miner's allowed_validators and reloads it",
                        registration.miner.url
                    );
                }
            }
            MinersAction::List => {
                let miners = operator.list().await?;
                if json {
                    print_json(&miners)?;
                } else if miners.is_empty() {
                    println!("no miners registered");
                } else {
                    miners.iter().for_each(show::print_miner);
                }
            }
            MinersAction::Remove { url } => {
                let removed = operator.remove(&url).await?;
                if json {
                    print_json(&serde_json::json!({ "url": url, "removed": removed }))?;
                } else {
                    println!("{}", if removed { "removed" } else { "was not registered" });
                }
            }
            MinersAction::Rates => {
                let table = operator.rates().await?;
                if json {
                    print_json(&table)?;
                } else {
                    show::print_rate_table(&table);
                }
            }
            MinersAction::Revoked => {
                let keys = operator.revoked().await?;
                if json {
                    print_json(&keys)?;
                } else {
                    show::print_revoked(&keys);
                }
            }
            MinersAction::Attest { url } => {
                let mut lines = show::ProgressLines::new();
                let verdict = operator
                    .attest(&url, |event| {
                        if !json {
                            show::print_attest_event(event, &mut lines);
                        }
                    })
                    .await?;
                if json {
                    print_json(&verdict)?;
                } else {
                    show::print_stored_verdicts(std::slice::from_ref(&verdict));
                }
                return Ok(Answer::from_passed(verdict.passed));
            }
            MinersAction::Verdicts { filter } if filter.follow => {
                let miner = filter.filter().miner_url;
                operator
                    .follow(filter.after, miner, |v| show::print_followed_verdict(&v, json))
                    .await?;
            }
            MinersAction::Verdicts { filter } => {
                let verdicts = operator.verdicts(&filter.filter()).await?;
                if json {
                    print_json(&verdicts)?;
                } else {
                    show::print_stored_verdicts(&verdicts);
                }
            }
            MinersAction::Revoke { key, reason } => {
                let newly_revoked = operator.revoke(&key, &reason).await?;
                if json {
                    print_json(&serde_json::json!({ "miner_key": key, "newly_revoked": newly_revoked }))?;
                } else {
                    println!("{}", if newly_revoked { "revoked" } else { "was already revoked" });
                }
            }
        }
        Ok(Answer::Yes)
    })
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
