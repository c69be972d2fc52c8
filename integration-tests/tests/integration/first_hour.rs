//! An operator's first hour, through the real binaries: certificates made by `validator
//! tls-certs` carry a miner and a validator over mutual TLS, and the validator's API over mutual
//! TLS to an operator, who attests the miner with `validator miners attest`; a miner whose
//! allow-list lacks the validator is named at once, and then in `miners list`.

use crate::common;

use common::operated::{start_logged, validator_serve};
use common::process::{Dir, cmd, keygen, tls_certs, write_small_validator_config};

#[tokio::test(flavor = "multi_thread")]
async fn the_certificates_tls_certs_makes_carry_mutual_tls_both_ways() {
    let dir = Dir::fresh("first-hour-tls");
    let d = &dir.0;
    let pki = tls_certs(d);
    // A second run never overwrites what the first made.
    let again = cmd("validator")
        .args(["tls-certs", "--miner-host", "localhost", "--out"])
        .arg(&pki)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwrites"));

    let validator_key = keygen("validator", &d.join("v.key"));
    keygen("miner", &d.join("m.key"));
    // The miner serves TLS with its certificate and requires the validator's (mutual TLS).
    std::fs::write(
        d.join("miner.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nkey_file = {:?}\nallowed_validators = [{validator_key:?}]\n\
             backend = \"cpu\"\ncpu_threads = 1\n\
             [tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
            d.join("m.key"),
            pki.join("miner-localhost.pem"),
            pki.join("miner-localhost.key"),
            pki.join("ca.pem"),
        ),
    )
    .unwrap();
    let mut serve = cmd("miner");
    serve.args(["serve", "--config"]).arg(d.join("miner.toml"));
    let miner = start_logged(serve, d.join("miner.log"), false);
    let port = miner.url.rsplit(':').next().unwrap().to_string();
    let miner_url = format!("https://localhost:{port}");

    // The validator's API requires the operator's certificate; it presents its own to miners.
    std::fs::write(
        d.join("validator.toml"),
        format!(
            "key_file = {:?}\nsamples = 4\ncpu_threads = 1\n\
             [challenge]\ncpu_n = 64\niterations = 4\ncheckpoint_every = 2\ntarget_seconds = 0.5\n\
             [deadline]\nmin_ms = 2000\n[memory]\nenabled = false\n\
             [[rates]]\nbackend = \"cpu\"\nops_per_sec = 2e9\n\
             [tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n\
             [miner_tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
            d.join("v.key"),
            pki.join("validator.pem"),
            pki.join("validator.key"),
            pki.join("ca.pem"),
            pki.join("validator.pem"),
            pki.join("validator.key"),
            pki.join("ca.pem"),
        ),
    )
    .unwrap();
    let validator = start_logged(validator_serve(d, &d.join("v.db")), d.join("validator.log"), false);
    let api = format!("https://localhost:{}", validator.url.rsplit(':').next().unwrap());
    let operator = |args: &[&str], with_cert: bool| {
        let mut command = cmd("validator");
        command
            .args(["miners", "--api", &api, "--api-ca"])
            .arg(pki.join("ca.pem"));
        if with_cert {
            command
                .arg("--api-cert")
                .arg(pki.join("operator.pem"))
                .arg("--api-key")
                .arg(pki.join("operator.key"));
        }
        command.args(args).output().unwrap()
    };

    let added = operator(&["add", &miner_url, "--name", "tls-rig", "--json"], true);
    assert!(
        added.status.success(),
        "{}\nvalidator: {}\nminer: {}",
        String::from_utf8_lossy(&added.stderr),
        validator.log(),
        miner.log()
    );
    // The miner allows this validator, and said so as it was registered: no warning.
    let registration: serde_json::Value = serde_json::from_slice(&added.stdout).unwrap();
    assert_eq!(registration["allows_this_validator"], true, "{registration}");
    assert!(!String::from_utf8_lossy(&added.stderr).contains("warning"));
    let listed = operator(&["list"], true);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("tls-rig"));
    // Without the operator's certificate the API refuses the connection.
    let refused = operator(&["list"], false);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("--api-cert and --api-key"), "{said}");
    // `--config` alone gives the address (https, since it serves TLS) and the CA that checks
    // the API's certificate: the validator's config, with the port it listens on.
    let config_text = std::fs::read_to_string(d.join("validator.toml")).unwrap();
    let listening = format!("listen = \"127.0.0.1:{}\"\n", validator.url.rsplit(':').next().unwrap());
    std::fs::write(d.join("operator-view.toml"), listening + &config_text).unwrap();
    let by_config = cmd("validator")
        .args(["miners", "--config"])
        .arg(d.join("operator-view.toml"))
        .arg("--api-cert")
        .arg(pki.join("operator.pem"))
        .arg("--api-key")
        .arg(pki.join("operator.key"))
        .arg("list")
        .output()
        .unwrap();
    assert!(
        by_config.status.success() && String::from_utf8_lossy(&by_config.stdout).contains("tls-rig"),
        "{}",
        String::from_utf8_lossy(&by_config.stderr)
    );
    // Plaintext to the TLS API: the error says to use https://.
    let plaintext = cmd("validator")
        .args(["miners", "--api", &api.replacen("https://", "http://", 1), "list"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&plaintext.stderr);
    assert!(!plaintext.status.success() && said.contains("use https://"), "{said}");

    // `miners attest`: the validator attests the miner over mutual TLS, with these
    // certificates alone, and the operator sees the phases and the verdict.
    let attested = operator(&["attest", &miner_url], true);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&attested.stdout),
        String::from_utf8_lossy(&attested.stderr),
    );
    assert_eq!(
        attested.status.code(),
        Some(0),
        "{stdout}\n{stderr}\n{}",
        validator.log()
    );
    assert!(stdout.contains("PASS") && stdout.contains(&miner_url), "{stdout}");
    assert!(
        stderr.contains("challenge-sent") && stderr.contains("verifying"),
        "{stderr}"
    );

    // `miners list` shows where the miner stands.
    let listed = operator(&["list"], true);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.contains("last verdict #1 PASS 20") && text.contains("; last pass 20"),
        "{text}"
    );

    // Revocations can be listed, with their reasons.
    let none = operator(&["revoked"], true);
    assert_eq!(String::from_utf8_lossy(&none.stdout).trim(), "no miner key is revoked");
    let listed = operator(&["list", "--json"], true);
    let miners: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let key = miners[0]["miner_key"].as_str().unwrap().to_string();
    let revoked = operator(&["revoke", &key, "--reason", "retired rig"], true);
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    let listed = operator(&["revoked"], true);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.starts_with(&key) && text.contains("retired rig"), "{text}");
    assert!(text.contains(" revoked 20"), "the time it was revoked, in UTC: {text}");
    let listed = operator(&["list"], true);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("REVOKED"));
}

