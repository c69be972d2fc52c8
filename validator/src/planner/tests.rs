//! The planner's tests: what it plans for each inventory, config and rate book.

use super::*;
use crate::config::calibration::CalibrationConfig;
use crate::config::memory::MemoryConfig;
use crate::rates::shipped::shipped_rates;
use crate::store::Observation;
use gpu_attest_shared::inventory::MinerLimits;
use gpu_attest_shared::keys::KeyPair;
use gpu_attest_shared::params::PROTOCOL_VERSION;
use gpu_attest_shared::statement::DeviceInfo;

const H100: &str = "NVIDIA H100 80GB HBM3";
/// The shipped expected rate of one H100: half its dense int8 figure.
const H100_RATE: f64 = 1.979e15 / 2.0;
const OPS_PER_CHAIN: f64 = 2.0 * 2048.0 * 2048.0 * 2048.0 * 16.0;

fn inventory(backend: &str, kernel: &str, names: &[&str]) -> Inventory {
    Inventory {
        miner_key: KeyPair::from_seed([7; 32]).public_key(),
        claim: HardwareClaim {
            backend: backend.into(),
            kernel: kernel.into(),
            devices: names
                .iter()
                .enumerate()
                .map(|(j, n)| DeviceInfo {
                    index: j as u32,
                    name: n.to_string(),
                    sm_count: 4,
                    ..Default::default()
                })
                .collect(),
        },
        protocol_version: PROTOCOL_VERSION,
        software_version: "test".into(),
        limits: MinerLimits {
            max_n: 8192,
            max_chains: 1 << 16,
            max_iterations: 1 << 16,
            max_duration_ms: 3_600_000,
            max_samples: 64,
        },
        takes_finish_by: true,
    }
}

/// The chains alone: the memory phase's planning has tests of its own below.
fn config(challenge: ChallengeConfig) -> ValidatorConfig {
    ValidatorConfig {
        challenge,
        memory: MemoryConfig {
            enabled: false,
            ..MemoryConfig::default()
        },
        ..ValidatorConfig::default()
    }
}

/// A validator that still plans version 3's memory phase (`refuse_version_3` off), for the
/// tests of that phase while it remains in the code.
fn version_3_config() -> ValidatorConfig {
    let mut config = ValidatorConfig::default();
    config.memory.refuse_version_3 = false;
    config
}

fn shipped_book() -> RateBook {
    RateBook::shipped(shipped_rates(), CalibrationConfig::default())
}

/// One CUDA device `name` claiming `memory_bytes`, saying version 4, with room for the
/// chains its pool needs.
fn v4_inventory(name: &str, memory_bytes: u64) -> Inventory {
    let mut inv = inventory("cuda", "tensor", &[name]);
    inv.protocol_version = 4;
    inv.claim.devices[0].memory_bytes = memory_bytes;
    inv.limits.max_chains = 1 << 20;
    inv
}

/// A sampled plan with the default deadline policy and shipped rates, and zero nonce and seed.
fn plan_for(inv: &Inventory, cfg: &ChallengeConfig) -> Result<Plan, PlanError> {
    plan(inv, &config(cfg.clone()), &shipped_book(), true, [0; 32], [0; 32])
}

fn seconds(p: &Plan) -> f64 {
    OPS_PER_CHAIN * p.params.num_chains as f64 / p.expectation.ops_per_sec
}

