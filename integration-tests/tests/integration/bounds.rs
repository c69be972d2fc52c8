//! Every network step of an attestation has a bound, with the real binaries: a host that accepts
//! connections and never answers, one that stalls inside the TLS handshake, and a miner stopped
//! with SIGSTOP (its kernel still accepts connections for it) each end as a `timed-out` attempt
//! within `deadline.connect_ms`. The one-shot `attest` says so in one line; the scheduler backs
//! off from each, logs it, counts it, shows it in `miners list`, and goes on attesting a healthy
//! miner meanwhile, even with a single slot. (A miner frozen mid-stream is `operations.rs`'s
//! `a_miner_that_stalls_its_stream_times_out_and_the_validator_serves_on`.)

use crate::common;

use common::operated::{Started, start_logged};
use common::process::{Dir, cmd, keygen, sample, scrape, signal, tls_certs};
use gpu_attest_proto::v1::{self, validator_client::ValidatorClient};
use gpu_attest_shared::keys::PublicKey;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `deadline.connect_ms` in these tests: short, so that each stuck attempt costs a second.
const CONNECT_MS: u64 = 1_000;

/// How a fake host behaves once it has accepted a connection.
#[derive(Clone, Copy)]
enum Stuck {
    /// Reads what it is sent and never writes a byte.
    Silent,
    /// Reads the TLS ClientHello, then sends the first bytes of a ServerHello record (its header
    /// promises 80 bytes; two follow) and nothing more: a handshake stalled half-way.
    MidHandshake,
}

/// A loopback listener behaving as `stuck` on every connection, held open until the test ends;
/// its port.
fn stuck_host(stuck: Stuck) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(socket) = socket else { return };
            std::thread::spawn(move || hold(socket, stuck));
        }
    });
    port
}

fn hold(mut socket: TcpStream, stuck: Stuck) {
    let mut buffer = [0u8; 4096];
    if matches!(stuck, Stuck::MidHandshake) && socket.read(&mut buffer).is_ok_and(|n| n > 0) {
        // A handshake record (22), TLS 1.2 on the record layer, 80 bytes announced; then a
        // ServerHello's type (2) and the first byte of its length.
        let _ = socket.write_all(&[0x16, 0x03, 0x03, 0x00, 0x50, 0x02, 0x00]);
    }
    // Read until the peer goes: the connection stays open for as long as it waits.
    while socket.read(&mut buffer).is_ok_and(|n| n > 0) {}
}

/// The validator's config: small CPU challenges without the memory phase, `deadline.connect_ms`
/// of [`CONNECT_MS`], TLS towards miners, and a schedule of one slot when `schedule`.
fn write_validator_config(d: &Path, pki: &Path, schedule: bool) {
    let mut config = format!(
        "key_file = {:?}\ndatabase = {:?}\nsamples = 4\ncpu_threads = 1\n\
         [challenge]\ncpu_n = 64\niterations = 4\ncheckpoint_every = 2\ntarget_seconds = 0.2\n\
         [deadline]\nmin_ms = 2000\nconnect_ms = {CONNECT_MS}\n\
         [calibration]\nmin_miners = 1000\n\
         [memory]\nenabled = false\n\
         [[rates]]\nbackend = \"cpu\"\nops_per_sec = 2e9\n\
         [miner_tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
        d.join("v.key"),
        d.join("v.db"),
        pki.join("validator.pem"),
        pki.join("validator.key"),
        pki.join("ca.pem"),
    );
    if schedule {
        config.push_str(
            "[schedule]\ninterval_secs = 2\nconcurrency = 1\njitter = 0.1\n\
             backoff_initial_secs = 1\nbackoff_max_secs = 4\n",
        );
    }
    std::fs::write(d.join("validator.toml"), config).unwrap();
}

/// A real miner serving mutual TLS with the certificates of `tls_certs`, in its own
/// directory `home` (its key and nonce log); its `https://localhost:PORT` URL.
fn tls_miner(d: &Path, home: &str, pki: &Path, validator_key: &str) -> (Started, String) {
    let home = d.join(home);
    std::fs::create_dir_all(&home).unwrap();
    keygen("miner", &home.join("m.key"));
    std::fs::write(
        home.join("miner.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nkey_file = {:?}\nallowed_validators = [{validator_key:?}]\n\
             backend = \"cpu\"\ncpu_threads = 1\n\
             [tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
            home.join("m.key"),
            pki.join("miner-localhost.pem"),
            pki.join("miner-localhost.key"),
            pki.join("ca.pem"),
        ),
    )
    .unwrap();
    let mut serve = cmd("miner");
    serve
        .current_dir(&home)
        .args(["serve", "--config"])
        .arg(home.join("miner.toml"));
    let miner = start_logged(serve, home.join("miner.log"), false);
    let port = miner.url.rsplit(':').next().unwrap().to_string();
    (miner, format!("https://localhost:{port}"))
}