/// A miner that would refuse this validator: `miners add` says so at once (the registration
/// stands, so that adding the key on the miner's side is all that is left), and once the
/// scheduler has tried it, `miners list` shows the refusal and the backoff.
#[tokio::test(flavor = "multi_thread")]
async fn a_miner_that_refuses_this_validator_is_named_at_once_and_in_the_list() {
    let dir = Dir::fresh("first-hour-refusing");
    let d = &dir.0;
    write_small_validator_config(d);
    // A first scheduled attempt within two seconds of registering, not within ten minutes.
    let mut config = std::fs::read_to_string(d.join("validator.toml")).unwrap();
    config.push_str("[schedule]\ninterval_secs = 2\n");
    std::fs::write(d.join("validator.toml"), config).unwrap();
    keygen("validator", &d.join("v.key"));
    let someone_else = keygen("validator", &d.join("other.key"));
    keygen("miner", &d.join("m.key"));
    std::fs::write(
        d.join("miner.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nkey_file = {:?}\nallowed_validators = [{someone_else:?}]\n\
             backend = \"cpu\"\ncpu_threads = 1\n",
            d.join("m.key"),
        ),
    )
    .unwrap();
    let mut serve = cmd("miner");
    serve.args(["serve", "--config"]).arg(d.join("miner.toml"));
    let miner = start_logged(serve, d.join("miner.log"), false);
    // Scheduled, so that the refusal reaches the miner's standing.
    let mut serve = cmd("validator");
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(d.join("validator.toml"));
    let validator = start_logged(serve, d.join("validator.log"), false);
    let operator = |args: &[&str]| {
        cmd("validator")
            .args(["miners", "--api", &validator.url])
            .args(args)
            .output()
            .unwrap()
    };

    let added = operator(&["add", &miner.url, "--name", "stranger"]);
    let stderr = String::from_utf8_lossy(&added.stderr);
    assert_eq!(added.status.code(), Some(0), "{stderr}\n{}", validator.log());
    assert!(
        stderr.contains("warning:")
            && stderr.contains("does not allow this validator")
            && stderr.contains("allowed_validators"),
        "{stderr}"
    );
    let again = operator(&["add", &miner.url, "--json"]);
    let registration: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(registration["allows_this_validator"], false, "{registration}");
    assert!(
        validator.log().contains("does not allow this validator"),
        "the daemon's log says it too: {}",
        validator.log()
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let listed = loop {
        let listed = String::from_utf8_lossy(&operator(&["list"]).stdout).to_string();
        if listed.contains("backing off") {
            break listed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the scheduler's refusal never reached `miners list`: {listed}\n{}",
            validator.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    assert!(
        listed.contains("stranger") && listed.contains("not attested yet") && listed.contains("next attestation due"),
        "{listed}"
    );
    assert!(
        listed.to_lowercase().contains("allow"),
        "the latest error names the allow-list: {listed}"
    );

    // Removing it is logged, for whoever reads the daemon's log later.
    let removed = operator(&["remove", &miner.url]);
    assert_eq!(String::from_utf8_lossy(&removed.stdout).trim(), "removed");
    assert!(validator.log().contains("miner removed"), "{}", validator.log());
}

/// A TLS key that is not its certificate's stops the daemon before it says it listens, naming
/// both files; a key every user may read is logged as a warning.
#[test]
fn a_tls_key_that_is_not_the_certificates_is_refused_before_listening() {
    use std::os::unix::fs::PermissionsExt;
    let dir = Dir::fresh("tls-key-mismatch");
    let d = &dir.0;
    let pki = tls_certs(d);
    keygen("miner", &d.join("m.key"));
    let write_config = |key: &str| {
        std::fs::write(
            d.join("miner.toml"),
            format!(
                "listen = \"127.0.0.1:0\"\nkey_file = {:?}\nbackend = \"cpu\"\ncpu_threads = 1\n\
                 [tls]\ncert = {:?}\nkey = {:?}\n",
                d.join("m.key"),
                pki.join("miner-localhost.pem"),
                pki.join(key),
            ),
        )
        .unwrap();
    };
    write_config("validator.key");
    let out = cmd("miner")
        .args(["serve", "--config"])
        .arg(d.join("miner.toml"))
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(!stdout.contains("listening on"), "announced before checking: {stdout}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("is not the key of the certificate")
            && last.contains("validator.key")
            && last.contains("miner-localhost.pem"),
        "{stderr}"
    );

    // The right key, readable by everyone: it serves, and says what to fix.
    write_config("miner-localhost.key");
    std::fs::set_permissions(pki.join("miner-localhost.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut serve = cmd("miner");
    serve.args(["serve", "--config"]).arg(d.join("miner.toml"));
    let miner = start_logged(serve, d.join("miner.log"), false);
    let log = miner.log();
    assert!(
        log.contains("readable by every user") && log.contains("chmod o-r"),
        "{log}"
    );
}