#[test]
fn expected_rate_is_per_device_on_gpus_and_per_core_on_cpus() {
    let cfg = ValidatorConfig::default();
    let book = shipped_book();
    let gpus = inventory("cuda", "tensor", &[H100, H100]);
    let e = expectation(&gpus.claim, 2048, &book, &cfg);
    assert_eq!(e.ops_per_sec, 2.0 * H100_RATE);
    assert_eq!((e.source, e.miners, e.slack), (Some(RateSource::Shipped), 0, 3.0));
    // Four cores of avx512-vnni at the shipped 1.4e11 per core.
    let cpu = inventory("cpu", "avx512-vnni", &["cpu: Xeon"]);
    let e = expectation(&cpu.claim, 256, &book, &cfg);
    assert_eq!(e.ops_per_sec, 4.0 * 1.4e11);
    // The peaks a verdict states its share of: two H100s' datasheet figures; four cores of
    // 256 int8 operations a cycle at 5 GHz.
    assert_eq!(
        expectation(&gpus.claim, 2048, &book, &cfg).peak_ops_per_sec,
        2.0 * 1.979e15
    );
    assert_eq!(e.peak_ops_per_sec, 4.0 * 256.0 * 5.0e9);
}

#[test]
fn observed_rates_earn_the_tight_slack_only_for_every_device() {
    let cfg = ValidatorConfig::default();
    let mut book = shipped_book();
    let votes: Vec<Observation> = (1..=3)
        .map(|m| Observation {
            miner_key: [m; 32],
            ops_per_unit: 7.0e14,
        })
        .collect();
    let claim = inventory("cuda", "tensor", &[H100]).claim;
    book.learn(RateClass::of(&claim, &claim.devices[0], 2048), &votes);
    let e = expectation(&claim, 2048, &book, &cfg);
    assert_eq!(
        (e.ops_per_sec, e.source, e.miners),
        (7.0e14, Some(RateSource::Calibrated), 3)
    );
    assert_eq!(e.slack, cfg.deadline.slack);
    // One device of an unobserved class is at first contact, and the verdict says so; but
    // it loosens the deadline only by its own share: 8 calibrated H100s and one odd device
    // must still show 8 H100s' worth within the tight slack.
    let mixed = inventory("cuda", "tensor", &[H100, "NVIDIA A100"]).claim;
    let e = expectation(&mixed, 2048, &book, &cfg);
    assert_eq!((e.source, e.miners), (Some(RateSource::Shipped), 0));
    assert_eq!(e.ops_per_sec, 7.0e14 + 6.24e14 / 2.0);
    let least = 7.0e14 / cfg.deadline.slack + 6.24e14 / 2.0 / cfg.deadline.first_contact_slack;
    assert!((e.slack - e.ops_per_sec / least).abs() < 1e-12);
    let mut names = vec![H100; 8];
    names.push("Odd GPU");
    let padded = expectation(&inventory("cuda", "tensor", &names).claim, 2048, &book, &cfg);
    assert!(padded.slack < 1.06 * cfg.deadline.slack, "{}", padded.slack);
}

#[test]
fn chain_count_follows_target_and_device_count() {
    let mut inv = inventory("cuda", "tensor", &[H100, H100]);
    inv.limits.max_chains = 1 << 20;
    let cfg = ChallengeConfig::default();
    let p = plan_for(&inv, &cfg).unwrap();
    assert!((seconds(&p) - 30.0).abs() < 0.1, "{}", seconds(&p));
    assert_eq!(p.deadline_ms, (p.expected_ms as f64 * 3.0).ceil() as u64);
    assert_eq!(p.claim, inv.claim);
    assert_eq!(p.params.miner_key, inv.miner_key.0);
    // The miner's own limit caps the chain count (and so the work) below the target.
    inv.limits.max_chains = 1 << 16;
    let capped = plan_for(&inv, &cfg).unwrap();
    assert_eq!(capped.params.num_chains, 1 << 16);
    assert!(seconds(&capped) < 30.0);
}

