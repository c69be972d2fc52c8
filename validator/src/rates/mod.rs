//! What each hardware class is expected to do: the rate a challenge is sized and timed by.
//!
//! Three sources, in order of trust:
//! - **calibrated**: learned by this validator from the rates its passing verdicts proved
//!   ([`calibration`]), once enough distinct miners have voted;
//! - **shared**: imported from another validator's export ([`file`]), so a fleet shares one
//!   table;
//! - **shipped**: the built-in table ([`shipped`]), for first contact with a class.
//!
//! Every rate is capped at the class's physical ceiling. The planner times calibrated and shared
//! classes with the tight slack and shipped ones with the first-contact slack.

pub mod calibration;
pub mod class;
pub mod file;
pub mod report;
pub mod shipped;

use crate::store::{Store, StoreError};
use calibration::{CalibrationConfig, Learned, learn};
pub use class::{RateClass, Unit};
use serde::{Deserialize, Serialize};
pub use shipped::RateEntry;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateSource {
    Calibrated,
    Shared,
    Shipped,
}

impl RateSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RateSource::Calibrated => "calibrated",
            RateSource::Shared => "shared",
            RateSource::Shipped => "shipped",
        }
    }

    pub fn parse(s: &str) -> Option<RateSource> {
        [RateSource::Calibrated, RateSource::Shared, RateSource::Shipped]
            .into_iter()
            .find(|r| r.as_str() == s)
    }

    /// Whether the rate was observed on real miners (tight slack) or is a first-contact guess.
    pub fn is_observed(self) -> bool {
        self != RateSource::Shipped
    }
}

impl std::fmt::Display for RateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An imported row: a rate another validator learned, with the evidence it reported.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedRate {
    pub ops_per_unit: f64,
    pub miners: u32,
    pub observations: u32,
}

/// The rate a class is expected to sustain, per unit, and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expected {
    pub ops_per_unit: f64,
    pub source: RateSource,
    /// Distinct miners behind an observed rate; 0 for a shipped one.
    pub miners: u32,
    pub observations: u32,
    pub ceiling: f64,
    /// An observed rate above the ceiling was cut to it.
    pub capped: bool,
}

/// The rates one planning decision needs: the shipped table, and what this validator learned
/// or imported for the classes at hand.
#[derive(Clone, Debug)]
pub struct RateBook {
    shipped: Vec<RateEntry>,
    calibration: CalibrationConfig,
    learned: HashMap<RateClass, Learned>,
    shared: HashMap<RateClass, SharedRate>,
}

impl RateBook {
    /// Only the shipped table: every class is at first contact.
    pub fn shipped(shipped: Vec<RateEntry>, calibration: CalibrationConfig) -> Self {
        RateBook {
            shipped,
            calibration,
            learned: HashMap::new(),
            shared: HashMap::new(),
        }
    }

    /// The shipped table plus what `store` holds for `classes`.
    pub fn load(
        store: &Store,
        shipped: Vec<RateEntry>,
        calibration: CalibrationConfig,
        classes: impl IntoIterator<Item = RateClass>,
        now_ms: u64,
    ) -> Result<Self, StoreError> {
        let mut book = RateBook::shipped(shipped, calibration);
        let since_ms = now_ms.saturating_sub(u64::from(book.calibration.max_age_days) * 86_400_000);
        for class in classes {
            if book.learned.contains_key(&class) || book.shared.contains_key(&class) {
                continue;
            }
            let observations = store.observations(&class, since_ms)?;
            book.learn(class.clone(), &observations);
            if let Some(shared) = store.shared_rate(&class)? {
                book.shared.insert(class, shared);
            }
        }
        Ok(book)
    }

    /// Learns `class` from `observations` (newest first), if enough miners voted.
    pub fn learn(&mut self, class: RateClass, observations: &[calibration::Observation]) {
        let ceiling = shipped::peak_for(&self.shipped, &class);
        if let Some(learned) = learn(observations, &self.calibration, ceiling) {
            self.learned.insert(class, learned);
        }
    }

