//! One validator against many miners: how many verdicts a second it gives, how long each takes,
//! how much memory it holds, and whether every verdict it reported is stored exactly once.
//!
//! The validator is the real `validator serve` binary with its SQLite database, its API on
//! loopback; the miners are real gRPC miner servers on loopback (in this process, sharing one
//! CPU thread for their compute: small challenges, so that the validator's side is what is
//! measured). Every miner is registered through the API, then CONCURRENCY clients attest the
//! miners in turn through the API for SECONDS, timing each attestation from request to verdict.
//! Afterwards the database is read: every reported verdict must be there once, no nonce twice.
//!
//! With `postgres`, two validators share one PostgreSQL database (a fresh one on the server
//! `GPU_ATTEST_TEST_POSTGRES` names) and the clients alternate between them.
//!
//! `cargo bench -p gpu-attest-integration-tests --bench validator_load [-- MINERS SECONDS CONCURRENCY] [postgres]`
//! (defaults 200, 60, 16, SQLite).

#[path = "../tests/common/mod.rs"]
mod common;

use common::process::{Daemon, Dir, cmd, keygen};
use common::*;
use gpu_attest_miner::config::Limits;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_proto::v1::{self, attest_event::Event, validator_client::ValidatorClient};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_validator::store::{Store, VerdictFilter};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One attestation as the client saw it.
struct Attested {
    id: u64,
    nonce: Vec<u8>,
    passed: bool,
    /// Fail reason codes, for a failed verdict.
    reasons: Vec<String>,
    latency: Duration,
}

/// Challenges of a few chains at n = 64 (the declared rate is far below what a core does, so an
/// honest miner finishes well inside its deadline even while others compute on the same thread):
/// the miners' work is small, and the validator's own cost per verdict is what is measured.
fn write_config(dir: &Path, database: &str) {
    std::fs::write(
        dir.join("validator.toml"),
        format!(
            "key_file = {:?}\ndatabase = {:?}\nsamples = 4\ncpu_threads = 1\n\
             requests_per_minute = 100000000\nrequest_burst = 1000000\n\
             [challenge]\ncpu_n = 64\niterations = 4\ncheckpoint_every = 2\ntarget_seconds = 0.05\n[memory]\nenabled = false\n\
             [deadline]\nmin_ms = 100\n\
             [[rates]]\nbackend = \"cpu\"\nops_per_sec = 1e8\n",
            dir.join("v.key"),
            database
        ),
    )
    .unwrap();
}

/// The peak resident memory of process `pid` so far, in bytes (Linux's VmHWM).
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