#[test]
fn the_deadline_floor_is_met_with_work_never_with_slack() {
    let inv = inventory("cuda", "tensor", &[H100, H100]);
    let tiny = ChallengeConfig {
        target_seconds: 0.0,
        ..ChallengeConfig::default()
    };
    let p = plan_for(&inv, &tiny).unwrap();
    assert_eq!(p.deadline_ms, (p.expected_ms as f64 * 3.0).ceil() as u64);
    assert!(p.deadline_ms >= 2_000, "{}", p.deadline_ms);
    let one_less = Timing {
        ops_per_chain: OPS_PER_CHAIN,
        rate: p.expectation.ops_per_sec,
        slack: 3.0,
        fixed_s: 0.0,
    };
    assert!(one_less.deadline_ms(p.params.num_chains - 1) < 2_000);
    // A miner whose limits allow less work than the floor needs is refused, not timed loosely.
    let mut small = inv.clone();
    small.limits.max_chains = 100;
    match plan_for(&small, &tiny) {
        Err(PlanError::TooLittleWork {
            max_chains: 100,
            needed,
            min_ms: 2_000,
            // The refusal states the closed form, within rounding of the exact count.
        }) => assert!(
            needed.abs_diff(p.params.num_chains) <= p.params.num_chains / 100,
            "{needed}"
        ),
        other => panic!("{other:?}"),
    }
    // An absurd claim (64 CPUs of 4 billion cores each) is refused at once, not searched.
    let mut absurd = inventory("cpu", "portable", &["cpu"; 64]);
    for d in &mut absurd.claim.devices {
        d.sm_count = u32::MAX;
    }
    assert!(matches!(
        plan_for(&absurd, &ChallengeConfig::default()),
        Err(PlanError::TooLittleWork { .. })
    ));
}

#[test]
fn refuses_what_the_miner_cannot_take() {
    let mut inv = inventory("cpu", "portable", &["cpu"]);
    inv.limits.max_n = 128;
    let err = plan_for(&inv, &ChallengeConfig::default());
    assert_eq!(err.unwrap_err(), PlanError::SizeOverLimit { n: 256, max_n: 128 });
    inv.claim.devices.clear();
    let err = plan_for(&inv, &ChallengeConfig::default());
    assert_eq!(err.unwrap_err(), PlanError::Inventory(InventoryError::NoDevices));
    let mut many = inventory("cpu", "portable", &["cpu"; 65]);
    assert_eq!(
        plan_for(&many, &ChallengeConfig::default()).unwrap_err(),
        PlanError::Inventory(InventoryError::TooManyDevices(65))
    );
    many.claim.devices.truncate(64);
    many.limits.max_chains = 63;
    assert_eq!(
        plan_for(&many, &ChallengeConfig::default()).unwrap_err(),
        PlanError::ChainsBelowDevices {
            max_chains: 63,
            devices: 64
        }
    );
    let mut newer = inventory("cpu", "portable", &["cpu"]);
    newer.protocol_version = 5;
    assert_eq!(
        plan_for(&newer, &ChallengeConfig::default()).unwrap_err(),
        PlanError::Inventory(InventoryError::ProtocolVersion {
            theirs: 5,
            oldest: 2,
            ours: 4
        })
    );
}

#[test]
fn samples_adapt_to_the_miner_down_to_the_floor() {
    let mut inv = inventory("cpu", "portable", &["cpu"]);
    let cfg = ValidatorConfig {
        samples: 32,
        min_samples: 8,
        ..config(ChallengeConfig::default())
    };
    let book = shipped_book();
    let samples = |inv: &Inventory| plan(inv, &cfg, &book, true, [0; 32], [0; 32]).map(|p| p.samples);
    assert_eq!(samples(&inv), Ok(32));
    inv.limits.max_samples = 12;
    assert_eq!(samples(&inv), Ok(12));
    inv.limits.max_samples = 0; // not stated
    assert_eq!(samples(&inv), Ok(32));
    inv.limits.max_samples = 7;
    assert_eq!(
        samples(&inv),
        Err(PlanError::TooFewSamples {
            max_samples: 7,
            floor: 8
        })
    );
    // Full re-execution opens nothing, so the miner's sample limit does not matter.
    assert_eq!(plan(&inv, &cfg, &book, false, [0; 32], [0; 32]).unwrap().samples, 0);
}

