//! End-to-end tests live in `tests/`. The library holds what tests, test helpers and the fuzz
//! targets share and what no production crate may carry: the test PKI that stands in for
//! NVIDIA's, and the entry points through which hostile inputs reach the daemons' checks.

pub mod cheats;
pub mod hostile;
pub mod test_pki;

use gpu_attest_miner::config::Limits;
use gpu_attest_validator::config::ValidatorConfig;

/// A miner's limits that say protocol version 3 (`protocol_4` off), as a miner of a release
/// before version 4 does: for the tests and harnesses of version 3's memory phase.
pub fn version_3_limits() -> Limits {
    Limits {
        protocol_4: false,
        ..Limits::default()
    }
}

/// The validator's defaults with `[memory] refuse_version_3 = false`, as a validator that still
/// attests miners of a release before version 4 runs.
pub fn version_3_validator_config() -> ValidatorConfig {
    let mut config = ValidatorConfig::default();
    config.memory.refuse_version_3 = false;
    config
}
