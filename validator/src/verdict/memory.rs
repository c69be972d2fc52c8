//! What a verdict states of the memory phase (PROTOCOL.md 18.6): per device the memory claimed
//! and proven, and for the walk its size, its times on this validator's clock, and the bandwidth
//! it proved beside the one expected.

use gpu_attest_shared::memory::locality::ordered_share_at_least;
use serde::{Deserialize, Serialize};

/// One device's memory, as a verdict states it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceMemory {
    /// What the inventory claimed (and the challenge's digest bound).
    pub claimed_bytes: u64,
    /// P_j: the entries of 64 KiB its pool held.
    pub pool_entries: u64,
    /// Version 3: `pool_entries * 65536` on a pass, the pool the walk covered (SECURITY.md
    /// states what its time bounds). Version 4: the least of this device's pool the host was
    /// shown to hold, somewhere among its devices: `floor(walk.held_at_least * claimed_bytes)`.
    /// 0 on a verdict that proves nothing.
    pub proven_bytes: u64,
    /// Version 4: this device's own walk, clocked and judged on its own (PROTOCOL.md 20.9).
    /// Absent in version 3, whose one walk the proof's fields state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk: Option<DeviceWalk>,
    /// The locality walk of this device (PROTOCOL.md 20.10), where it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<DeviceLocality>,
}

/// One device's locality walk, as a verdict states it (PROTOCOL.md 20.10): what was walked,
/// opened and timed. It states no share of the device's steps served from elsewhere: a miner
/// that makes up whole generations walks the rest in pieces side by side, and the openings see
/// that only at the share of generations made up (SECURITY.md, "The locality walk").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceLocality {
    /// `W`, `G` and `C`: walkers a generation, generations, steps a walker takes in one.
    pub walkers: u32,
    pub generations: u32,
    pub steps: u32,
    pub segments_opened: u32,
    /// From sending the locality request to this device's signed root, on this validator's
    /// clock; 0 when no root came.
    pub measured_us: u64,
    pub expected_us: u64,
    pub deadline_us: u64,
    /// `measured_us * 1000 / (G * C)`: the most a step took on average, the round trip and the
    /// pauses between generations included.
    pub step_ns: f64,
    /// The hop the bound speaks of: a step whose line lay behind it took at least this long.
    #[serde(default)]
    pub hop_ns: u64,
    /// `s = 0.01^(1/m)`: unless a share `s` of the walk's (generation, walker) pairs was walked
    /// in order from its committed start, `m` openings all pass with probability below 1%.
    #[serde(default)]
    pub sequential_at_least: f64,
    /// `measured_us * 1000 / (s * G * C * hop_ns)`, at most 1: along the walk's sequence, the
    /// largest share of steps that could each have crossed such a hop within the measured time
    /// (PROTOCOL.md 20.10, SECURITY.md "The locality walk"). `None` when the verdict proves
    /// nothing, and in verdicts stored before the walk was ordered by its tree.
    #[serde(default)]
    pub hop_share_at_most: Option<f64>,
}

impl DeviceLocality {
    /// The mean step time and the hop bound from the measured time; the bound only where the
    /// verdict `proves` and a root came.
    pub fn settle(&mut self, proves: bool) {
        let steps = u64::from(self.generations) * u64::from(self.steps);
        self.step_ns = self.measured_us as f64 * 1000.0 / steps.max(1) as f64;
        self.sequential_at_least = ordered_share_at_least(self.segments_opened);
        self.hop_share_at_most = (proves && self.measured_us > 0 && self.hop_ns > 0 && steps > 0).then(|| {
            let sequential_steps = self.sequential_at_least * steps as f64;
            (self.measured_us as f64 * 1000.0 / (sequential_steps * self.hop_ns as f64)).min(1.0)
        });
    }
}

#[cfg(test)]
mod locality_tests {
    use super::*;

    fn walked(measured_us: u64) -> DeviceLocality {
        DeviceLocality {
            walkers: 2,
            generations: 1000,
            steps: 256,
            segments_opened: 16,
            measured_us,
            expected_us: 0,
            deadline_us: 0,
            step_ns: 0.0,
            hop_ns: 8_000,
            sequential_at_least: 0.0,
            hop_share_at_most: None,
        }
    }

