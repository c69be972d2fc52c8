//! Placed fakes against version 4's step openings (docs/design/protocol-v4.md 6 and 9). A miner
//! short of part of its pool fakes the steps that would read what it lacks, and places its fakes
//! where it likes: here bunched in one walker, the placement that bought a version 3 cheater the
//! rest of a segment. Each run is one commitment with the real miner daemon (its walk faked by
//! `tests/common/step_fakes.rs`) and the validator's exchange (validator/src/attest/walk_v4.rs),
//! in two settings:
//!
//! - few openings, so that the predicted pass rate is near 30%: the count of passes must fall in
//!   the 99% binomial interval of the prediction, which tests the prediction itself;
//! - the bound's counts for an H100 SXM (design table 6.3: a faked share of at least 1.126%, 468
//!   openings), predicted to pass under 1%: at most 6 passes in 200 (`P(X >= 7) = 0.43%` at
//!   `p = 0.01`).
//!
//! The prediction is exact: with every state committed, a run passes if and only if none of the
//! `s` steps drawn uniformly without replacement among the `W * L` is one of the `F` faked,
//! `C(WL - F, s) / C(WL, s)`, wherever the fakes are.
//!
//! Then the cheater the bound is computed against (PROTOCOL.md 20.9 step 7, design 6.2), played
//! by `Grinding` in `tests/common/step_fakes.rs`: short of the share of its pool that the
//! planner's own verdict for an H100 SXM at the shipped settings says it holds at least, it
//! serves misses up to what its clock hides, fakes the rest, and grinds each made-up state until
//! its next steps read slices it holds. Its faked share must be no less than the bound's least,
//! its pass count must agree with the exact prediction from its own fakes (few openings), and at
//! the planner's openings, over three times the runs, it must pass no more often than the bound
//! allows. Its walk is 16,384 steps: shorter than a GPU's (about 1e8), which favours it, since its
//! faked share then varies more from run to run and the pass probability is convex in it.
//!
//! `cargo bench -p gpu-attest-integration-tests --bench placed_fakes [-- RUNS]`

#[path = "../tests/common/mod.rs"]
mod common;

use common::pool_cheat::CheatingCpu;
use common::pool_cheat::PoolCheat;
use common::step_fakes::{Grinding, StepFakes};
use common::v4::{v4_challenge, validator_exchange};
use common::*;
use gpu_attest_miner::config::Limits;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::device::DeviceInfo;
use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::memory::bound::{self, VERSION_4};
use gpu_attest_shared::memory::chain_pool::ChainPoolParams;
use gpu_attest_validator::memory::plan_v4::{
    ChainPoolPlan, DeviceWalkPlan, ExpectedWalk, V4Settings, plan_chain_pools,
};
use gpu_attest_validator::verdict::class::RateSource;
use gpu_attest_validator::verdict::reason::ReasonCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const DEFAULT_RUNS: u32 = 200;
const N: u32 = 256;

/// One setting: the walk's shape, the faked steps (a bunch in walker 0 from step `first`), and
/// the steps opened.
struct Setting {
    label: String,
    walkers: u32,
    steps: u32,
    faked: u32,
    first: u32,
    opened: u32,
}

impl Setting {
    fn total(&self) -> u64 {
        u64::from(self.walkers) * u64::from(self.steps)
    }

    /// `C(WL - F, s) / C(WL, s)`.
    fn predicted_pass(&self) -> f64 {
        without_replacement(self.total(), u64::from(self.faked), self.opened)
    }
}

/// The smallest and largest pass counts of `runs` at `p` that each tail leaves at least `tail`
/// of probability beyond: the central 99% interval at `tail = 0.005`.
fn binomial_interval(runs: u32, p: f64, tail: f64) -> (u32, u32) {
    let pmf: Vec<f64> = (0..=runs)
        .map(|k| {
            let ln_choose = ln_factorial(runs) - ln_factorial(k) - ln_factorial(runs - k);
            (ln_choose + f64::from(k) * p.ln() + f64::from(runs - k) * (1.0 - p).ln()).exp()
        })
        .collect();
    let mut below = 0.0;
    let mut low = 0;
    while low < runs && below + pmf[low as usize] <= tail {
        below += pmf[low as usize];
        low += 1;
    }
    let mut above = 0.0;
    let mut high = runs;
    while high > 0 && above + pmf[high as usize] <= tail {
        above += pmf[high as usize];
        high -= 1;
    }
    (low, high)
}

