//! The `[memory]` section of the validator's configuration.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Ask every miner that speaks protocol version 3 for the memory phase. Off, challenges are
    /// version 2 and verdicts prove no memory.
    pub enabled: bool,
    /// Refuse to attest a miner that cannot do the memory phase (it speaks version 2: an older
    /// miner, or one on GPUs too old for the walk kernel). Off, such a miner is
    /// challenged without it, and its verdicts say `memory: null`: they prove compute, not
    /// memory.
    pub required: bool,
    /// Refuse version 3's memory phase (PROTOCOL.md 18): a miner that speaks 3 is then treated
    /// as one that cannot prove memory (refused while `required`, else challenged under
    /// version 2, compute only), and only version 4 verdicts state memory. On by default:
    /// version 3 bounds no share of the claim (a device holding 90% of it passes), and a
    /// validator that still accepted it would let a cheater downgrade to it. Off only to attest
    /// miners of releases before version 4 while they are upgraded.
    pub refuse_version_3: bool,
    /// Thousandths of each device's claimed memory that its pool fills (PROTOCOL.md 18.6).
    pub pool_permille: u32,
    /// Walkers per GPU: many must be in flight to keep a GPU's memory busy.
    pub walkers_per_gpu: u32,
    /// Walkers per core on the CPU backend.
    pub walkers_per_core: u32,
    /// How long the walk should take at the expected bandwidth, in milliseconds.
    pub walk_target_ms: u64,
    /// Walk segments opened per attestation (each c_w = 8 entries of 64 KiB).
    pub walk_samples: u32,
    /// Walk deadline over the expected walk time when every device's bandwidth was observed, on
    /// GPUs: honest GPU walks time within 1% of their learned rate (p99 1.005 on an H200,
    /// BENCHMARKS.md), and a tighter clock leaves a cheater less time to regenerate or fetch
    /// what it does not hold.
    pub slack: f64,
    /// The same on the CPU backend, whose walks time less steadily (a shared machine, other
    /// processes on its memory bus). A CPU verdict states no share of memory held, so this
    /// only keeps honest CPU miners passing.
    pub cpu_slack: f64,
    /// The same at first contact, against the shipped table's bandwidth (0.75 of the datasheet).
    pub first_contact_slack: f64,
    /// The locality walk (`[memory.locality]`, PROTOCOL.md 20.10): off by default.
    pub locality: LocalityConfig,
}

/// The `[memory.locality]` table: the locality walk after version 4's walk (PROTOCOL.md 20.10),
/// a latency-bound walk in the order of a depth-robust tree. A verdict states the largest share
/// of the walk's steps that could have crossed a hop of `hop_ns` (SECURITY.md, "The locality
/// walk"); memory stays stated per host. Off by default. Asked of every CPU miner, and of a GPU
/// miner only where each of its devices' classes has a measured step in `gpu_step_ns` (the
/// H200's ships, measured on one: BENCHMARKS.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalityConfig {
    pub enabled: bool,
    /// `W`: walkers a generation, per device.
    pub walkers: u32,
    /// `C`: steps a walker takes in one generation (one line each).
    pub steps: u32,
    /// How long the walk should take at `step_ns`, in milliseconds: long enough that the
    /// network's round trip is a small part of it.
    pub walk_target_ms: u64,
    /// The time a local step is expected to take on the CPU backend, nanoseconds: a dependent
    /// load from DRAM, with its TLB miss (488-509 ns measured over a 4 GiB pool, BENCHMARKS.md).
    pub step_ns: u64,
    /// Deadline over the expected walk time.
    pub slack: f64,
    /// Segments opened per device.
    pub segments: u32,
    /// The hop the verdict's bound speaks of, nanoseconds. A cheater pays the cheapest crossing
    /// to memory elsewhere: a walker that moves to its next line's host pays one way. Over the
    /// kernel's TCP that measured 4.4-7.7 us on loopback alone (both ends polling, on a guest
    /// whose speed drifts by up to 2x between days); between hosts two NICs and a wire add to
    /// it. The default sits below every such figure. Kernel bypass, RDMA and shared memory cost
    /// less and are not counted at the default (SECURITY.md, BENCHMARKS.md). The bound assumes
    /// nothing of a local step (it may take no time at all).
    pub hop_ns: u64,
    /// A GPU class's local step, nanoseconds, at one walker an SM (the walkers a GPU miner is
    /// asked for), as `miner bench` reports it on that class, keyed by the model's name in the
    /// shipped table ("H100 SXM", "RTX 4090": what a version 4 verdict's `bound_as` says of a
    /// device of a known model; the error for an unknown name lists them). A GPU miner is asked
    /// for the walk only where every claimed device's class has a figure here, and its deadline
    /// is timed by the slowest of them. Ships [`SHIPPED_GPU_STEP_NS`]; a table in the
    /// configuration replaces it whole, so one that adds a model repeats the shipped lines.
    pub gpu_step_ns: BTreeMap<String, u64>,
}

