//! Which silicon a claimed model is: the chip its certificate must name, and the project SKUs an
//! operator knows for it.
//!
//! A model name (NVML's, such as `NVIDIA H100 80GB HBM3`) is matched by its words: the table's
//! word must be one of the name's whitespace-separated words, so that `H20` does not match
//! `H200`.

use serde::{Deserialize, Serialize};

/// The chips the validator knows without being told: every Hopper data-centre part is a GH100.
const BUILT_IN_CHIPS: &[(&str, &str)] = &[
    ("H100", "GH100"),
    ("H200", "GH100"),
    ("H800", "GH100"),
    ("H20", "GH100"),
    ("GH200", "GH100"),
];

/// One operator-supplied row: the model word a chip stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChipEntry {
    /// A word of the model name, such as `B200`.
    pub model: String,
    /// The chip its certificate names, such as `GB100`.
    pub chip: String,
}

/// One operator-supplied row: a board project and SKU, as a report's opaque data names them,
/// and the model word it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkuEntry {
    /// The report's project (opaque field 17), such as `G520`.
    pub project: String,
    /// The report's project SKU (opaque field 18), such as `0200`.
    pub project_sku: String,
    /// A word of the model names this SKU is sold as, such as `H100`.
    pub model: String,
}

/// The chip and SKU knowledge a validator checks evidence against.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkuTable {
    /// Chips beyond the built-in Hopper ones.
    #[serde(default)]
    pub chips: Vec<ChipEntry>,
    /// Project SKUs the operator knows; a report whose SKU is listed must name a listed model.
    #[serde(default)]
    pub skus: Vec<SkuEntry>,
}

/// Whether `word` is one of the words of `model`, ignoring case.
fn has_word(model: &str, word: &str) -> bool {
    model.split_whitespace().any(|part| part.eq_ignore_ascii_case(word))
}

/// The chip of a model name from the built-in table alone.
pub fn chip_of_model(model: &str) -> Option<&'static str> {
    BUILT_IN_CHIPS
        .iter()
        .find(|(word, _)| has_word(model, word))
        .map(|(_, chip)| *chip)
}

impl SkuTable {
    /// The chip the operator's rows, then the built-in table, give for a model name.
    pub fn chip_for(&self, model: &str) -> Option<String> {
        self.chips
            .iter()
            .find(|entry| has_word(model, &entry.model))
            .map(|entry| entry.chip.clone())
            .or_else(|| chip_of_model(model).map(str::to_string))
    }

    /// The model words the operator lists for a project SKU: empty when it is not listed.
    pub fn models_for_sku(&self, project: &str, project_sku: &str) -> Vec<&str> {
        self.skus
            .iter()
            .filter(|entry| {
                entry.project.eq_ignore_ascii_case(project) && entry.project_sku.eq_ignore_ascii_case(project_sku)
            })
            .map(|entry| entry.model.as_str())
            .collect()
    }

    /// Whether a listed SKU may be the claimed model: true when the SKU is not listed.
    pub fn sku_may_be(&self, project: &str, project_sku: &str, model: &str) -> bool {
        let models = self.models_for_sku(project, project_sku);
        models.is_empty() || models.iter().any(|word| has_word(model, word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_match_by_whole_words() {
        assert_eq!(chip_of_model("NVIDIA H100 80GB HBM3"), Some("GH100"));
        assert_eq!(chip_of_model("NVIDIA H200"), Some("GH100"));
        assert_eq!(chip_of_model("NVIDIA GeForce RTX 4090"), None);
        let table = SkuTable {
            chips: vec![ChipEntry {
                model: "B200".into(),
                chip: "GB100".into(),
            }],
            skus: vec![SkuEntry {
                project: "G520".into(),
                project_sku: "0200".into(),
                model: "H100".into(),
            }],
        };
        assert_eq!(table.chip_for("NVIDIA B200").as_deref(), Some("GB100"));
        assert_eq!(table.chip_for("NVIDIA H20").as_deref(), Some("GH100"));
        assert!(table.sku_may_be("g520", "0200", "NVIDIA H100 80GB HBM3"));
        assert!(!table.sku_may_be("G520", "0200", "NVIDIA H200"));
        assert!(
            table.sku_may_be("1010", "0200", "NVIDIA H200"),
            "an unlisted SKU is not refused"
        );
    }
}
