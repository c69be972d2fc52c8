//! What each hardware class is expected to do: the rate a challenge is sized and timed by.
//!
//! Three sources, in order of trust:
//! - **calibrated**: learned by this validator from the rates its passing verdicts proved
//!   ([`calibration`]), once enough distinct miners have voted;
//! - **shared**: imported from another validator's export ([`file`]), so a fleet shares one
//!   table;
//! - **related**: for a class not observed itself, the slowest observed class that the same
//!   model-specific shipped row names (another spelling or variant of the model), so that a
//!   miner cannot escape to first contact by naming its device differently;
//! - **shipped**: the built-in table ([`shipped`]), for first contact with a class.
//!
//! Every observed rate is capped at the class's physical ceiling, and floored at the shipped rate
//! over the first-contact slack: the least a first-contact pass proves, so that miners who hold
//! a class's votes cannot ratchet its rate down round after round. The planner times calibrated
//! and shared classes with the tight slack and shipped ones with the first-contact slack.

pub mod calibration;
pub mod file;
pub mod report;
pub mod shipped;

use crate::config::ValidatorConfig;
use crate::config::calibration::CalibrationConfig;
use crate::config::rates::RateEntry;
use crate::store::SharedRate;
use crate::store::{Store, StoreError};
use crate::verdict::class::{RateClass, RateSource};
use calibration::{Learned, learn};
use std::collections::HashMap;

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
    /// Observed rates are kept at or above the shipped rate over this (the first-contact slack).
    floor_divisor: f64,
    /// The same for walk classes: `[memory] first_contact_slack` over the loosest observed
    /// slack (`slack` or `cpu_slack`), so that an observed walk's deadline (its slack over the
    /// floor) is never looser than first contact's on any backend.
    walk_floor_divisor: f64,
}

impl RateBook {
    /// Only the shipped table: every class is at first contact. Observed rates added later are
    /// not floored until [`RateBook::with_floor`].
    pub fn shipped(shipped: Vec<RateEntry>, calibration: CalibrationConfig) -> Self {
        RateBook {
            shipped,
            calibration,
            learned: HashMap::new(),
            shared: HashMap::new(),
            floor_divisor: f64::INFINITY,
            walk_floor_divisor: f64::INFINITY,
        }
    }

    /// Keeps observed rates at or above the shipped rate over `first_contact_slack`.
    pub fn with_floor(mut self, first_contact_slack: f64) -> Self {
        self.floor_divisor = first_contact_slack.max(1.0);
        self
    }

    /// Keeps observed walk rates at or above the shipped rate over `divisor`.
    pub fn with_walk_floor(mut self, divisor: f64) -> Self {
        self.walk_floor_divisor = divisor.max(1.0);
        self
    }

    /// The tables `config` names, nothing observed yet: every class at first contact, and
    /// observed rates added later floored as `config` says. A walk class is floored by the
    /// memory phase's slacks: miners that hold its votes and walk slowly on purpose cannot
    /// bring its clock below what first contact times a walk at.
    pub fn of_config(config: &ValidatorConfig) -> Self {
        RateBook::shipped(shipped::rate_table(&config.rates), config.calibration.clone())
            .with_floor(config.deadline.first_contact_slack)
            .with_walk_floor(config.memory.first_contact_slack / config.memory.loosest_observed_slack())
    }

    /// The tables `config` names plus what `store` holds for `classes`.
    pub async fn load(
        store: &Store,
        config: &ValidatorConfig,
        classes: impl IntoIterator<Item = RateClass>,
        now_ms: u64,
    ) -> Result<Self, StoreError> {
        let mut book = RateBook::of_config(config);
        let since_ms = now_ms.saturating_sub(u64::from(book.calibration.max_age_days) * 86_400_000);
        let classes: std::collections::BTreeSet<RateClass> = classes.into_iter().collect();
        for class in &classes {
            book.load_class(store, class, since_ms).await?;
        }
        // Classes not observed themselves may borrow from their family (see `related`).
        let families: std::collections::BTreeSet<_> = classes
            .iter()
            .filter(|c| book.observed(c).is_none())
            .filter_map(|c| book.family(c).map(|row| (c.backend.clone(), c.n, row)))
            .collect();
        if !families.is_empty() {
            for other in store.rate_classes().await? {
                let family = book.family(&other).map(|row| (other.backend.clone(), other.n, row));
                if !classes.contains(&other) && family.is_some_and(|f| families.contains(&f)) {
                    book.load_class(store, &other, since_ms).await?;
                }
            }
        }
        Ok(book)
    }