    /// `m` openings all pass with probability `s^m` at a share `s` walked in order: 1% at the
    /// stated share; and the bound is the measured time spread over that share's steps at one
    /// hop each, never above 1, and stated only by a verdict that proves.
    #[test]
    fn the_hop_bound_is_the_time_over_the_ordered_steps_at_one_hop_each() {
        for m in [1, 16, 64] {
            assert!(
                (ordered_share_at_least(m).powi(m as i32) - 0.01).abs() < 1e-12,
                "m = {m}"
            );
        }
        assert_eq!(ordered_share_at_least(0), 0.0);
        let mut l = walked(256_000);
        l.settle(true);
        // 256 ms over 0.75 x 256,000 steps is 1.33 us a step: a sixth of an 8 us hop.
        let want = 256_000.0 * 1000.0 / (ordered_share_at_least(16) * 256_000.0 * 8_000.0);
        assert!((l.hop_share_at_most.unwrap() - want).abs() < 1e-12);
        assert!((l.step_ns - 1000.0).abs() < 1e-9);
        let mut slow = walked(10_000_000);
        slow.settle(true);
        assert_eq!(slow.hop_share_at_most, Some(1.0));
        let mut failed = walked(256_000);
        failed.settle(false);
        assert_eq!(failed.hop_share_at_most, None);
        let mut none_came = walked(0);
        none_came.settle(true);
        assert_eq!(none_came.hop_share_at_most, None);
    }
}

/// One device's version 4 walk, as a verdict states it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceWalk {
    /// From sending the walk request to this device's signed root, on this validator's clock;
    /// 0 when no root came.
    pub measured_ms: u64,
    pub expected_ms: u64,
    pub deadline_ms: u64,
    /// The device's `walk-v4` class rate times its units, bytes per second.
    pub expected_bytes_per_sec: f64,
    /// `walk_bytes / measured`, on a pass or a graded miss.
    pub proven_bytes_per_sec: Option<f64>,
    /// Where the expected rate came from, as `rate_source` (`shipped`: first contact).
    pub bandwidth_source: String,
    pub steps_opened: u32,
    pub rows_checked: u32,
    /// The model of the design's table the openings were sized for; empty for a device outside
    /// it, which was opened as the table's worst row.
    pub sized_as: String,
    /// The share of this device's claim below which a host holding less of this device's pool,
    /// somewhere among its devices (hidden ones included), would have been caught with
    /// probability at least 99.5%: walkers move between devices, so the walk shows the pool
    /// held on the host, not on this device. Against a cheater that uses every device's
    /// sources at once (regeneration on their tensor cores, their host links, a GH200's Grace
    /// memory) and mixes cheap states and faked steps as suits it best (PROTOCOL.md 20.9 step
    /// 7). It assumes each device is the model its name says. Null on a verdict that proves
    /// nothing (and, on verdicts stored before every device had a bound, a device outside the
    /// table).
    pub held_at_least: Option<f64>,
    /// The model the bound was computed with: the device's own where a table names it, else
    /// `an unlisted GPU` (the strongest GPU known) or `a CPU` (PROTOCOL.md 20.9 step 7). Empty
    /// on a verdict stored before it was recorded.
    #[serde(default)]
    pub bound_as: String,
}

