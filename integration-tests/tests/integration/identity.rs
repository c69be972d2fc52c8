//! Device evidence end to end (PROTOCOL.md 19): real miner servers on loopback, the validator's
//! whole attestation with its store, under the `required` and `when-offered` policies.
//!
//! No GPU here, so the evidence comes from the project's test PKI (`gpu_attest_integration_tests::
//! test_pki`), signed over the very nonce each challenge derives, and the validator pins that
//! PKI's root instead of NVIDIA's. The miners compute on the CPU backend, whose devices are
//! named `cpu: <model>`; each test's validator is told, by an operator's chip row, that such a
//! device is a GH100, so that GH100 evidence can stand for it. Nothing else is stood in for: the
//! miner signs its evidence statement, the validator checks it and stores what it found.

use crate::common;

use common::*;
use gpu_attest_integration_tests::test_pki::{ReportSpec, TestPki, signed_report};
use gpu_attest_miner::config::Limits;
use gpu_attest_miner::core::MinerCore;
use gpu_attest_miner::evidence::EvidenceSource;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::evidence::{CcState, ChipEntry, DeviceEvidence};
use gpu_attest_shared::keys::KeyPair;
use gpu_attest_shared::statement::DeviceInfo;
use gpu_attest_validator::attest::Attestor;
use gpu_attest_validator::audit::{Finding, Report, audit_with_anchors};
use gpu_attest_validator::config::identity::{IdentityConfig, IdentityPolicy};
use gpu_attest_validator::config::transcripts::KeepTranscripts;
use gpu_attest_validator::config::{Policy, ValidatorConfig};
use gpu_attest_validator::store::Store;
use gpu_attest_validator::transcript::{open, seal};
use gpu_attest_validator::verdict::Verdict;
use gpu_attest_validator::verdict::identity::IdentityStatus;
use gpu_attest_validator::verdict::reason::ReasonCode;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// What the test miner's "GPUs" answer.
#[derive(Clone, Copy)]
enum Answer {
    /// Each device signs its own slot's nonce with its own key.
    Genuine,
    /// Each device hands over a report it made for another challenge.
    Replayed,
    /// One device answers for every slot, each time over that slot's nonce.
    OnePartForAll,
}

struct TestGpus {
    answer: Answer,
}

impl EvidenceSource for TestGpus {
    fn gather(&self, devices: &[DeviceInfo], nonces: &[[u8; 32]]) -> Vec<DeviceEvidence> {
        devices
            .iter()
            .zip(nonces)
            .map(|(device, nonce)| {
                let part = match self.answer {
                    Answer::OnePartForAll => 0,
                    _ => device.index as u8,
                };
                let pki = TestPki::device(0x30 + part, &format!("00C0FFEE000000{part:02X}"));
                let nonce = match self.answer {
                    Answer::Replayed => [0x99; 32],
                    _ => *nonce,
                };
                DeviceEvidence {
                    index: device.index,
                    cc_state: CcState::On,
                    report: signed_report(&pki.leaf_key, &ReportSpec::new(nonce)),
                    certificates: pki.chain(),
                }
            })
            .collect()
    }
}

fn miner(seed: u8, devices: u32, answer: Option<Answer>) -> Arc<MinerCore> {
    let core = MinerCore::new(
        KeyPair::from_seed([seed; 32]),
        HashSet::from([validator_key()]),
        Limits::default(),
        cpu_backend(devices),
        Duration::from_secs(60),
        NonceLog::in_memory(),
    );
    Arc::new(match answer {
        Some(answer) => core.with_evidence(Box::new(TestGpus { answer })),
        None => core,
    })
}

fn identity_config(dir: &TempDir, policy: IdentityPolicy) -> ValidatorConfig {
    ValidatorConfig {
        identity: IdentityConfig {
            policy,
            // This machine's CPU devices stand in for GH100s (see the module's comment).
            chips: vec![ChipEntry {
                model: "cpu:".into(),
                chip: "GH100".into(),
            }],
            ..IdentityConfig::default()
        },
        ..validator_config(dir, Policy::Sampled)
    }
}

