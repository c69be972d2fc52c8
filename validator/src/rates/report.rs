//! `validator rates`: the table as this validator sees it, and its export and import.

use super::file::{FORMAT, RateFile, RateFileError, SharedClass};
use super::shipped;
use super::{Expected, RateBook, RateClass, RateEntry, RateSource};
use crate::config::ValidatorConfig;
use crate::store::Observation;
use crate::store::{Store, StoreError};
use gpu_attest_proto::v1;
use serde::Serialize;

/// One class this validator has observed or imported, and the rate it would plan with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassRow {
    #[serde(flatten)]
    pub class: RateClass,
    pub unit: &'static str,
    /// "calibrated", "shared" or "shipped" (not yet enough miners).
    pub source: String,
    pub ops_per_sec: f64,
    pub miners: u32,
    pub observations: u32,
    pub ceiling: f64,
    pub capped: bool,
    /// What this validator saw of the class itself within `calibration.max_age_days`, whether
    /// or not it was enough to calibrate: passes and the distinct miners behind them. A class
    /// still planned from the shipped table shows here how far it is from its own rate.
    pub seen_observations: u32,
    pub seen_miners: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RateTable {
    pub classes: Vec<ClassRow>,
    pub shipped: Vec<RateEntry>,
    /// Distinct miners a class needs before it is calibrated.
    pub calibration_min_miners: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum RatesError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    File(#[from] RateFileError),
}

async fn book(store: &Store, config: &ValidatorConfig, now_ms: u64) -> Result<(Vec<RateClass>, RateBook), StoreError> {
    let classes = store.rate_classes().await?;
    let book = RateBook::load(store, config, classes.clone(), now_ms).await?;
    Ok((classes, book))
}

fn row(class: RateClass, e: Expected, seen: &[Observation]) -> ClassRow {
    let seen_miners = seen
        .iter()
        .map(|o| o.miner_key)
        .collect::<std::collections::HashSet<_>>();
    ClassRow {
        seen_observations: u32::try_from(seen.len()).unwrap_or(u32::MAX),
        seen_miners: u32::try_from(seen_miners.len()).unwrap_or(u32::MAX),
        unit: class.unit().as_str(),
        class,
        source: e.source.to_string(),
        ops_per_sec: e.ops_per_unit,
        miners: e.miners,
        observations: e.observations,
        ceiling: e.ceiling,
        capped: e.capped,
    }
}

pub async fn table(store: &Store, config: &ValidatorConfig, now_ms: u64) -> Result<RateTable, StoreError> {
    let (classes, book) = book(store, config, now_ms).await?;
    let since_ms = now_ms.saturating_sub(u64::from(config.calibration.max_age_days) * 86_400_000);
    let mut rows = Vec::with_capacity(classes.len());
    for class in classes {
        let seen = store.observations(&class, since_ms).await?;
        let e = book.expected(&class);
        rows.push(row(class, e, &seen));
    }
    Ok(RateTable {
        classes: rows,
        shipped: shipped::rate_table(&config.rates),
        calibration_min_miners: config.calibration.min_miners,
    })
}

/// The table as the API sends it (ListRates).
pub fn table_to_wire(t: &RateTable) -> v1::ListRatesResponse {
    v1::ListRatesResponse {
        classes: t
            .classes
            .iter()
            .map(|c| v1::RateClassRow {
                backend: c.class.backend.clone(),
                kernel: c.class.kernel.clone(),
                model: c.class.model.clone(),
                n: c.class.n,
                unit: c.unit.into(),
                source: c.source.clone(),
                ops_per_sec: c.ops_per_sec,
                miners: c.miners,
                observations: c.observations,
                ceiling: c.ceiling,
                capped: c.capped,
                seen_observations: c.seen_observations,
                seen_miners: c.seen_miners,
            })
            .collect(),
        shipped: t
            .shipped
            .iter()
            .map(|r| v1::ShippedRate {
                backend: r.backend.clone(),
                kernel: r.kernel.clone(),
                model: r.model.clone(),
                ops_per_sec: r.ops_per_sec,
                peak_ops_per_sec: r.peak_ops_per_sec,
                source: r.source.clone(),
            })
            .collect(),
        calibration_min_miners: t.calibration_min_miners,
    }
}

/// The API's table as this validator's, so that `validator miners rates` prints what `validator
/// rates show` does.
pub fn table_from_wire(t: &v1::ListRatesResponse) -> RateTable {
    RateTable {
        classes: t
            .classes
            .iter()
            .map(|c| {
                let class = RateClass {
                    backend: c.backend.clone(),
                    kernel: c.kernel.clone(),
                    model: c.model.clone(),
                    n: c.n,
                };
                ClassRow {
                    unit: class.unit().as_str(),
                    class,
                    source: c.source.clone(),
                    ops_per_sec: c.ops_per_sec,
                    miners: c.miners,
                    observations: c.observations,
                    ceiling: c.ceiling,
                    capped: c.capped,
                    seen_observations: c.seen_observations,
                    seen_miners: c.seen_miners,
                }
            })
            .collect(),
        shipped: t
            .shipped
            .iter()
            .map(|r| RateEntry {
                backend: r.backend.clone(),
                kernel: r.kernel.clone(),
                model: r.model.clone(),
                ops_per_sec: r.ops_per_sec,
                peak_ops_per_sec: r.peak_ops_per_sec,
                source: r.source.clone(),
            })
            .collect(),
        calibration_min_miners: t.calibration_min_miners,
    }
}

/// The rates this validator calibrated itself, as a rate file. Shipped guesses are left out
/// (every validator has them), and so are imported rows (they are another validator's word, to
/// be shared by that validator), and any row another validator would refuse.
pub async fn export(store: &Store, config: &ValidatorConfig, now_ms: u64) -> Result<RateFile, StoreError> {
    let (classes, book) = book(store, config, now_ms).await?;
    Ok(RateFile {
        format: FORMAT,
        classes: classes
            .iter()
            .filter_map(|c| {
                let e = book.expected(c);
                let row = SharedClass::new(c, &e);
                (e.source == RateSource::Calibrated && row.is_importable()).then_some(row)
            })
            .collect(),
    })
}

/// Imports a rate file's rows as shared rates; all or nothing. Returns the rows imported.
pub async fn import(store: &Store, text: &str, now_ms: u64) -> Result<Vec<SharedClass>, RatesError> {
    let file = RateFile::parse(text)?;
    let rows: Vec<_> = file.classes.iter().map(|c| (c.class(), c.rate())).collect();
    store.import_shared_rates(&rows, now_ms).await?;
    Ok(file.classes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ClassObservation, test_support::passing_verdict};

    /// Below `min_miners` a class is planned from the shipped table, and the table still says
    /// what this validator saw of it: how far it is from a rate of its own.
    #[tokio::test]
    async fn a_class_not_yet_calibrated_shows_what_was_seen_of_it() {
        let config = ValidatorConfig::default();
        assert!(
            config.calibration.min_miners > 2,
            "the test needs a class short of miners"
        );
        let class = RateClass {
            backend: "cpu".into(),
            kernel: "portable".into(),
            model: "cpu: test".into(),
            n: 64,
        };
        for (store, _scratch) in crate::store::test_stores("report-seen").await {
            // Two passes by one miner, one by another.
            for (nonce, miner) in [(1u8, 1u8), (2, 1), (3, 2)] {
                assert!(store.claim_nonce(&[nonce; 32], "http://m", 1).await.unwrap());
                let observation = ClassObservation {
                    class: class.clone(),
                    miner_key: [miner; 32],
                    ops_per_unit: 4.0e9,
                };
                store
                    .record_verdict(&passing_verdict([nonce; 32]), std::slice::from_ref(&observation))
                    .await
                    .unwrap();
            }
            let table = table(&store, &config, 2_000).await.unwrap();
            let row = table.classes.iter().find(|r| r.class == class).expect("class listed");
            assert_ne!(row.source, "calibrated");
            assert_eq!((row.miners, row.observations), (0, 0), "nothing observed is used yet");
            assert_eq!((row.seen_observations, row.seen_miners), (3, 2));
        }
    }
}
