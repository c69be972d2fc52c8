//! Sizing version 4's memory phase (docs/design/protocol-v4.md 2.6, 3 and 6.3; PROTOCOL.md 20):
//! how many of each device's chains keep their states as its pool, the fewest steps a chain
//! must run so that a missing state costs `kappa` operations a byte to make again, the walk's
//! shape, each device's own expected walk time and deadline, and how many steps and rows to
//! open on each device, from `shared::memory::bound` rather than a constant.
//!
//! Nothing here reads the rate book or the configuration file: the caller gives each device's
//! expected walk rate and where it came from, so that the arithmetic is tested alone.

use crate::rates::RateSource;
use gpu_attest_shared::memory::bound::{self, Design, DeviceModel, MODELS, Proven, VERSION_4};
use gpu_attest_shared::memory::chain_pool::{ChainPoolParams, MAX_POOL_SLICES, MAX_WALK_STEPS};
use gpu_attest_shared::memory::params::MAX_WALKERS;
use gpu_attest_shared::memory::slice::SLICE_BYTES;
use gpu_attest_shared::statement::DeviceInfo;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// `kappa = 2 n K >= 2^17` operations a pool byte (design 2.2): `K >= 2^16 / n`.
const KAPPA_OVER_TWO: u32 = 1 << 16;

/// What the planner sizes version 4 with: the design's parameters and the walk's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct V4Settings {
    /// Pool share, kappa, calibrated slack, the honest walk's share of the datasheet, and the
    /// pass probability the openings are sized for.
    pub design: Design,
    /// Deadline over expected walk time when every device's rate was observed. The design's
    /// 1.25 waits for a measured device-timed spread (p99 of time over expected at most 1.1);
    /// until then `[memory] slack`. The verdict's bound is computed at whichever is used.
    pub calibrated_slack: f64,
    pub first_contact_slack: f64,
    pub walkers_per_gpu: u32,
    pub walkers_per_core: u32,
    /// How long the slowest device's walk should take at its expected rate.
    pub walk_target_ms: u64,
}

impl Default for V4Settings {
    fn default() -> Self {
        V4Settings {
            design: VERSION_4,
            calibrated_slack: 1.5,
            first_contact_slack: 2.0,
            walkers_per_gpu: 8192,
            walkers_per_core: 4,
            walk_target_ms: 2_000,
        }
    }
}

/// One device's expected walk rate, as the caller looked it up (its `walk-v4` class times its
/// units).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpectedWalk {
    pub bytes_per_sec: f64,
    /// Where the rate came from: observed (learned from this validator's or its peers' passing
    /// verdicts, the calibrated slack) or shipped (first contact).
    pub source: RateSource,
}

/// One device's part of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceWalkPlan {
    /// `N_j`: chains whose final states are the pool.
    pub pool_chains: u64,
    pub bytes_per_sec: f64,
    pub source: RateSource,
    /// This device's walk at its own expected rate, its own slack (calibrated where its rate
    /// was observed, first contact where not) and its own deadline: each device's root is
    /// clocked on its own (design 5.2).
    pub expected_ms: u64,
    pub slack: f64,
    pub deadline_ms: u64,
    /// Walk steps opened, and of them how many have a row checked (design 6.3, 6.4).
    pub steps_opened: u32,
    pub rows_checked: u32,
    /// The model of the bound's table these counts come from; `None` when the device is none of
    /// them and is sized for the table's worst row.
    pub sized_as: Option<&'static str>,
    /// The share of its claim below which this device is caught with probability at least
    /// `1 - pass` (0.995), against its model's sized sources (design 4.4 row C; row A on a
    /// GH200), at this clock and with these openings; `None` for a device outside the bound's
    /// table, of which nothing is claimed. Below 0.9 at first contact on some models.
    pub held_at_least: Option<f64>,
}

impl DeviceWalkPlan {
    /// Whether a device holding 90% of its claim is caught (design 4.4); `false` for a device
    /// outside the table, and at first contact on some models.
    pub fn catches_ninety_percent(&self) -> bool {
        // The counts are whole numbers rounded up from the bound, so at the design's clock the
        // bound sits at or just above 0.9; the tolerance absorbs the bisection's last bits.
        self.held_at_least.is_some_and(|h| h >= 0.9 - 1e-9)
    }
}