/// A validator that pins the test PKI's root, with its database in the directory returned.
async fn identity_validator(policy: IdentityPolicy) -> (Attestor, TempDir) {
    identity_validator_keeping(policy, KeepTranscripts::Failures).await
}

/// [`identity_validator`], keeping the transcripts `keep` says.
async fn identity_validator_keeping(policy: IdentityPolicy, keep: KeepTranscripts) -> (Attestor, TempDir) {
    let dir = TempDir::new("identity");
    let mut config = identity_config(&dir, policy);
    config.transcripts.keep = keep;
    let attestor = Attestor::new(
        KeyPair::from_seed([VALIDATOR_SEED; 32]),
        config.clone(),
        Arc::new(CpuBackend::new(2, None).unwrap()),
        false,
        Arc::new(Store::open(&config.database).await.unwrap()),
    )
    .with_evidence_anchors(TestPki::anchors());
    (attestor, dir)
}

/// One attestation by a fresh validator.
async fn attest_identity(url: &str, policy: IdentityPolicy) -> Verdict {
    let (attestor, _dir) = identity_validator(policy).await;
    attest_with(&attestor, url).await
}

fn statuses(verdict: &Verdict) -> Vec<IdentityStatus> {
    verdict
        .identity
        .as_ref()
        .expect("an identity section")
        .devices
        .iter()
        .map(|d| d.status)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_passes_when_every_device_is_genuine_and_nonce_bound() {
    let mut running = spawn_miner(miner(0x51, 2, Some(Answer::Genuine))).await;
    let verdict = attest_identity(&running.url(), IdentityPolicy::Required).await;
    running.stop();
    assert!(verdict.passed, "reasons: {:?}", verdict.reasons);
    let identity = verdict.identity.as_ref().unwrap();
    assert_eq!(identity.policy, "required");
    assert_eq!(statuses(&verdict), vec![IdentityStatus::Genuine; 2]);
    assert_eq!(
        identity.devices[1].line,
        "genuine NVIDIA GH100 G520/0200 (device 00C0FFEE00000001), nonce-bound"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_fails_when_the_evidence_was_made_for_another_challenge() {
    let mut running = spawn_miner(miner(0x52, 1, Some(Answer::Replayed))).await;
    let verdict = attest_identity(&running.url(), IdentityPolicy::Required).await;
    running.stop();
    assert_failed_with(&verdict, ReasonCode::IdentityWrongNonce);
    assert_eq!(statuses(&verdict), vec![IdentityStatus::Refused]);
    assert_eq!(
        verdict.identity.unwrap().devices[0].reason.as_deref(),
        Some("identity-wrong-nonce")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_genuine_part_cannot_stand_for_two_devices() {
    let mut running = spawn_miner(miner(0x53, 2, Some(Answer::OnePartForAll))).await;
    let verdict = attest_identity(&running.url(), IdentityPolicy::WhenOffered).await;
    running.stop();
    assert_failed_with(&verdict, ReasonCode::IdentityDeviceMismatch);
    assert_eq!(
        statuses(&verdict),
        vec![IdentityStatus::Genuine, IdentityStatus::Refused]
    );
}

/// `verdict`'s kept transcript.
async fn kept_transcript(attestor: &Attestor, verdict: &Verdict) -> Vec<u8> {
    let stored = attestor.store().transcript(verdict.id).await.unwrap();
    stored.expect("a kept transcript")
}

/// Audits `file` against the test PKI's root.
async fn audited(file: &[u8]) -> Report {
    let backend = Arc::new(CpuBackend::new(2, None).unwrap());
    audit_with_anchors(file, Some(validator_key()), backend, TestPki::anchors())
        .await
        .unwrap()
}

/// Audits `file` with its stated verdict changed by `change` and signed again by this
/// validator's key: what a validator that lies about its own verdict could publish.
async fn audited_with_verdict_changed(file: &[u8], change: impl FnOnce(&mut Verdict)) -> Report {
    let mut transcript = open(file).unwrap().transcript;
    let mut stated: Verdict = serde_json::from_str(&transcript.verdict_json).unwrap();
    change(&mut stated);
    transcript.verdict_json = serde_json::to_string(&stated).unwrap();
    audited(&seal(&transcript, &KeyPair::from_seed([VALIDATOR_SEED; 32]))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_genuine_part_cannot_answer_for_two_miners() {
    // Two miner keys whose "GPUs" are the same parts: one rented GPU answering for both.
    let (attestor, _dir) = identity_validator_keeping(IdentityPolicy::Required, KeepTranscripts::All).await;
    let mut first = spawn_miner(miner(0x58, 1, Some(Answer::Genuine))).await;
    let passed = attest_with(&attestor, &first.url()).await;
    first.stop();
    assert!(passed.passed, "reasons: {:?}", passed.reasons);
    let mut second = spawn_miner(miner(0x59, 1, Some(Answer::Genuine))).await;
    let verdict = attest_with(&attestor, &second.url()).await;
    assert_failed_with(&verdict, ReasonCode::IdentityDeviceMismatch);
    assert!(
        verdict.reasons[0].message.contains("answered for miner"),
        "{:?}",
        verdict.reasons
    );

    // The audit derives each device's evidence again and takes only the part history as
    // stated: the refusal for reuse, and that the pass's part had not been seen elsewhere.
    for (verdict, stated) in [
        (&verdict, "answered for another miner lately"),
        (&passed, "had not answered"),
    ] {
        let report = audited(&kept_transcript(&attestor, verdict).await).await;
        assert_eq!(report.finding(), Finding::ConfirmedInPart, "{report}");
        assert!(report.taken_as_stated.iter().any(|t| t.contains(stated)), "{report}");
        assert!(
            report.taken_as_stated.iter().all(|t| t.contains("part history")),
            "{report}"
        );
    }
    // A refusal for reuse that names this very miner's key is not what the reuse check writes.
    let own = KeyPair::from_seed([0x59; 32]).public_key().to_string();
    let mut other = String::new();
    let file = kept_transcript(&attestor, &verdict).await;
    let report = audited_with_verdict_changed(&file, |stated| {
        let device = &mut stated.identity.as_mut().unwrap().devices[0];
        other = device.line.split(' ').nth(5).unwrap().to_string();
        device.line = device.line.replace(&other, &own);
        stated.reasons[0].message = stated.reasons[0].message.replace(&other, &own);
    })
    .await;
    assert!(
        report
            .differs
            .iter()
            .any(|d| d.contains("not as the reuse check says it")),
        "{report}"
    );
    assert_ne!(other, own, "the line named another miner's key before");

    // A validator that states other evidence than the device gave is caught: the finding is
    // derived, not copied.
    let file = kept_transcript(&attestor, &passed).await;
    let report = audited_with_verdict_changed(&file, |stated| {
        stated.identity.as_mut().unwrap().devices[0].line = "genuine NVIDIA GB200".into();
    })
    .await;
    assert!(report.differs.iter().any(|d| d.contains("identity")), "{report}");
    // The first key may use its part again.
    let mut again = spawn_miner(miner(0x58, 1, Some(Answer::Genuine))).await;
    assert!(attest_with(&attestor, &again.url()).await.passed);
    second.stop();
    again.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_cannot_sign_passes_when_offered_and_fails_when_required() {
    // The CPU backend's own source: every device "CC not supported".
    let mut running = spawn_miner(miner(0x54, 1, None)).await;
    let offered = attest_identity(&running.url(), IdentityPolicy::WhenOffered).await;
    assert!(offered.passed, "reasons: {:?}", offered.reasons);
    assert_eq!(statuses(&offered), vec![IdentityStatus::NotOffered]);
    assert_eq!(
        offered.identity.as_ref().unwrap().devices[0].line,
        "not offered (CC not supported)"
    );

    let required = attest_identity(&running.url(), IdentityPolicy::Required).await;
    running.stop();
    assert_failed_with(&required, ReasonCode::IdentityNotOffered);

    let mut running = spawn_miner(miner(0x55, 1, None)).await;
    let off = attest_identity(&running.url(), IdentityPolicy::Off).await;
    running.stop();
    assert!(
        off.passed && off.identity.is_none(),
        "under `off` nothing is read or stated"
    );
}

/// The checks before any report is read: the list is one entry per device in index order, and
/// the miner's own signature covers it (PROTOCOL.md 19.4, step 1).
#[test]
fn the_evidence_statement_must_be_whole_and_signed_by_the_miner() {
    use gpu_attest_proto::evidence::SignedEvidence;
    use gpu_attest_shared::commitment::WorkCommitment;
    use gpu_attest_shared::evidence::{EvidenceTrust, evidence_statement_bytes, spdm_nonce};
    use gpu_attest_shared::statement::{Challenge, Commitment};
    use gpu_attest_shared::{ChallengeParams, Digest};
    use gpu_attest_validator::device_identity::check_commitment_evidence;

    let miner = KeyPair::from_seed([0x56; 32]);
    let validator = KeyPair::from_seed([VALIDATOR_SEED; 32]);
    let inventory: Vec<DeviceInfo> = (0..2)
        .map(|index| DeviceInfo {
            index,
            name: "NVIDIA H100 80GB HBM3".into(),
            ..DeviceInfo::default()
        })
        .collect();
    let params = ChallengeParams {
        nonce: [0x11; 32],
        seed: [0x22; 32],
        miner_key: miner.public_key().0,
        n: 64,
        num_chains: 2,
        iterations: 4,
        checkpoint_every: 2,
    };
    let challenge = Challenge {
        finish_by_ms: None,
        params,
        issued_at_ms: 0,
        deadline_ms: 1,
        validator_key: validator.public_key(),
        inventory_digest: Digest([0x33; 32]),
        memory: None,
    };
    let commitment = Commitment {
        work: WorkCommitment {
            nonce: params.nonce,
            devices: Vec::new(),
            global: Digest::default(),
        },
        miner_key: miner.public_key(),
        validator_key: validator.public_key(),
        inventory,
        backend: "cuda".into(),
        kernel: "tensor".into(),
        compute_ms: 1,
        pools: None,
    };
    let devices: Vec<DeviceEvidence> = (0..2u32)
        .map(|index| {
            let pki = TestPki::device(0x40 + index as u8, &format!("00C0FFEE000000A{index}"));
            let nonce = spdm_nonce(&params.nonce, &params.miner_key, &challenge.inventory_digest, index);
            DeviceEvidence {
                index,
                cc_state: CcState::On,
                report: signed_report(&pki.leaf_key, &ReportSpec::new(nonce)),
                certificates: pki.chain(),
            }
        })
        .collect();
    let signed_by = |signer: &KeyPair, devices: Vec<DeviceEvidence>| {
        let bytes = evidence_statement_bytes(
            &params.nonce,
            &miner.public_key().0,
            &validator.public_key().0,
            &devices,
        );
        Ok(Some(SignedEvidence {
            signature: signer.sign(&bytes),
            devices,
        }))
    };
    let config = IdentityConfig {
        policy: IdentityPolicy::Required,
        ..IdentityConfig::default()
    };
    let trust = EvidenceTrust {
        anchors: TestPki::anchors(),
        table: config.table(),
    };
    let codes = |evidence| {
        let (proof, reasons) = check_commitment_evidence(
            &config,
            &trust,
            &challenge,
            &commitment,
            &commitment.inventory,
            &evidence,
            gpu_attest_integration_tests::test_pki::NOW,
        );
        assert!(proof.is_some());
        reasons.iter().map(|r| r.code).collect::<Vec<_>>()
    };

    assert_eq!(
        codes(signed_by(&miner, devices.clone())),
        vec![],
        "whole and signed: genuine"
    );
    assert_eq!(
        codes(signed_by(&KeyPair::from_seed([0x57; 32]), devices.clone())),
        vec![ReasonCode::IdentityStatementSignature]
    );
    assert_eq!(
        codes(signed_by(&miner, devices[..1].to_vec())),
        vec![ReasonCode::IdentityMalformed]
    );
    let swapped = vec![devices[1].clone(), devices[0].clone()];
    assert_eq!(codes(signed_by(&miner, swapped)), vec![ReasonCode::IdentityMalformed]);
    let mut devtools = devices.clone();
    devtools[1].cc_state = CcState::DevTools;
    assert_eq!(codes(signed_by(&miner, devtools)), vec![ReasonCode::IdentityDevtools]);
}