/// The memory phase as PROTOCOL.md 18.6 sizes it, on a GPU at first contact.
#[test]
fn memory_phase_is_sized_from_claimed_memory_and_datasheet_bandwidth() {
    let mut inv = inventory("cuda", "tensor", &[H100]);
    inv.claim.devices[0].memory_bytes = 80 << 30;
    inv.limits.max_chains = 1 << 20;
    let with_memory = version_3_config();
    let p = plan(&inv, &with_memory, &shipped_book(), true, [0; 32], [0; 32]).unwrap();
    let m = p.memory.v3().expect("a version 3 miner gets the memory phase");
    assert_eq!(m.pools[0].entries, (80u64 << 30) * 950 / 1000 / 65536);
    assert_eq!(m.params.pool_permille, 950);
    assert_eq!((m.params.walkers, m.params.walk_checkpoint_every), (8192, 8));
    // 0.75 of the H100's 3.35 TB/s, a walk of about 2 s, first-contact slack 2.
    assert_eq!(m.bytes_per_sec, vec![0.75 * 3.35e12]);
    assert_eq!((m.source, m.slack), (RateSource::Shipped, 2.0));
    let seconds = m.walk_bytes() as f64 / (0.75 * 3.35e12);
    assert!((2.0..2.01).contains(&seconds), "{seconds}");
    assert_eq!(m.walk_expected_ms, (seconds * 1000.0).ceil() as u64);
    assert_eq!(m.walk_deadline_ms, m.walk_expected_ms * 2);
    // The fill is added to the chains' time: its operations at the compute rate, each
    // counted as the tensor kernel's fill weight, 3 (PROTOCOL.md 18.6).
    assert_eq!(m.fill_weight, 3.0);
    let fill_ms = 3.0 * m.pools[0].fill_ops() / H100_RATE * 1000.0;
    let without = plan(
        &inv,
        &config(ChallengeConfig::default()),
        &shipped_book(),
        true,
        [0; 32],
        [0; 32],
    )
    .unwrap();
    assert_eq!(p.params.num_chains, without.params.num_chains);
    assert!(
        (p.expected_ms as f64 - without.expected_ms as f64 - fill_ms).abs() <= 1.0,
        "{} vs {} + {fill_ms}",
        p.expected_ms,
        without.expected_ms
    );
}

/// A miner that says 4 gets version 4's memory phase and no fill: chains at least
/// `2^16 / n` steps long, enough of them for every device's pool, and openings from the
/// bound for its model.
#[test]
fn a_version_4_miner_is_planned_with_its_pool_in_its_chains() {
    let mut inv = v4_inventory(H100, 80_000_000_000);
    let p = plan(
        &inv,
        &ValidatorConfig::default(),
        &shipped_book(),
        true,
        [0; 32],
        [0; 32],
    )
    .unwrap();
    let pool = p.memory.v4().expect("version 4's phase");
    assert_eq!(p.memory.protocol_version(), 4);
    assert_eq!(pool.params.pool_chains, vec![18310], "design table 2.6");
    assert_eq!(p.params.n, 2048);
    assert_eq!(p.params.iterations, 32, "16 configured, raised to 2^16 / 2048");
    assert!(p.params.num_chains >= 18310, "{}", p.params.num_chains);
    assert_eq!(pool.devices[0].sized_as, Some("H100 SXM"));
    // At first contact (the shipped 0.75 of the datasheet, slack 2) the 90% holder is not
    // claimed caught, even with the worst row's openings (497 and 185 at the design clock, raised
    // as far as the cap).
    assert_eq!(
        (pool.devices[0].steps_opened, pool.devices[0].rows_checked),
        (1649, 474)
    );
    assert_eq!(pool.slack(), 2.0);
    assert!(!pool.devices[0].catches_ninety_percent());

    // A miner whose limits cannot take its pool's chains is refused, saying so.
    inv.limits.max_chains = 1000;
    assert_eq!(
        plan(
            &inv,
            &ValidatorConfig::default(),
            &shipped_book(),
            true,
            [0; 32],
            [0; 32]
        )
        .unwrap_err(),
        PlanError::PoolChainsOverLimit {
            needed: 18310,
            max_chains: 1000
        }
    );
}

