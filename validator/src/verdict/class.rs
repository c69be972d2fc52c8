//! Hardware classes: what a rate is learned and looked up for.

use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::statement::DeviceInfo;
use serde::{Deserialize, Serialize};

/// Devices that compute alike: the same backend, kernel and device model, on the same matrix
/// size. The rate of a class is per unit: per device on GPUs, per core on the CPU backend (a CPU
/// miner states the threads it computes on as its device's `sm_count`), so CPUs of one model
/// with different core counts share a class.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RateClass {
    pub backend: String,
    pub kernel: String,
    /// The device name as the miner reports it, normalised ([`model_of`]).
    pub model: String,
    /// Matrix size: rates depend strongly on it, and the planner fixes it per backend.
    pub n: u32,
}

/// The kernel name of every version 3 walk class (PROTOCOL.md 18.6): a device's memory
/// bandwidth is rated as a class of its own, in bytes per second per unit.
pub const WALK_KERNEL: &str = "walk";

/// The kernel name of every version 4 walk class (PROTOCOL.md 20.9). Apart from version 3's: a
/// version 3 walk is timed with the host's copies and hashing inside the clock, so its rate is
/// lower, and a version 4 walk timed at it would let the clock hide more of a pool (the
/// undetected shortfall grows as the expected rate falls).
pub const WALK_V4_KERNEL: &str = "walk-v4";

/// Whether a kernel name is a walk's (bytes per second), rather than a GEMM's (operations).
pub fn is_walk_kernel(kernel: &str) -> bool {
    kernel == WALK_KERNEL || kernel == WALK_V4_KERNEL
}

/// The version 3 walk class of one device: what its bandwidth is learned and looked up for.
pub fn walk_class(claim: &HardwareClaim, device: &DeviceInfo) -> RateClass {
    RateClass {
        backend: claim.backend.clone(),
        kernel: WALK_KERNEL.into(),
        model: model_of(&device.name),
        n: gpu_attest_shared::memory::ENTRY_N as u32,
    }
}

/// The version 4 walk class of one device at matrix size `n`: its pool is `n x n` states, so
/// the size is part of the class, as a compute class's is (on a CPU a small pool sits in its
/// caches).
pub fn walk_v4_class(claim: &HardwareClaim, device: &DeviceInfo, n: u32) -> RateClass {
    RateClass {
        backend: claim.backend.clone(),
        kernel: WALK_V4_KERNEL.into(),
        model: model_of(&device.name),
        n,
    }
}

/// What one unit of a class's rate is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Device,
    Core,
}

impl Unit {
    pub fn of_backend(backend: &str) -> Unit {
        if backend == "cpu" { Unit::Core } else { Unit::Device }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Device => "device",
            Unit::Core => "core",
        }
    }
}

impl RateClass {
    pub fn of(claim: &HardwareClaim, device: &DeviceInfo, n: u32) -> RateClass {
        RateClass {
            backend: claim.backend.clone(),
            kernel: claim.kernel.clone(),
            model: model_of(&device.name),
            n,
        }
    }

    pub fn unit(&self) -> Unit {
        Unit::of_backend(&self.backend)
    }

    /// A walk class (either version's): rated in bytes per second.
    pub fn is_walk(&self) -> bool {
        is_walk_kernel(&self.kernel)
    }
}

impl std::fmt::Display for RateClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} \"{}\" n={}", self.backend, self.kernel, self.model, self.n)
    }
}

