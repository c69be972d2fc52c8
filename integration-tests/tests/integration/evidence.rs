//! NVIDIA confidential-computing evidence (PROTOCOL.md section 19): NVIDIA's own public sample
//! against the pinned root, and the project's test PKI for every way evidence can be wrong.

use gpu_attest_integration_tests::test_pki::{self, NOW, ReportSpec, TestPki, signed_report};
use gpu_attest_shared::Digest;
use gpu_attest_shared::evidence::{
    AttestationReport, CcState, ChipEntry, DeviceChain, DeviceEvidence, EvidenceFault, EvidenceTrust, SkuEntry,
    SkuTable, TrustAnchors, check_device_evidence, check_evidence_set, spdm_nonce,
};
use proptest::prelude::*;

const H100: &str = "NVIDIA H100 80GB HBM3";

/// NVIDIA's published Hopper report and its certificate chain (DER, leaf first).
fn nvidia_sample() -> (Vec<u8>, Vec<Vec<u8>>) {
    let (sample, _) = gpu_attest_integration_tests::hostile::nvidia_sample();
    (sample.report.clone(), sample.certificates.clone())
}

fn offered(index: u32, report: Vec<u8>, certificates: Vec<Vec<u8>>) -> DeviceEvidence {
    DeviceEvidence {
        index,
        cc_state: CcState::On,
        report,
        certificates,
    }
}

fn test_trust() -> EvidenceTrust {
    EvidenceTrust {
        anchors: TestPki::anchors(),
        table: SkuTable::default(),
    }
}

fn nonce() -> [u8; 32] {
    spdm_nonce(&[7; 32], &[8; 32], &Digest([9; 32]), 0)
}

/// A valid device's evidence answering `nonce()`.
fn good_evidence() -> DeviceEvidence {
    let pki = TestPki::device(0x21, "00C0FFEE00000001");
    offered(0, signed_report(&pki.leaf_key, &ReportSpec::new(nonce())), pki.chain())
}

fn check(evidence: &DeviceEvidence, trust: &EvidenceTrust) -> Result<String, EvidenceFault> {
    check_device_evidence(evidence, &nonce(), H100, trust, NOW).map(|genuine| genuine.describe())
}

#[test]
fn nvidia_sample_report_verifies_against_the_pinned_nvidia_root() {
    let (report, chain) = nvidia_sample();
    let parsed = AttestationReport::parse(&report).expect("NVIDIA's sample report parses");
    assert_eq!(parsed.measurement_blocks, 64);
    assert_eq!(chain.len(), 5, "leaf, BROM, provisioner CA, GH100 CA, device root");
    let leaf = DeviceChain::decode(&chain)
        .unwrap()
        .verify(&TrustAnchors::nvidia(), NOW)
        .expect("the chain verifies");
    assert_eq!(
        (leaf.chip.as_str(), leaf.device_id.as_str()),
        ("GH100", "48B02D92494BADF4")
    );
    assert_eq!(
        leaf.fwid.as_deref(),
        parsed.fwid(),
        "the leaf was issued for the firmware the report names"
    );

    let evidence = offered(0, report.clone(), chain.clone());
    let genuine = check_device_evidence(
        &evidence,
        &parsed.request_nonce,
        "NVIDIA H100 PCIe",
        &EvidenceTrust::nvidia(SkuTable::default()),
        NOW,
    )
    .expect("NVIDIA's sample is genuine evidence for its own nonce");
    assert_eq!(genuine.project.as_deref(), Some("1010"));
    assert_eq!(genuine.project_sku.as_deref(), Some("0200"));
    assert_eq!(
        genuine.describe(),
        "genuine NVIDIA GH100 1010/0200 (device 48B02D92494BADF4), nonce-bound"
    );

    let fault = check_device_evidence(
        &evidence,
        &nonce(),
        H100,
        &EvidenceTrust::nvidia(SkuTable::default()),
        NOW,
    )
    .unwrap_err();
    assert_eq!(fault.reason(), "identity-wrong-nonce", "{fault}");

    let mut flipped = report;
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let fault = check_device_evidence(
        &offered(0, flipped, chain),
        &parsed.request_nonce,
        H100,
        &EvidenceTrust::nvidia(SkuTable::default()),
        NOW,
    )
    .unwrap_err();
    assert_eq!(fault.reason(), "identity-signature", "{fault}");
}

