//! Two validators sharing one PostgreSQL database, with the real binaries: they split the
//! registered miners by leases (no miner attested by both at once or twice in an interval, none
//! forgotten), and when one is killed mid-round, the other picks its miners up once their leases
//! run out. Skipped, with one line, where no PostgreSQL server is configured
//! (`GPU_ATTEST_TEST_POSTGRES`; `.ci/run` starts one).

use crate::common;

use common::process::{Daemon, Dir, cmd, keygen, serve_miner};
use gpu_attest_validator::store::{Store, VerdictFilter, scratch};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const MINERS: usize = 6;
const INTERVAL_SECS: u64 = 2;
const LEASE_SECS: u64 = 3;

/// Small challenges sized by a rate far below what a core does, and never calibrated (eight
/// processes share two cores here: calibrated deadlines would time the contention). Without the
/// memory phase: each miner's default 16 MiB pool takes seconds of these two cores to fill, and
/// this test is about the leases (the memory phase has `memory.rs`).
fn write_fleet_config(dir: &Path, key: &str, database: &str) {
    std::fs::write(
        dir.join(format!("{key}.toml")),
        format!(
            "key_file = {:?}\ndatabase = {database:?}\nsamples = 4\ncpu_threads = 1\n\
             [challenge]\ncpu_n = 64\niterations = 4\ncheckpoint_every = 2\ntarget_seconds = 0.2\n\
             [deadline]\nmin_ms = 2000\n\
             [schedule]\ninterval_secs = {INTERVAL_SECS}\nconcurrency = 2\njitter = 0.1\n\
             backoff_initial_secs = 1\nbackoff_max_secs = 2\nlease_secs = {LEASE_SECS}\n\
             [calibration]\nmin_miners = 1000\n\
             [memory]\nenabled = false\n\
             [[rates]]\nbackend = \"cpu\"\nops_per_sec = 2e9\n",
            dir.join(format!("{key}.key")),
        ),
    )
    .unwrap();
}

/// `validator serve` with its schedule on, its log in `DIR/NAME.log`; the daemon and its API URL.
fn start_validator(dir: &Path, name: &str) -> (Daemon, String) {
    let mut child = cmd("validator")
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join(format!("{name}.toml")))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .expect("listening line")
        .to_string();
    (Daemon(child), format!("http://{address}"))
}

fn scheduled_passes(dir: &Path, name: &str) -> usize {
    std::fs::read_to_string(dir.join(format!("{name}.log")))
        .unwrap_or_default()
        .matches("scheduled attestation passed")
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_validators_on_postgres_split_the_miners_and_take_over_from_a_dead_one() {
    let Some(admin) = scratch::postgres_server("validator fleet") else {
        return;
    };
    let database = scratch::postgres_database(&admin, "fleet").await;
    let dir = Dir::fresh("fleet");
    let d = &dir.0;
    let keys = [
        keygen("validator", &d.join("a.key")),
        keygen("validator", &d.join("b.key")),
    ];
    for name in ["a", "b"] {
        write_fleet_config(d, name, &database);
    }

    let mut miners = Vec::new();
    for i in 0..MINERS {
        let home = d.join(format!("miner-{i}"));
        std::fs::create_dir_all(&home).unwrap();
        keygen("miner", &home.join("m.key"));
        let mut serve = serve_miner(&home, &keys[0]);
        serve.args(["--allow-validator", &keys[1]]);
        let mut child = serve.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = format!("http://{}", line.trim().strip_prefix("listening on ").unwrap());
        miners.push((Daemon(child), url));
    }

    let (a, api_a) = start_validator(d, "a");
    let (_b, _api_b) = start_validator(d, "b");
    for (_, url) in &miners {
        let out = cmd("validator")
            .args(["miners", "--api", &api_a, "add", url])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let started = Instant::now();

    // Both at work for a few intervals, then one killed without warning, mid-round or not.
    tokio::time::sleep(Duration::from_secs(4 * INTERVAL_SECS)).await;
    let (passes_a, passes_b) = (scheduled_passes(d, "a"), scheduled_passes(d, "b"));
    drop(a);
    let killed_at_ms = gpu_attest_validator::attest::now_ms();
    tokio::time::sleep(Duration::from_secs(LEASE_SECS + 3 * INTERVAL_SECS)).await;

    let store = Store::open(Path::new(&database)).await.unwrap();
    let verdicts = store
        .verdicts(&VerdictFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut by_miner: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for v in &verdicts {
        assert!(v.passed, "{v:?}");
        by_miner.entry(v.miner_url.as_str()).or_default().push(v.created_at_ms);
    }
    println!(
        "{} verdicts in {:.1} s; scheduled passes before the kill: a {passes_a}, b {passes_b}",
        verdicts.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        passes_a > 0 && passes_b > 0,
        "both validators took miners: a {passes_a}, b {passes_b}"
    );
    assert_eq!(by_miner.len(), MINERS, "every miner attested: {by_miner:?}");
    // The lease's next-due time keeps any two attestations of a miner an interval (less the
    // jitter) apart, whichever validators gave them.
    let least_gap_ms = INTERVAL_SECS * 1000 * 9 / 10 - 50;
    for (url, times) in &mut by_miner {
        times.sort();
        for pair in times.windows(2) {
            assert!(
                pair[1] - pair[0] >= least_gap_ms,
                "{url} attested twice within {} ms: {times:?}",
                pair[1] - pair[0]
            );
        }
        // None forgotten: the survivor took every miner after the dead one's leases ran out.
        assert!(
            times.iter().any(|&t| t > killed_at_ms + LEASE_SECS * 1000),
            "{url} not attested after the kill: {times:?}"
        );
    }
    let nonces: std::collections::HashSet<&str> = verdicts.iter().map(|v| v.nonce.as_str()).collect();
    assert_eq!(nonces.len(), verdicts.len(), "no nonce serves two verdicts");
}
