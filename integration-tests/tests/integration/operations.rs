//! The daemons as operators run them, through the real binaries on loopback: the metrics
//! endpoint moving during an attestation, and the faults a long-running validator meets (a miner
//! killed or stalled mid-challenge, the validator itself killed mid-round and restarted, its
//! database full or read-only). Each fault ends with a recorded reason and the daemons serving.

use crate::common;

use common::operated::{Started, attest_via_api, start_logged, validator_serve};
use common::process::{Dir, cmd, keygen, sample, scrape, serve_miner, signal, write_small_validator_config};
use gpu_attest_proto::v1::{self, validator_client::ValidatorClient};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The stored verdicts, as `validator verdicts --json` lists them (it reads the file directly).
fn stored_verdicts(database: &Path) -> Vec<serde_json::Value> {
    let out = cmd("validator")
        .args(["verdicts", "--json", "--database"])
        .arg(database)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A validator config whose challenges keep a 1-thread miner busy for seconds (the rate is set
/// far above what one core does), with a short deadline, so that a fault can strike mid-way.
fn write_long_challenge_config(dir: &Path) {
    std::fs::write(
        dir.join("validator.toml"),
        format!(
            "key_file = {:?}\nsamples = 4\ncpu_threads = 1\n\
             [challenge]\ncpu_n = 256\niterations = 4\ncheckpoint_every = 2\ntarget_seconds = 4\n\
             [deadline]\nmin_ms = 2000\ncpu_slack = 1.5\nfirst_contact_slack = 1.5\n\
             [[rates]]\nbackend = \"cpu\"\nops_per_sec = 1e12\n",
            dir.join("v.key"),
        ),
    )
    .unwrap();
}

/// Keys for a validator and a miner in `d`, and a miner serving that allows the validator.
fn miner_for(d: &Path, metrics: bool) -> (String, Started) {
    let validator_key = keygen("validator", &d.join("v.key"));
    keygen("miner", &d.join("m.key"));
    let miner = start_logged(serve_miner(d, &validator_key), d.join("miner.log"), metrics);
    (validator_key, miner)
}

async fn health_serving(url: &str) -> bool {
    let Ok(channel) = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
    else {
        return false;
    };
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .is_ok_and(|r| r.into_inner().status == 1)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_move_during_an_attestation() {
    let dir = Dir::fresh("metrics");
    let d = &dir.0;
    let (_key, miner) = miner_for(d, true);
    write_small_validator_config(d);
    let validator = start_logged(validator_serve(d, &d.join("v.db")), d.join("validator.log"), true);
    let (miner_metrics, validator_metrics) = (miner.metrics.clone().unwrap(), validator.metrics.clone().unwrap());

    let before = (scrape(&miner_metrics), scrape(&validator_metrics));
    assert!(
        sample(&before.0, "gpu_attest_miner_cpu_load_average_1m").is_some(),
        "a host without GPUs reports its CPU load: {}",
        before.0
    );
    assert_eq!(
        sample(&before.0, "gpu_attest_miner_challenges_total{outcome=\"committed\"}"),
        None
    );
    // Each outcome's counter is there from the start, at 0, so that `increase()` sees the first.
    assert_eq!(
        sample(&before.1, "gpu_attest_validator_attestations_total{outcome=\"pass\"}"),
        Some(0.0)
    );

    // Registered, so that its proven rate gets a series of its own.
    let added = cmd("validator")
        .args(["miners", "--api", &validator.url, "add", &miner.url])
        .output()
        .unwrap();
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let verdict = attest_via_api(&validator.url, &miner.url, || {}).await.unwrap();
    assert!(verdict.passed, "{:?}", verdict.reasons);
    let unreachable = attest_via_api(&validator.url, "http://127.0.0.1:1", || {}).await;
    assert_eq!(unreachable.unwrap_err().code(), tonic::Code::Unavailable);

    let (m, v) = (scrape(&miner_metrics), scrape(&validator_metrics));
    assert_eq!(
        sample(&m, "gpu_attest_miner_challenges_total{outcome=\"committed\"}"),
        Some(1.0),
        "{m}"
    );
    assert!(
        sample(&m, "gpu_attest_miner_openings_total{outcome=\"served\"}").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert!(sample(&m, "gpu_attest_miner_chains_per_second").unwrap() > 0.0, "{m}");
    assert_eq!(sample(&m, "gpu_attest_miner_compute_seconds_count"), Some(1.0), "{m}");
    assert_eq!(
        sample(&v, "gpu_attest_validator_attestations_total{outcome=\"pass\"}"),
        Some(1.0),
        "{v}"
    );
    assert_eq!(
        sample(
            &v,
            "gpu_attest_validator_attestation_errors_total{kind=\"unreachable\"}"
        ),
        Some(1.0),
        "{v}"
    );
    for phase in ["prepare", "challenge", "verify", "store"] {
        assert_eq!(
            sample(
                &v,
                &format!("gpu_attest_validator_phase_seconds_count{{phase=\"{phase}\"}}")
            ),
            Some(1.0),
            "{phase}: {v}"
        );
    }
    assert_eq!(
        sample(&v, "gpu_attest_validator_verification_seconds_count"),
        Some(1.0),
        "{v}"
    );
    let proven = sample(
        &v,
        &format!("gpu_attest_validator_proven_ops_per_second{{miner=\"{}\"}}", miner.url),
    );
    assert!(proven.is_some_and(|r| r > 0.0), "{v}");
}

#[test]
fn metrics_off_loopback_are_refused_unless_allowed() {
    let dir = Dir::fresh("metrics-remote");
    let d = &dir.0;
    keygen("validator", &d.join("v.key"));
    let out = cmd("validator")
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-schedule",
            "--metrics-listen",
            "0.0.0.0:0",
        ])
        .arg("--key-file")
        .arg(d.join("v.key"))
        .arg("--database")
        .arg(d.join("v.db"))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("error: refusing to serve metrics in plaintext on 0.0.0.0:0"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_miner_killed_mid_challenge_fails_its_verdict_and_the_validator_serves_on() {
    let dir = Dir::fresh("fault-kill-miner");
    let d = &dir.0;
    let (_key, miner) = miner_for(d, false);
    write_long_challenge_config(d);
    let database = d.join("v.db");
    let validator = start_logged(validator_serve(d, &database), d.join("validator.log"), false);

    let pid = miner.pid();
    let verdict = attest_via_api(&validator.url, &miner.url, || signal(pid, "-KILL"))
        .await
        .unwrap_or_else(|s| panic!("{s:?}; log: {}", validator.log()));
    assert!(!verdict.passed);
    let codes: Vec<&str> = verdict.fail_reasons.iter().map(|r| r.code.as_str()).collect();
    assert_eq!(codes, ["miner-failed"], "{:?}", verdict.fail_reasons);
    // Said as what happened to the connection, not as the HTTP/2 library's words alone.
    assert!(
        verdict.fail_reasons[0]
            .message
            .contains("connection closed after it accepted the challenge"),
        "{:?}",
        verdict.fail_reasons
    );
    let stored = stored_verdicts(&database);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["passed"], false);

    // The validator serves on: healthy, and its API answers.
    assert!(health_serving(&validator.url).await, "log: {}", validator.log());
    let listed = ValidatorClient::connect(validator.url.clone())
        .await
        .unwrap()
        .list_verdicts(v1::ListVerdictsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.verdicts.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_miner_that_stalls_its_stream_times_out_and_the_validator_serves_on() {
    let dir = Dir::fresh("fault-stall-miner");
    let d = &dir.0;
    let (_key, miner) = miner_for(d, false);
    write_long_challenge_config(d);
    let database = d.join("v.db");
    let validator = start_logged(validator_serve(d, &database), d.join("validator.log"), false);

    // SIGSTOP: the miner's connection stays open, and nothing more comes down it.
    let pid = miner.pid();
    let verdict = attest_via_api(&validator.url, &miner.url, || signal(pid, "-STOP")).await;
    signal(pid, "-CONT");
    let verdict = verdict.unwrap_or_else(|s| panic!("{s:?}; log: {}", validator.log()));
    assert!(!verdict.passed);
    let codes: Vec<&str> = verdict.fail_reasons.iter().map(|r| r.code.as_str()).collect();
    assert_eq!(codes, ["commitment-timed-out"], "{:?}", verdict.fail_reasons);
    assert_eq!(stored_verdicts(&database).len(), 1);
    assert!(health_serving(&validator.url).await, "log: {}", validator.log());
}

/// What the store says about `database`: verdict nonces, and how many nonces were issued.
/// A draining daemon waits for its open calls up to the drain limit (25 s), but an operator who
/// interrupts it again means now: the second Ctrl-C stops it at once, and the log says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_interrupt_stops_a_draining_miner_at_once() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let dir = Dir::fresh("second-interrupt");
    let (_key, mut miner) = miner_for(&dir.0, false);
    // A health Watch stream never ends by itself: it holds the drain open.
    let channel = tonic::transport::Endpoint::from_shared(miner.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest { service: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert!(watch.message().await.unwrap().is_some());

    let pid = miner.pid();
    signal(pid, "-INT");
    let exited = |miner: &mut Started, within: Duration| {
        let until = std::time::Instant::now() + within;
        loop {
            if let Some(status) = miner.daemon.0.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert!(
        exited(&mut miner, Duration::from_secs(2)).is_none(),
        "the first interrupt drains (the Watch stream is open); log: {}",
        miner.log()
    );
    assert!(
        miner.log().contains("interrupt again"),
        "the log says how to stop now: {}",
        miner.log()
    );
    signal(pid, "-INT");
    let status = exited(&mut miner, Duration::from_secs(8))
        .unwrap_or_else(|| panic!("still draining 8 s after a second interrupt; log: {}", miner.log()));
    assert!(status.success(), "{status:?}; log: {}", miner.log());
    assert!(
        miner.log().contains("interrupted again: stopping now"),
        "{}",
        miner.log()
    );
}

/// A one-shot `validator attest` interrupted mid-challenge says what it left: the challenge was
/// sent and abandoned, and no verdict was stored (the database agrees).
#[test]
fn an_interrupted_one_shot_attest_says_that_nothing_was_stored() {
    use std::io::{BufRead, BufReader};
    let dir = Dir::fresh("interrupted-attest");
    let d = &dir.0;
    let (_key, miner) = miner_for(d, false);
    write_long_challenge_config(d);
    let database = d.join("v.db");
    let mut attest = cmd("validator")
        .args(["attest", "--miner", &miner.url, "--config"])
        .arg(d.join("validator.toml"))
        .arg("--database")
        .arg(&database)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(attest.stderr.take().unwrap()).lines();
    // Phases go to stderr one a line off a terminal; interrupt once the miner is computing.
    let mut seen = Vec::new();
    for line in stderr.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.starts_with("computing:") {
            break;
        }
    }
    assert!(seen.iter().any(|l| l.starts_with("computing:")), "{seen:?}");
    signal(attest.id() as i32, "-INT");
    let rest: Vec<String> = stderr.map(Result::unwrap).collect();
    let status = attest.wait().unwrap();
    assert_eq!(status.code(), Some(2), "{rest:?}");
    let last = rest.last().cloned().unwrap_or_default();
    assert!(
        last.starts_with("error: interrupted: the challenge was sent and abandoned; no verdict was stored"),
        "{rest:?}"
    );
    assert!(stored_verdicts(&database).is_empty());
}

async fn nonces_of(database: &Path) -> (Vec<String>, u64) {
    let store = gpu_attest_validator::store::Store::open(database).await.unwrap();
    let verdicts = store
        .verdicts(&gpu_attest_validator::store::VerdictFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    (
        verdicts.into_iter().map(|v| v.nonce).collect(),
        store.nonce_count().await.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_validator_killed_mid_round_and_restarted_loses_no_verdict_and_reuses_no_nonce() {
    let dir = Dir::fresh("fault-kill-validator");
    let d = &dir.0;
    let (_key, miner) = miner_for(d, false);
    let database = d.join("v.db");

    // A verdict the API has reported is on disk, even if the validator dies the next instant.
    write_small_validator_config(d);
    let validator = start_logged(validator_serve(d, &database), d.join("validator1.log"), false);
    let first = attest_via_api(&validator.url, &miner.url, || {}).await.unwrap();
    assert!(first.passed, "{:?}", first.reasons);
    signal(validator.pid(), "-KILL");
    drop(validator);

    // Killed while the miner computes: the round leaves no verdict, and its nonce stays issued.
    write_long_challenge_config(d);
    let validator = start_logged(validator_serve(d, &database), d.join("validator2.log"), false);
    let pid = validator.pid();
    let killed = attest_via_api(&validator.url, &miner.url, || signal(pid, "-KILL")).await;
    assert!(killed.is_err(), "the validator died mid-round: {killed:?}");
    drop(validator);

    // Restarted on the same database: it attests again with a fresh nonce. The miner may still
    // be winding down the abandoned challenge for a moment (it cancels when it notices the
    // validator has gone); that is a refusal without a verdict, and the attempt is repeated.
    write_small_validator_config(d);
    let validator = start_logged(validator_serve(d, &database), d.join("validator3.log"), false);
    let mut last = None;
    for _ in 0..20 {
        match attest_via_api(&validator.url, &miner.url, || {}).await {
            Ok(v) => {
                last = Some(v);
                break;
            }
            Err(s) if s.code() == tonic::Code::FailedPrecondition && s.message().contains("refused") => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(s) => panic!("{s:?}; log: {}", validator.log()),
        }
    }
    let last = last.expect("the miner took challenges again");
    assert!(last.passed, "{:?}", last.reasons);
    drop(validator);

    let (verdict_nonces, issued) = nonces_of(&database).await;
    assert_eq!(verdict_nonces.len(), 2, "both reported verdicts are stored, once each");
    assert_eq!(
        verdict_nonces.iter().collect::<std::collections::HashSet<_>>().len(),
        2,
        "no nonce serves two verdicts"
    );
    assert!(
        verdict_nonces.contains(&hex::encode(&first.nonce)) && verdict_nonces.contains(&hex::encode(&last.nonce)),
        "{verdict_nonces:?}"
    );
    assert!(
        issued >= 3,
        "the abandoned round's nonce stays issued, so it is never used again ({issued} issued)"
    );
}

/// A small tmpfs mounted on `path` for the test's lifetime, or `None` (with the reason) where
/// this process may not mount file systems.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if out.status.success() {
            Ok(Tmpfs(path.to_path_buf()))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Writes zeros to `path` until the file system is full.
fn fill(path: &Path) {
    let mut file = File::create(path).unwrap();
    let block = vec![0u8; 64 << 10];
    while file.write_all(&block).is_ok() {}
    let _ = file.sync_all();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_database_disk_refuses_attestations_plainly_and_recovers_when_freed() {
    let dir = Dir::fresh("fault-disk-full");
    let d = &dir.0;
    let disk = match Tmpfs::mount(&d.join("disk"), "4m") {
        Ok(disk) => disk,
        Err(why) => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: a full disk needs a small file system of the test's own, and mounting one failed: {why}"
            );
            return;
        }
    };
    let (_key, miner) = miner_for(d, false);
    write_small_validator_config(d);
    let database = disk.0.join("v.db");
    let validator = start_logged(validator_serve(d, &database), d.join("validator.log"), false);
    let first = attest_via_api(&validator.url, &miner.url, || {}).await.unwrap();
    assert!(first.passed, "{:?}", first.reasons);

    fill(&disk.0.join("filler"));
    let refused = attest_via_api(&validator.url, &miner.url, || {}).await;
    let status = refused.expect_err("nothing can be stored on a full disk");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("cannot be written"), "{status:?}");
    assert!(health_serving(&validator.url).await, "log: {}", validator.log());

    // Space again: the next attestation is stored, and the earlier verdict is intact.
    std::fs::remove_file(disk.0.join("filler")).unwrap();
    let again = attest_via_api(&validator.url, &miner.url, || {})
        .await
        .unwrap_or_else(|s| panic!("{s:?}; log: {}", validator.log()));
    assert!(again.passed, "{:?}", again.reasons);
    drop(validator);
    let stored = stored_verdicts(&database);
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert!(stored.iter().all(|v| v["passed"] == true));
    drop(disk);
}