/// What a first-contact verdict states per model (SECURITY.md quotes these): each device at
/// the shipped walk row's rate (0.75 of the slowest variant's datasheet bandwidth) and slack
/// 2, its openings raised as far as the worst row's.
#[test]
fn first_contact_bounds_per_model() {
    let cases = [
        ("NVIDIA H100 80GB HBM3", 80_000_000_000, 0.8854),
        ("NVIDIA H200", 141_000_000_000, 0.9001),
        // Its shipped rate is 0.75 of the 40GB PCIe part's 1,555 GB/s: 0.572 of this one's.
        ("NVIDIA A100-SXM4-80GB", 80_000_000_000, 0.8841),
        ("NVIDIA GeForce RTX 4090", 24_000_000_000, 0.8512),
        // Its Grace memory over C2C counted: the clock hides 31% of the pool at first
        // contact (0.75 of its own 4 TB/s; it was once matched as an H200, whose name it
        // contains, and expected at 0.9 of its own).
        ("NVIDIA GH200 480GB", 96_000_000_000, 0.6435),
    ];
    for (name, memory_bytes, held) in cases {
        let inv = v4_inventory(name, memory_bytes);
        let pool = plan(
            &inv,
            &ValidatorConfig::default(),
            &shipped_book(),
            true,
            [0; 32],
            [0; 32],
        )
        .unwrap()
        .memory
        .v4()
        .cloned()
        .unwrap();
        let stated = pool.devices[0].held_at_least.unwrap();
        assert!((stated - held).abs() < 0.0001, "{name}: {stated}");
    }
}

/// A rate book that learned only version 3 walks leaves a version 4 miner at first contact:
/// a version 3 rate has the host inside its clock. Its own `walk-v4` class, once learned,
/// times it with the calibrated slack.
#[test]
fn version_3_walk_rates_do_not_time_version_4() {
    let mut inv = v4_inventory(H100, 80_000_000_000);
    let config = version_3_config();
    let learned = |rate: f64| crate::store::SharedRate {
        ops_per_unit: rate,
        miners: 3,
        observations: 3,
    };
    let device = &inv.claim.devices[0];
    let mut book = shipped_book();
    book.share(walk_class(&inv.claim, device), learned(2.2e12));
    let pool = v4_plan(&inv, &config, &book);
    assert!(!pool.observed(), "a version 3 rate does not make version 4 calibrated");
    assert_eq!(pool.slack(), 2.0);
    assert_eq!(
        pool.devices[0].bytes_per_sec,
        0.75 * 3.35e12,
        "the shipped first-contact rate"
    );

    book.share(walk_v4_class(&inv.claim, device, 2048), learned(3.1e12));
    let pool = v4_plan(&inv, &config, &book);
    assert!(pool.observed());
    assert_eq!(
        pool.slack(),
        1.25,
        "[memory] slack: a GPU walk's measured spread (p99 1.005 on an H200) allows 1.25"
    );
    assert_eq!(pool.devices[0].bytes_per_sec, 3.1e12);
    assert!(pool.devices[0].catches_ninety_percent(), "near 0.9 of the datasheet");
    // Its version 3 walk class is still what a version 3 miner is timed by.
    inv.protocol_version = 3;
    let v3 = plan(&inv, &config, &book, true, [0; 32], [0; 32]).unwrap();
    assert_eq!(v3.memory.v3().unwrap().bytes_per_sec, vec![2.2e12]);
}

/// The version 4 pool plan for `inv` (zero nonce and seed), which must be planned under 4.
fn v4_plan(inv: &Inventory, config: &ValidatorConfig, book: &RateBook) -> crate::memory::plan_v4::ChainPoolPlan {
    plan(inv, config, book, true, [0; 32], [0; 32])
        .unwrap()
        .memory
        .v4()
        .cloned()
        .unwrap()
}