impl Default for LocalityConfig {
    fn default() -> Self {
        LocalityConfig {
            enabled: false,
            walkers: 1,
            steps: 256,
            walk_target_ms: 500,
            step_ns: 600,
            slack: 2.0,
            segments: 16,
            hop_ns: 3_000,
            gpu_step_ns: SHIPPED_GPU_STEP_NS
                .iter()
                .map(|&(model, ns)| (model.to_string(), ns))
                .collect(),
        }
    }
}

/// The GPU models whose locality step was measured, nanoseconds at one walker an SM, to the last
/// generation's digest on the host (`miner bench --backend cuda`'s "with one an SM"):
/// - H200: 1134 ns over a pool of 128232 MiB (2026-11-29; 639 ns with one walker, 1452 with 1024).
///
/// A model missing here is not asked for the walk until its operator measures it.
pub const SHIPPED_GPU_STEP_NS: &[(&str, u64)] = &[("H200", 1134)];

/// The longest walk a validator may aim for: ten minutes.
pub(crate) const MAX_WALK_TARGET_MS: u64 = 600_000;
/// The slowest local step a validator may expect, nanoseconds: a millisecond, a thousand times a
/// DRAM load's latency.
pub(crate) const MAX_STEP_NS: u64 = 1_000_000;
/// The longest hop a verdict may speak of, nanoseconds: a second.
pub(crate) const MAX_HOP_NS: u64 = 1_000_000_000;
/// The loosest deadline over the expected walk: a thousand times it. Without a limit the
/// deadline's arithmetic could overflow.
pub(crate) const MAX_LOCALITY_SLACK: f64 = 1000.0;

/// Whether `slack` is one a locality walk may be timed with: 1 to [`MAX_LOCALITY_SLACK`].
pub(crate) fn locality_slack_allowed(slack: f64) -> bool {
    slack.is_finite() && (1.0..=MAX_LOCALITY_SLACK).contains(&slack)
}

/// The longest hop that says nothing over a walk at `step_ns` with `segments` openings: the
/// bound spreads the measured time over the ordered share of the steps at one hop each
/// (PROTOCOL.md 20.10), so with a hop no longer than the step over that share a walk at the
/// expected rate or slower states 1.
pub(crate) fn useless_hop_below(step_ns: u64, segments: u32) -> u64 {
    (step_ns as f64 / gpu_attest_shared::memory::locality::ordered_share_at_least(segments)) as u64
}

