//! Attestation transcripts and the offline audit (PROTOCOL.md 21), end to end: real miners
//! (honest and cheating) on loopback, a real validator storing verdicts and their transcripts,
//! and `audit` re-deriving each verdict from its transcript alone; then every kind of tampering
//! with a transcript, each caught and named.

use crate::common;

use common::cheats::{Cheat, spawn_cheater};
use common::pool_cheat::CheatingCpu;
use common::step_fakes::StepFakes;
use common::v4::{v4_miner, v4_validator_config};
use common::*;
use gpu_attest_proto::v1;
use gpu_attest_proto::v1::recorded_opening::Received;
use gpu_attest_shared::keys::KeyPair;
use gpu_attest_validator::audit::{Finding, Report, audit};
use gpu_attest_validator::config::Policy;
use gpu_attest_validator::config::transcripts::KeepTranscripts;
use gpu_attest_validator::transcript::{open, seal};
use gpu_attest_validator::verdict::Verdict;
use gpu_attest_validator::verdict::reason::ReasonCode;
use gpu_attest_validator::{Attestor, ValidatorConfig};
use prost::Message;
use std::sync::Arc;

/// A version 4 validator at n = 256 (`common::v4`'s) keeping `keep`'s transcripts.
fn v4_config(dir: &TempDir, policy: Policy, keep: KeepTranscripts) -> ValidatorConfig {
    let mut config = v4_validator_config(dir, policy);
    config.transcripts.keep = keep;
    config
}

/// Attests `url` with `attestor` and returns the verdict and its kept transcript.
pub(crate) async fn attest_and_export(attestor: &Attestor, url: &str) -> (Verdict, Vec<u8>) {
    let verdict = attestor.attest(url, &|_| {}).await.expect("a verdict");
    let transcript = attestor
        .store()
        .transcript(verdict.id)
        .await
        .unwrap()
        .expect("a kept transcript");
    (verdict, transcript)
}

pub(crate) async fn audited(file: &[u8]) -> Report {
    audit(file, None, Arc::new(test_cpu(2)), false)
        .await
        .expect("a transcript")
}

/// An honest version 4 miner's pass, under `policy`, with every transcript kept.
async fn honest_pass(seed: u8, policy: Policy) -> (Verdict, Vec<u8>, TempDir) {
    let cpu = test_cpu(TEST_CORES as usize).claiming(TEST_CORES, 256 << 10);
    let kernel = cpu.kernel();
    let miner = spawn_miner(v4_miner(seed, kernel, Arc::new(cpu))).await;
    let dir = TempDir::new("transcript-honest");
    let attestor = attestor(&v4_config(&dir, policy, KeepTranscripts::All)).await;
    let (verdict, file) = attest_and_export(&attestor, &miner.url()).await;
    // A CPU miner's small pool: its step openings' few slices are kept once each.
    assert!(file.len() < 16 << 20, "{} bytes", file.len());
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert_eq!(verdict.protocol_version, 4);
    (verdict, file, dir)
}