/// The memory phase of one verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryProof {
    pub pool_permille: u32,
    pub walkers: u32,
    pub walk_steps: u32,
    pub walk_checkpoint_every: u32,
    /// Walk segments opened.
    pub walk_samples: u32,
    pub devices: Vec<DeviceMemory>,
    /// Bytes each device's walk read: `W * L * 65536`.
    pub walk_bytes: u64,
    /// From sending the walk request to receiving the walk statement, on this validator's clock;
    /// 0 when no statement came.
    pub walk_measured_ms: u64,
    pub walk_expected_ms: u64,
    pub walk_deadline_ms: u64,
    /// The expected bandwidth of the slowest device, bytes per second.
    pub expected_walk_bytes_per_sec: f64,
    /// `walk_bytes / walk_measured`, per device, on a pass.
    pub proven_walk_bytes_per_sec: Option<f64>,
    /// Where the expected bandwidth came from (the weakest source among the devices).
    pub bandwidth_source: String,
    pub bandwidth_miners: u32,
    /// Walk deadline over expected walk time.
    pub slack: f64,
    /// Chain operations at the class's rate that one fill operation was timed as (PROTOCOL.md
    /// 18.6 step 5, [`super::fill::fill_weight`]); verdicts stored before it was recorded were
    /// timed with 2. 0 in version 4, whose pool is the chains' own final states: there is no
    /// fill, and a proof without one is version 4's ([`MemoryProof::protocol_version`]).
    #[serde(default = "legacy_fill_weight")]
    pub fill_weight: f64,
    /// Version 4: the least share of the host's claimed memory (every device's claim together)
    /// that it was shown to hold of the pools, somewhere among its devices (hidden ones
    /// included), with probability at least 99.5%: what the walk proves, per host (PROTOCOL.md
    /// 20.9 step 7). Null in version 3, on a verdict that proves nothing, and on one stored
    /// before it was recorded.
    #[serde(default)]
    pub host_held_at_least: Option<f64>,
    /// What the memory phase proves, in one sentence a person reads on the verdict's face
    /// ([`MemoryProof::statement`]): which bound, for what, or that nothing was shown. Empty on
    /// a verdict stored before it was recorded.
    #[serde(default)]
    pub proves: String,
}

fn legacy_fill_weight() -> f64 {
    LEGACY_FILL_WEIGHT
}

impl MemoryProof {
    /// The protocol version the proof was made under: 4 when it has no fill, else 3.
    pub fn protocol_version(&self) -> u32 {
        if self.fill_weight == 0.0 { 4 } else { 3 }
    }

    /// Records version 4's walk time of device `j`, and the proof's (the slowest device's).
    pub fn record_device_walk(&mut self, j: usize, measured_ms: u64) {
        if let Some(walk) = self.devices.get_mut(j).and_then(|d| d.walk.as_mut()) {
            walk.measured_ms = measured_ms;
        }
        self.walk_measured_ms = self.walk_measured_ms.max(measured_ms);
    }

    /// Fills in what a verdict proves: on a pass or a graded miss (`proves`), every pool and the
    /// walk's bandwidth, and each version 4 device's own; a verdict that proves nothing states
    /// no bound either.
    pub fn settle(&mut self, proves: bool) {
        let walk_bytes = self.walk_bytes;
        for device in &mut self.devices {
            if let Some(locality) = device.locality.as_mut() {
                locality.settle(proves);
            }
            device.proven_bytes = match device.walk.as_mut() {
                // Version 4: what the bound shows held, never the pool asked for.
                Some(walk) => {
                    walk.proven_bytes_per_sec = (proves && walk.measured_ms > 0)
                        .then(|| walk_bytes as f64 / (walk.measured_ms as f64 / 1000.0));
                    if !proves {
                        walk.held_at_least = None;
                    }
                    walk.held_at_least
                        .map_or(0, |held| (held * device.claimed_bytes as f64).floor() as u64)
                }
                None if proves => device
                    .pool_entries
                    .saturating_mul(gpu_attest_shared::memory::ENTRY_BYTES as u64),
                None => 0,
            };
        }
        if !proves {
            self.host_held_at_least = None;
        }
        let short_of_ninety = std::mem::take(&mut self.proves);
        self.proves = self.statement(proves, &short_of_ninety);
        self.proven_walk_bytes_per_sec = (proves && self.walk_measured_ms > 0)
            .then(|| self.walk_bytes as f64 / (self.walk_measured_ms as f64 / 1000.0));
    }

    /// What the memory phase proves, on the verdict's face (PROTOCOL.md 16.1 `memory.proves`),
    /// with why a version 4 plan falls under the 90% line where it does (`short_of_ninety`,
    /// from the plan; empty otherwise).
    pub fn statement(&self, proves: bool, short_of_ninety: &str) -> String {
        if !proves {
            return "nothing: the verdict proves no memory".into();
        }
        let under = if short_of_ninety.is_empty() {
            String::new()
        } else {
            format!("; under the 90% line because {short_of_ninety}")
        };
        match (self.protocol_version(), self.host_held_at_least) {
            (4, Some(share)) if share > 0.0 => format!(
                "version 4: the host held at least {:.1}% of its claim in its pools, somewhere among its devices (walkers move between them: not where), against every device's sources at once, if its walkers stayed on GPUs: walkers moved to the host's CPUs or to another machine read memory this figure does not count (PROTOCOL.md 20.9, SECURITY.md){under}",
                share * 100.0
            ),
            (4, _) => format!(
                "version 4: nothing of the claim is shown held: the walk's clock lets a cheater serve the whole pool from elsewhere (PROTOCOL.md 20.9){under}"
            ),
            _ => "version 3: the pools were walked in time, by the host's devices together; no share of the claim is bounded (a device holding 90% of its claim can pass: SECURITY.md, version 3's memory proof)".into(),
        }
    }