impl LocalityConfig {
    /// Refuses settings no locality walk could run with, with the reason.
    pub fn problem(&self) -> Option<String> {
        use gpu_attest_shared::memory::locality::{MAX_SEGMENT_STEPS, MAX_WALKERS};
        use gpu_attest_shared::statement::locality::MAX_SEGMENT_SAMPLES_PER_DEVICE;
        if !(1..=MAX_WALKERS).contains(&self.walkers) {
            return Some(format!(
                "[memory.locality] walkers = {} must be in 1..={MAX_WALKERS}",
                self.walkers
            ));
        }
        if !(1..=MAX_SEGMENT_STEPS).contains(&self.steps) {
            return Some(format!(
                "[memory.locality] steps = {} must be in 1..={MAX_SEGMENT_STEPS}",
                self.steps
            ));
        }
        if self.walk_target_ms == 0 || self.step_ns == 0 || self.hop_ns == 0 {
            return Some("[memory.locality] walk_target_ms, step_ns and hop_ns must be at least 1".into());
        }
        // Upper limits far past any real walk, so that the plan's products (steps x step,
        // generations x steps x step) cannot overflow.
        if self.walk_target_ms > MAX_WALK_TARGET_MS || self.step_ns > MAX_STEP_NS || self.hop_ns > MAX_HOP_NS {
            return Some(format!(
                "[memory.locality] walk_target_ms (at most {MAX_WALK_TARGET_MS}), step_ns (at most {MAX_STEP_NS}) and hop_ns (at most {MAX_HOP_NS}) are past any walk: walk_target_ms = {}, step_ns = {}, hop_ns = {}",
                self.walk_target_ms, self.step_ns, self.hop_ns
            ));
        }
        for (model, &step_ns) in &self.gpu_step_ns {
            if gpu_attest_shared::memory::bound::model(model).is_none() {
                let known: Vec<&str> = gpu_attest_shared::memory::bound::models().map(|m| m.name).collect();
                return Some(format!(
                    "[memory.locality.gpu_step_ns] names {model:?}, which is no model of the shipped table; use one of: {}",
                    known.join(", ")
                ));
            }
            if !(1..=MAX_STEP_NS).contains(&step_ns) {
                return Some(format!(
                    "[memory.locality.gpu_step_ns] {model:?} = {step_ns} must be in 1..={MAX_STEP_NS}"
                ));
            }
        }
        if !(1..=MAX_SEGMENT_SAMPLES_PER_DEVICE as u32).contains(&self.segments) {
            return Some(format!(
                "[memory.locality] segments = {} must be in 1..={MAX_SEGMENT_SAMPLES_PER_DEVICE}",
                self.segments
            ));
        }
        if !locality_slack_allowed(self.slack) {
            return Some(format!(
                "[memory.locality] slack = {} must be at least 1 and at most {MAX_LOCALITY_SLACK}",
                self.slack
            ));
        }
        // A hop that says nothing ([`useless_hop_below`]) is refused; only a walk that is on is
        // held to it.
        let ordered = gpu_attest_shared::memory::locality::ordered_share_at_least(self.segments);
        // Every step a walk may be timed by: the CPU's and each GPU class's (the model, where
        // the slowest is a GPU's).
        let (slowest_model, slowest_step_ns) = self
            .gpu_step_ns
            .iter()
            .map(|(model, &ns)| (Some(model.as_str()), ns))
            .fold(
                (None, self.step_ns),
                |slowest, step| if step.1 > slowest.1 { step } else { slowest },
            );
        let useless_below = useless_hop_below(slowest_step_ns, self.segments);
        if self.enabled && self.hop_ns <= useless_below {
            let (whose, or_else) = match slowest_model {
                None => ("the CPU's step_ns".to_string(), String::new()),
                Some(model) => (
                    format!("{model:?} in [memory.locality.gpu_step_ns]"),
                    format!(
                        ", or leave {model:?} out of [memory.locality.gpu_step_ns] (a table written there replaces the shipped one)"
                    ),
                ),
            };
            return Some(format!(
                "[memory.locality] hop_ns = {} is no longer than the expected local step ({slowest_step_ns} ns, {whose}) over the share of the walk {} openings show in order ({ordered:.2}): a walk at that step or slower would state that all its steps could have crossed a hop, which says nothing. Set hop_ns above {useless_below} (the default 3000 counts a walker moved over the kernel's TCP, SECURITY.md){or_else}",
                self.hop_ns, self.segments
            ));
        }
        None
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            enabled: true,
            required: true,
            refuse_version_3: true,
            pool_permille: 950,
            walkers_per_gpu: 8192,
            walkers_per_core: 4,
            walk_target_ms: 2_000,
            walk_samples: 64,
            slack: 1.25,
            cpu_slack: 1.5,
            first_contact_slack: 2.0,
            locality: LocalityConfig::default(),
        }
    }
}

impl MemoryConfig {
    /// The walk's slack for a rate observed on `backend`: `cpu_slack` on the CPU, else `slack`.
    pub fn observed_slack(&self, backend: &str) -> f64 {
        if backend == "cpu" { self.cpu_slack } else { self.slack }
    }

    /// The loosest observed slack: a walk class's learned rate is floored at the shipped rate
    /// times it over `first_contact_slack`, so that no backend's observed clock is looser than
    /// first contact's (a floor that holds for the loosest holds for every backend). Version 3's
    /// walks, whose timed window holds the host's copies, are timed at it on every backend.
    pub fn loosest_observed_slack(&self) -> f64 {
        self.slack.max(self.cpu_slack)
    }