/// Version 4's memory phase for one challenge.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainPoolPlan {
    pub params: ChainPoolParams,
    /// The fewest steps per chain (`K`, a multiple of the checkpoint interval).
    pub min_iterations: u32,
    /// The fewest chains in the challenge: with section 6's even split every device then runs
    /// at least its `N_j`.
    pub min_chains: u64,
    pub devices: Vec<DeviceWalkPlan>,
}

impl ChainPoolPlan {
    /// The largest of the devices' slacks (deadline over expected walk time): what a verdict
    /// states as the walk's one slack.
    pub fn slack(&self) -> f64 {
        self.devices.iter().map(|d| d.slack).fold(1.0, f64::max)
    }

    /// Whether every device's walk rate was observed (each device at the calibrated slack),
    /// rather than shipped.
    pub fn observed(&self) -> bool {
        self.devices.iter().all(|d| d.source.is_observed())
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum PlanV4Error {
    #[error("n = {0} is not a multiple of 256: version 4 walks whole 64 KiB slices of each state")]
    NotWholeSlices(u32),
    #[error("{devices} devices but {rates} expected walk rates")]
    RatesPerDevice { devices: usize, rates: usize },
    #[error(
        "device {device} claims {memory_bytes} bytes: {share} of it holds no state of n^2 = {state_bytes} bytes; challenge it at a smaller n"
    )]
    NoStateFits {
        device: u32,
        memory_bytes: u64,
        share: f64,
        state_bytes: u64,
    },
    #[error(
        "the memory design sizes no openings for any model it knows (its clock hides every 90% holder's shortfall): a walk would be checked by nothing"
    )]
    NoOpenings,
    #[error("device {device}'s expected walk rate {bytes_per_sec} bytes/s is not a positive number")]
    NoRate { device: u32, bytes_per_sec: f64 },
    #[error(
        "even the longest walk ({MAX_WALK_STEPS} steps of {walkers} walkers) takes only {reach_ms:.0} ms at the expected rate, under half of the {target_ms} ms target: lower the walk target"
    )]
    WalkTooShort {
        walkers: u32,
        reach_ms: f64,
        target_ms: u64,
    },
}

/// The fewest steps per chain at `n` with checkpoints every `checkpoint_every`: `2^16 / n`
/// rounded up, and up again to a whole number of checkpoints.
pub fn min_iterations(n: u32, checkpoint_every: u32) -> u32 {
    let every = checkpoint_every.max(1);
    KAPPA_OVER_TWO.div_ceil(n.max(1)).max(every).div_ceil(every) * every
}

/// Steps to open, rows to check, and what they prove.
type Counts = (u32, u32, Option<Proven>);

/// What the bound's figures are remembered by: the design's parameters (by their bits) and the
/// model, and for a device's clock its slack and `eta` too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CountsKey {
    Design([u64; 5], &'static str),
    Clock([u64; 5], &'static str, u64, u64),
}

/// Counts computed once per process for each clock: the bound's searches take a fraction of a
/// second, and a validator plans the same few classes at the same rates over and over. Cleared
/// when it grows past a size no real fleet reaches, so that drifting learned rates cannot grow
/// it without bound.
fn remembered(key: CountsKey, compute: impl FnOnce() -> Counts) -> Counts {
    static SEEN: OnceLock<Mutex<HashMap<CountsKey, Counts>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(counts) = seen.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return *counts;
    }
    let counts = compute();
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    if seen.len() >= 4096 {
        seen.clear();
    }
    seen.insert(key, counts);
    counts
}

fn design_bits(design: &Design) -> [u64; 5] {
    [
        design.pool_share.to_bits(),
        design.kappa.to_bits(),
        design.slack.to_bits(),
        design.eta.to_bits(),
        design.pass.to_bits(),
    ]
}

/// The counts that catch `model`'s 90% holder at the design's clock against the best mixed
/// cheater (design 6.3 and 6.4, `Design::mixed_counts`).
fn design_counts(design: &Design, model: &DeviceModel) -> Option<(u32, u32)> {
    let key = CountsKey::Design(design_bits(design), model.name);
    let (steps, rows, _) = remembered(key, || {
        let clock = design.clocked(model, bound::sized_sources(model), design.slack, design.eta);
        match clock.and_then(|clock| design.mixed_counts(clock)) {
            Some((steps, rows)) => (steps, rows, None),
            None => (0, 0, None),
        }
    });
    (steps > 0).then_some((steps, rows))
}