    /// The memory proven in all, bytes: in version 4 the host's bound over its whole claim
    /// (the sources shared between the pools, so at least the devices' figures added up).
    pub fn proven_bytes(&self) -> u64 {
        let devices: u64 = self.devices.iter().map(|d| d.proven_bytes).sum();
        match self.host_held_at_least {
            Some(share) => devices.max((share * self.claimed_bytes() as f64).floor() as u64),
            None => devices,
        }
    }

    /// The int8 operations that made every pool: 2^31 an entry (PROTOCOL.md 18.1); none in
    /// version 4, whose pools are the chains' states.
    pub fn fill_ops(&self) -> f64 {
        if self.protocol_version() >= 4 {
            return 0.0;
        }
        self.devices
            .iter()
            .map(|d| d.pool_entries as f64 * gpu_attest_shared::memory::ENTRY_OPS as f64)
            .sum()
    }

    /// The pools' fill as the verdict's throughput counts it: its operations and their weight.
    pub fn fill_work(&self) -> FillWork {
        FillWork {
            ops: self.fill_ops(),
            weight: self.fill_weight,
        }
    }

    /// The fill of a verdict's memory phase, if it had one: nothing filled without it.
    pub fn fill_work_of(memory: Option<&MemoryProof>) -> FillWork {
        memory.map_or(FillWork::NONE, MemoryProof::fill_work)
    }

    /// The memory claimed in all, bytes.
    pub fn claimed_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.claimed_bytes).sum()
    }
}

/// Version 3: `memory: 1.0 GiB claimed, 0.9 GiB proven on 1 device(s); walk of 64 MiB per device
/// in 316 ms (expected 401, deadline 802): proved 21.2 GB/s per device, expected 17.0 GB/s
/// (shipped); ...`. Version 4 leads with what the host was shown to hold (or that nothing was),
/// then the walk, then each device's own.
impl std::fmt::Display for MemoryProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
        let version_4 = self.protocol_version() >= 4;
        if version_4 {
            write!(
                f,
                "memory (version 4, no fill): {:.3} GiB claimed on {} device(s); ",
                gib(self.claimed_bytes()),
                self.devices.len()
            )?;
            match self.host_held_at_least {
                Some(share) if share > 0.0 => write!(
                    f,
                    "the host held at least {:.3} GiB of its pools ({:.1}% of its claim), somewhere among its devices (walkers move between them: not shown where), if its walkers stayed on GPUs; ",
                    gib(self.proven_bytes()),
                    share * 100.0
                )?,
                Some(_) => write!(
                    f,
                    "nothing of the claim shown held: the walk's clock lets a cheater serve the whole pool from elsewhere; "
                )?,
                None => write!(f, "no memory proven; ")?,
            }
        } else {
            write!(
                f,
                "memory: {:.3} GiB claimed, {:.3} GiB proven on {} device(s); ",
                gib(self.claimed_bytes()),
                gib(self.proven_bytes()),
                self.devices.len(),
            )?;
        }
        write!(
            f,
            "walk of {} MiB per device in {} ms (expected {}, deadline {}): ",
            self.walk_bytes >> 20,
            self.walk_measured_ms,
            self.walk_expected_ms,
            self.walk_deadline_ms
        )?;
        match self.proven_walk_bytes_per_sec {
            Some(rate) => write!(f, "proved {:.1} GB/s per device, ", rate / 1e9)?,
            None => write!(f, "proved no bandwidth, ")?,
        }
        write!(
            f,
            "expected {:.1} GB/s ({})",
            self.expected_walk_bytes_per_sec / 1e9,
            self.bandwidth_source
        )?;
        if !version_4 {
            return write!(f, "; the fill timed as {} chain operations each", self.fill_weight);
        }
        for (j, walk) in self
            .devices
            .iter()
            .enumerate()
            .filter_map(|(j, d)| Some((j, d.walk.as_ref()?)))
        {
            write!(f, "; device {j}: {walk}")?;
        }
        Ok(())
    }
}