    /// Refuses settings no attestation could pass or plan with, with the reason.
    pub fn problem(&self) -> Option<String> {
        if let Some(problem) = self.locality.problem() {
            return Some(problem);
        }
        if !(1..=1000).contains(&self.pool_permille) {
            return Some(format!(
                "[memory] pool_permille = {} must be in 1..=1000",
                self.pool_permille
            ));
        }
        if self.walkers_per_gpu == 0 || self.walkers_per_core == 0 {
            return Some("[memory] walkers_per_gpu and walkers_per_core must be at least 1".into());
        }
        if self.walk_target_ms == 0 {
            return Some("[memory] walk_target_ms must be at least 1".into());
        }
        if !(1..=gpu_attest_shared::memory::params::MAX_WALK_SAMPLES).contains(&self.walk_samples) {
            return Some(format!(
                "[memory] walk_samples = {} must be in 1..={}",
                self.walk_samples,
                gpu_attest_shared::memory::params::MAX_WALK_SAMPLES
            ));
        }
        let valid = |slack: f64| slack.is_finite() && slack >= 1.0;
        if !valid(self.slack) || !valid(self.cpu_slack) || !valid(self.first_contact_slack) {
            return Some("[memory] slack, cpu_slack and first_contact_slack must be at least 1".into());
        }
        for (name, slack) in [("slack", self.slack), ("cpu_slack", self.cpu_slack)] {
            if slack > self.first_contact_slack {
                return Some(format!(
                    "[memory] {name} = {slack} exceeds first_contact_slack = {}: a walk whose rate was observed would be timed more loosely than one seen for the first time; lower {name} or raise first_contact_slack",
                    self.first_contact_slack
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the CPU's default step (600 ns, 16 openings: 75% in order) and no GPU step, a hop of
    /// 800 ns or less makes a walk at the expected rate state 1 (600 / 0.7499 = 800.1 ns); the
    /// error names the setting and the bound it must pass. A walk that is off is not held to it.
    #[test]
    fn a_hop_no_longer_than_the_ordered_local_step_is_refused() {
        assert_eq!(LocalityConfig::default().problem(), None);
        let at = |hop_ns| LocalityConfig {
            enabled: true,
            hop_ns,
            gpu_step_ns: BTreeMap::new(),
            ..LocalityConfig::default()
        };
        assert_eq!(at(3_000).problem(), None);
        let off = LocalityConfig {
            enabled: false,
            ..at(800)
        };
        assert_eq!(off.problem(), None);
        let refused = at(800).problem().expect("refused");
        assert!(
            refused.contains("hop_ns = 800") && refused.contains("above 800"),
            "{refused}"
        );
        assert!(at(1).problem().is_some());
        assert_eq!(at(801).problem(), None);
    }

    /// The shipped steps name models of the bound's table, and the defaults with the walk turned
    /// on are accepted: the default hop says something over the slowest shipped step.
    #[test]
    fn the_shipped_gpu_steps_are_known_models_and_the_defaults_turned_on_are_accepted() {
        let shipped = LocalityConfig::default();
        assert_eq!(shipped.gpu_step_ns.get("H200"), Some(&1134));
        for (model, _) in SHIPPED_GPU_STEP_NS {
            assert!(gpu_attest_shared::memory::bound::model(model).is_some(), "{model}");
        }
        let on = LocalityConfig {
            enabled: true,
            ..shipped
        };
        assert_eq!(on.problem(), None);
        let slowest = SHIPPED_GPU_STEP_NS.iter().map(|&(_, ns)| ns).max().unwrap_or(0);
        assert!(on.hop_ns > useless_hop_below(slowest, on.segments));
    }

    /// A GPU class's step is keyed by a model of the shipped table and is at least 1 ns; the
    /// hop is held to the slowest step a walk may be timed by, which the error names.
    #[test]
    fn a_gpu_step_names_a_known_model_and_holds_the_hop_above_it() {
        let with = |steps: &[(&str, u64)]| LocalityConfig {
            enabled: true,
            gpu_step_ns: steps.iter().map(|&(m, ns)| (m.to_string(), ns)).collect(),
            ..LocalityConfig::default()
        };
        assert_eq!(with(&[("H100 SXM", 700), ("RTX 4090", 900)]).problem(), None);
        let unknown = with(&[("H100", 700)]).problem().expect("refused");
        assert!(
            unknown.contains("\"H100\"") && unknown.contains("H100 SXM") && unknown.contains("RTX 4090"),
            "{unknown}"
        );
        assert!(
            with(&[("H200", 0)])
                .problem()
                .expect("refused")
                .contains("\"H200\" = 0")
        );
        // Past any walk: the plan's products could overflow.
        let huge = with(&[("H200", 1 << 56)]).problem().expect("refused");
        assert!(huge.contains("must be in 1..=1000000"), "{huge}");
        for too_much in [
            LocalityConfig {
                step_ns: MAX_STEP_NS + 1,
                ..with(&[])
            },
            LocalityConfig {
                walk_target_ms: MAX_WALK_TARGET_MS + 1,
                ..with(&[])
            },
            LocalityConfig {
                hop_ns: MAX_HOP_NS + 1,
                ..with(&[])
            },
        ] {
            assert!(too_much.problem().expect("refused").contains("past any walk"));
        }
        // 2,400 ns over the 0.7499 shown in order is 3,200 ns: the default 3 us hop says nothing.
        let slow = with(&[("H200", 650), ("RTX 4090", 2_400)]).problem().expect("refused");
        assert!(
            slow.contains("2400 ns, \"RTX 4090\" in [memory.locality.gpu_step_ns]")
                && slow.contains("above 3200")
                && slow.contains("or leave \"RTX 4090\" out"),
            "{slow}"
        );
        // The CPU's step alone: nothing to leave out.
        let cpu = LocalityConfig {
            hop_ns: 700,
            ..with(&[])
        };
        let cpu = cpu.problem().expect("refused");
        assert!(cpu.contains("the CPU's step_ns") && !cpu.contains("leave"), "{cpu}");
        assert_eq!(with(&[("RTX 4090", 2_200)]).problem(), None);
    }
}