#[test]
fn valid_test_evidence_is_genuine_and_nonce_bound() {
    let described = check(&good_evidence(), &test_trust()).expect("valid evidence verifies");
    assert_eq!(
        described,
        "genuine NVIDIA GH100 G520/0200 (device 00C0FFEE00000001), nonce-bound"
    );
}

#[test]
fn a_pem_chain_from_nvml_becomes_the_same_der_chain() {
    let pki = TestPki::device(0x22, "00C0FFEE00000002");
    assert_eq!(
        DeviceChain::pem_to_der(pki.chain_pem().as_bytes()).unwrap(),
        pki.chain()
    );
}

#[test]
fn each_kind_of_bad_evidence_is_refused_with_its_own_reason() {
    let trust = test_trust();
    let pki = TestPki::device(0x21, "00C0FFEE00000001");
    let reason = |evidence: &DeviceEvidence, trust: &EvidenceTrust| check(evidence, trust).unwrap_err().reason();

    let wrong_nonce = offered(0, signed_report(&pki.leaf_key, &ReportSpec::new([3; 32])), pki.chain());
    assert_eq!(reason(&wrong_nonce, &trust), "identity-wrong-nonce");

    let other_key = offered(
        0,
        signed_report(&test_pki::key(0x55), &ReportSpec::new(nonce())),
        pki.chain(),
    );
    assert_eq!(reason(&other_key, &trust), "identity-signature");

    // The leaf claims the device's CA as its issuer but was signed by another key.
    let forged_leaf = test_pki::issue(
        test_pki::LEAF_NAME,
        &pki.leaf_key,
        &test_pki::brom_name("00C0FFEE00000001"),
        &test_pki::key(0x66),
        false,
        (test_pki::NOT_BEFORE, test_pki::NOT_AFTER),
        vec![
            test_pki::device_name("GH100", "00C0FFEE00000001"),
            test_pki::fwid_extension(&test_pki::FWID),
        ],
    );
    let broken = offered(
        0,
        signed_report(&pki.leaf_key, &ReportSpec::new(nonce())),
        vec![
            forged_leaf,
            pki.brom.clone(),
            pki.intermediate.clone(),
            pki.root.clone(),
        ],
    );
    assert_eq!(reason(&broken, &trust), "identity-chain");

    let missing_intermediate = offered(
        0,
        signed_report(&pki.leaf_key, &ReportSpec::new(nonce())),
        vec![pki.leaf.clone(), pki.root.clone()],
    );
    assert_eq!(reason(&missing_intermediate, &trust), "identity-chain");

    let expired_pki = TestPki::device_with(0x23, "GH100", "00C0FFEE00000003", (test_pki::NOT_BEFORE, NOW - 1));
    let expired = offered(
        0,
        signed_report(&expired_pki.leaf_key, &ReportSpec::new(nonce())),
        expired_pki.chain(),
    );
    assert_eq!(reason(&expired, &trust), "identity-chain-expired");

    assert_eq!(
        reason(&good_evidence(), &EvidenceTrust::nvidia(SkuTable::default())),
        "identity-untrusted-root",
        "a chain that ends at a root the validator does not pin proves nothing"
    );

    let mut devtools = good_evidence();
    devtools.cc_state = CcState::DevTools;
    assert_eq!(reason(&devtools, &trust), "identity-devtools");

    let blackwell_pki = TestPki::device_with(
        0x24,
        "GB100",
        "00C0FFEE00000004",
        (test_pki::NOT_BEFORE, test_pki::NOT_AFTER),
    );
    let other_chip = offered(
        0,
        signed_report(&blackwell_pki.leaf_key, &ReportSpec::new(nonce())),
        blackwell_pki.chain(),
    );
    assert_eq!(
        reason(&other_chip, &trust),
        "identity-device-mismatch",
        "a GB100 part is not an H100"
    );
    let knows_b200 = EvidenceTrust {
        anchors: TestPki::anchors(),
        table: SkuTable {
            chips: vec![ChipEntry {
                model: "B200".into(),
                chip: "GB100".into(),
            }],
            skus: vec![],
        },
    };
    assert!(check_device_evidence(&other_chip, &nonce(), "NVIDIA B200", &knows_b200, NOW).is_ok());

    let sku_table = EvidenceTrust {
        anchors: TestPki::anchors(),
        table: SkuTable {
            chips: vec![],
            skus: vec![SkuEntry {
                project: "G520".into(),
                project_sku: "0200".into(),
                model: "H200".into(),
            }],
        },
    };
    assert_eq!(
        reason(&good_evidence(), &sku_table),
        "identity-sku-mismatch",
        "the operator says G520/0200 is an H200"
    );
    assert!(check_device_evidence(&good_evidence(), &nonce(), "NVIDIA H200", &sku_table, NOW).is_ok());

    let mut other_firmware = ReportSpec::new(nonce());
    other_firmware.fwid = Some([0x77; 48]);
    let stale_firmware = offered(0, signed_report(&pki.leaf_key, &other_firmware), pki.chain());
    assert_eq!(reason(&stale_firmware, &trust), "identity-chain");

    let mut names_its_chip = ReportSpec::new(nonce());
    names_its_chip.chip_info = Some("GH100");
    let consistent = offered(0, signed_report(&pki.leaf_key, &names_its_chip), pki.chain());
    assert!(check(&consistent, &trust).is_ok());
    names_its_chip.chip_info = Some("GB100");
    let inconsistent = offered(0, signed_report(&pki.leaf_key, &names_its_chip), pki.chain());
    assert_eq!(
        reason(&inconsistent, &trust),
        "identity-device-mismatch",
        "the report and its certificate disagree"
    );

    let mut truncated = good_evidence();
    truncated.report.truncate(100);
    assert_eq!(reason(&truncated, &trust), "identity-malformed");
    let mut trailing = good_evidence();
    trailing.report.push(0);
    assert_eq!(reason(&trailing, &trust), "identity-malformed");

    assert_eq!(
        reason(&DeviceEvidence::not_offered(0, CcState::Off), &trust),
        "identity-not-offered"
    );
}