/// The class model of a device name: lower-cased, then only letters, digits, ASCII punctuation
/// and single spaces kept (lower-casing first makes it idempotent: a character whose lower case
/// adds a combining mark loses the mark). Names are the miner's word, so without this a miner could open a class of its
/// own (and stay at first contact, with its wide slack) by adding a space, changing case or
/// slipping in an invisible character.
pub fn model_of(name: &str) -> String {
    name.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || c.is_ascii_punctuation() || c.is_whitespace())
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Units one device contributes: 1 for a GPU; its cores for a CPU (at least 1, so a CPU that
/// states no cores is still held to one core's rate).
pub fn units(backend: &str, device: &DeviceInfo) -> f64 {
    match Unit::of_backend(backend) {
        Unit::Device => 1.0,
        Unit::Core => f64::from(device.sm_count.max(1)),
    }
}

/// The one class of a claim whose devices are all alike, with its total units; `None` for a
/// mixed claim, whose proven rate cannot be split between its classes.
pub fn homogeneous(claim: &HardwareClaim, n: u32) -> Option<(RateClass, f64)> {
    let first = claim.devices.first()?;
    let class = RateClass::of(claim, first, n);
    if claim.devices.iter().any(|d| model_of(&d.name) != class.model) {
        return None;
    }
    let total = claim.devices.iter().map(|d| units(&claim.backend, d)).sum();
    Some((class, total))
}

/// Where an expected rate comes from, most trusted first: learned from this validator's
/// passes, imported from another validator, taken from a related class, or the shipped table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateSource {
    Calibrated,
    Shared,
    Related,
    Shipped,
}

impl RateSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RateSource::Calibrated => "calibrated",
            RateSource::Shared => "shared",
            RateSource::Related => "related",
            RateSource::Shipped => "shipped",
        }
    }

    /// The less trusted of two sources: what a claim's devices together are timed by.
    pub fn weaker(self, other: RateSource) -> RateSource {
        if other.trust() < self.trust() { other } else { self }
    }

    /// The more trusted of two sources.
    pub fn stronger(self, other: RateSource) -> RateSource {
        if other.trust() > self.trust() { other } else { self }
    }

    /// Calibrated beats shared beats related beats shipped.
    pub fn trust(self) -> u8 {
        match self {
            RateSource::Shipped => 0,
            RateSource::Related => 1,
            RateSource::Shared => 2,
            RateSource::Calibrated => 3,
        }
    }

    pub fn parse(s: &str) -> Option<RateSource> {
        [
            RateSource::Calibrated,
            RateSource::Shared,
            RateSource::Related,
            RateSource::Shipped,
        ]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, cores: u32) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            sm_count: cores,
            ..Default::default()
        }
    }

    #[test]
    fn cpu_units_are_cores_and_gpu_units_devices() {
        assert_eq!(units("cpu", &device("cpu: Xeon", 8)), 8.0);
        assert_eq!(units("cpu", &device("cpu: Xeon", 0)), 1.0);
        assert_eq!(units("cuda", &device("NVIDIA H100", 132)), 1.0);
    }

    #[test]
    fn spelling_variants_of_a_name_are_one_class() {
        for variant in ["NVIDIA H100", " nvidia  H100 ", "NVIDIA\u{200b} H100", "NVIDIA\tH100\n"] {
            assert_eq!(model_of(variant), "nvidia h100", "{variant:?}");
        }
        for name in ["NVIDIA H100", "İstanbul GPU", "Ǆ x", "™ H100"] {
            assert_eq!(model_of(&model_of(name)), model_of(name), "{name:?}");
        }
        assert_ne!(model_of("NVIDIA H100 PCIe"), model_of("NVIDIA H100"));
    }

    #[test]
    fn only_claims_of_one_model_form_a_class() {
        let mut claim = HardwareClaim {
            backend: "cuda".into(),
            kernel: "tensor".into(),
            devices: vec![device("NVIDIA H100", 132), device("NVIDIA H100", 132)],
        };
        let (class, total) = homogeneous(&claim, 2048).unwrap();
        assert_eq!(class.model, "nvidia h100");
        assert_eq!(total, 2.0);
        claim.devices.push(device("NVIDIA A100", 108));
        assert_eq!(homogeneous(&claim, 2048), None);
        claim.devices.clear();
        assert_eq!(homogeneous(&claim, 2048), None);
    }
}