    pub fn share(&mut self, class: RateClass, rate: SharedRate) {
        self.shared.insert(class, rate);
    }

    pub fn ceiling(&self, class: &RateClass) -> f64 {
        shipped::peak_for(&self.shipped, class)
    }

    pub fn expected(&self, class: &RateClass) -> Expected {
        let ceiling = self.ceiling(class);
        if let Some(l) = self.learned.get(class) {
            return Expected {
                ops_per_unit: l.ops_per_unit,
                source: RateSource::Calibrated,
                miners: l.miners,
                observations: l.observations,
                ceiling,
                capped: l.capped,
            };
        }
        // An imported row counts only with as much evidence as this validator would demand.
        if let Some(s) = self
            .shared
            .get(class)
            .filter(|s| s.miners >= self.calibration.min_miners && s.ops_per_unit > 0.0)
        {
            return Expected {
                ops_per_unit: s.ops_per_unit.min(ceiling),
                source: RateSource::Shared,
                miners: s.miners,
                observations: s.observations,
                ceiling,
                capped: s.ops_per_unit > ceiling,
            };
        }
        let rate = shipped::row_for(&self.shipped, class)
            .map(|r| r.ops_per_sec)
            .unwrap_or(shipped::FALLBACK_OPS_PER_SEC);
        Expected {
            ops_per_unit: rate.min(ceiling),
            source: RateSource::Shipped,
            miners: 0,
            observations: 0,
            ceiling,
            capped: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::calibration::Observation;
    use super::*;

    fn class(model: &str) -> RateClass {
        RateClass {
            backend: "cuda".into(),
            kernel: "tensor".into(),
            model: model.into(),
            n: 2048,
        }
    }

    fn votes(rate: f64, miners: u8) -> Vec<Observation> {
        (1..=miners)
            .map(|m| Observation {
                miner_key: [m; 32],
                ops_per_unit: rate,
            })
            .collect()
    }

    #[test]
    fn calibrated_beats_shared_beats_shipped() {
        let h100 = class("NVIDIA H100 80GB HBM3");
        let mut book = RateBook::shipped(shipped::shipped_rates(), CalibrationConfig::default());
        let first = book.expected(&h100);
        assert_eq!(
            (first.source, first.ops_per_unit),
            (RateSource::Shipped, 1.979e15 / 2.0)
        );
        // A shared row with less evidence than this validator demands is not used.
        let thin = SharedRate {
            ops_per_unit: 1.2e15,
            miners: 2,
            observations: 9,
        };
        book.share(h100.clone(), thin);
        assert_eq!(book.expected(&h100).source, RateSource::Shipped);
        book.share(h100.clone(), SharedRate { miners: 5, ..thin });
        let shared = book.expected(&h100);
        assert_eq!(
            (shared.source, shared.ops_per_unit, shared.miners),
            (RateSource::Shared, 1.2e15, 5)
        );
        book.learn(h100.clone(), &votes(1.1e15, 3));
        let own = book.expected(&h100);
        assert_eq!(
            (own.source, own.ops_per_unit, own.miners),
            (RateSource::Calibrated, 1.1e15, 3)
        );
        // Too few of our own votes leaves the shared row in charge.
        let a100 = class("NVIDIA A100");
        book.learn(a100.clone(), &votes(3.0e14, 2));
        assert_eq!(book.expected(&a100).source, RateSource::Shipped);
    }

    #[test]
    fn imported_rates_are_capped_too() {
        let h100 = class("NVIDIA H100 80GB HBM3");
        let mut book = RateBook::shipped(shipped::shipped_rates(), CalibrationConfig::default());
        book.share(
            h100.clone(),
            SharedRate {
                ops_per_unit: 9.0e15,
                miners: 50,
                observations: 500,
            },
        );
        let e = book.expected(&h100);
        assert_eq!((e.ops_per_unit, e.capped), (1.979e15, true));
    }
}