#[test]
fn a_report_from_an_earlier_challenge_does_not_answer_this_one() {
    let pki = TestPki::device(0x21, "00C0FFEE00000001");
    let earlier = spdm_nonce(&[1; 32], &[8; 32], &Digest([9; 32]), 0);
    let replayed = offered(0, signed_report(&pki.leaf_key, &ReportSpec::new(earlier)), pki.chain());
    assert_eq!(
        check(&replayed, &test_trust()).unwrap_err().reason(),
        "identity-wrong-nonce"
    );
}

#[test]
fn one_part_cannot_stand_for_two_slots() {
    let pki = TestPki::device(0x21, "00C0FFEE00000001");
    let nonce_of = |index| spdm_nonce(&[7; 32], &[8; 32], &Digest([9; 32]), index);
    // The same GPU asked twice, once with each slot's nonce: both reports are genuine.
    let slot0 = offered(
        0,
        signed_report(&pki.leaf_key, &ReportSpec::new(nonce_of(0))),
        pki.chain(),
    );
    let slot1 = offered(
        1,
        signed_report(&pki.leaf_key, &ReportSpec::new(nonce_of(1))),
        pki.chain(),
    );
    let outcomes = check_evidence_set(
        [(&slot0, nonce_of(0), H100), (&slot1, nonce_of(1), H100)],
        &test_trust(),
        NOW,
    );
    assert!(outcomes[0].1.is_ok());
    assert_eq!(outcomes[1].1.as_ref().unwrap_err().reason(), "identity-device-mismatch");

    let other = TestPki::device(0x25, "00C0FFEE00000005");
    let slot1 = offered(
        1,
        signed_report(&other.leaf_key, &ReportSpec::new(nonce_of(1))),
        other.chain(),
    );
    let outcomes = check_evidence_set(
        [(&slot0, nonce_of(0), H100), (&slot1, nonce_of(1), H100)],
        &test_trust(),
        NOW,
    );
    assert!(
        outcomes.iter().all(|(_, outcome)| outcome.is_ok()),
        "two parts, two slots"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No byte string panics the report parser, and a report with any byte changed either fails
    /// to decode or fails its signature: nothing in it is outside what the signature covers.
    #[test]
    fn reports_never_panic_and_every_byte_is_signed(position in 0usize..10_000, flip in 1u8..=255, junk in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = AttestationReport::parse(&junk);
        let mut evidence = good_evidence();
        let position = position % evidence.report.len();
        evidence.report[position] ^= flip;
        let fault = check(&evidence, &test_trust()).unwrap_err();
        prop_assert!(
            matches!(fault.reason(), "identity-malformed" | "identity-signature"),
            "byte {position}: {fault}"
        );
    }
}

/// The chain checks one by one: each removed from `chain.rs` would let one of these through.
#[test]
fn chains_that_do_not_make_a_device_identity_are_refused() {
    use test_pki::{
        FWID, INTERMEDIATE_NAME, LEAF_NAME, NOT_AFTER, NOT_BEFORE, brom_name, device_name, fwid_extension, issue, key,
    };
    let trust = test_trust();
    let pki = TestPki::device(0x21, "00C0FFEE00000001");
    let report = signed_report(&pki.leaf_key, &ReportSpec::new(nonce()));
    let with_chain = |chain: Vec<Vec<u8>>| offered(0, report.clone(), chain);
    let reason = |evidence: &DeviceEvidence| check(evidence, &trust).unwrap_err();
    let leaf_with = |issuer_key: &p384::ecdsa::SigningKey, extra| {
        issue(
            LEAF_NAME,
            &pki.leaf_key,
            &brom_name("00C0FFEE00000001"),
            issuer_key,
            false,
            (NOT_BEFORE, NOT_AFTER),
            extra,
        )
    };

    // A device CA that is not a CA (no basic constraints with cA).
    let not_a_ca = issue(
        &brom_name("00C0FFEE00000001"),
        &pki.brom_key,
        INTERMEDIATE_NAME,
        &key(2),
        false,
        (NOT_BEFORE, NOT_AFTER),
        vec![],
    );
    let fault = reason(&with_chain(vec![
        pki.leaf.clone(),
        not_a_ca,
        pki.intermediate.clone(),
        pki.root.clone(),
    ]));
    assert_eq!(fault.reason(), "identity-chain", "{fault}");
    assert!(fault.to_string().contains("is not a CA"), "{fault}");

    // A leaf whose key usage does not allow signatures: built as a CA, whose usage is
    // certificate signing only.
    let signing_not_allowed = issue(
        LEAF_NAME,
        &pki.leaf_key,
        &brom_name("00C0FFEE00000001"),
        &pki.brom_key,
        true,
        (NOT_BEFORE, NOT_AFTER),
        vec![device_name("GH100", "00C0FFEE00000001"), fwid_extension(&FWID)],
    );
    let fault = reason(&with_chain(vec![
        signing_not_allowed,
        pki.brom.clone(),
        pki.intermediate.clone(),
        pki.root.clone(),
    ]));
    assert!(fault.to_string().contains("may not sign"), "{fault}");

    // A leaf that names no device.
    let nameless = leaf_with(&pki.brom_key, vec![fwid_extension(&FWID)]);
    let fault = reason(&with_chain(vec![
        nameless,
        pki.brom.clone(),
        pki.intermediate.clone(),
        pki.root.clone(),
    ]));
    assert!(fault.to_string().contains("names no NVIDIA device"), "{fault}");

    // A device name not of the form NVIDIA:<chip>:<id>.
    let misnamed = leaf_with(
        &pki.brom_key,
        vec![device_name("GH100:EXTRA", "1"), fwid_extension(&FWID)],
    );
    let fault = reason(&with_chain(vec![
        misnamed,
        pki.brom.clone(),
        pki.intermediate.clone(),
        pki.root.clone(),
    ]));
    assert_eq!(fault.reason(), "identity-chain", "{fault}");

    // One certificate, the root alone, or more than the limit.
    assert_eq!(reason(&with_chain(vec![pki.root.clone()])).reason(), "identity-chain");
    assert_eq!(
        reason(&with_chain(vec![pki.root.clone(), pki.root.clone()])).reason(),
        "identity-chain",
        "the root as its own leaf"
    );
    let too_long = std::iter::repeat_n(pki.intermediate.clone(), 10)
        .chain([pki.root.clone()])
        .collect();
    assert_eq!(reason(&with_chain(too_long)).reason(), "identity-chain");

    // A leaf not yet valid.
    let future = TestPki::device_with(0x26, "GH100", "00C0FFEE00000006", (NOW + 3_600, NOT_AFTER));
    let early = offered(
        0,
        signed_report(&future.leaf_key, &ReportSpec::new(nonce())),
        future.chain(),
    );
    assert_eq!(reason(&early).reason(), "identity-chain-expired");

    // A certificate in BER rather than DER: its outer length in the long form it need not take.
    let mut ber = pki.leaf.clone();
    assert_eq!(ber[1], 0x82, "a test leaf's length takes two bytes");
    ber.splice(1..2, [0x83, 0x00]);
    let fault = reason(&with_chain(vec![
        ber,
        pki.brom.clone(),
        pki.intermediate.clone(),
        pki.root.clone(),
    ]));
    assert_eq!(fault.reason(), "identity-chain", "{fault}");
}

#[test]
fn one_part_is_one_part_whatever_its_id_is_spelled_or_whichever_leaf_it_shows() {
    let nonce_of = |index| spdm_nonce(&[7; 32], &[8; 32], &Digest([9; 32]), index);
    let slot0_pki = TestPki::device(0x21, "00c0ffee0000000a");
    let slot0 = offered(
        0,
        signed_report(&slot0_pki.leaf_key, &ReportSpec::new(nonce_of(0))),
        slot0_pki.chain(),
    );
    // The same id in another case, from another key and another device CA.
    let shouting = TestPki::device(0x27, "00C0FFEE0000000A");
    let slot1 = offered(
        1,
        signed_report(&shouting.leaf_key, &ReportSpec::new(nonce_of(1))),
        shouting.chain(),
    );
    let outcomes = check_evidence_set(
        [(&slot0, nonce_of(0), H100), (&slot1, nonce_of(1), H100)],
        &test_trust(),
        NOW,
    );
    assert_eq!(outcomes[1].1.as_ref().unwrap_err().reason(), "identity-device-mismatch");

    // A second leaf under the first part's own CA, naming another id: a leaked per-part key
    // minting devices is still that one part.
    let minted_key = test_pki::key(0x28);
    let minted = test_pki::issue(
        test_pki::LEAF_NAME,
        &minted_key,
        &test_pki::brom_name("00c0ffee0000000a"),
        &slot0_pki.brom_key,
        false,
        (test_pki::NOT_BEFORE, test_pki::NOT_AFTER),
        vec![
            test_pki::device_name("GH100", "00C0FFEE0000000B"),
            test_pki::fwid_extension(&test_pki::FWID),
        ],
    );
    let slot1 = offered(
        1,
        signed_report(&minted_key, &ReportSpec::new(nonce_of(1))),
        vec![
            minted,
            slot0_pki.brom.clone(),
            slot0_pki.intermediate.clone(),
            slot0_pki.root.clone(),
        ],
    );
    let outcomes = check_evidence_set(
        [(&slot0, nonce_of(0), H100), (&slot1, nonce_of(1), H100)],
        &test_trust(),
        NOW,
    );
    assert!(
        check_device_evidence(&slot1, &nonce_of(1), H100, &test_trust(), NOW).is_ok(),
        "alone, the minted leaf verifies: only the part's CA gives it away"
    );
    assert_eq!(outcomes[1].1.as_ref().unwrap_err().reason(), "identity-device-mismatch");
}

/// A report's length fields changed to every value near the truth: the parser neither panics
/// nor accepts, whatever the field claims.
#[test]
fn lying_length_fields_are_caught() {
    let good = good_evidence();
    let record_len_at = 37 + 5; // the response's 3-byte record length
    let record_len = u32::from_le_bytes([
        good.report[record_len_at],
        good.report[record_len_at + 1],
        good.report[record_len_at + 2],
        0,
    ]) as usize;
    let opaque_len_at = 37 + 8 + record_len + 32;
    for delta in [-300i64, -2, -1, 1, 2, 300, 0xFFFF, 0xFF_FFFF] {
        let mut lying = good.clone();
        let record = (record_len as i64 + delta).clamp(0, 0xFF_FFFF) as u32;
        lying.report[record_len_at..record_len_at + 3].copy_from_slice(&record.to_le_bytes()[..3]);
        assert!(matches!(
            check(&lying, &test_trust()).unwrap_err().reason(),
            "identity-malformed" | "identity-signature"
        ));
        let mut lying = good.clone();
        let opaque = u16::from_le_bytes([good.report[opaque_len_at], good.report[opaque_len_at + 1]]) as i64;
        let opaque = (opaque + delta).clamp(0, 0xFFFF) as u16;
        lying.report[opaque_len_at..opaque_len_at + 2].copy_from_slice(&opaque.to_le_bytes());
        assert!(matches!(
            check(&lying, &test_trust()).unwrap_err().reason(),
            "identity-malformed" | "identity-signature"
        ));
    }
}