fn ln_factorial(k: u32) -> f64 {
    (2..=k).map(|i| f64::from(i).ln()).sum()
}

/// `runs` commitments of a miner wearing `cheat` on one CPU device, its pool `params`' chains
/// (one slice each at n = 256), each opened at `opened` steps: whether each passed the memory
/// phase. Only a faked step may fail.
async fn commitments<C: PoolCheat + 'static>(
    cheat: C,
    params: &ChainPoolParams,
    opened: u32,
    runs: u32,
    seed: u8,
) -> Vec<bool> {
    // Claiming room for the pool: 64 KiB a chain at n = 256, and as much again.
    let claimed = 2 * params.pool_chains[0] * 65536;
    let cpu = CpuBackend::new(2, None).unwrap().claiming(TEST_CORES, claimed);
    let cheater = CheatingCpu::new(cpu.with_logical_devices(1), cheat);
    let kernel = cheater.kernel();
    let backend = selected(kernel, Arc::new(cheater));
    let claim = HardwareClaim {
        devices: backend.devices(),
        backend: backend.name.clone(),
        kernel: backend.kernel.clone(),
    };
    let core = miner_on(
        seed,
        &[validator_key()],
        backend,
        // It says version 4, as a miner must to be sent a version 4 challenge.
        Limits {
            protocol_4: true,
            ..Limits::default()
        },
        NonceLog::in_memory(),
    );
    let miner_key = core.public_key();
    let miner = spawn_miner(core).await;
    let chains = params.pool_chains[0];
    let plan = ChainPoolPlan {
        params: params.clone(),
        min_iterations: 2,
        min_chains: chains,
        devices: vec![DeviceWalkPlan {
            pool_chains: chains,
            bytes_per_sec: 1e9,
            source: RateSource::Shipped,
            expected_ms: 300_000,
            slack: 2.0,
            deadline_ms: 600_000,
            steps_opened: opened,
            rows_checked: 0,
            sized_as: None,
            bound_as: "a CPU",
            held_at_least: None,
        }],
        host_held_at_least: 0.0,
        short_of_ninety: None,
    };
    let mut passed = Vec::with_capacity(runs as usize);
    for run in 0..runs {
        let mut nonce = [seed; 32];
        nonce[..4].copy_from_slice(&run.to_le_bytes());
        let mut c = v4_challenge(miner_key, nonce, 1, N, chains, params.clone());
        c.inventory_digest = claim.digest();
        let reasons = validator_exchange(&miner, &c, &plan, |_| {}, None, nonce).await;
        assert!(
            reasons.iter().all(|r| r.code == ReasonCode::WalkSegmentMismatch),
            "only a faked step may fail: {reasons:?}"
        );
        passed.push(reasons.is_empty());
    }
    passed
}

/// `runs` commitments of a miner faking `setting`'s bunch: how many passed the memory phase.
async fn passes(setting: &Setting, runs: u32, seed: u8) -> u32 {
    let (first, end) = (setting.first, setting.first + setting.faked);
    let faker = StepFakes(Arc::new(move |_, walker, step| {
        walker == 0 && (first..end).contains(&step)
    }));
    let params = ChainPoolParams {
        walkers: setting.walkers,
        walk_steps: setting.steps,
        pool_chains: vec![2],
    };
    let passed = commitments(faker, &params, setting.opened, runs, seed).await;
    passed.iter().filter(|&&p| p).count() as u32
}

/// A grinding cheater's setting: the walk, its pool (one slice a chain), the share it lacks and
/// the share its clock hides, and the steps opened.
struct GrindSetting {
    label: String,
    walkers: u32,
    steps: u32,
    slices: u64,
    /// `x`: the cheater lacks the nearest whole count of slices to this share.
    short: f64,
    /// `x*`: the share of the walk's steps it may serve.
    hidden: f64,
    /// The walk-lengths of reads its deadline allows at full bandwidth.
    reads: f64,
    opened: u32,
}

/// What `runs` commitments of a [`Grinding`] cheater in `setting` came to.
struct Ground {
    passed: u32,
    /// The sum over runs of each run's exact pass probability, from its own faked count.
    expected: f64,
    faked: Vec<f64>,
    reads: Vec<f64>,
    phi_min: f64,
    run: u32,
    missing: u64,
}

