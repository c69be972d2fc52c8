//! `miner info`: the backend this config selects, and what was detected.

use super::{Answer, CommandError, print_json};
use crate::cli::Settings;
use crate::{backends, show};
use gpu_attest_kernels::detect::detect;

pub(super) fn info(settings: &Settings, json: bool) -> Result<Answer, CommandError> {
    let config = settings.resolve()?;
    let detection = detect();
    let selected = backends::select_detected(&config, &detection)?;
    if json {
        print_json(&show::info_json(&selected, &detection))?;
    } else {
        show::print_info(&selected, &detection);
    }
    Ok(Answer::Yes)
}
