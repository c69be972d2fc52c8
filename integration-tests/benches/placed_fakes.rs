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
//! `cargo bench -p gpu-attest-integration-tests --bench placed_fakes [-- RUNS]`

#[path = "../tests/common/mod.rs"]
mod common;

use common::pool_cheat::CheatingCpu;
use common::step_fakes::StepFakes;
use common::v4::{v4_challenge, validator_exchange};
use common::*;
use gpu_attest_miner::config::Limits;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_shared::memory::bound::{self, VERSION_4};
use gpu_attest_shared::memory::chain_pool::ChainPoolParams;
use gpu_attest_validator::memory::plan_v4::{ChainPoolPlan, DeviceWalkPlan};
use gpu_attest_validator::rates::RateSource;
use gpu_attest_validator::reason::ReasonCode;
use std::sync::Arc;
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
        let (total, faked) = (self.total() as f64, f64::from(self.faked));
        (0..self.opened)
            .map(|i| (total - faked - f64::from(i)) / (total - f64::from(i)))
            .product()
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

/// `runs` commitments of a miner faking `setting`'s bunch: how many passed the memory phase.
async fn passes(setting: &Setting, runs: u32, seed: u8) -> u32 {
    let (first, end) = (setting.first, setting.first + setting.faked);
    let faker = CheatingCpu::new(
        test_cpu(2).with_logical_devices(1),
        StepFakes(Arc::new(move |_, walker, step| {
            walker == 0 && (first..end).contains(&step)
        })),
    );
    let kernel = faker.kernel();
    let core = miner_on(
        seed,
        &[validator_key()],
        selected(kernel, Arc::new(faker)),
        // It says version 4, as a miner must to be sent a version 4 challenge.
        Limits {
            preview_protocol_4: true,
            ..Limits::default()
        },
        NonceLog::in_memory(),
    );
    let miner_key = core.public_key();
    let miner = spawn_miner(core).await;
    let params = ChainPoolParams {
        walkers: setting.walkers,
        walk_steps: setting.steps,
        pool_chains: vec![2],
    };
    let plan = ChainPoolPlan {
        params: params.clone(),
        min_iterations: 2,
        min_chains: 2,
        devices: vec![DeviceWalkPlan {
            pool_chains: 2,
            bytes_per_sec: 1e9,
            source: RateSource::Shipped,
            expected_ms: 300_000,
            slack: 2.0,
            deadline_ms: 600_000,
            steps_opened: setting.opened,
            rows_checked: 0,
            sized_as: None,
            bound_as: "a CPU",
            held_at_least: None,
        }],
        host_held_at_least: 0.0,
        short_of_ninety: None,
    };
    let mut passed = 0;
    for run in 0..runs {
        let mut nonce = [seed; 32];
        nonce[..4].copy_from_slice(&run.to_le_bytes());
        let c = v4_challenge(miner_key, nonce, 1, N, 2, params.clone());
        let reasons = validator_exchange(&miner, &c, &plan, |_| {}, None, nonce).await;
        assert!(
            reasons.iter().all(|r| r.code == ReasonCode::WalkSegmentMismatch),
            "only a faked step may fail: {reasons:?}"
        );
        passed += u32::from(reasons.is_empty());
    }
    passed
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
}