/// `eta` to the thousandth, rounded down: a learned rate moves a little with every vote, and a
/// lower `eta` only weakens the bound a verdict states (the clock is taken to hide more), so
/// the rounded clock's counts and bound are safe to state and can be remembered.
fn rounded_down(eta: f64) -> f64 {
    // The nudge keeps a share that is a whole thousandth up to float error (0.75 of a
    // datasheet figure, computed as a product and a quotient) at that thousandth.
    ((eta * 1000.0 + 1e-9).floor() / 1000.0).max(0.0)
}

/// The bound's counts for `model` and what they prove: the design clock's counts, raised
/// towards what the device's own clock needs (`slack` over `eta` of its datasheet bandwidth,
/// the rate it is expected at) but never past `cap` (the table's worst row, what a device
/// outside the table is opened with, which bounds this validator's work), and the cap itself
/// where no count up to it catches the 90% holder: where the clock alone hides its shortfall
/// (an RTX 4090 at first contact), or catching what it leaves would take more (an H100 at
/// first contact needs about 150,000 openings). The verdict states the weaker bound the
/// openings prove.
fn counts(design: &Design, model: &DeviceModel, slack: f64, eta: f64, cap: (u32, u32)) -> Counts {
    let eta = rounded_down(eta);
    // The cap is the design's worst row, a function of the design: the key need not hold it.
    let key = CountsKey::Clock(design_bits(design), model.name, slack.to_bits(), eta.to_bits());
    remembered(key, || counted(design, model, slack, eta, cap))
}

fn counted(design: &Design, model: &DeviceModel, slack: f64, eta: f64, cap: (u32, u32)) -> Counts {
    let sources = bound::sized_sources(model);
    let Some(clock) = design.clocked(model, sources, slack, eta) else {
        return (cap.0, cap.1, None);
    };
    // A model the design sizes nothing for is opened as the cap, like a device outside it.
    let base = design_counts(design, model).unwrap_or(cap);
    let (steps, rows) = design.opened(base, clock, cap);
    (steps, rows, Some(design.proven(clock, steps, rows)))
}

/// The most any model of the table needs at the design's clock: what a device outside it is
/// sized for.
fn worst_counts(design: &Design) -> (u32, u32) {
    MODELS
        .iter()
        .filter_map(|model| design_counts(design, model))
        .fold((0, 0), |(steps, rows), (s, r)| (steps.max(s), rows.max(r)))
}

/// Walkers per device: per GPU, or per core of the CPU with the fewest cores.
fn walkers(backend: &str, devices: &[DeviceInfo], settings: &V4Settings) -> u32 {
    let per_device = if backend == "cpu" {
        let cores = devices.iter().map(|d| d.sm_count.max(1)).min().unwrap_or(1);
        settings.walkers_per_core.saturating_mul(cores)
    } else {
        settings.walkers_per_gpu
    };
    per_device.clamp(1, MAX_WALKERS)
}