/// Observed walks are timed at `[memory] slack` on GPUs and `cpu_slack` on the CPU, and the
/// walk class's floor keeps both clocks no looser than first contact's.
#[test]
fn observed_walks_are_timed_at_the_slack_of_their_backend() {
    let config = ValidatorConfig::default();
    assert_eq!((config.memory.slack, config.memory.cpu_slack), (1.25, 1.5));
    let learned = crate::store::SharedRate {
        ops_per_unit: 30e9,
        miners: 3,
        observations: 3,
    };
    let mut cpu = inventory("cpu", "avx2", &["cpu: test"]);
    cpu.protocol_version = 4;
    cpu.claim.devices[0].memory_bytes = 16 << 20;
    let mut book = shipped_book();
    let n = config.challenge.cpu_n;
    book.share(walk_v4_class(&cpu.claim, &cpu.claim.devices[0], n), learned);
    let pool = v4_plan(&cpu, &config, &book);
    assert!(pool.observed());
    assert_eq!(pool.slack(), 1.5, "a CPU walk at cpu_slack");
    // The floor: first contact's slack over the loosest observed one.
    assert_eq!(config.memory.loosest_observed_slack(), 1.5);
}

/// Design 7: where this validator refuses version 3's memory phase, a miner that speaks 3
/// is refused before any challenge, the error naming the upgrade and the compute-only way;
/// with `required = false` it is challenged under version 2 (no memory phase). A miner that
/// says 4 is not touched by it.
#[test]
fn a_version_3_miner_is_refused_naming_the_upgrade() {
    let mut inv = v4_inventory(H100, 80_000_000_000);
    inv.protocol_version = 3;
    // This release's default.
    let mut config = ValidatorConfig::default();
    assert!(config.memory.refuse_version_3);
    let book = shipped_book();
    let refused = plan(&inv, &config, &book, true, [0; 32], [0; 32]).unwrap_err();
    assert_eq!(refused, PlanError::Memory(MemoryPlanError::Version3Refused));
    let message = refused.to_string();
    for names in ["version 4", "upgrade", "required = false", "refuse_version_3"] {
        assert!(message.contains(names), "{message}");
    }
    config.memory.required = false;
    let compute_only = plan(&inv, &config, &book, true, [0; 32], [0; 32]).unwrap();
    assert_eq!(compute_only.memory, MemoryPhasePlan::Off);
    assert_eq!(compute_only.memory.protocol_version(), 2);
    inv.protocol_version = 4;
    let v4 = plan(&inv, &config, &book, true, [0; 32], [0; 32]).unwrap();
    assert!(v4.memory.v4().is_some());
    // Off (for miners of releases before version 4), version 3 is planned as before.
    inv.protocol_version = 3;
    let kept = plan(&inv, &version_3_config(), &book, true, [0; 32], [0; 32]).unwrap();
    assert_eq!(kept.memory.protocol_version(), 3);
}

#[test]
fn memory_phase_refusals_name_their_cause() {
    let with_memory = version_3_config();
    let book = shipped_book();
    let mut old = inventory("cuda", "tensor", &[H100]);
    old.claim.devices[0].memory_bytes = 80 << 30;
    old.protocol_version = 2;
    let refused = plan(&old, &with_memory, &book, true, [0; 32], [0; 32]).unwrap_err();
    assert_eq!(refused, PlanError::Memory(MemoryPlanError::NotSpoken(2)));
    assert!(refused.to_string().contains("required = false"), "{refused}");
    // Without the memory phase, or where it is not required, a version 2 miner is
    // challenged as before.
    let without = plan(&old, &config(ChallengeConfig::default()), &book, true, [0; 32], [0; 32]);
    assert_eq!(without.unwrap().memory, MemoryPhasePlan::Off);
    let optional = ValidatorConfig {
        memory: MemoryConfig {
            required: false,
            ..version_3_config().memory
        },
        ..ValidatorConfig::default()
    };
    assert!(plan(&old, &optional, &book, true, [0; 32], [0; 32]).unwrap().memory == MemoryPhasePlan::Off);
    // A claim too small for one entry cannot be challenged.
    let tiny = inventory("cuda", "tensor", &[H100]);
    assert!(matches!(
        plan(&tiny, &with_memory, &book, true, [0; 32], [0; 32]),
        Err(PlanError::Memory(MemoryPlanError::PoolSize { entries: 0, .. }))
    ));
    // CPU walkers are per core: 4 cores at the default 4 per core.
    let mut cpu = inventory("cpu", "avx2", &["cpu: test"]);
    cpu.claim.devices[0].memory_bytes = 1 << 20;
    let p = plan(&cpu, &with_memory, &book, true, [0; 32], [0; 32]).unwrap();
    assert_eq!(p.memory.v3().unwrap().params.walkers, 16);
}