/// Runs `command` to its end, killing it if it is still running after `limit`.
fn output_within(mut command: Command, limit: Duration) -> Output {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}, killed; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_host_that_never_answers_fails_attest_in_one_line_within_the_bound() {
    let dir = Dir::fresh("bounds-one-shot");
    let d = &dir.0;
    let pki = tls_certs(d);
    keygen("validator", &d.join("v.key"));
    write_validator_config(d, &pki, false);
    let silent = stuck_host(Stuck::Silent);
    let mid_handshake = stuck_host(Stuck::MidHandshake);
    for (url, step) in [
        (format!("https://localhost:{silent}"), "TLS handshake"),
        (format!("https://localhost:{mid_handshake}"), "TLS handshake"),
        // Plaintext: the connection is up at once, and the miner never answers GetInventory.
        (format!("http://127.0.0.1:{silent}"), "GetInventory"),
    ] {
        let mut attest = cmd("validator");
        attest
            .args(["attest", "--json", "--miner", &url, "--config"])
            .arg(d.join("validator.toml"));
        // Far above the bound (two steps of CONNECT_MS), far below "for ever".
        let out = output_within(attest, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{url}: {stderr}");
        assert!(
            stderr.contains("timed out") && stderr.contains(step) && stderr.contains(&format!("{CONNECT_MS} ms")),
            "{url}: {stderr}"
        );
    }
}

fn log_mentions(log: &str, url: &str, needle: &str) -> bool {
    log.lines().any(|line| line.contains(url) && line.contains(needle))
}

#[tokio::test(flavor = "multi_thread")]
async fn stuck_hosts_cannot_hold_the_schedulers_one_slot() {
    let dir = Dir::fresh("bounds-scheduler");
    let d = &dir.0;
    let pki = tls_certs(d);
    let validator_key = keygen("validator", &d.join("v.key"));
    write_validator_config(d, &pki, true);
    let (healthy, healthy_url) = tls_miner(d, "healthy", &pki, &validator_key);
    let (frozen, frozen_url) = tls_miner(d, "frozen", &pki, &validator_key);
    let silent_url = format!("https://localhost:{}", stuck_host(Stuck::Silent));
    let stalled_url = format!("https://localhost:{}", stuck_host(Stuck::MidHandshake));

    // Registered before the validator starts (a stuck host cannot answer the registration's
    // inventory probe). The stuck hosts' keys are never checked: they are never reached.
    {
        let store = gpu_attest_validator::store::Store::open(&d.join("v.db")).await.unwrap();
        let key_of = |home: &str| {
            gpu_attest_shared::keys::KeyPair::load_file(&d.join(home).join("m.key"))
                .unwrap()
                .public_key()
        };
        let registrations = [
            (&healthy_url, key_of("healthy")),
            (&frozen_url, key_of("frozen")),
            (&silent_url, PublicKey([7; 32])),
            (&stalled_url, PublicKey([8; 32])),
        ];
        for (url, key) in registrations {
            store.register_miner(url, None, key, false, 0).await.unwrap();
        }
    }
    // SIGSTOP: the process is frozen, and its kernel still accepts connections for it.
    signal(frozen.pid(), "-STOP");

    let mut serve = cmd("validator");
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(d.join("validator.toml"));
    let validator = start_logged(serve, d.join("validator.log"), true);
    let stuck = [&frozen_url, &silent_url, &stalled_url];

    // Without bounds the first stuck host to get the one slot would keep it: the healthy miner
    // would be attested at most once. With them, each stuck attempt gives the slot back after
    // CONNECT_MS, and backs off.
    let started = Instant::now();
    let passes = |log: &str| log.matches("scheduled attestation passed").count();
    loop {
        let log = validator.log();
        let backed_off = stuck.iter().all(|url| log_mentions(&log, url, "backing off"));
        if passes(&log) >= 3 && backed_off {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "after {:?}: {} scheduled passes; log:\n{log}",
            started.elapsed(),
            passes(&log)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let log = validator.log();
    assert!(!log_mentions(&log, &healthy_url, "backing off"), "{log}");

    // `miners list` shows each stuck host in backoff, with what timed out.
    let listed = ValidatorClient::connect(validator.url.clone())
        .await
        .unwrap()
        .list_miners(v1::ListMinersRequest {})
        .await
        .unwrap()
        .into_inner()
        .miners;
    for record in &listed {
        if record.url == healthy_url {
            assert!(record.last_verdict_passed, "{record:?}");
            assert_eq!(record.failures_in_a_row, 0, "{record:?}");
        } else {
            assert!(stuck.contains(&&record.url), "{record:?}");
            assert!(record.failures_in_a_row >= 1, "{record:?}");
            assert!(
                record.last_error.contains("timed out") && record.last_error.contains("TLS handshake"),
                "{record:?}"
            );
        }
    }
    assert_eq!(listed.len(), 4);

    // Counted as their own kind of error.
    let metrics = scrape(validator.metrics.as_ref().unwrap());
    let timed_out = sample(
        &metrics,
        "gpu_attest_validator_attestation_errors_total{kind=\"timed-out\"}",
    );
    assert!(timed_out.is_some_and(|n| n >= 3.0), "{metrics}");
    signal(frozen.pid(), "-CONT");
    drop(healthy);
}