async fn grind(setting: &GrindSetting, runs: u32, seed: u8) -> Ground {
    // The nearest whole count of slices (at 1024 slices, 6.25% is 64 of them exactly), and the
    // cheater plays its own shortfall.
    let missing = (setting.short * setting.slices as f64).round() as u64;
    let short = missing as f64 / setting.slices as f64;
    let phi_min =
        bound::least_faked_share(short, setting.hidden, setting.reads).expect("a shortfall the clock leaves to fake");
    let run = bound::ground_run(short, setting.hidden, setting.reads, phi_min).round() as u32;
    let tallies = Arc::new(Mutex::new(Vec::new()));
    let cheat = Grinding {
        missing,
        serve_share: setting.hidden,
        run,
        tallies: tallies.clone(),
    };
    let params = ChainPoolParams {
        walkers: setting.walkers,
        walk_steps: setting.steps,
        pool_chains: vec![setting.slices],
    };
    let passed = commitments(cheat, &params, setting.opened, runs, seed).await;
    let tallies = tallies.lock().unwrap().clone();
    assert_eq!(tallies.len(), passed.len(), "one walk a commitment");
    let total = u64::from(setting.walkers) * u64::from(setting.steps);
    Ground {
        passed: passed.iter().filter(|&&p| p).count() as u32,
        expected: tallies
            .iter()
            .map(|t| without_replacement(total, t.faked, setting.opened))
            .sum(),
        faked: tallies.iter().map(|t| t.faked as f64 / t.steps as f64).collect(),
        reads: tallies.iter().map(|t| t.reads as f64 / t.steps as f64).collect(),
        phi_min,
        run,
        missing,
    }
}

