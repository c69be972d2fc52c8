//! The `[[rates]]` rows of the validator's configuration: the shape of a rate table's row, which
//! the shipped table (`rates::shipped`) uses too. How a row matches a class is the rate book's.

use serde::{Deserialize, Serialize};

/// One row. A class matches when the backend is equal, the kernel is equal (or the row's is
/// empty and the class is not a walk class) and the row's model occurs in the device name,
/// case-insensitively, a `#` in it standing for any one digit (or the model is empty). The
/// first matching row gives the expected rate; the first matching row with a peak gives the
/// ceiling. Rows for the memory walk (kernel `walk`, PROTOCOL.md 18.6) rate bytes per second,
/// not operations: only a row that names a walk kernel matches a walk class. A `walk` row rates
/// both versions' walks (`walk` and `walk-v4`: the datasheet's bandwidth is the same), unless a
/// `walk-v4` row for the class comes first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateEntry {
    pub backend: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Integer operations per second (2 n^3 per GEMM step) per unit: per device on GPUs, per
    /// core on the CPU backend. Bytes per second for a `walk` row.
    pub ops_per_sec: f64,
    /// The hardware's physical ceiling per unit; 0 leaves it to a later row or the backend's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub peak_ops_per_sec: f64,
    /// Where the figures come from.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}