/// A CPU's small pool sits in its cache: once its bandwidth is learned, even the longest
/// walk of the configured walkers is short of the target, and the walkers are raised until
/// it is not (the soak found one-core CPU miners unattestable before).
#[test]
fn walkers_grow_until_a_fast_cpu_walks_for_the_target() {
    let with_memory = version_3_config();
    let mut cpu = inventory("cpu", "avx2", &["cpu: test"]);
    cpu.claim.devices[0].sm_count = 1;
    cpu.claim.devices[0].memory_bytes = 16 << 20;
    let mut book = shipped_book();
    let class = crate::verdict::class::walk_class(&cpu.claim, &cpu.claim.devices[0]);
    let learned = 21e9;
    book.share(
        class,
        crate::store::SharedRate {
            ops_per_unit: learned,
            miners: 3,
            observations: 3,
        },
    );
    let m = plan(&cpu, &with_memory, &book, true, [0; 32], [0; 32])
        .expect("a fast CPU is still attested")
        .memory
        .v3()
        .cloned()
        .unwrap();
    assert_eq!(m.bytes_per_sec, vec![learned], "the learned bandwidth times one core");
    // 4 walkers walk at most 4096 * 8 steps of 64 KiB: 409 ms at 21 GB/s. 20 walkers reach
    // the 2 s target, and the walk is then sized to it as usual.
    assert_eq!(m.params.walkers, 20);
    assert_eq!(m.params.walk_steps, 4006 * 8);
    assert!((2_000..2_010).contains(&m.walk_expected_ms), "{}", m.walk_expected_ms);
    // Walkers that already reach it are left as configured.
    let slow = ValidatorConfig {
        memory: MemoryConfig {
            walkers_per_core: 64,
            ..version_3_config().memory
        },
        ..ValidatorConfig::default()
    };
    let m = plan(&cpu, &slow, &book, true, [0; 32], [0; 32])
        .unwrap()
        .memory
        .v3()
        .cloned()
        .unwrap();
    assert_eq!(m.params.walkers, 64);
    assert!((2_000..2_100).contains(&m.walk_expected_ms), "{}", m.walk_expected_ms);
}

#[test]
fn the_fitted_chain_counts_are_exact() {
    for (rate, slack) in [(1.0e8, 2.0), (3.3e9, 1.3), (7.0e6, 1.0), (1.0e12, 3.0)] {
        let timing = Timing {
            ops_per_chain: 2.0 * 64f64.powi(3) * 4.0,
            rate,
            slack,
            fixed_s: 0.0,
        };
        for window in (0..200).map(|i| i * 137 + 11) {
            match timing.chains_within(window, 1 << 20) {
                None => assert!(timing.deadline_ms(1) > window),
                Some(m) => {
                    assert!(timing.deadline_ms(m) <= window, "{m} chains overrun {window} ms");
                    assert!(
                        m == 1 << 20 || timing.deadline_ms(m + 1) > window,
                        "{} chains also fit {window} ms",
                        m + 1
                    );
                }
            }
            let fewest = timing.fewest_reaching(window, 1 << 20);
            if fewest > 1 << 20 {
                assert!(timing.deadline_ms(1 << 20) < window);
                continue;
            }
            assert!(
                timing.deadline_ms(fewest) >= window,
                "{fewest} chains fall short of {window} ms"
            );
            assert!(
                fewest == 1 || timing.deadline_ms(fewest - 1) < window,
                "{} chains also reach {window} ms",
                fewest - 1
            );
        }
    }
}