async fn attest(api: &str, miner: &str) -> Result<v1::Verdict, tonic::Status> {
    let mut client = ValidatorClient::connect(api.to_string())
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut events = client
        .attest_miner(v1::AttestMinerRequest { url: miner.into() })
        .await?
        .into_inner();
    while let Some(event) = events.message().await? {
        if let Some(Event::Verdict(verdict)) = event.event {
            return Ok(verdict);
        }
    }
    Err(tonic::Status::unknown("stream ended without a verdict"))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let numbers: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let miners = numbers.first().copied().unwrap_or(200) as usize;
    let seconds = numbers.get(1).copied().unwrap_or(60);
    let concurrency = numbers.get(2).copied().unwrap_or(16) as usize;
    let postgres = std::env::args().any(|a| a == "postgres");

    let dir = Dir::fresh("load");
    let d = &dir.0;
    let validator_key = PublicKey::from_hex(&keygen("validator", &d.join("v.key"))).unwrap();
    let database = if postgres {
        let admin = gpu_attest_validator::store::scratch::postgres_server("validator load")
            .expect("`postgres` needs a server: set GPU_ATTEST_TEST_POSTGRES (scripts/test-postgres.sh starts one)");
        gpu_attest_validator::store::scratch::postgres_database(&admin, "load").await
    } else {
        d.join("v.db").display().to_string()
    };
    write_config(d, &database);

    // The miners: one shared one-thread CPU backend, a key and a server each.
    let backend = cpu_backend_on(1, 1);
    let mut servers = Vec::with_capacity(miners);
    for i in 0..miners {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        seed[8] = 0x4c;
        let core = Arc::new(gpu_attest_miner::MinerCore::new(
            KeyPair::from_seed(seed),
            HashSet::from([validator_key]),
            Limits::default(),
            backend.clone(),
            Duration::from_secs(60),
            NonceLog::in_memory(),
        ));
        servers.push(spawn_miner(core).await);
    }
    let urls: Vec<String> = servers.iter().map(Running::url).collect();

    // Both validators use the same key: the miners allow one validator key here.
    let validators: Vec<(Daemon, u32, String)> = (0..if postgres { 2 } else { 1 })
        .map(|i| {
            let mut child = cmd("validator")
                .args(["serve", "--listen", "127.0.0.1:0", "--no-schedule", "--config"])
                .arg(d.join("validator.toml"))
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(d.join(format!("validator-{i}.log"))).unwrap())
                .spawn()
                .unwrap();
            let mut first = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut first)
                .unwrap();
            let pid = child.id();
            let api = format!(
                "http://{}",
                first.trim().strip_prefix("listening on ").expect("listening line")
            );
            (Daemon(child), pid, api)
        })
        .collect();
    let apis: Vec<String> = validators.iter().map(|(_, _, api)| api.clone()).collect();
    let api = apis[0].clone();
    let rss_idle: Vec<u64> = validators
        .iter()
        .map(|(_, pid, _)| peak_rss(*pid).unwrap_or(0))
        .collect();

    let registering = Instant::now();
    let mut client = ValidatorClient::connect(api.clone()).await.unwrap();
    for (i, url) in urls.iter().enumerate() {
        client
            .register_miner(v1::RegisterMinerRequest {
                url: url.clone(),
                name: format!("load-{i}"),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let registered_in = registering.elapsed();

    let next = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency {
        let (api, urls, next) = (apis[worker % apis.len()].clone(), urls.clone(), next.clone());
        workers.spawn(async move {
            let mut done = Vec::new();
            let mut errors = Vec::new();
            while Instant::now() < until {
                let url = &urls[next.fetch_add(1, Ordering::Relaxed) % urls.len()];
                let at = Instant::now();
                match attest(&api, url).await {
                    Ok(v) => done.push(Attested {
                        id: v.id,
                        nonce: v.nonce,
                        passed: v.passed,
                        reasons: v.fail_reasons.into_iter().map(|r| r.code).collect(),
                        latency: at.elapsed(),
                    }),
                    Err(status) => errors.push(format!("{:?}: {}", status.code(), status.message())),
                }
            }
            (done, errors)
        });
    }
    let mut attested = Vec::new();
    let mut errors = Vec::new();
    while let Some(joined) = workers.join_next().await {
        let (done, failed) = joined.unwrap();
        attested.extend(done);
        errors.extend(failed);
    }
    let elapsed = started.elapsed();
    let rss_peak: Vec<u64> = validators
        .iter()
        .map(|(_, pid, _)| peak_rss(*pid).unwrap_or(0))
        .collect();
    drop(validators);

    // What the database holds, against what the API reported.
    let store = Store::open(Path::new(&database)).await.unwrap();
    let stored = store
        .verdicts(&VerdictFilter {
            limit: u32::MAX,
            ..Default::default()
        })
        .await
        .unwrap();
    let stored_ids: HashMap<u64, &str> = stored.iter().map(|v| (v.id, v.nonce.as_str())).collect();
    let lost = attested.iter().filter(|a| !stored_ids.contains_key(&a.id)).count();
    let mismatched = attested
        .iter()
        .filter(|a| stored_ids.get(&a.id).is_some_and(|n| *n != hex::encode(&a.nonce)))
        .count();
    let distinct_nonces: HashSet<&str> = stored.iter().map(|v| v.nonce.as_str()).collect();
    let duplicated = stored.len() - distinct_nonces.len();
    let unreported = stored.len().saturating_sub(attested.len());
    let miners_attested: HashSet<&str> = stored.iter().map(|v| v.miner_url.as_str()).collect();

    let mut latencies: Vec<Duration> = attested.iter().map(|a| a.latency).collect();
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "validator load: {miners} miners, {concurrency} concurrent API clients, {seconds} s, {}",
        if postgres {
            "two validators sharing PostgreSQL"
        } else {
            "one validator on SQLite"
        }
    );
    println!(
        "  registered {miners} miners through the API in {:.2} s",
        registered_in.as_secs_f64()
    );
    println!(
        "  verdicts: {} ({} passed) in {:.1} s = {:.1} verdicts/s; {} miners attested",
        attested.len(),
        attested.iter().filter(|a| a.passed).count(),
        elapsed.as_secs_f64(),
        attested.len() as f64 / elapsed.as_secs_f64(),
        miners_attested.len()
    );
    if !latencies.is_empty() {
        println!(
            "  latency request to verdict: p50 {:.0} ms, p95 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.95)),
            ms(percentile(&latencies, 0.99)),
            ms(percentile(&latencies, 1.0))
        );
    }
    let mib = |bytes: &[u64]| {
        bytes
            .iter()
            .map(|b| format!("{:.1}", *b as f64 / (1 << 20) as f64))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!(
        "  validator resident memory (MiB): {} after start, {} peak",
        mib(&rss_idle),
        mib(&rss_peak)
    );
    println!(
        "  database: {} verdicts stored; lost {lost}, duplicated {duplicated}, nonce mismatches {mismatched}, stored but not reported {unreported}",
        stored.len()
    );
    println!("  attestations that gave no verdict: {}", errors.len());
    for e in errors.iter().take(5) {
        println!("    {e}");
    }
    let failed = attested.iter().filter(|a| !a.passed).count();
    assert_eq!(
        (lost, duplicated, mismatched, unreported),
        (0, 0, 0, 0),
        "every reported verdict stored exactly once"
    );
    assert_eq!(
        miners_attested.len(),
        miners.min(attested.len()),
        "every miner attested"
    );
    if failed > 0 {
        let mut tally: HashMap<&str, usize> = HashMap::new();
        for reason in attested.iter().flat_map(|a| &a.reasons) {
            *tally.entry(reason.as_str()).or_default() += 1;
        }
        println!("  failed verdicts: {failed}, by reason: {tally:?}");
    }
}
