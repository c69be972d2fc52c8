//! The fuzz targets' inputs under `cargo test`, where no fuzzer runs: every committed corpus and
//! regression input goes through its entry point again (a crash the fuzzer found stays fixed),
//! the committed seeds are the genuine inputs `hostile::seeds` makes today and pass the checks
//! they seed, and every entry point has its target. `scripts/fuzz.sh` runs the fuzzer itself.

use gpu_attest_integration_tests::hostile::{self, TARGETS};
use gpu_attest_proto::convert::{commitment_from_wire, inventory_from_wire, opening_from_wire, walk_opening_from_wire};
use gpu_attest_proto::evidence::evidence_from_wire;
use gpu_attest_proto::v1;
use gpu_attest_shared::CancelToken;
use gpu_attest_shared::evidence::{EvidenceTrust, check_device_evidence};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::opening::SampleRequest;
use gpu_attest_shared::verify::{check_commitment, verify_opening};
use gpu_attest_validator::config::ValidatorConfig;
use gpu_attest_validator::planner::plan;
use gpu_attest_validator::rates::RateBook;
use gpu_attest_validator::rates::file::RateFile;
use prost::Message;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn seed_path(target: &str, name: &str) -> PathBuf {
    fuzz_dir().join("corpus").join(target).join(format!("seed-{name}"))
}

/// The files directly under `dir`, sorted; none when it does not exist.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.expect("a readable entry").path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("reading {}: {e}", dir.display()),
    };
    files.retain(|p| p.is_file());
    files.sort();
    files
}

#[test]
fn every_entry_point_has_its_fuzz_target_and_every_target_its_entry_point() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let mut declared: Vec<&str> = manifest
        .lines()
        .filter_map(|line| line.strip_prefix("name = \""))
        .filter_map(|rest| rest.strip_suffix('"'))
        .filter(|name| *name != "gpu-attest-fuzz")
        .collect();
    declared.sort_unstable();
    let mut entry_points: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    entry_points.sort_unstable();
    assert_eq!(
        declared, entry_points,
        "fuzz/Cargo.toml's [[bin]] targets against hostile::TARGETS"
    );
    for name in entry_points {
        let source = std::fs::read_to_string(fuzz_dir().join("fuzz_targets").join(format!("{name}.rs")))
            .unwrap_or_else(|e| panic!("fuzz target {name}: {e}"));
        assert!(
            source.contains(&format!("hostile::{name}(data)")),
            "fuzz target {name} must call hostile::{name}"
        );
    }
}