    /// What `store` holds for `class` since `since_ms`: its observations and imported rate.
    async fn load_class(&mut self, store: &Store, class: &RateClass, since_ms: u64) -> Result<(), StoreError> {
        let observations = store.observations(class, since_ms).await?;
        self.learn(class.clone(), &observations);
        if let Some(shared) = store.shared_rate(class, since_ms).await? {
            self.shared.insert(class.clone(), shared);
        }
        Ok(())
    }

    /// The model-specific shipped row that names a class (its family), if any. Catch-all rows
    /// (no model) name no family: their classes have nothing in common but the backend.
    fn family(&self, class: &RateClass) -> Option<usize> {
        self.shipped
            .iter()
            .position(|r| r.matches(class))
            .filter(|&i| !self.shipped[i].model.is_empty())
    }

    /// The class's own observed rate: calibrated, else a shared row with enough miners.
    fn observed(&self, class: &RateClass) -> Option<(f64, RateSource, u32, u32, bool)> {
        if let Some(l) = self.learned.get(class) {
            return Some((
                l.ops_per_unit,
                RateSource::Calibrated,
                l.miners,
                l.observations,
                l.capped,
            ));
        }
        self.shared
            .get(class)
            .filter(|s| s.miners >= self.calibration.min_miners && s.ops_per_unit > 0.0)
            .map(|s| (s.ops_per_unit, RateSource::Shared, s.miners, s.observations, false))
    }

    /// The slowest observed class of the same family, backend and n: a device named so that no
    /// class of its own was observed is still held to what its model does elsewhere. The slowest,
    /// so that an honest variant of a model (a lower-clocked board) is not held to the fastest.
    /// A walk borrows only from walks of its own version: one `walk` row rates both, but a
    /// version 3 walk's rate has the host inside its clock and would time version 4 too loosely.
    fn related(&self, class: &RateClass) -> Option<(f64, u32, u32)> {
        let family = self.family(class)?;
        self.learned
            .keys()
            .chain(self.shared.keys())
            .filter(|other| *other != class && other.backend == class.backend && other.n == class.n)
            .filter(|other| !class.is_walk() || other.kernel == class.kernel)
            .filter(|other| self.family(other) == Some(family))
            .filter_map(|other| self.observed(other))
            .map(|(rate, _, miners, observations, _)| (rate, miners, observations))
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }

    /// Learns `class` from `observations` (newest first), if enough miners voted.
    pub fn learn(&mut self, class: RateClass, observations: &[crate::store::Observation]) {
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

    fn shipped_rate(&self, class: &RateClass) -> f64 {
        shipped::row_for(&self.shipped, class)
            .map(|r| r.ops_per_sec)
            .unwrap_or(shipped::FALLBACK_OPS_PER_SEC)
    }

    /// The least an observed rate may be: what a first-contact pass proves at the least; for a
    /// walk, the rate at which the calibrated slack allows what the first-contact slack does.
    fn floor(&self, class: &RateClass) -> f64 {
        let divisor = if class.is_walk() {
            self.walk_floor_divisor
        } else {
            self.floor_divisor
        };
        (self.shipped_rate(class) / divisor).min(self.ceiling(class))
    }

    pub fn expected(&self, class: &RateClass) -> Expected {
        let ceiling = self.ceiling(class);
        let floor = self.floor(class);
        let (rate, source, miners, observations) = match self.observed(class) {
            Some((rate, source, miners, observations, _)) => (rate, source, miners, observations),
            None => match self.related(class) {
                Some((rate, miners, observations)) => (rate, RateSource::Related, miners, observations),
                None => (self.shipped_rate(class), RateSource::Shipped, 0, 0),
            },
        };
        let capped = rate > ceiling || self.learned.get(class).is_some_and(|l| l.capped);
        let rate = rate.min(ceiling);
        Expected {
            // Observed rates are kept at or above the floor; shipped ones are what they are.
            ops_per_unit: if source.is_observed() { rate.max(floor) } else { rate },
            source,
            miners,
            observations,
            ceiling,
            capped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Observation;

    /// The weaker of two sources is the less trusted, whichever side it is on; ties keep it.
    #[test]
    fn weaker_and_stronger_follow_trust() {
        use RateSource::*;
        let all = [Calibrated, Shared, Related, Shipped];
        for a in all {
            for b in all {
                let (weak, strong) = (a.weaker(b), a.stronger(b));
                assert_eq!(weak.trust(), a.trust().min(b.trust()), "{a:?} {b:?}");
                assert_eq!(strong.trust(), a.trust().max(b.trust()), "{a:?} {b:?}");
                assert_eq!(a.weaker(b), b.weaker(a));
            }
        }
        assert_eq!(Calibrated.weaker(Shipped), Shipped);
        assert_eq!(Related.stronger(Shared), Shared);
    }

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
    fn a_new_spelling_of_an_observed_model_is_held_to_that_model() {
        let mut book = RateBook::shipped(shipped::shipped_rates(), CalibrationConfig::default());
        book.learn(class("nvidia h100 80gb hbm3"), &votes(1.1e15, 3));
        book.learn(class("nvidia h100 80gb hbm3 oc"), &votes(1.3e15, 3));
        // Not observed itself, but the shipped H100 row names it: the slowest H100 class.
        let renamed = book.expected(&class("nvidia h100 80gb hbm3 (rev b)"));
        assert_eq!(
            (renamed.source, renamed.ops_per_unit, renamed.miners),
            (RateSource::Related, 1.1e15, 3)
        );
        assert!(renamed.source.is_observed(), "timed with the tight slack");
        // Another row's model, another size or backend, or a catch-all row borrows nothing.
        assert_eq!(book.expected(&class("NVIDIA H100 PCIe")).source, RateSource::Shipped);
        let other_n = RateClass {
            n: 4096,
            ..class("nvidia h100 80gb hbm3 (rev b)")
        };
        assert_eq!(book.expected(&other_n).source, RateSource::Shipped);
        assert_eq!(book.expected(&class("some future gpu")).source, RateSource::Shipped);
    }

    #[test]
    fn observed_rates_never_fall_below_what_first_contact_proves() {
        let h100 = class("NVIDIA H100 80GB HBM3");
        let mut book = RateBook::shipped(shipped::shipped_rates(), CalibrationConfig::default()).with_floor(3.0);
        // Miners holding the class's votes have ratcheted it down to a crawl.
        book.learn(h100.clone(), &votes(1.0e12, 3));
        assert_eq!(book.expected(&h100).ops_per_unit, 1.979e15 / 2.0 / 3.0);
    }

    /// A walk class whose votes are held by miners walking slowly on purpose is floored where
    /// its calibrated deadline allows what first contact does (slack 1.5 over 0.5625 of the
    /// datasheet against 2.0 over 0.75), not at the compute floor's third of the shipped rate.
    #[test]
    fn a_walk_class_is_not_ratcheted_below_first_contact() {
        let walk = RateClass {
            kernel: crate::verdict::class::WALK_V4_KERNEL.into(),
            ..class("NVIDIA H100 80GB HBM3")
        };
        let mut book = RateBook::shipped(shipped::shipped_rates(), CalibrationConfig::default())
            .with_floor(3.0)
            .with_walk_floor(2.0 / 1.5);
        book.learn(walk.clone(), &votes(1.0e11, 3));
        let floored = book.expected(&walk);
        assert_eq!(floored.source, RateSource::Calibrated);
        assert!(
            (floored.ops_per_unit - 0.75 * 3.35e12 * 1.5 / 2.0).abs() < 1.0,
            "{floored:?}"
        );
        assert!(1.5 / floored.ops_per_unit <= 2.0 / (0.75 * 3.35e12) * (1.0 + 1e-12));
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
