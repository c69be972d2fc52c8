//! The locality walk (PROTOCOL.md 20.10) through the whole attestation: real CPU miners on
//! loopback, a real validator with `[memory.locality]` on, and every verdict's transcript
//! audited again. An honest miner passes and its verdict records each device's walk (a
//! measurement: it states no share served from elsewhere, SECURITY.md); a miner
//! that makes up its walkers' ends fails on its openings; one whose lines come from afar is
//! late; one that cannot walk lines passes with memory stated per host, and no locality bound.
//! Then tampering with a recorded locality walk, each kind caught.

use crate::common;

use common::locality_cheats::LocalityCheat;
use common::pool_cheat::CheatingCpu;
use common::v4::v4_validator_config;
use common::*;
use gpu_attest_shared::keys::KeyPair;
use gpu_attest_validator::attest::locality::LocalityPlan;
use gpu_attest_validator::audit::{Finding, Report, audit};
use gpu_attest_validator::config::Policy;
use gpu_attest_validator::config::memory::LocalityConfig;
use gpu_attest_validator::config::transcripts::KeepTranscripts;
use gpu_attest_validator::transcript::{open, seal};
use gpu_attest_validator::verdict::Verdict;
use gpu_attest_validator::verdict::reason::ReasonCode;
use std::sync::Arc;
use std::time::Duration;

/// 100 ms of walk at the CPU's 600 ns a step: 652 generations of one walker x 256 steps.
const GENERATIONS: u32 = 652;

/// Attests a miner of `seed` (with `cheat`, if any) that keeps its own record of what it
/// answered; the verdict, its kept transcript and the miner's record's directory.
async fn attested(seed: u8, cheat: Option<LocalityCheat>) -> (Verdict, Vec<u8>, TempDir) {
    let _alone = crate::TIMED.lock().await;
    let cpu = test_cpu(TEST_CORES as usize).claiming(TEST_CORES, 256 << 10);
    let kernel = cpu.kernel();
    let backend: Arc<dyn gpu_attest_shared::Backend> = match cheat {
        None => Arc::new(cpu),
        Some(cheat) => Arc::new(CheatingCpu::new(cpu, cheat)),
    };
    let dir = TempDir::new("locality");
    let answers = gpu_attest_miner::answers::AnswerLog::open(&dir.path("answers"), 7).unwrap();
    let core = gpu_attest_miner::MinerCore::new(
        KeyPair::from_seed([seed; 32]),
        [validator_key()].into_iter().collect(),
        common::v4::speaks_4(),
        selected(kernel, backend),
        Duration::from_secs(60),
        gpu_attest_miner::nonces::NonceLog::in_memory(),
    )
    .with_answer_log(answers);
    let miner = spawn_miner(Arc::new(core)).await;
    let mut config = v4_validator_config(&dir, Policy::Sampled);
    config.memory.locality = LocalityConfig {
        enabled: true,
        walk_target_ms: 100,
        ..Default::default()
    };
    config.transcripts.keep = KeepTranscripts::All;
    let attestor = attestor(&config).await;
    let verdict = attestor.attest(&miner.url(), &|_| {}).await.expect("a verdict");
    let file = attestor
        .store()
        .transcript(verdict.id)
        .await
        .unwrap()
        .expect("every transcript kept");
    (verdict, file, dir)
}

async fn audited(file: &[u8]) -> Report {
    audit(file, None, Arc::new(test_cpu(2)), false)
        .await
        .expect("a transcript")
}

fn assert_confirmed(report: &Report) {
    assert_eq!(report.finding(), Finding::Confirmed, "{report}");
    assert!(
        report.differs.is_empty() && report.taken_as_stated.is_empty(),
        "{report}"
    );
}