/// The seeds are committed so that a fuzz run starts from them without building anything first.
/// When the protocol changes them, rewrite them with `GPU_ATTEST_WRITE_FUZZ_SEEDS=1` and commit.
#[test]
fn the_committed_seeds_are_the_genuine_inputs_of_today() {
    let rewrite = std::env::var_os("GPU_ATTEST_WRITE_FUZZ_SEEDS").is_some();
    let mut stale = Vec::new();
    for (target, name, bytes) in hostile::seeds() {
        let path = seed_path(target, name);
        if rewrite {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else if std::fs::read(&path).ok().as_deref() != Some(bytes.as_slice()) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "seeds missing or out of date (rewrite them with GPU_ATTEST_WRITE_FUZZ_SEEDS=1 and commit): {stale:?}"
    );
}

/// Each seed passes the checks of its target, so that the fuzzer starts past every refusal.
#[test]
fn the_seeds_pass_the_checks_they_seed() {
    let seed = |target: &str, name: &str| {
        hostile::seeds()
            .into_iter()
            .find(|(t, n, _)| *t == target && *n == name)
            .map(|(_, _, bytes)| bytes)
            .unwrap_or_else(|| panic!("no seed {target}/{name}"))
    };
    let (work, exec, _) = hostile::honest();

    // Both challenges, the version 3 one re-signed by the harness (its flag bit 4), are
    // accepted by the miner: the fuzzer starts past every acceptance check.
    for name in ["challenge", "challenge-with-memory"] {
        let bytes = seed("wire_messages", name);
        assert_eq!(bytes[0] & 0x0f, 0, "{name} is a challenge");
        assert!(hostile::challenge_received(bytes[0], &bytes[1..]), "{name} is accepted");
    }

    // The first byte is the target's flags (none: the miner's own signatures stand).
    let wire = v1::Commitment::decode(&seed("commitment", "honest")[1..]).unwrap();
    let (commitment, signature) = commitment_from_wire(&wire).unwrap();
    commitment.verify(&signature).expect("the seed commitment is signed");
    check_commitment(work, &commitment.work).expect("the seed commitment is the honest work's");

    let wire = v1::ChainOpening::decode(seed("chain_opening", "honest").as_slice()).unwrap();
    let (_, opening, _) = opening_from_wire(&wire, 64).unwrap();
    let request = SampleRequest {
        chain: opening.chain,
        segment: opening.segment,
    };
    verify_opening(
        hostile::backend(),
        work,
        &exec.commitment,
        request,
        &opening,
        &CancelToken::new(),
    )
    .expect("the seed opening verifies");

    let wire = v1::WalkOpening::decode(seed("walk_opening", "honest").as_slice()).unwrap();
    let (_, opening, _) = walk_opening_from_wire(&wire).unwrap();
    hostile::check_any_walk_opening(&opening).expect("the seed walk opening passes");

    let wire = v1::Inventory::decode(seed("inventory", "cpu-two-devices").as_slice()).unwrap();
    let inventory = inventory_from_wire(&wire).unwrap();
    // The seed inventory says version 3: planned where version 3 is still allowed.
    let config = gpu_attest_integration_tests::version_3_validator_config();
    let rates = RateBook::of_config(&config);
    plan(&inventory, &config, &rates, true, [1; 32], [2; 32]).expect("the seed inventory is planned for");

    let wire = v1::DeviceEvidence::decode(seed("device_evidence", "nvidia-hopper-sample").as_slice()).unwrap();
    let evidence = evidence_from_wire(&[wire], &[0; 64])
        .unwrap()
        .expect("the seed offers evidence");
    check_device_evidence(
        &evidence.devices[0],
        &hostile::nvidia_sample().1,
        hostile::SAMPLE_MODEL,
        &EvidenceTrust::nvidia(Default::default()),
        gpu_attest_integration_tests::test_pki::NOW,
    )
    .expect("NVIDIA's sample is genuine");

    let text = String::from_utf8(seed("key_file", "secret-key")).unwrap();
    assert!(KeyPair::from_key_text(&text).is_some());
    let text = String::from_utf8(seed("key_file", "public-key")).unwrap();
    PublicKey::from_hex(&text).unwrap().check_usable().unwrap();

    let text = String::from_utf8(seed("config_file", "miner-defaults")[1..].to_vec()).unwrap();
    gpu_attest_daemon::config::parse_config::<gpu_attest_miner::config::MinerConfig>(&text, "miner.toml")
        .unwrap()
        .validate()
        .unwrap();
    let text = String::from_utf8(seed("config_file", "validator-defaults")[1..].to_vec()).unwrap();
    gpu_attest_daemon::config::parse_config::<ValidatorConfig>(&text, "validator.toml")
        .unwrap()
        .validate()
        .unwrap();

    let text = String::from_utf8(seed("rate_file", "example")).unwrap();
    let file = RateFile::parse(&text).unwrap();
    assert!(file.classes.iter().all(|row| row.is_importable()));
}

#[test]
fn every_corpus_and_regression_input_is_answered_without_a_panic() {
    let mut replayed = 0;
    for (name, entry_point) in TARGETS {
        for kind in ["corpus", "regressions"] {
            for path in files_in(&fuzz_dir().join(kind).join(name)) {
                let bytes = std::fs::read(&path).unwrap();
                if let Err(panic) = std::panic::catch_unwind(|| entry_point(&bytes)) {
                    panic!("{} panics {name}: {panic:?}", path.display());
                }
                replayed += 1;
            }
        }
    }
    let seeds = hostile::seeds().len();
    assert!(
        replayed >= seeds,
        "only {replayed} inputs replayed, fewer than the {seeds} seeds"
    );
    println!(
        "{replayed} corpus and regression inputs replayed through {} targets",
        TARGETS.len()
    );
}
