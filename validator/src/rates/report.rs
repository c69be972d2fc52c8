//! `validator rates`: the table as this validator sees it, and its export and import.

use super::file::{FORMAT, RateFile, RateFileError, SharedClass};
use super::{Expected, RateBook, RateClass, RateEntry, RateSource};
use crate::config::ValidatorConfig;
use crate::store::{Store, StoreError};
use serde::Serialize;

/// One class this validator has observed or imported, and the rate it would plan with.
#[derive(Clone, Debug, Serialize)]
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
}

#[derive(Clone, Debug, Serialize)]
pub struct RateTable {
    pub classes: Vec<ClassRow>,
    pub shipped: Vec<RateEntry>,
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

fn row(class: RateClass, e: Expected) -> ClassRow {
    ClassRow {
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
    Ok(RateTable {
        classes: classes
            .into_iter()
            .map(|c| {
                let e = book.expected(&c);
                row(c, e)
            })
            .collect(),
        shipped: config.rate_table(),
    })
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