#[test]
fn deadlines_fit_the_miners_max_duration() {
    let mut inv = inventory("cuda", "tensor", &[H100]);
    inv.limits.max_chains = 1 << 20;
    let cfg = ChallengeConfig::default(); // 30 s of work, first-contact slack 3: a 90 s deadline
    let unlimited = plan_for(&inv, &cfg).unwrap();
    assert!(unlimited.deadline_ms > 80_000, "{}", unlimited.deadline_ms);
    // A 20 s limit: fewer chains, and the deadline plus the clock allowance fits.
    inv.limits.max_duration_ms = 20_000;
    let fitted = plan_for(&inv, &cfg).unwrap();
    assert!(
        fitted.deadline_ms <= 20_000 - MINER_CLOCK_ALLOWANCE_MS,
        "{}",
        fitted.deadline_ms
    );
    assert!(fitted.params.num_chains < unlimited.params.num_chains);
    // One more chain would not have fitted.
    let one_more = Timing {
        ops_per_chain: OPS_PER_CHAIN,
        rate: fitted.expectation.ops_per_sec,
        slack: 3.0,
        fixed_s: 0.0,
    }
    .deadline_ms(fitted.params.num_chains + 1);
    assert!(one_more > 20_000 - MINER_CLOCK_ALLOWANCE_MS, "{one_more}");
    // Below the deadline floor nothing fits: refused, never sent to be refused or failed.
    inv.limits.max_duration_ms = 3_500;
    match plan_for(&inv, &cfg) {
        Err(PlanError::DurationOverLimit {
            max_duration_ms: 3_500,
            needed_ms,
        }) => assert!((2_000..2_010).contains(&needed_ms), "{needed_ms}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_finish_by_time_is_deadlines_within_the_miners_limit() {
    let mut inv = inventory("cuda", "tensor", &[H100]);
    inv.limits.max_chains = 1 << 20;
    let cfg = ChallengeConfig::default();
    // The default, two deadlines.
    let p = plan_for(&inv, &cfg).unwrap();
    assert_eq!(p.finish_by_ms, p.deadline_ms * 2);
    // A miner that does not take one gets none, and the same challenge otherwise.
    inv.takes_finish_by = false;
    let none = plan_for(&inv, &cfg).unwrap();
    assert_eq!(none.finish_by_ms, 0);
    assert_eq!(none.params.num_chains, p.params.num_chains);
    inv.takes_finish_by = true;
    // The miner's limit shortens the late window, not the work.
    inv.limits.max_duration_ms = p.deadline_ms + MINER_CLOCK_ALLOWANCE_MS + 5_000;
    let tight = plan_for(&inv, &cfg).unwrap();
    assert_eq!(tight.params.num_chains, p.params.num_chains);
    assert_eq!(tight.finish_by_ms, p.deadline_ms + 5_000);
    // A limit the deadline already fills leaves no late window.
    inv.limits.max_duration_ms = p.deadline_ms + MINER_CLOCK_ALLOWANCE_MS;
    assert_eq!(plan_for(&inv, &cfg).unwrap().finish_by_ms, 0);
    // A factor of 1 sends none; other factors round up.
    for (factor, want) in [(1.0, 0), (1.25, (p.deadline_ms as f64 * 1.25).ceil() as u64)] {
        inv.limits.max_duration_ms = 0;
        let mut config = config(cfg.clone());
        config.deadline.finish_by = factor;
        let got = plan(&inv, &config, &shipped_book(), true, [0; 32], [0; 32]).unwrap();
        assert_eq!(got.finish_by_ms, want, "factor {factor}");
    }
}