/// Plans version 4's memory phase for `devices` (the claim, in index order) on `backend` at
/// matrix size `n`, each device walking at `rates[j]`.
pub fn plan_chain_pools(
    backend: &str,
    devices: &[DeviceInfo],
    rates: &[ExpectedWalk],
    n: u32,
    checkpoint_every: u32,
    settings: &V4Settings,
) -> Result<ChainPoolPlan, PlanV4Error> {
    if n == 0 || !n.is_multiple_of(256) {
        return Err(PlanV4Error::NotWholeSlices(n));
    }
    if rates.len() != devices.len() {
        return Err(PlanV4Error::RatesPerDevice {
            devices: devices.len(),
            rates: rates.len(),
        });
    }
    let design = &settings.design;
    let state_bytes = u64::from(n) * u64::from(n);
    let slices_per_state = state_bytes / SLICE_BYTES as u64;
    let mut pool_chains = Vec::with_capacity(devices.len());
    for (j, device) in devices.iter().enumerate() {
        let fits = (design.pool_share * device.memory_bytes as f64 / state_bytes as f64).floor() as u64;
        let chains = fits.min(MAX_POOL_SLICES / slices_per_state);
        if chains == 0 {
            return Err(PlanV4Error::NoStateFits {
                device: j as u32,
                memory_bytes: device.memory_bytes,
                share: design.pool_share,
                state_bytes,
            });
        }
        pool_chains.push(chains);
    }
    if let Some((j, rate)) = rates
        .iter()
        .enumerate()
        .find(|(_, r)| !(r.bytes_per_sec.is_finite() && r.bytes_per_sec > 0.0))
    {
        return Err(PlanV4Error::NoRate {
            device: j as u32,
            bytes_per_sec: rate.bytes_per_sec,
        });
    }
    // Each device's own slack (design 5.2): one device at first contact does not loosen the
    // clock of the others.
    let slack_of = |rate: &ExpectedWalk| {
        if rate.source.is_observed() {
            settings.calibrated_slack
        } else {
            settings.first_contact_slack
        }
    };

    // The walk's length from the slowest device, as in version 3 (PROTOCOL.md 18.6): walkers
    // are raised where even the longest walk of the configured ones is too short (a CPU whose
    // small pool sits in its caches).
    let slowest = rates.iter().map(|r| r.bytes_per_sec).fold(f64::INFINITY, f64::min);
    let target_ms = settings.walk_target_ms as f64;
    let ms_for = |walkers: u32, steps: u32| f64::from(walkers) * f64::from(steps) * SLICE_BYTES as f64 / slowest * 1e3;
    let configured = walkers(backend, devices, settings);
    let walkers = if ms_for(configured, MAX_WALK_STEPS) >= target_ms {
        configured
    } else {
        let needed = (f64::from(configured) * target_ms / ms_for(configured, MAX_WALK_STEPS)).ceil();
        needed.clamp(f64::from(configured), f64::from(MAX_WALKERS)) as u32
    };
    if ms_for(walkers, MAX_WALK_STEPS) < target_ms / 2.0 {
        return Err(PlanV4Error::WalkTooShort {
            walkers,
            reach_ms: ms_for(walkers, MAX_WALK_STEPS),
            target_ms: settings.walk_target_ms,
        });
    }
    let wanted = target_ms / ms_for(walkers, 1);
    let walk_steps = wanted.ceil().clamp(1.0, f64::from(MAX_WALK_STEPS)) as u32;

    let walk_bytes = f64::from(walkers) * f64::from(walk_steps) * SLICE_BYTES as f64;
    let worst = worst_counts(design);
    if worst.0 == 0 || worst.1 == 0 {
        return Err(PlanV4Error::NoOpenings);
    }
    let plans: Vec<DeviceWalkPlan> = devices
        .iter()
        .zip(rates)
        .zip(&pool_chains)
        .map(|((device, rate), &pool_chains)| {
            let slack = slack_of(rate);
            let model = bound::model_for_device(&device.name, device.memory_bytes);
            // The clock hides more the lower the expected rate is against the datasheet: the
            // bound is taken at the rate this device is actually expected at (a first-contact
            // rate is 0.75 of the datasheet), never at the design's 0.9 unless it is that.
            let (steps_opened, rows_checked, proven) = match model {
                Some(model) => {
                    let expected_eta = (rate.bytes_per_sec / model.bandwidth).min(1.0);
                    counts(design, model, slack, expected_eta, worst)
                }
                None => (worst.0, worst.1, None),
            };
            let expected_ms = (walk_bytes / rate.bytes_per_sec * 1e3).ceil() as u64;
            DeviceWalkPlan {
                pool_chains,
                bytes_per_sec: rate.bytes_per_sec,
                source: rate.source,
                expected_ms,
                slack,
                deadline_ms: (expected_ms as f64 * slack).ceil() as u64,
                steps_opened,
                rows_checked,
                sized_as: model.map(|m| m.name),
                held_at_least: proven.map(|p| p.held_at_least),
            }
        })
        .collect();
    let most = pool_chains.iter().copied().max().unwrap_or(1);
    Ok(ChainPoolPlan {
        params: ChainPoolParams {
            walkers,
            walk_steps,
            pool_chains,
        },
        min_iterations: min_iterations(n, checkpoint_every),
        min_chains: most.saturating_mul(devices.len() as u64),
        devices: plans,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_attest_shared::memory::chain_pool::chain_pools;
    use gpu_attest_shared::params::{ChallengeParams, Work};
    use gpu_attest_shared::partition::canonical_partition;

    fn gpu(name: &str, memory_bytes: u64) -> DeviceInfo {
        DeviceInfo {
            index: 0,
            name: name.into(),
            uuid: String::new(),
            memory_bytes,
            sm_count: 132,
            compute_capability: (9, 0),
            pci_bus_id: String::new(),
            driver_version: String::new(),
        }
    }

    /// The design's own parameters, its calibrated slack of 1.25 included.
    fn design_settings() -> V4Settings {
        V4Settings {
            calibrated_slack: VERSION_4.slack,
            ..V4Settings::default()
        }
    }

    fn calibrated(bytes_per_sec: f64) -> ExpectedWalk {
        ExpectedWalk {
            bytes_per_sec,
            source: RateSource::Calibrated,
        }
    }

    #[test]
    fn chains_run_long_enough_for_kappa() {
        // K >= 2^16 / n, in whole checkpoints: 32 at n = 2048 (design 0), 256 at n = 256.
        assert_eq!(min_iterations(2048, 1), 32);
        assert_eq!(min_iterations(2048, 8), 32);
        assert_eq!(min_iterations(2048, 5), 35);
        assert_eq!(min_iterations(256, 1), 256);
        assert_eq!(min_iterations(768, 1), 86);
        for (n, every) in [(256, 1), (768, 3), (2048, 8), (4096, 1)] {
            let k = min_iterations(n, every);
            assert!(2 * u64::from(n) * u64::from(k) >= 1 << 17, "n = {n}");
            assert_eq!(k % every, 0);
        }
    }

    /// Design table 2.6: `N_j = floor(0.96 * C_j / n^2)` at n = 2048, datasheet sizes.
    #[test]
    fn pools_are_the_design_tables_at_its_sizes() {
        let cases = [
            ("NVIDIA H100 80GB HBM3", 80_000_000_000, 18310),
            ("NVIDIA H200", 141_000_000_000, 32272),
            ("NVIDIA GeForce RTX 4090", 24_000_000_000, 5493),
        ];
        for (name, bytes, want) in cases {
            let plan = plan_chain_pools(
                "cuda",
                &[gpu(name, bytes)],
                &[calibrated(3e12)],
                2048,
                8,
                &design_settings(),
            )
            .unwrap();
            assert_eq!(plan.params.pool_chains, vec![want], "{name}");
            assert_eq!(plan.min_chains, want);
            assert_eq!(plan.min_iterations, 32);
        }
    }

    /// What this validator plans, a GPU miner of this release holds: beside the states of 96%
    /// of the claim (as NVML reports it), the walk's buffers (`walk_buffer_bytes` for the
    /// planned W and L), the reserve kept beside a pool, one chain's batch at n = 2048, 512 MiB
    /// for the CUDA context and modules, and 160 MiB for the tree kernels' local memory (138 MB
    /// on an H100), on the smallest and largest GPUs the bound's
    /// table names, at the default walk target; and at ten times it, on the H100 and H200.
    /// An RTX 4090 cannot hold a 20 s walk's kept traces (1 byte a step, 275 MB) in the 4% its
    /// pool leaves: its miner refuses such a challenge before any work, naming the sizes
    /// (`check_chain_pool_capacity`), as this test shows by the numbers.
    #[test]
    fn a_gpu_holds_the_planned_pool_beside_its_walk_and_chains() {
        use gpu_attest_kernels::plan::POOL_RESERVE_BYTES;
        use gpu_attest_kernels::pool_states::walk_buffer_bytes;
        let one_chain = 3 * 2048 * 2048 + 2048 * 2048 / 16 + 32 * 32;
        let context = (512 << 20) + (160 << 20);
        // (name, NVML's total, a calibrated walk rate)
        let cases = [
            ("NVIDIA GeForce RTX 4090", 25_757_220_864u64, 0.9e12),
            ("NVIDIA H100 80GB HBM3", 85_520_809_984, 3.0e12),
            ("NVIDIA H200", 150_754_820_096, 4.3e12),
        ];
        for (name, total, rate) in cases {
            for target_ms in [2_000, 20_000] {
                let fits = target_ms == 2_000 || !name.contains("4090");
                let settings = V4Settings {
                    walk_target_ms: target_ms,
                    ..design_settings()
                };
                let plan =
                    plan_chain_pools("cuda", &[gpu(name, total)], &[calibrated(rate)], 2048, 8, &settings).unwrap();
                let states = plan.params.pool_chains[0] * 2048 * 2048;
                let walk = walk_buffer_bytes(plan.params.walkers, plan.params.walk_steps);
                let needed = states + walk + POOL_RESERVE_BYTES + one_chain + context;
                assert_eq!(
                    needed <= total,
                    fits,
                    "{name}, {target_ms} ms: {} MiB of states, {} MiB for the walk of {} x {}, {} MiB free",
                    states >> 20,
                    walk >> 20,
                    plan.params.walkers,
                    plan.params.walk_steps,
                    total.saturating_sub(needed) >> 20,
                );
            }
        }
    }

    /// Design table 6.3 at the calibrated slack; the worst row for a device outside the table.
    #[test]
    fn openings_follow_the_bound_per_model() {
        let devices = [
            gpu("NVIDIA H100 80GB HBM3", 80_000_000_000),
            gpu("NVIDIA H200", 141_000_000_000),
            gpu("NVIDIA GeForce RTX 4090", 24_000_000_000),
            gpu("NVIDIA L40S", 48_000_000_000),
        ];
        // Each at the design's 0.9 of its datasheet bandwidth.
        let rates = [0.9 * 3.35e12, 0.9 * 4.8e12, 0.9 * 1.008e12, 0.9 * 8.64e11].map(calibrated);
        let plan = plan_chain_pools("cuda", &devices, &rates, 2048, 8, &design_settings()).unwrap();
        let got: Vec<_> = plan
            .devices
            .iter()
            .map(|d| (d.steps_opened, d.rows_checked, d.sized_as))
            .collect();
        assert_eq!(
            got,
            [
                (497, 185, Some("H100 SXM")),
                (342, 138, Some("H200")),
                (1649, 474, Some("RTX 4090")),
                (1649, 474, None),
            ]
        );
        assert!(plan.devices[..3].iter().all(|d| d.catches_ninety_percent()));
        assert!(
            !plan.devices[3].catches_ninety_percent(),
            "nothing is claimed for a model the bound lacks"
        );
        assert_eq!(plan.slack(), 1.25);
    }

    /// Each device is timed at its own rate: a fast device's deadline is not the slow one's.
    #[test]
    fn each_device_has_its_own_deadline() {
        let devices = [
            gpu("NVIDIA H200", 141_000_000_000),
            gpu("NVIDIA H100 80GB HBM3", 80_000_000_000),
        ];
        let rates = [calibrated(4.3e12), calibrated(3.0e12)];
        let plan = plan_chain_pools("cuda", &devices, &rates, 2048, 8, &design_settings()).unwrap();
        let (fast, slow) = (&plan.devices[0], &plan.devices[1]);
        let walk_bytes = f64::from(plan.params.walkers) * f64::from(plan.params.walk_steps) * 65536.0;
        assert_eq!(fast.expected_ms, (walk_bytes / 4.3e12 * 1e3).ceil() as u64);
        assert!(
            slow.expected_ms >= 2_000 && slow.expected_ms < 2_010,
            "{}",
            slow.expected_ms
        );
        assert!(
            fast.deadline_ms < slow.expected_ms,
            "the fast device may not walk as slowly as the slow one"
        );
        assert_eq!(fast.deadline_ms, (fast.expected_ms as f64 * 1.25).ceil() as u64);
        // Each device runs at least its pool's chains under the even split.
        let work = Work::new(ChallengeParams {
            nonce: [0; 32],
            seed: [0; 32],
            miner_key: [0; 32],
            n: 2048,
            num_chains: plan.min_chains,
            iterations: plan.min_iterations,
            checkpoint_every: 8,
        })
        .unwrap();
        let partition = canonical_partition(plan.min_chains, 2).unwrap();
        assert!(chain_pools(&work, &partition, &plan.params.pool_chains).is_ok());
    }

    #[test]
    fn first_contact_is_looser_and_says_what_it_proves() {
        let device = [gpu("NVIDIA H100 80GB HBM3", 80_000_000_000)];
        let first = [ExpectedWalk {
            bytes_per_sec: 0.75 * 3.35e12,
            source: RateSource::Shipped,
        }];
        let plan = plan_chain_pools("cuda", &device, &first, 2048, 8, &design_settings()).unwrap();
        assert_eq!(plan.slack(), 2.0);
        let d = &plan.devices[0];
        assert!(
            !d.catches_ninety_percent(),
            "x* at S = 2 over 0.75 of the datasheet is past the 90% holder's shortfall"
        );
        assert_eq!(
            (d.steps_opened, d.rows_checked),
            (1649, 474),
            "catching the 90% holder would take more: opened as the worst row"
        );
        // The weaker bound the verdict states: the clock hides 6.22%, the openings catch what
        // lies beyond it less surely than at the calibrated clock.
        let held = d.held_at_least.unwrap();
        assert!((held - 0.8854).abs() < 0.0001, "{held}");

        // An H200's first contact needs fewer than the worst row's openings to catch the 90%
        // holder: it is opened that much, and claims it.
        let h200 = [gpu("NVIDIA H200", 141_000_000_000)];
        let first = [ExpectedWalk {
            bytes_per_sec: 0.75 * 4.8e12,
            source: RateSource::Shipped,
        }];
        let plan = plan_chain_pools("cuda", &h200, &first, 2048, 8, &design_settings()).unwrap();
        let d = &plan.devices[0];
        assert!(d.steps_opened > 342 && d.steps_opened <= 1649, "{}", d.steps_opened);
        assert!(d.rows_checked > 138 && d.rows_checked <= 474, "{}", d.rows_checked);
        assert!(d.catches_ninety_percent(), "{:?}", d.held_at_least);
    }

    /// A calibrated slack over a rate well under the design's 0.9 of the datasheet (one learned
    /// from version 3's walks, say) does not claim the 90% holder caught.
    #[test]
    fn the_claim_follows_the_rate_the_device_is_expected_at() {
        let device = [gpu("NVIDIA H100 80GB HBM3", 80_000_000_000)];
        let at = |share: f64| {
            let rate = [calibrated(share * 3.35e12)];
            plan_chain_pools("cuda", &device, &rate, 2048, 8, &design_settings())
                .unwrap()
                .devices[0]
                .clone()
        };
        assert!(at(0.9).catches_ninety_percent());
        assert!(!at(0.5).catches_ninety_percent());
        assert_eq!(
            (at(0.5).steps_opened, at(0.5).rows_checked),
            (1649, 474),
            "raised as far as the worst row"
        );
        assert_eq!((at(0.9).steps_opened, at(0.9).rows_checked), (497, 185));
    }

    #[test]
    fn a_cpus_walkers_grow_and_bad_inputs_are_named() {
        let mut cpu = gpu("cpu: test", 1 << 20);
        cpu.sm_count = 2;
        // 16 slices of 64 KiB at 10 GB/s: 8 walkers reach 2 s in well under 2^20 steps.
        let plan = plan_chain_pools("cpu", &[cpu.clone()], &[calibrated(1e10)], 256, 1, &design_settings()).unwrap();
        assert_eq!(plan.params.walkers, 8);
        assert_eq!(plan.params.pool_chains, vec![15]);
        assert_eq!(plan.min_iterations, 256);
        let fast = plan_chain_pools("cpu", &[cpu.clone()], &[calibrated(1e14)], 256, 1, &design_settings()).unwrap();
        assert!(fast.params.walkers > 8, "{:?}", fast.params);
        assert!(matches!(
            plan_chain_pools("cpu", &[cpu.clone()], &[calibrated(1e18)], 256, 1, &design_settings()),
            Err(PlanV4Error::WalkTooShort { .. })
        ));

        let settings = V4Settings::default();
        assert_eq!(
            plan_chain_pools("cpu", &[cpu.clone()], &[calibrated(1e10)], 300, 1, &settings),
            Err(PlanV4Error::NotWholeSlices(300))
        );
        assert!(matches!(
            plan_chain_pools("cpu", &[cpu.clone()], &[calibrated(1e10)], 2048, 1, &settings),
            Err(PlanV4Error::NoStateFits { device: 0, .. })
        ));
        assert!(matches!(
            plan_chain_pools("cpu", &[cpu.clone()], &[calibrated(0.0)], 256, 1, &settings),
            Err(PlanV4Error::NoRate { device: 0, .. })
        ));
        assert!(matches!(
            plan_chain_pools("cpu", &[cpu], &[], 256, 1, &settings),
            Err(PlanV4Error::RatesPerDevice { devices: 1, rates: 0 })
        ));
    }
}