/// `C(total - faked, opened) / C(total, opened)`.
fn without_replacement(total: u64, faked: u64, opened: u32) -> f64 {
    (0..u64::from(opened))
        .map(|i| (total - faked).saturating_sub(i) as f64 / (total - i) as f64)
        .product()
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The most passes of `runs` that a pass probability of at most `p` leaves with probability at
/// least 1%: more refutes the stated bound.
fn most_passes_at(runs: u32, p: f64) -> u32 {
    binomial_interval(runs, p, 0.01).1
}

/// The planner's own plan for one H100 SXM, calibrated at the design's 0.9 of its datasheet
/// bandwidth, at the shipped settings: its openings and what its verdict states.
fn h100_as_planned() -> (DeviceWalkPlan, f64) {
    let h100 = DeviceInfo {
        index: 0,
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: String::new(),
        memory_bytes: 80_000_000_000,
        sm_count: 132,
        compute_capability: (9, 0),
        pci_bus_id: String::new(),
        driver_version: String::new(),
    };
    let rate = ExpectedWalk {
        bytes_per_sec: VERSION_4.eta * bound::model("H100 SXM").expect("the table's H100").bandwidth,
        source: RateSource::Calibrated,
    };
    let plan = plan_chain_pools("cuda", &[h100], &[rate], 2048, 8, &V4Settings::default()).expect("an H100's plan");
    let slack = plan.slack();
    (plan.devices[0].clone(), slack)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let runs: u32 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(DEFAULT_RUNS);
    let h100 = bound::model("H100 SXM").expect("the table's H100");
    let sizing = VERSION_4.size(h100, bound::sized_sources(h100)).expect("the H100 row");
    let (phi, openings) = (sizing.faked.expect("a faked share"), sizing.openings.expect("openings"));
    let (walkers, steps) = (8, 512);
    let faked = (phi * f64::from(walkers * steps)).ceil() as u32;
    let settings = [
        Setting {
            label: "few openings (predicted near 30%)".into(),
            walkers: 4,
            steps: 256,
            faked: 50,
            first: 100,
            opened: 24,
        },
        Setting {
            label: format!("H100 bound: {:.3}% faked, {openings} openings", phi * 100.0),
            walkers,
            steps,
            faked,
            first: 200,
            opened: openings,
        },
    ];
    println!("placed fakes: {runs} runs a setting, fakes bunched in walker 0, n = {N}, 1 CPU device\n");
    for (i, setting) in settings.iter().enumerate() {
        let started = Instant::now();
        let passed = passes(setting, runs, 0x70 + i as u8).await;
        let p = setting.predicted_pass();
        let (low, high) = binomial_interval(runs, p, 0.005);
        println!(
            "{:<44} W {} x L {}, {} faked of {}, {} opened: passed {passed}/{runs}; predicted p = {:.4} ({:.1} expected), 99% interval {low}..={high}: {} ({:.0} s)",
            setting.label,
            setting.walkers,
            setting.steps,
            setting.faked,
            setting.total(),
            setting.opened,
            p,
            p * f64::from(runs),
            if (low..=high).contains(&passed) {
                "inside"
            } else {
                "OUTSIDE"
            },
            started.elapsed().as_secs_f64()
        );
    }

    // The grinding cheater short of pool, against the planner's own plan for an H100 SXM at
    // the shipped settings: it holds exactly the share the verdict states (`held_at_least`),
    // so the bound says it passes at most `pass` (0.5%) of the time.
    let (planned, slack) = h100_as_planned();
    let held = planned.held_at_least.expect("a GPU's bound");
    let short = bound::shortfall_holding(held, VERSION_4.pool_share);
    let clock = VERSION_4
        .clocked(h100, bound::sized_sources(h100), slack, VERSION_4.eta)
        .expect("the H100's clock");
    let at_counts = GrindSetting {
        label: format!(
            "grinding, the planner's H100 ({} openings, holds {:.2}%)",
            planned.steps_opened,
            held * 100.0
        ),
        walkers: 16,
        steps: 1024,
        slices: 1024,
        short,
        hidden: clock.undetected,
        reads: clock.reads,
        opened: planned.steps_opened,
    };
    // The same cheater with openings cut to a predicted pass near 30%: the count must agree
    // with the exact per-run prediction, which checks that a ground state is a failed opening
    // like any other and that nothing else fails.
    let phi_min = bound::least_faked_share(short, clock.undetected, clock.reads).expect("a share to fake");
    let few = GrindSetting {
        label: "grinding, few openings (predicted near 30%)".into(),
        opened: (0.3f64.ln() / (1.0 - phi_min).ln()).round() as u32,
        ..at_counts
    };
    println!(
        "\ngrinding cheater short of pool: {runs} runs (x3 at the planner's counts), n = {N}, 1 CPU device, pool of {} slices; \
         the verdict's bound is short by x = {:.4}% of the pool, its clock (S = {slack}, eta = {}) hides x* = {:.4}% and allows {:.3} walk-lengths of reads\n",
        at_counts.slices,
        short * 100.0,
        VERSION_4.eta,
        clock.undetected * 100.0,
        clock.reads
    );
    for (i, (setting, runs)) in [(&few, runs), (&at_counts, 3 * runs)].into_iter().enumerate() {
        let started = Instant::now();
        let g = grind(setting, runs, 0x90 + i as u8).await;
        let p = g.expected / f64::from(runs);
        let (low, high) = binomial_interval(runs, p, 0.005);
        // What the bound says this cheater passes at most: (1 - phi_min)^s at its own shortfall,
        // under the 0.5% the openings are sized for wherever it holds no less than the verdict says.
        let bound_pass = (1.0 - g.phi_min).powf(f64::from(setting.opened));
        let stated = most_passes_at(runs, bound_pass);
        println!(
            "{:<52} W {} x L {}, lacks {} slices, grinds runs of {}: faked {:.4}% (bound {:.4}%, min {:.4}%, max {:.4}%), reads {:.3} walk-lengths; \
             {} opened: passed {}/{runs}; predicted from its fakes p = {:.5} ({:.2} expected), 99% interval {low}..={high}: {}; \
             the bound's p = {:.5} allows at most {stated}: {} ({:.0} s)",
            setting.label,
            setting.walkers,
            setting.steps,
            g.missing,
            g.run,
            mean(&g.faked) * 100.0,
            g.phi_min * 100.0,
            g.faked.iter().copied().fold(f64::INFINITY, f64::min) * 100.0,
            g.faked.iter().copied().fold(0.0, f64::max) * 100.0,
            mean(&g.reads),
            setting.opened,
            g.passed,
            p,
            g.expected,
            if (low..=high).contains(&g.passed) {
                "inside"
            } else {
                "OUTSIDE"
            },
            bound_pass,
            if g.passed <= stated { "holds" } else { "REFUTED" },
            started.elapsed().as_secs_f64()
        );
    }
}
