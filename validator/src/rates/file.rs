//! The rate file: observed rates as TOML, exported by one validator and imported by others, so
//! a fleet times miners by one table.
//!
//! ```toml
//! format = 1
//!
//! [[class]]
//! backend = "cuda"
//! kernel = "tensor"
//! model = "nvidia h100 80gb hbm3"
//! n = 2048
//! unit = "device"
//! ops_per_sec = 1.1e15
//! miners = 12
//! observations = 170
//! ```

use super::{Expected, SharedRate};
use crate::verdict::class::{RateClass, Unit, model_of};
use serde::{Deserialize, Serialize};

pub const FORMAT: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateFile {
    pub format: u32,
    #[serde(default, rename = "class")]
    pub classes: Vec<SharedClass>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedClass {
    pub backend: String,
    pub kernel: String,
    pub model: String,
    pub n: u32,
    /// What `ops_per_sec` is per: stated so that a reader cannot mistake a per-core rate for a
    /// per-device one; it must agree with the backend.
    pub unit: Unit,
    pub ops_per_sec: f64,
    pub miners: u32,
    pub observations: u32,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RateFileError {
    #[error("not a rate file: {0}")]
    Parse(String),
    #[error("rate file format {0}; this validator reads format {FORMAT}")]
    Format(u32),
    #[error("class {index} ({class}): {problem}")]
    Class {
        index: usize,
        class: String,
        problem: String,
    },
}

impl SharedClass {
    pub fn new(class: &RateClass, expected: &Expected) -> Self {
        SharedClass {
            backend: class.backend.clone(),
            kernel: class.kernel.clone(),
            model: class.model.clone(),
            n: class.n,
            unit: class.unit(),
            ops_per_sec: expected.ops_per_unit,
            miners: expected.miners,
            observations: expected.observations,
        }
    }

    /// The class this row is for, its model normalised as the validator names classes.
    pub fn class(&self) -> RateClass {
        RateClass {
            backend: self.backend.clone(),
            kernel: self.kernel.clone(),
            model: model_of(&self.model),
            n: self.n,
        }
    }

    pub fn rate(&self) -> SharedRate {
        SharedRate {
            ops_per_unit: self.ops_per_sec,
            miners: self.miners,
            observations: self.observations,
        }
    }

    /// Whether [`RateFile::parse`] accepts this row.
    pub fn is_importable(&self) -> bool {
        self.problem().is_none()
    }

    fn problem(&self) -> Option<String> {
        if self.backend.is_empty() || self.kernel.is_empty() || model_of(&self.model).is_empty() {
            return Some("backend, kernel and model must all be named".into());
        }
        if !(1..=gpu_attest_shared::params::MAX_N).contains(&self.n) {
            return Some(format!("n = {} is outside the protocol's sizes", self.n));
        }
        if self.unit != Unit::of_backend(&self.backend) {
            return Some(format!(
                "unit {:?} does not fit backend {:?}, whose rates are per {}",
                self.unit.as_str(),
                self.backend,
                Unit::of_backend(&self.backend).as_str()
            ));
        }
        if !(self.ops_per_sec.is_finite() && self.ops_per_sec > 0.0) {
            return Some(format!("ops_per_sec = {} must be a positive number", self.ops_per_sec));
        }
        if self.miners == 0 || self.observations < self.miners {
            return Some(format!(
                "{} miners and {} observations: a rate needs at least one observation per miner",
                self.miners, self.observations
            ));
        }
        None
    }
}

impl RateFile {
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).unwrap_or_default();
        format!(
            "# gpu-attest rate table: rates per class that validators observed on passing verdicts.\n\
             # ops_per_sec is per unit (per device on GPUs, per core on the CPU backend).\n\
             # Import with `validator rates import FILE`.\n{body}"
        )
    }

    /// Parses and checks every row; one bad row refuses the whole file, so that an import is
    /// all or nothing.
    pub fn parse(text: &str) -> Result<RateFile, RateFileError> {
        let file: RateFile = toml::from_str(text).map_err(|e| RateFileError::Parse(e.to_string()))?;
        if file.format != FORMAT {
            return Err(RateFileError::Format(file.format));
        }
        for (index, row) in file.classes.iter().enumerate() {
            if let Some(problem) = row.problem() {
                return Err(RateFileError::Class {
                    index,
                    class: row.class().to_string(),
                    problem,
                });
            }
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> SharedClass {
        SharedClass {
            backend: "cpu".into(),
            kernel: "avx512-vnni".into(),
            model: "cpu: intel(r) xeon(r) processor".into(),
            n: 256,
            unit: Unit::Core,
            ops_per_sec: 1.3e11,
            miners: 3,
            observations: 9,
        }
    }

    #[test]
    fn an_export_parses_back() {
        let file = RateFile {
            format: FORMAT,
            classes: vec![row()],
        };
        assert_eq!(RateFile::parse(&file.to_toml()).unwrap(), file);
    }

    #[test]
    fn bad_rows_refuse_the_whole_file() {
        let with = |edit: fn(&mut SharedClass)| {
            let mut r = row();
            edit(&mut r);
            RateFile {
                format: FORMAT,
                classes: vec![row(), r],
            }
            .to_toml()
        };
        let problem = |text: String| match RateFile::parse(&text) {
            Err(RateFileError::Class { index: 1, problem, .. }) => problem,
            other => panic!("{other:?}"),
        };
        assert!(problem(with(|r| r.unit = Unit::Device)).contains("per core"));
        assert!(problem(with(|r| r.ops_per_sec = -1.0)).contains("positive"));
        assert!(problem(with(|r| r.miners = 0)).contains("miners"));
        assert!(problem(with(|r| r.n = 0)).contains("n = 0"));
        assert!(problem(with(|r| r.model.clear())).contains("named"));
        assert_eq!(RateFile::parse("format = 2\n"), Err(RateFileError::Format(2)));
        assert!(matches!(
            RateFile::parse("format = 1\nextra = true\n"),
            Err(RateFileError::Parse(_))
        ));
    }
}