/// `walked in 812 ms (expected 1000, deadline 2000, shipped), 1649 steps opened, 474 rows
/// checked; its pool held on the host at 88.5% of its claim or more (bound as H100 SXM, against
/// every device's regeneration and host links at once)`.
impl std::fmt::Display for DeviceWalk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "walked in {} ms (expected {}, deadline {}, {}), {} steps opened, {} rows checked; ",
            self.measured_ms,
            self.expected_ms,
            self.deadline_ms,
            self.bandwidth_source,
            self.steps_opened,
            self.rows_checked
        )?;
        let model = if self.bound_as.is_empty() {
            &self.sized_as
        } else {
            &self.bound_as
        };
        match self.held_at_least {
            Some(held) if held > 0.0 => write!(
                f,
                "its pool held on the host (not shown where) at {:.1}% of its claim or more (bound as {model}, against every device's regeneration and host links at once)",
                held * 100.0
            ),
            Some(_) => write!(
                f,
                "nothing shown of its memory: the clock allows a cheater as {model} to serve the whole pool from elsewhere"
            ),
            None if model.is_empty() => write!(f, "no bound claimed: not a model the bound covers"),
            None => write!(f, "no bound: the verdict proves nothing"),
        }
    }
}

/// The weight verdicts stored before it was recorded were timed with: PROTOCOL.md 18.6's first
/// factor, 2 on every backend.
pub const LEGACY_FILL_WEIGHT: f64 = 2.0;

/// A challenge's pool work as its verdict counts it: the fill's operations and their weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FillWork {
    /// `sum over j of P_j * 2^31`: the int8 operations that made every pool.
    pub ops: f64,
    /// Chain operations at the class's rate that one fill operation is timed as.
    pub weight: f64,
}

impl FillWork {
    /// No memory phase: nothing filled.
    pub const NONE: FillWork = FillWork { ops: 0.0, weight: 1.0 };

    /// The fill in chain operations at the class's rate.
    pub fn weighted_ops(&self) -> f64 {
        self.ops * self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored verdict reads back bit for bit: a proven rate parsed one unit in the last place
    /// off (serde_json's default float parser) changed what a verdict states between the
    /// attestation and the store.
    #[test]
    fn proven_rates_survive_the_store_exactly() {
        for rate in [32522906016.260162_f64, 1.0 / 3.0 * 1e10, 4.0e9 / 7.0] {
            let text = serde_json::to_string(&rate).unwrap();
            assert_eq!(
                serde_json::from_str::<f64>(&text).unwrap().to_bits(),
                rate.to_bits(),
                "{text}"
            );
        }
    }

    /// A proof stored before the fill's weight was recorded reads back with the factor it was
    /// timed with, so its proven rate is recomputed as its deadline was set.
    #[test]
    fn a_proof_stored_without_a_fill_weight_reads_back_with_the_old_factor() {
        let stored = r#"{"pool_permille":950,"walkers":8,"walk_steps":64,"walk_checkpoint_every":8,
            "walk_samples":64,"devices":[{"claimed_bytes":1048576,"pool_entries":15,"proven_bytes":983040}],
            "walk_bytes":33554432,"walk_measured_ms":20,"walk_expected_ms":50,"walk_deadline_ms":100,
            "expected_walk_bytes_per_sec":4.0e9,"proven_walk_bytes_per_sec":null,
            "bandwidth_source":"shipped","bandwidth_miners":0,"slack":2.0}"#;
        let proof: MemoryProof = serde_json::from_str(stored).unwrap();
        assert_eq!(proof.fill_weight, LEGACY_FILL_WEIGHT);
        let work = proof.fill_work();
        assert_eq!(work.ops, 15.0 * 2f64.powi(31));
        assert_eq!(work.weighted_ops(), 2.0 * work.ops);
        let again: MemoryProof = serde_json::from_str(&serde_json::to_string(&proof).unwrap()).unwrap();
        assert_eq!(again, proof, "the weight is written back out");
    }
}