fn tampered(file: &[u8], change: impl FnOnce(&mut gpu_attest_proto::v1::Transcript)) -> Vec<u8> {
    let mut transcript = open(file).unwrap().transcript;
    change(&mut transcript);
    seal(&transcript, &KeyPair::from_seed([VALIDATOR_SEED; 32]))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_honest_miner_passes_and_its_verdict_records_each_devices_locality_walk() {
    let (verdict, file, dir) = attested(91, None).await;
    assert!(verdict.passed, "{:?}", verdict.reasons);
    let memory = verdict.memory.as_ref().unwrap();
    for (j, device) in memory.devices.iter().enumerate() {
        let locality = device
            .locality
            .as_ref()
            .unwrap_or_else(|| panic!("device {j} walked lines"));
        assert_eq!(
            (locality.walkers, locality.generations, locality.steps),
            (1, GENERATIONS, 256)
        );
        assert_eq!(locality.segments_opened, 16);
        assert_eq!(
            locality.expected_us,
            (u64::from(GENERATIONS) * 256 * 600).div_ceil(1000)
        );
        assert_eq!(locality.deadline_us, 2 * locality.expected_us + 100_000);
        assert!(0 < locality.measured_us && locality.measured_us <= locality.deadline_us);
        let steps = f64::from(GENERATIONS) * 256.0;
        assert!((locality.step_ns - locality.measured_us as f64 * 1000.0 / steps).abs() < 1e-6);
        // The bound: 16 openings show 0.01^(1/16) = 75% of the walk in order, and within the
        // measured time at most this share of that order's steps could have crossed hops of
        // the configured 3 us.
        assert_eq!(locality.hop_ns, LocalityConfig::default().hop_ns);
        assert_eq!(locality.hop_ns, 3_000);
        assert!((locality.sequential_at_least - 0.749_894).abs() < 1e-6);
        let over_ordered_steps = |us: u64| us as f64 * 1000.0 / (locality.sequential_at_least * steps * 3_000.0);
        let stated = locality.hop_share_at_most.expect("a pass states its bound");
        let bound = over_ordered_steps(locality.measured_us);
        assert!((stated - bound.min(1.0)).abs() < 1e-9, "{stated} against {bound}");
        // A walk within its deadline (2 x 600 ns a step, plus 100 ms: 300 ms) states at most
        // 80% (0.7997): the bound says something of every pass.
        let at_the_deadline = over_ordered_steps(locality.deadline_us);
        assert!((at_the_deadline - 0.7997).abs() < 1e-4, "{at_the_deadline}");
        assert!(stated <= at_the_deadline, "{stated} against {at_the_deadline}");
    }
    assert_confirmed(&audited(&file).await);

    // The miner holds the transcript against its own record: the locality request, each root
    // and each opening are the ones it received and sent.
    let said = crate::transcripts::miner_checks(&dir, &file);
    assert!(said.contains("device 0's locality root, sent"), "{said}");
    let openings = 16 * memory.devices.len();
    assert!(
        said.contains(&format!(
            "{openings} locality opening(s), each the one this miner sent in its place"
        )),
        "{said}"
    );

    // A root's time moved past its deadline: the audit finds the verdict should have failed.
    let late = tampered(&file, |t| {
        t.locality.as_mut().unwrap().roots[0].received_after_us += 60_000_000;
    });
    let report = audited(&late).await;
    assert!(
        report.differs.iter().any(|d| d.contains("(locality-timed-out)")),
        "{report}"
    );
    // The roots replaced by a time-out, held to the deadline, a tenth of it and 2 s.
    let recorded = open(&file).unwrap().transcript.locality.unwrap();
    let plan: LocalityPlan = serde_json::from_str(&recorded.plan_json).unwrap();
    let deadline_us = plan.deadline_us();
    let give_up_ms = (deadline_us + deadline_us / 10) / 1000 + 2_000;
    let early = "before its deadline and grace had passed";
    crate::transcripts::a_time_out_is_held_to_the_give_up(&file, give_up_ms, early, "locality-timed-out", |t, ms| {
        let locality = t.locality.as_mut().unwrap();
        (locality.roots, locality.timed_out_after_ms) = (Vec::new(), ms);
    })
    .await;
    // A byte of an opened line changed: the miner's signature over the opening fails.
    let changed = tampered(&file, |t| {
        let locality = t.locality.as_mut().unwrap();
        let Some(gpu_attest_proto::v1::recorded_locality_opening::Received::Opening(opening)) =
            locality.openings[3].received.as_mut()
        else {
            panic!("an opening is recorded");
        };
        opening.lines[100].chunk[7] ^= 1;
    });
    let report = audited(&changed).await;
    assert!(
        report
            .differs
            .iter()
            .any(|d| d.contains("(locality-opening-signature)")),
        "{report}"
    );
    // The walk dropped from the record: the verdict's bound has nothing under it.
    let dropped = tampered(&file, |t| t.locality = None);
    let report = audited(&dropped).await;
    assert!(
        report
            .differs
            .iter()
            .any(|d| d.contains("locality walk the transcript does not record")),
        "{report}"
    );
    // A segment asked for twice over (the plan's count per device no longer).
    let more = tampered(&file, |t| {
        let open = t.locality.as_mut().unwrap().open_request.as_mut().unwrap();
        open.samples.push(open.samples[0]);
    });
    assert_ne!(audited(&more).await.finding(), Finding::Confirmed);
    // A plan no validator of this software makes (a slack below 1: a deadline short of the
    // expected walk), sealed by the validator all the same: the audit says so.
    let short = tampered(&file, |t| {
        let locality = t.locality.as_mut().unwrap();
        let mut plan: LocalityPlan = serde_json::from_str(&locality.plan_json).unwrap();
        plan.slack = 0.5;
        locality.plan_json = serde_json::to_string(&plan).unwrap();
    });
    let report = audited(&short).await;
    assert!(
        report
            .differs
            .iter()
            .any(|d| d.contains("is outside what this software may make for the claim") && d.contains("slack (0.5")),
        "{report}"
    );
}

/// The cheater the generations are for: one whose walkers did not walk (their ends made up,
/// as a walker split into pieces walked side by side must make up where each piece starts).
#[tokio::test(flavor = "multi_thread")]
async fn a_miner_that_makes_up_its_walkers_ends_fails_on_its_openings() {
    let (verdict, file, _dir) = attested(92, Some(LocalityCheat::MadeUpEnds)).await;
    assert!(!verdict.passed);
    assert_failed_with(&verdict, ReasonCode::LocalitySegmentMismatch);
    assert_eq!(verdict.reasons.len(), 1, "{:?}", verdict.reasons);
    let memory = verdict.memory.as_ref().unwrap();
    assert!(
        memory.devices.iter().all(|d| d.locality.is_none()),
        "a failed walk states no bound"
    );
    assert_eq!(memory.proven_bytes(), 0);
    assert_confirmed(&audited(&file).await);
}

/// Lines served from afar: the walk takes the hops' time and its roots come after the
/// deadline (a second of hops against a deadline of 0.36 s).
#[tokio::test(flavor = "multi_thread")]
async fn a_miner_whose_lines_come_from_afar_is_late() {
    let (verdict, file, _dir) = attested(93, Some(LocalityCheat::FromAfar(Duration::from_secs(1)))).await;
    assert!(!verdict.passed);
    assert_failed_with(&verdict, ReasonCode::LocalityTimedOut);
    let memory = verdict.memory.as_ref().unwrap();
    assert!(
        memory
            .devices
            .iter()
            .all(|d| d.locality.as_ref().is_none_or(|l| l.hop_share_at_most.is_none())),
        "a failed verdict states no hop bound"
    );
    assert_confirmed(&audited(&file).await);
}

/// A miner that cannot walk lines (UNIMPLEMENTED) is not failed for it: its verdict states
/// memory per host, as every verdict does, and records no locality walk.
#[tokio::test(flavor = "multi_thread")]
async fn a_miner_that_cannot_walk_lines_passes_without_a_locality_walk() {
    let (verdict, file, _dir) = attested(94, Some(LocalityCheat::NoLineWalk)).await;
    assert!(verdict.passed, "{:?}", verdict.reasons);
    let memory = verdict.memory.as_ref().unwrap();
    assert!(memory.devices.iter().all(|d| d.locality.is_none()));
    assert_confirmed(&audited(&file).await);
}