fn assert_confirmed(report: &Report) {
    assert_eq!(report.finding(), Finding::Confirmed, "{report}");
    assert!(
        report.differs.is_empty() && report.taken_as_stated.is_empty(),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_honest_version_4_pass_audits_as_confirmed_under_either_policy_and_walk_tampering_is_caught() {
    let _alone = crate::TIMED.lock().await;
    for (seed, policy) in [(90, Policy::Sampled), (91, Policy::Full)] {
        let (verdict, file, _dir) = honest_pass(seed, policy).await;
        // Under the full policy, re-executed here only when asked; otherwise taken as stated.
        if policy == Policy::Full {
            let report = audited(&file).await;
            assert_eq!(report.finding(), Finding::ConfirmedInPart, "{report}");
            assert!(report.taken_as_stated[0].contains("--reexecute"), "{report}");
        }
        let report = audit(&file, Some(validator_key()), Arc::new(test_cpu(2)), true)
            .await
            .expect("a transcript");
        assert_confirmed(&report);
        let said = report.to_string();
        assert!(said.contains("sized again from the expected walk rates"), "{said}");
        assert!(said.contains(&format!("verdict {} (PASS", verdict.id)), "{said}");
        assert!(said.contains("walk root(s) signed by the miner"), "{said}");
        assert!(said.contains("1649 walk step(s) checked"), "{said}");
        match policy {
            Policy::Full => assert!(said.contains("every chain re-executed"), "{said}"),
            _ => assert!(said.contains("8 chain opening(s) recomputed"), "{said}"),
        }
        assert!(
            said.contains("the verdict re-derived from the transcript is the stated one"),
            "{said}"
        );
        if policy == Policy::Sampled {
            // The same transcript, tampered with: one attestation serves both.
            tampering_with_the_walk_is_caught_and_named(&file, &verdict).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_keeps_no_transcript_by_default_and_a_step_fakers_fail_does_and_audits_to_its_reasons() {
    let _alone = crate::TIMED.lock().await;
    let dir = TempDir::new("transcript-faker");
    let config = v4_config(&dir, Policy::Sampled, KeepTranscripts::Failures);
    assert_eq!(ValidatorConfig::default().transcripts.keep, KeepTranscripts::Failures);
    let attestor = attestor(&config).await;
    // An honest miner's pass: no transcript by default.
    let cpu = test_cpu(TEST_CORES as usize).claiming(TEST_CORES, 256 << 10);
    let kernel = cpu.kernel();
    let honest = spawn_miner(v4_miner(92, kernel, Arc::new(cpu))).await;
    let pass = attestor.attest(&honest.url(), &|_| {}).await.unwrap();
    assert!(pass.passed, "{:?}", pass.reasons);
    assert_eq!(attestor.store().transcript(pass.id).await.unwrap(), None);
    // A miner that fakes every fifth walk step: a FAIL, whose transcript is kept.
    let cpu = test_cpu(TEST_CORES as usize).claiming(TEST_CORES, 256 << 10);
    let faker = CheatingCpu::new(cpu, StepFakes(Arc::new(|_, _, step| step % 5 == 0)));
    let miner = spawn_miner(v4_miner(93, kernel, Arc::new(faker))).await;
    let (verdict, file) = attest_and_export(&attestor, &miner.url()).await;
    assert!(!verdict.passed);
    assert!(
        verdict
            .reasons
            .iter()
            .all(|r| r.code == ReasonCode::WalkSegmentMismatch)
    );
    let report = audited(&file).await;
    assert_confirmed(&report);
    assert!(report.to_string().contains(&format!("verdict {} (FAIL", verdict.id)));

    // Tampered: a reason dropped from the stated verdict, the transcript signed again with the
    // validator's own key. The audit shows the reason the verdict no longer states.
    let dropped = tampered(&file, |t| {
        let mut v: Verdict = serde_json::from_str(&t.verdict_json).unwrap();
        v.reasons.pop();
        t.verdict_json = serde_json::to_string(&v).unwrap();
    });
    let report = audited(&dropped).await;
    assert_eq!(report.finding(), Finding::Differs);
    assert!(
        report.differs.iter().any(
            |d| d.starts_with("the transcript shows a reason the verdict does not state")
                && d.ends_with("(walk-segment-mismatch)")
        ),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_cheaters_fail_audits_to_its_reasons_and_a_swapped_opening_is_caught() {
    let dir = TempDir::new("transcript-cheater");
    let mut config = validator_config(&dir, Policy::Sampled);
    config.transcripts.keep = KeepTranscripts::All;
    let attestor = attestor(&config).await;
    let cheater = spawn_cheater(miner_core(94, &[validator_key()], 1), Cheat::LeafChangedAfterCommit).await;
    let (verdict, file) = attest_and_export(&attestor, &cheater.url()).await;
    assert!(!verdict.passed);
    assert_eq!(verdict.protocol_version, 2);
    assert_confirmed(&audited(&file).await);

    // An honest version 2 pass: its openings swapped in the transcript (re-signed), each then
    // answers another sample and fails as it would have.
    let honest = spawn_miner(miner_core(95, &[validator_key()], 1)).await;
    let (pass, file) = attest_and_export(&attestor, &honest.url()).await;
    assert!(pass.passed, "{:?}", pass.reasons);
    assert_confirmed(&audited(&file).await);
    let swapped = tampered(&file, |t| {
        let openings = &mut t.open.as_mut().unwrap().openings;
        assert!(openings.len() >= 2);
        openings.swap(0, 1);
    });
    let report = audited(&swapped).await;
    assert_eq!(report.finding(), Finding::Differs);
    assert_names(&report, |d| {
        d.starts_with("the transcript shows a reason the verdict does not state")
    });
    assert_names(&report, |d| d.starts_with("verdict field `passed`"));
}

/// An honest version 2 pass's transcript (no memory phase: quick to audit), kept.
async fn honest_version_2_pass(seed: u8) -> (Verdict, Vec<u8>, TempDir) {
    let dir = TempDir::new("transcript-v2");
    let mut config = validator_config(&dir, Policy::Sampled);
    config.transcripts.keep = KeepTranscripts::All;
    let attestor = attestor(&config).await;
    let honest = spawn_miner(miner_core(seed, &[validator_key()], 1)).await;
    let (verdict, file) = attest_and_export(&attestor, &honest.url()).await;
    assert!(verdict.passed, "{:?}", verdict.reasons);
    assert_confirmed(&audited(&file).await);
    (verdict, file, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn tampering_with_a_time_a_deadline_a_signature_or_a_byte_is_caught_and_named() {
    let (verdict, file, _dir) = honest_version_2_pass(96).await;

    // A byte changed after signing: the signature fails (and the part it changed shows).
    let opened = open(&file).unwrap();
    let mut moved = opened.transcript.clone();
    moved.commitment.as_mut().unwrap().received_after_ms += verdict.deadline_ms;
    let unsigned = v1::SignedTranscript {
        transcript: moved.encode_to_vec(),
        ..v1::SignedTranscript::decode(file.as_slice()).unwrap()
    }
    .encode_to_vec();
    let report = audited(&unsigned).await;
    assert_names(&report, |d| d.starts_with("the transcript's signature does not verify"));

    // A time moved, signed again: the commitment is now late, which the verdict does not say,
    // and its measured time is not the verdict's.
    let late = tampered(&file, |t| {
        t.commitment.as_mut().unwrap().received_after_ms += verdict.deadline_ms
    });
    let report = audited(&late).await;
    assert_eq!(report.finding(), Finding::Differs);
    assert_names(&report, |d| {
        d.contains("does not state") && d.ends_with("(late-commitment)")
    });
    assert_names(&report, |d| d.starts_with("verdict field `measured_ms`"));

    // The deadline in the plan loosened: the signed challenge says otherwise.
    let looser = tampered(&file, |t| {
        let mut plan: serde_json::Value = serde_json::from_str(&t.plan_json).unwrap();
        plan["deadline_ms"] = (verdict.deadline_ms * 2).into();
        t.plan_json = plan.to_string();
    });
    let report = audited(&looser).await;
    assert_names(&report, |d| d.starts_with("deadline:"));

    // An opening's signature from another key.
    let foreign = tampered(&file, |t| {
        let opening = t
            .open
            .as_mut()
            .unwrap()
            .openings
            .iter_mut()
            .find_map(|o| match &mut o.received {
                Some(Received::Opening(o)) => Some(o),
                _ => None,
            });
        let opening = opening.unwrap();
        opening.signature = KeyPair::from_seed([0x43; 32]).sign(b"something else").to_vec();
    });
    let report = audited(&foreign).await;
    assert_names(&report, |d| d.ends_with("(opening-signature)"));

    // Signed by another key: the challenge names this validator, not the signer; and an auditor
    // who names the validator's key sees that too.
    let other = KeyPair::from_seed([0x42; 32]);
    let forged = seal(&open(&file).unwrap().transcript, &other);
    let report = audit(&forged, Some(validator_key()), Arc::new(test_cpu(2)), false)
        .await
        .unwrap();
    assert_names(&report, |d| d.contains("the transcript is signed by another key"));
    assert_names(&report, |d| d.starts_with("signed by"));

    // Truncated or not a transcript at all: an error, or a signature that fails; never a panic.
    for cut in [0, 1, file.len() / 3, file.len() - 1] {
        match audit(&file[..cut], None, Arc::new(test_cpu(2)), false).await {
            Err(_) => {}
            Ok(report) => assert_eq!(report.finding(), Finding::Differs, "cut at {cut}: {report}"),
        }
    }
}

/// `miner check-transcript` on `file` against the answer log under `dir/answers`: what it
/// printed, once it has found the transcript matches (exit 0).
pub(crate) fn miner_checks(dir: &TempDir, file: &[u8]) -> String {
    let path = dir.path("verdict.transcript");
    std::fs::write(&path, file).unwrap();
    let checked = common::process::cmd("miner")
        .arg("check-transcript")
        .arg(&path)
        .arg("--answers")
        .arg(dir.path("answers"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert_eq!(
        checked.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    said
}

/// Asserts that `report` names a difference `found` picks.
pub(crate) fn assert_names(report: &Report, found: impl Fn(&str) -> bool) {
    assert!(report.differs.iter().any(|d| found(d)), "{report}");
}

/// `file` with a walk's answer replaced by a time-out (`time_out(transcript, after_ms)`): read
/// one millisecond before the validator gives up (`give_up_ms`), it would fail a miner still
/// inside its time, and the audit names it (`early`, words of the difference); read when the
/// validator gives up, it is judged as the time-out whose reason code is `code`.
pub(crate) async fn a_time_out_is_held_to_the_give_up(
    file: &[u8],
    give_up_ms: u64,
    early: &str,
    code: &str,
    time_out: impl Fn(&mut v1::Transcript, u64),
) {
    let report = audited(&tampered(file, |t| time_out(t, give_up_ms - 1))).await;
    assert_names(&report, |d| d.contains(early));
    let report = audited(&tampered(file, |t| time_out(t, give_up_ms))).await;
    assert!(!report.differs.iter().any(|d| d.contains(early)), "{report}");
    assert_names(&report, |d| d.contains(&format!("({code})")));
}

/// `file` with its transcript changed by `change`, then signed again with this validator's key:
/// what a validator that lies about its own verdict could publish.
pub(crate) fn tampered(file: &[u8], change: impl FnOnce(&mut v1::Transcript)) -> Vec<u8> {
    let mut transcript = open(file).unwrap().transcript;
    change(&mut transcript);
    seal(&transcript, &KeyPair::from_seed([VALIDATOR_SEED; 32]))
}

/// Every kind of tampering with a version 4 walk, on `file` (an honest pass's transcript).
async fn tampering_with_the_walk_is_caught_and_named(file: &[u8], verdict: &Verdict) {
    let file = file.to_vec();

    // The roots replaced by a time-out, held to the longest device deadline, a tenth of it
    // and 2 s.
    let longest = verdict.memory.as_ref().unwrap().devices.iter();
    let longest = longest.map(|d| d.walk.as_ref().unwrap().deadline_ms).max().unwrap();
    let early = "before the longest device deadline and its grace had passed";
    a_time_out_is_held_to_the_give_up(
        &file,
        longest + longest / 10 + 2_000,
        early,
        "walk-timed-out",
        |t, ms| {
            let walk = t.walk.as_mut().unwrap();
            (walk.roots, walk.timed_out_after_ms) = (Vec::new(), ms);
        },
    )
    .await;

    // A walk root's time moved past its device's deadline.
    let slow_walk = tampered(&file, |t| {
        t.walk.as_mut().unwrap().roots[0].received_after_us += 3_600_000_000;
    });
    let report = audited(&slow_walk).await;
    assert_names(&report, |d| d.ends_with("(late-walk)"));

    // A step opening's bytes changed: a byte of a slice steps read (the miner's signature over
    // each of them then fails), and a step's state.
    let bad_slice = tampered(&file, |t| t.open.as_mut().unwrap().slices[0][0] ^= 1);
    let report = audited(&bad_slice).await;
    assert_names(&report, |d| d.ends_with("(walk-opening-signature)"));
    let bad_state = tampered(&file, |t| {
        let open = t.open.as_mut().unwrap();
        let step = open
            .openings
            .iter_mut()
            .find_map(|o| match &mut o.received {
                Some(Received::Opening(o)) => o.step.as_mut(),
                _ => None,
            })
            .unwrap();
        step.after[0] ^= 1;
    });
    let report = audited(&bad_state).await;
    assert_names(&report, |d| d.ends_with("(walk-opening-signature)"));
    // A slice reference to no slice: named, never a panic.
    let bad_ref = tampered(&file, |t| {
        let open = t.open.as_mut().unwrap();
        let count = open.slices.len() as u32;
        open.openings.iter_mut().find(|o| o.slice_ref > 0).unwrap().slice_ref = count + 1;
    });
    let report = audited(&bad_ref).await;
    assert_names(&report, |d| d.contains("refers to slice"));

    // A row dropped: a step that was to be row-checked shows none.
    let fewer_rows = tampered(&file, |t| {
        t.open.as_mut().unwrap().row_checks.pop();
    });
    let report = audited(&fewer_rows).await;
    assert_names(&report, |d| d.contains("no row is recorded"));
    // Fewer steps row-checked than the plan says.
    let fewer_checked = tampered(&file, |t| {
        t.walk.as_mut().unwrap().row_checked.pop();
    });
    let report = audited(&fewer_checked).await;
    assert_names(&report, |d| d.contains("not the plan's counts per device"));
    // The plan's bound raised: it is not what the stated rates give.
    let raised = tampered(&file, |t| {
        let mut plan: serde_json::Value = serde_json::from_str(&t.plan_json).unwrap();
        plan["memory"]["host_held_at_least"] = 0.99.into();
        t.plan_json = plan.to_string();
    });
    let report = audited(&raised).await;
    assert_names(&report, |d| d.contains("are not what its rates and settings give"));
}

/// Each way a challenge stream ends in a FAIL before any commitment is derived again from the
/// recorded reads, so that such a verdict audits as confirmed, not in part; a read dropped, one
/// moved before the window it says passed, or a changed event is a difference.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_ends_in_a_failure_audits_to_its_reason_and_a_changed_read_is_caught() {
    let mut kept = Vec::new();
    for (seed, cheat, code) in [
        (100, Cheat::ImpossibleProgress, ReasonCode::ImpossibleProgress),
        (101, Cheat::NeverAccepts, ReasonCode::NotAccepted),
        (102, Cheat::RefusesAfterComputing, ReasonCode::NotAccepted),
        (103, Cheat::CommitsBeforeAccepting, ReasonCode::StreamOutOfOrder),
    ] {
        let dir = TempDir::new("transcript-stream");
        let mut config = validator_config(&dir, Policy::Sampled);
        config.transcripts.keep = KeepTranscripts::Failures;
        config.deadline.accept_ms = 300;
        let attestor = attestor(&config).await;
        let miner = spawn_cheater(miner_core(seed, &[validator_key()], 1), cheat).await;
        let (verdict, file) = attest_and_export(&attestor, &miner.url()).await;
        failed_with(&verdict, code);
        let report = audited(&file).await;
        assert_confirmed(&report);
        assert!(
            report
                .confirmed
                .iter()
                .any(|c| c.contains(&format!("ended in {}", code.as_str()))),
            "{cheat:?}: {report}"
        );
        kept.push((cheat, file));
    }

    let (_, impossible) = &kept[0];
    let (_, silent) = &kept[1];
    let stream = |t: &mut v1::Transcript| t.stream.as_mut().unwrap().reads.clone();
    assert!(
        stream(&mut open(silent).unwrap().transcript).len() > 1,
        "the empty events are recorded"
    );

    // The deciding read dropped: the record ends without an outcome, and the reason is not
    // derived.
    let dropped = tampered(silent, |t| {
        t.stream.as_mut().unwrap().reads.pop();
    });
    let report = audited(&dropped).await;
    assert_names(&report, |d| d.contains("without an outcome"));
    assert_names(&report, |d| d.ends_with("(not-accepted)"));

    // The window said to have passed before it had (every read in order, the last at 1 ms).
    let early = tampered(silent, |t| {
        for (i, read) in t.stream.as_mut().unwrap().reads.iter_mut().enumerate() {
            read.after_us = i as u64;
        }
        t.stream.as_mut().unwrap().reads.last_mut().unwrap().after_us = 1_000;
    });
    assert_names(&audited(&early).await, |d| {
        d.contains("the accept window (300 ms) passed")
    });

    // The impossible progress changed: what the stream fails on is not what the verdict states.
    let mended = tampered(impossible, |t| {
        use v1::recorded_stream_read::Read;
        let reads = &mut t.stream.as_mut().unwrap().reads;
        let last = reads
            .iter_mut()
            .rev()
            .find(|r| matches!(r.read, Some(Read::Progress(_))));
        let Some(Read::Progress(p)) = &mut last.unwrap().read else {
            unreachable!()
        };
        *p = v1::Progress {
            device: 0,
            done: 0,
            total: p.total.min(1),
        };
    });
    let report = audited(&mended).await;
    assert_eq!(report.finding(), Finding::Differs, "{report}");

    // The window said to have passed after the miner had answered.
    let answered = tampered(impossible, |t| {
        use v1::recorded_stream_read::Read;
        let last = t.stream.as_mut().unwrap().reads.last_mut().unwrap();
        last.read = Some(Read::WindowPassed(true));
        last.after_us = last.after_us.max(1_000_000);
    });
    assert_names(&audited(&answered).await, |d| {
        d.contains("after the miner had answered")
    });

    // The time allowed cut to the deadline, or an accept window under its floor.
    for (field, what) in [("allowed", "allowed"), ("window", "to accept the challenge")] {
        let cut = tampered(silent, |t| {
            let stream = t.stream.as_mut().unwrap();
            match field {
                "allowed" => stream.allowed_ms -= 1,
                _ => stream.accept_window_ms = 1,
            }
        });
        assert_names(&audited(&cut).await, |d| d.contains(what));
    }

    // The stream's record removed from a transcript of a format that has one.
    let stripped = tampered(silent, |t| t.stream = None);
    assert_names(&audited(&stripped).await, |d| {
        d.contains("records the challenge stream, and holds none")
    });

    // A read moved before the one ahead of it.
    let reordered = tampered(silent, |t| {
        let reads = &mut t.stream.as_mut().unwrap().reads;
        reads[0].after_us = reads.last().unwrap().after_us + 1;
    });
    assert_names(&audited(&reordered).await, |d| {
        d.contains("before the read ahead of it")
    });
}
