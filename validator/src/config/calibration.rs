//! The `[calibration]` section of the validator's configuration: how it learns a class's rate
//! from passing verdicts (`rates::calibration`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CalibrationConfig {
    /// Distinct miner keys a class needs before its learned rate is used.
    pub min_miners: u32,
    /// Newest observations per miner that its vote is taken from.
    pub per_miner: u32,
    /// Observations older than this are ignored, so the rate follows software and driver
    /// upgrades.
    pub max_age_days: u32,
    /// Learn only from miners registered with this validator under the key they presented:
    /// registration is the operator's act, so the votes are the operator's fleet. Off, every
    /// passing attestation teaches, including one-shot `attest` runs against any URL.
    pub registered_only: bool,
}

impl Default for CalibrationConfig {
    fn default() -> Self {
        CalibrationConfig {
            min_miners: 3,
            per_miner: 16,
            max_age_days: 30,
            registered_only: true,
        }
    }
}
