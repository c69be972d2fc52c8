//! The real `miner` and `validator` binaries, as a user runs them: keys, a miner on a port-0
//! listener, one-shot attestation with a verdict, the three ways an attestation cannot happen
//! (each one line on stderr, exit 2, nothing written to the database), and graceful shutdown.

use crate::common;

use common::process::{
    Dir, assert_one_line_failure, attest, cmd, keygen, serve_miner, start, start_logging, verdict_count,
    write_small_validator_config,
};
use std::path::Path;
use std::process::{Command, Output};

fn assert_one_line_error(out: &Output, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains(needle), "{stderr}");
}

#[test]
fn attest_a_real_miner_then_fail_cleanly_on_bad_targets() {
    let dir = Dir::fresh("binaries");
    let d = &dir.0;
    let validator_key = keygen("validator", &d.join("v.key"));
    keygen("miner", &d.join("m.key"));
    write_small_validator_config(d);

    let (mut miner, miner_url) = start(serve_miner(d, &validator_key));

    let out = attest(d, &miner_url);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdict["passed"], true, "{verdict}");
    assert_eq!(verdict["miner_url"], miner_url.as_str());
    assert_eq!(verdict_count(d), 1);

    // A miner that is down.
    assert_one_line_error(&attest(d, "http://127.0.0.1:1"), "cannot reach miner");
    // Something that is not a miner: a validator's API.
    let mut serve_validator = cmd("validator");
    serve_validator
        .args(["serve", "--listen", "127.0.0.1:0", "--no-schedule", "--key-file"])
        .arg(d.join("v.key"))
        .arg("--database")
        .arg(d.join("other.db"));
    let (_validator, validator_url) = start(serve_validator);
    assert_one_line_error(&attest(d, &validator_url), "not a gpu-attest miner");
    // A miner that refuses this validator: a second miner, so with a directory (and so a nonce
    // log beside its key) of its own.
    let strict_dir = d.join("strict");
    std::fs::create_dir(&strict_dir).unwrap();
    keygen("miner", &strict_dir.join("m2.key"));
    let mut strict = cmd("miner");
    strict
        .current_dir(d)
        .args(["serve", "--listen", "127.0.0.1:0", "--key-file"])
        .arg(strict_dir.join("m2.key"));
    let (_strict, strict_url) = start(strict);
    assert_one_line_error(&attest(d, &strict_url), "refused the challenge");
    // None of them left anything in the database.
    assert_eq!(verdict_count(d), 1);

    // SIGTERM: the miner finishes in-flight calls and exits cleanly.
    #[cfg(unix)]
    {
        let pid = miner.0.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = miner.0.wait().unwrap();
        assert!(status.success(), "miner exited with {status} on SIGTERM");
    }
}

/// The transcript path as an operator walks it with the binaries: a verdict kept with its
/// transcript, `verdicts export` writing it (never over a file), `audit` confirming it (exit 0),
/// a changed byte failing it (exit 1), and what is not a transcript refused (exit 2).
#[test]
fn a_verdicts_transcript_is_exported_and_audited_with_the_binaries() {
    let dir = Dir::fresh("transcripts");
    let d = &dir.0;
    let validator_key = keygen("validator", &d.join("v.key"));
    keygen("miner", &d.join("m.key"));
    write_small_validator_config(d);
    let config = d.join("validator.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[transcripts]\nkeep = \"all\"\n");
    std::fs::write(&config, text).unwrap();
    let (_miner, miner_url) = start(serve_miner(d, &validator_key));
    let out = attest(d, &miner_url);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = verdict["id"].as_u64().unwrap().to_string();
    let size = verdict["transcript_bytes"]
        .as_u64()
        .expect("the verdict says its transcript is kept");

    let export = |id: &str, out: &Path| {
        cmd("validator")
            .args(["verdicts", "--database"])
            .arg(d.join("v.db"))
            .args(["export", id, "--out"])
            .arg(out)
            .output()
            .unwrap()
    };
    let file = d.join("verdict.transcript");
    let exported = export(&id, &file);
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), size);
    assert_one_line_error(&export(&id, &file), "already exists");
    assert_one_line_error(&export("999", &d.join("none")), "no verdict 999");

    let audit = |path: &Path, key: Option<&str>| {
        let mut command = cmd("validator");
        command.arg("audit").arg(path);
        if let Some(key) = key {
            command.args(["--validator-key", key]);
        }
        command.output().unwrap()
    };
    let printed = |out: &Output| String::from_utf8_lossy(&out.stdout).into_owned();
    let confirmed = audit(&file, Some(validator_key.as_str()));
    let report = printed(&confirmed);
    assert_eq!(confirmed.status.code(), Some(0), "{report}");
    assert!(
        report.contains("CONFIRMED: the verdict follows from the transcript"),
        "{report}"
    );

    // One byte changed, past the file's first fields: the signature fails; exit 1.
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    let changed = d.join("changed.transcript");
    std::fs::write(&changed, &bytes).unwrap();
    let differs = audit(&changed, None);
    let report = printed(&differs);
    assert_eq!(
        differs.status.code(),
        Some(1),
        "{report}{}",
        String::from_utf8_lossy(&differs.stderr)
    );
    assert!(report.contains("DIFFERS"), "{report}");

    // The miner holds the transcript against its own record of what it answered
    // (`answers/` beside its key): every message matches; the changed file does not.
    let check = |path: &Path| {
        cmd("miner")
            .arg("check-transcript")
            .arg(path)
            .arg("--key-file")
            .arg(d.join("m.key"))
            .output()
            .unwrap()
    };
    let matches = check(&file);
    let said = printed(&matches);
    assert_eq!(
        matches.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&matches.stderr)
    );
    assert!(said.contains("MATCHES this miner's record"), "{said}");
    assert!(said.contains("matches: the commitment, sent at"), "{said}");
    assert!(
        said.contains("opening(s), each the one this miner sent in its place"),
        "{said}"
    );
    assert_eq!(check(&changed).status.code(), Some(1));
    // A validator that says the stream ended early, signed with its own key: this miner's record
    // holds the openings it sent after.
    let validator = gpu_attest_shared::keys::KeyPair::load_file(&d.join("v.key")).unwrap();
    let mut cut = gpu_attest_proto::transcript::open(&std::fs::read(&file).unwrap())
        .unwrap()
        .transcript;
    let openings = &mut cut.open.as_mut().unwrap().openings;
    assert!(openings.len() >= 3, "{}", openings.len());
    openings.truncate(openings.len() - 2);
    openings.push(gpu_attest_proto::v1::RecordedOpening {
        received: Some(gpu_attest_proto::v1::recorded_opening::Received::Ended(true)),
        ..Default::default()
    });
    let ended = d.join("ended.transcript");
    std::fs::write(&ended, gpu_attest_proto::transcript::seal(&cut, &validator)).unwrap();
    let short = check(&ended);
    let said = printed(&short);
    assert_eq!(short.status.code(), Some(1), "{said}");
    assert!(
        said.contains(
            "DIFFERS: this miner sent 2 opening(s) the transcript does not hold, where it records the stream ending"
        ),
        "{said}"
    );
    // A record that lacks the commitment: the validator's transcript holds one this miner has
    // no record of sending.
    let nonce = verdict["nonce"].as_str().unwrap();
    let record = d.join("answers").join(format!("{nonce}.jsonl"));
    let lines = std::fs::read_to_string(&record).unwrap();
    let kept: Vec<&str> = lines.lines().filter(|l| !l.contains("\"commitment\"")).collect();
    assert!(kept.len() < lines.lines().count(), "{lines}");
    std::fs::write(&record, kept.join("\n")).unwrap();
    let differs = check(&file);
    let said = printed(&differs);
    assert_eq!(differs.status.code(), Some(1), "{said}");
    assert!(
        said.contains("DIFFERS: the transcript's commitment is not one this miner sent"),
        "{said}"
    );

    // Not a transcript, and not a key.
    let junk = d.join("junk");
    std::fs::write(&junk, b"not a transcript").unwrap();
    assert_one_line_error(&audit(&junk, None), "not a gpu-attest transcript");
    assert_one_line_error(&audit(&file, Some("beef")), "--validator-key");
}

/// A miner whose answer log cannot be written still serves and attests: the record is the
/// operator's evidence, not the miner's work.
#[test]
fn a_miner_whose_answer_log_cannot_be_written_still_serves() {
    let dir = Dir::fresh("answers-unwritable");
    let d = &dir.0;
    let validator_key = keygen("validator", &d.join("v.key"));
    keygen("miner", &d.join("m.key"));
    write_small_validator_config(d);
    // Under a regular file, so that no directory can be made there.
    std::fs::write(d.join("a-file"), b"").unwrap();
    std::fs::write(d.join("miner.toml"), "[answers]\ndir = \"a-file/answers\"\n").unwrap();
    let mut serve = serve_miner(d, &validator_key);
    serve.arg("--config").arg(d.join("miner.toml"));
    let (_miner, miner_url) = start(serve);
    assert_eq!(attest(d, &miner_url).status.code(), Some(0));
}

/// A daemon started without its key says so in one line: the file, its cause once (most errors
/// carry their cause in their own message, and the chain used to repeat it at every level),
/// and the command that makes a key.
#[test]
fn a_missing_or_exposed_key_file_is_named_with_its_cause_and_remedy() {
    let dir = Dir::fresh("missing-key");
    let key = dir.0.join("absent.key");
    // Each daemon refuses to serve with the key file as it is; its one-line error.
    let refusals = || {
        [("miner", &["--backend", "cpu"][..]), ("validator", &[][..])].map(|(bin, extra)| {
            let out = cmd(bin)
                .current_dir(&dir.0)
                .args(["serve", "--listen", "127.0.0.1:0"])
                .args(extra)
                .arg("--key-file")
                .arg(&key)
                .output()
                .unwrap();
            assert!(!out.status.success(), "{bin} started with that key file");
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            (bin, stderr.lines().last().unwrap_or_default().to_string())
        })
    };
    for (bin, error) in refusals() {
        assert!(
            error.starts_with("error: key file ") && error.contains(&format!("; run `{bin} keygen --key-file")),
            "{error}"
        );
        assert_eq!(error.matches("No such file or directory").count(), 1, "{error}");
    }
    // A key file others may read is fixed with chmod; keygen, which never overwrites, is no
    // advice for it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(&key, format!("{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    for (_, error) in refusals() {
        assert!(error.contains("chmod 600") && !error.contains("keygen"), "{error}");
    }
}

/// `validator miners ...` against a running validator.
fn miners(api: &str, args: &[&str]) -> Output {
    cmd("validator")
        .args(["miners", "--api", api])
        .args(args)
        .output()
        .unwrap()
}

/// The first line a command that runs until stopped (`--follow`) prints, within 20 s; the
/// command is killed then.
fn first_line_of_follow(mut command: Command) -> String {
    use std::io::BufRead;
    let mut child = common::process::Daemon(
        command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("a followed verdict within 20 s")
}

fn stdout_of(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn an_operator_manages_the_miners_of_a_running_validator() {
    let dir = Dir::fresh("operator");
    let d = &dir.0;
    let validator_key = keygen("validator", &d.join("v.key"));
    let miner_key = keygen("miner", &d.join("m.key"));
    let (_miner, miner_url) = start(serve_miner(d, &validator_key));
    let mut serve_validator = cmd("validator");
    serve_validator
        .args(["serve", "--listen", "127.0.0.1:0", "--no-schedule", "--key-file"])
        .arg(d.join("v.key"))
        .arg("--database")
        .arg(d.join("v.db"));
    let (_validator, api) = start(serve_validator);

    // Registered through the API: the validator fetched the miner's key itself.
    let added: serde_json::Value = serde_json::from_str(&stdout_of(&miners(
        &api,
        &["add", &miner_url, "--name", "rig-1", "--json"],
    )))
    .unwrap();
    assert_eq!(added["url"], miner_url.as_str());
    assert_eq!(added["name"], "rig-1");
    assert_eq!(added["miner_key"], miner_key.as_str());
    let listed: Vec<serde_json::Value> = serde_json::from_str(&stdout_of(&miners(&api, &["list", "--json"]))).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["miner_key"], miner_key.as_str());
    assert!(stdout_of(&miners(&api, &["list"])).contains("rig-1"));
    assert_eq!(added["change"]["kind"], "new");
    // Added again: without a name it keeps its name and says nothing changed; with one, it
    // says it renamed it.
    let again = stdout_of(&miners(&api, &["add", &miner_url]));
    assert!(
        again.contains("nothing changed") && again.contains("(rig-1)"),
        "{again}"
    );
    let renamed = stdout_of(&miners(&api, &["add", &miner_url, "--name", "rig-2"]));
    assert_eq!(
        renamed.trim(),
        format!("renamed {miner_url} from \"rig-1\" to \"rig-2\"")
    );

    // A verdict stored in the running validator's database is listed through its API.
    write_small_validator_config(d);
    assert_eq!(attest(d, &miner_url).status.code(), Some(0));
    let listed: Vec<serde_json::Value> =
        serde_json::from_str(&stdout_of(&miners(&api, &["verdicts", "--json"]))).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["passed"], true);
    assert!(
        listed[0]["throughput"]["proven_ops_per_sec"].as_f64().unwrap() > 0.0,
        "{}",
        listed[0]
    );
    // One schema (PROTOCOL.md 16.1): the API's listing is the database's, field for field.
    let from_database = cmd("validator")
        .args(["verdicts", "--json", "--database"])
        .arg(d.join("v.db"))
        .output()
        .unwrap();
    let from_database: Vec<serde_json::Value> = serde_json::from_str(&stdout_of(&from_database)).unwrap();
    assert_eq!(listed, from_database);
    assert_eq!(
        stdout_of(&miners(&api, &["verdicts", "--failed"])).trim(),
        "no verdicts"
    );
    assert!(stdout_of(&miners(&api, &["verdicts", "--miner", &miner_url])).contains("PASS"));
    // A pass keeps no transcript by default: asked for through the API, the one line says what
    // keeps them.
    let id = listed[0]["id"].as_u64().unwrap().to_string();
    assert_one_line_error(
        &miners(&api, &["transcript", &id, "--out", &d.join("t").display().to_string()]),
        "has no kept transcript",
    );
    // Followed from the start, through the API and from the database file: the same verdict,
    // as one JSON line each.
    let mut through_api = cmd("validator");
    through_api.args([
        "miners", "--api", &api, "verdicts", "--follow", "--after", "0", "--json",
    ]);
    let followed_through_api: serde_json::Value = serde_json::from_str(&first_line_of_follow(through_api)).unwrap();
    assert_eq!(followed_through_api, listed[0]);
    let mut from_file = cmd("validator");
    from_file
        .args(["verdicts", "--follow", "--after", "0", "--json", "--database"])
        .arg(d.join("v.db"));
    let followed: serde_json::Value = serde_json::from_str(&first_line_of_follow(from_file)).unwrap();
    assert_eq!(followed, listed[0]);

    // The rate table through the API is the one `validator rates show` reads from the file
    // (both with the default config), the class just attested among it.
    let rates_through_api: serde_json::Value =
        serde_json::from_str(&stdout_of(&miners(&api, &["rates", "--json"]))).unwrap();
    let rates_from_file = cmd("validator")
        .args(["rates", "--database"])
        .arg(d.join("v.db"))
        .args(["show", "--json"])
        .output()
        .unwrap();
    let rates_from_file: serde_json::Value = serde_json::from_str(&stdout_of(&rates_from_file)).unwrap();
    assert_eq!(rates_through_api, rates_from_file);
    assert_eq!(rates_through_api["classes"][0]["backend"], "cpu", "{rates_through_api}");
    assert!(stdout_of(&miners(&api, &["rates"])).contains("observed classes"));

    // Revoked once, then told it already was; the key can no longer be registered.
    let revoke = ["revoke", &miner_key, "--reason", "test"];
    assert_eq!(stdout_of(&miners(&api, &revoke)).trim(), "revoked");
    assert_eq!(stdout_of(&miners(&api, &revoke)).trim(), "was already revoked");
    assert_one_line_error(&miners(&api, &["add", &miner_url]), "revoked");
    // Removed: nothing is registered any more.
    assert_eq!(stdout_of(&miners(&api, &["remove", &miner_url])).trim(), "removed");
    assert_eq!(stdout_of(&miners(&api, &["list"])).trim(), "no miners registered");
    assert_eq!(
        stdout_of(&miners(&api, &["remove", &miner_url])).trim(),
        "was not registered"
    );

    // Bad input and a validator that is not running: one line each, exit 2.
    assert_one_line_error(&miners(&api, &["revoke", "abcd", "--reason", "x"]), "64 hex digits");
    // A miner the validator cannot reach: the validator's words, not a hint about this
    // command's own connection (which worked).
    let unreachable = miners(&api, &["add", "http://127.0.0.1:1"]);
    assert_one_line_error(&unreachable, "cannot reach miner");
    assert!(!String::from_utf8_lossy(&unreachable.stderr).contains("--api-ca"));
    assert_one_line_error(
        &miners("http://127.0.0.1:1", &["list"]),
        "is `validator serve` running there?",
    );
}

fn rates(db: &Path, args: &[&str]) -> Output {
    cmd("validator")
        .args(["rates", "--database"])
        .arg(db)
        .args(args)
        .output()
        .unwrap()
}

fn rate_table(db: &Path) -> serde_json::Value {
    let out = rates(db, &["show", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_rate_table_is_imported_shown_and_exported() {
    let dir = Dir::fresh("rates");
    let db = dir.0.join("v.db");
    assert_one_line_error(&rates(&db, &[]), "no database");

    // Another validator's export: one observed class.
    let file = dir.0.join("fleet.toml");
    let row = |unit: &str| {
        format!(
            "format = 1\n[[class]]\nbackend = \"cuda\"\nkernel = \"tensor\"\nmodel = \"NVIDIA H100 80GB HBM3\"\n\
             n = 2048\nunit = \"{unit}\"\nops_per_sec = 1.1e15\nminers = 5\nobservations = 40\n"
        )
    };
    std::fs::write(&file, row("device")).unwrap();
    let out = rates(&db, &["import", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("imported 1 classes"));

    let table = rate_table(&db);
    let class = &table["classes"][0];
    assert_eq!(class["source"], "shared");
    assert_eq!(class["model"], "nvidia h100 80gb hbm3", "class names are normalised");
    assert_eq!(class["ops_per_sec"], 1.1e15);
    assert_eq!(class["miners"], 5);
    let shipped = table["shipped"].as_array().unwrap();
    assert!(
        shipped
            .iter()
            .any(|r| r["model"] == "H100" && r["peak_ops_per_sec"] == 1.979e15)
    );
    let human = String::from_utf8_lossy(&rates(&db, &[]).stdout).to_string();
    assert!(human.contains("shared") && human.contains("shipped table"), "{human}");

    // An export carries only the classes this validator calibrated itself: an imported row is
    // another validator's word, for that validator to share.
    let out = rates(&db, &["export"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let exported = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        exported.contains("format = 1") && !exported.contains("h100"),
        "{exported}"
    );

    // A file with a bad row is refused whole, in one line, and changes nothing.
    std::fs::write(&file, row("core")).unwrap();
    assert_one_line_error(&rates(&db, &["import", file.to_str().unwrap()]), "per device");
    assert_eq!(rate_table(&db)["classes"][0]["ops_per_sec"], 1.1e15);
}

fn miner_json(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let out = cmd("miner").args(args).envs(env.iter().copied()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `miner bench --json` on the CPU at n = 64 for a moment, on `kernel` forced by the
/// environment.
fn tiny_cpu_bench(kernel: &str) -> serde_json::Value {
    miner_json(
        &[
            "bench",
            "--backend",
            "cpu",
            "--sizes",
            "64",
            "--seconds",
            "0.05",
            "--memory-mib",
            "8",
            "--json",
        ],
        &[("GPU_ATTEST_CPU_KERNEL", kernel)],
    )
}

#[test]
fn the_cpu_kernel_is_chosen_by_setting_or_environment_and_reported() {
    // `miner info` names every kernel and whether it runs here; the one selected runs here.
    let info = miner_json(&["info", "--backend", "cpu", "--json"], &[]);
    let kernels = info["cpu_kernels"].as_array().unwrap();
    let names: Vec<&str> = kernels.iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["amx", "avx512-vnni", "avx-vnni", "avx2", "portable"]);
    let runs_here = |name: &str| kernels.iter().any(|k| k["name"] == name && k["available"] == true);
    let selected = info["kernel"].as_str().unwrap();
    assert!(
        runs_here(selected),
        "selected {selected}, which does not run here: {info}"
    );
    let fastest = names.iter().find(|&&k| runs_here(k)).unwrap();
    assert_eq!(selected, *fastest, "the default is the fastest kernel that runs here");

    // The environment variable forces a kernel for every command, bench included.
    let forced = miner_json(
        &["info", "--backend", "cpu", "--json"],
        &[("GPU_ATTEST_CPU_KERNEL", "portable")],
    );
    assert_eq!(forced["kernel"], "portable");
    let bench = tiny_cpu_bench("portable");
    let rows = bench["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{bench}");
    assert_eq!(rows[0]["kernel"], "portable");
    assert!(rows[0]["tops"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[0]["k_block"], 64, "one pass over k at n = 64");
    // The report gives the register-only ceiling of the fastest kernel this CPU runs (its
    // limit) and of each kernel timed, and reads a row against its own kernel's; the portable
    // kernel has none.
    let ceilings = bench["ceilings"].as_array().unwrap();
    let measured: Vec<&str> = ceilings.iter().map(|c| c["kernel"].as_str().unwrap()).collect();
    let limit: Vec<&str> = [*fastest].into_iter().filter(|&k| k != "portable").collect();
    assert_eq!(measured, limit, "{bench}");
    assert!(
        ceilings
            .iter()
            .all(|c| c["tops"].as_f64().unwrap() > 0.0 && !c["instructions"].as_str().unwrap().is_empty()),
        "{bench}"
    );
    assert!(rows[0]["share_of_ceiling"].is_null(), "{bench}");
    // The memory phase's figures: the buffers asked for, each rate measured, the walk read
    // against both bandwidths.
    let memory = &bench["memory"];
    assert_eq!(memory["bytes"], 8 << 20, "{bench}");
    for rate in [
        "read_bytes_per_sec",
        "copy_bytes_per_sec",
        "walk_bytes_per_sec",
        "fill_entries_per_sec",
        "walk_v4_bytes_per_sec",
    ] {
        assert!(memory[rate].as_f64().unwrap() > 0.0, "{rate}: {bench}");
    }
    let walk_v4 = memory["walk_v4_bytes_per_sec"].as_f64().unwrap();
    assert!(
        (memory["walk_v4_share_of_read"].as_f64().unwrap() - walk_v4 / memory["read_bytes_per_sec"].as_f64().unwrap())
            .abs()
            < 1e-9,
        "{bench}"
    );
    let walk = memory["walk_bytes_per_sec"].as_f64().unwrap();
    let share = memory["walk_share_of_read"].as_f64().unwrap();
    assert!(
        (share - walk / memory["read_bytes_per_sec"].as_f64().unwrap()).abs() < 1e-9,
        "{bench}"
    );
    if *fastest != "portable" {
        let own = tiny_cpu_bench(fastest);
        let ceiling = own["ceilings"][0]["tops"].as_f64().unwrap();
        let row = &own["rows"][0];
        let share = row["share_of_ceiling"].as_f64().unwrap();
        assert!((share - row["tops"].as_f64().unwrap() / ceiling).abs() < 1e-9, "{own}");
    }

    // The k-block knob reaches the engine and the report; a bad value is refused, not ignored.
    let blocked = miner_json(
        &[
            "bench",
            "--backend",
            "cpu",
            "--sizes",
            "256",
            "--seconds",
            "0.05",
            "--memory-mib",
            "0",
            "--json",
        ],
        &[("GPU_ATTEST_CPU_KERNEL", "portable"), ("GPU_ATTEST_CPU_K_BLOCK", "128")],
    );
    assert_eq!(blocked["rows"][0]["k_block"], 128, "{blocked}");
    // `miner bench` with one tuning variable set to `value` fails in one line saying `why`.
    let refused = |variable: &str, value: &str, why: &str| {
        let out = cmd("miner")
            .args(["bench", "--backend", "cpu", "--sizes", "64", "--seconds", "0.05"])
            .env("GPU_ATTEST_CPU_KERNEL", "portable")
            .env(variable, value)
            .output()
            .unwrap();
        assert_one_line_failure(&out, &format!("{variable}=\"{value}\": {why}"));
    };
    refused(
        "GPU_ATTEST_CPU_K_BLOCK",
        "100",
        "the k block is a positive multiple of 64",
    );
    // So does the cache-hint knob: the portable kernel takes no hints, so they read off there,
    // and a value that is neither auto nor off is refused.
    assert_eq!(rows[0]["cache_hints"], false, "{bench}");
    refused(
        "GPU_ATTEST_CPU_CACHE_HINTS",
        "nta",
        "the cache hints are \"auto\" (on) or \"off\"",
    );

    // A name that is no kernel, from the environment or a config file, is one line naming it
    // and the kernels there are.
    let out = cmd("miner")
        .args(["info", "--backend", "cpu"])
        .env("GPU_ATTEST_CPU_KERNEL", "sse9")
        .output()
        .unwrap();
    // The variable is read by the command line parser, whose usage errors add a hint line.
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: ") && first.contains("sse9") && first.contains("avx2, portable"),
        "{stderr}"
    );
    let dir = Dir::fresh("cpu-kernel-config");
    let config = dir.0.join("miner.toml");
    std::fs::write(&config, "cpu_kernel = \"neon9\"\n").unwrap();
    let out = cmd("miner")
        .args(["info", "--backend", "cpu", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_one_line_failure(&out, "line 1, column 14: unknown CPU kernel \"neon9\"");

    // A kernel this CPU lacks is refused with the reason, never run.
    if let Some(missing) = kernels.iter().find(|k| k["available"] == false) {
        let name = missing["name"].as_str().unwrap();
        let out = cmd("miner")
            .args(["info", "--backend", "cpu", "--cpu-kernel", name])
            .output()
            .unwrap();
        assert_one_line_failure(&out, &format!("the {name} CPU kernel is not available on this machine"));
    } else {
        println!("every CPU kernel runs on this machine: the refusal of a missing one is not exercised here");
    }
}

/// On a machine without a GPU, `miner selftest` checks every CPU kernel against PROTOCOL.md's
/// vector and a mid-sized challenge, says why there is no GPU, and passes.
#[test]
fn selftest_without_a_gpu_checks_the_cpu_kernels_and_says_so() {
    if gpu_attest_kernels::detect::detect().is_ok() {
        gpu_attest_shared::prerequisite::skip(
            "selftest_without_a_gpu_checks_the_cpu_kernels_and_says_so",
            "this host has a GPU, so `selftest` checks it (see the GPU tests)",
        );
        return;
    }
    let out = cmd("miner").args(["selftest", "--mid-n", "128"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.lines().next().unwrap().starts_with("no GPU: "), "{stdout}");
    assert!(stdout.contains("cpu kernel portable: passed"), "{stdout}");
    assert!(
        stdout.contains("vector (n = 64, 5 chains, 4 steps) and mid-sized (n = 128, 2 chains, 4 steps)"),
        "{stdout}"
    );
    let out = cmd("miner").args(["selftest", "--mid-n", "100"]).output().unwrap();
    assert_one_line_failure(&out, "--mid-n 100 is not a valid challenge size");
    // Asked to check the GPU it does not have, it fails, as `serve --backend cuda` would.
    let out = cmd("miner")
        .args(["selftest", "--mid-n", "128", "--backend", "cuda"])
        .output()
        .unwrap();
    assert_one_line_failure(&out, "--backend cuda was asked for, but no GPU kernel could be checked");
}

/// The example configs the systemd units point at (deploy/systemd/) are ones the daemons load.
#[test]
fn the_service_example_configs_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("deploy/systemd");
    for (bin, file, key) in [
        ("miner", "miner.example.toml", "/var/lib/gpu-attest-miner/miner.key"),
        (
            "validator",
            "validator.example.toml",
            "/var/lib/gpu-attest-validator/validator.db",
        ),
    ] {
        let out = cmd(bin)
            .args(["serve", "--print-config", "--config"])
            .arg(root.join(file))
            .output()
            .unwrap();
        assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains(key), "{file}");
        let unit = std::fs::read_to_string(root.join(format!("gpu-attest-{bin}.service"))).unwrap();
        assert!(
            unit.contains(&format!(
                "GPU_ATTEST_{}_CONFIG=/etc/gpu-attest/{bin}.toml",
                bin.to_uppercase()
            )),
            "the {bin} unit names its config"
        );
    }
}

/// The container images' configs (deploy/container/, baked into the images and mounted by the
/// compose file) are ones the daemons load, with the health probe the images' HEALTHCHECK asks
/// and the secrets' paths the compose file mounts.
#[test]
fn the_container_configs_load_with_their_health_probe() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("deploy/container");
    let compose = std::fs::read_to_string(root.join("compose.yaml")).unwrap();
    for (bin, probe, secret) in [
        ("miner", "127.0.0.1:7072", "/run/secrets/miner_key"),
        ("validator", "127.0.0.1:7073", "/run/secrets/validator_key"),
    ] {
        let out = cmd(bin)
            .args(["serve", "--print-config", "--config"])
            .arg(root.join(format!("{bin}.toml")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{bin}.toml: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            printed.contains(&format!("listen = \"{probe}\"")),
            "{bin}.toml: {printed}"
        );
        assert!(printed.contains(secret), "{bin}.toml names {secret}");
        let name = secret.rsplit('/').next().unwrap();
        assert!(
            compose.contains(&format!("{name}:")),
            "compose.yaml has the secret {name}"
        );
        assert!(
            compose.contains(&format!("test: gpu-attest-{bin} health")),
            "compose.yaml checks the {bin}'s health with its command"
        );
    }
}

/// `health` without a probe address to ask says where to set one, in one line, and a probe
/// nobody serves is an answer (unhealthy, status 1), not an error.
#[test]
fn the_health_command_without_a_probe() {
    for bin in ["miner", "validator"] {
        let env = format!("GPU_ATTEST_{}_CONFIG", bin.to_uppercase());
        let out = cmd(bin).arg("health").env_remove(&env).output().unwrap();
        assert_one_line_error(&out, "no health probe address: set [health] listen");
        let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = nobody.local_addr().unwrap();
        drop(nobody);
        let out = cmd(bin)
            .args(["health", "--address", &address.to_string()])
            .env_remove(&env)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{bin}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with(&format!("UNREACHABLE: cannot connect to {address}")),
            "{bin}: {out:?}"
        );
    }
}

/// A peer that accepts each connection and closes it at once (as a crowded miner closes a
/// newcomer's) makes `validator attest` fail in one line, "cannot reach", exit 2: never killed
/// by SIGPIPE on its next write to the dead socket (it was, about one run in six, exit 141 with
/// nothing printed; 40 runs make a miss unlikely), and never told the peer is "not a
/// gpu-attest miner".
#[test]
fn attest_against_a_peer_that_drops_every_connection_says_unreachable() {
    use std::io::{Read, Write};
    use std::os::unix::process::ExitStatusExt;

    let dir = Dir::fresh("dropping-peer");
    write_small_validator_config(&dir.0);
    keygen("validator", &dir.0.join("v.key"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let closer = {
        let stop = stop.clone();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            // Bounded: until told to stop, or 60 s.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && std::time::Instant::now() < until {
                match listener.accept() {
                    Ok((mut peer, _)) => {
                        // Read what came (the client's preface), send an empty HTTP/2 SETTINGS
                        // frame, which the client acknowledges, and close: its acknowledgement
                        // or its next frame then meets a reset socket.
                        peer.set_nonblocking(false).unwrap();
                        peer.set_read_timeout(Some(std::time::Duration::from_millis(200)))
                            .unwrap();
                        let _ = peer.read(&mut [0u8; 256]);
                        let _ = peer.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
        })
    };
    for run in 0..40 {
        let out = attest(&dir.0, &url);
        assert_eq!(out.status.signal(), None, "run {run}: killed by a signal");
        assert_one_line_error(&out, "cannot reach miner");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    closer.join().unwrap();
}

/// A command whose reader goes away (`miner info | head -1`) ends quietly, as Unix commands do,
/// instead of panicking on the closed pipe.
#[test]
fn a_command_whose_output_is_closed_ends_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;

    let mut child = cmd("miner")
        .args(["info", "--backend", "cpu"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before anything is written
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.success() || out.status.signal() == Some(13), // SIGPIPE
        "{:?}: {stderr}",
        out.status
    );
}

/// Filters that could only ever list nothing are refused, saying what to give instead of
/// "no verdicts".
#[test]
fn verdict_filters_that_match_nothing_are_refused_with_the_remedy() {
    let zero = cmd("validator").args(["verdicts", "--limit", "0"]).output().unwrap();
    assert_eq!(zero.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--limit"));
    let key = "ab".repeat(32);
    let by_key = cmd("validator").args(["verdicts", "--miner", &key]).output().unwrap();
    assert_eq!(by_key.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&by_key.stderr).contains("takes the miner's URL"),
        "{}",
        String::from_utf8_lossy(&by_key.stderr)
    );
}

/// Logs written to a file (or the journal) carry no colour escapes; `GPU_ATTEST_LOG_FORMAT=json`
/// makes each line one JSON object, and an unknown format is refused in one line.
#[test]
fn logs_to_a_file_are_plain_text_or_json_lines_never_coloured() {
    let d = Dir::fresh("logs");
    let validator_key = keygen("validator", &d.0.join("v.key"));
    keygen("miner", &d.0.join("m.key"));
    for format in ["text", "json"] {
        let log = d.0.join(format!("miner-{format}.log"));
        let mut serve = serve_miner(&d.0, &validator_key);
        serve
            .env("GPU_ATTEST_LOG_FORMAT", format)
            .env_remove("NO_COLOR")
            .stderr(std::fs::File::create(&log).unwrap());
        let (daemon, _) = start_logging(serve);
        // The miner logs as it starts serving; give the lines time to reach the file.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(&log).unwrap().lines().count() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        drop(daemon);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.lines().count() >= 2, "{format}: too few log lines: {text}");
        assert!(
            !text.contains('\u{1b}'),
            "{format}: colour escapes in a log file: {text}"
        );
        for line in text.lines() {
            let parsed = serde_json::from_str::<serde_json::Value>(line);
            match format {
                "json" => {
                    let event = parsed.unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
                    assert!(event["level"].is_string() && event["fields"].is_object(), "{line}");
                }
                _ => assert!(parsed.is_err(), "a text log line is JSON: {line}"),
            }
        }
    }
    let out = serve_miner(&d.0, &validator_key)
        .env("GPU_ATTEST_LOG_FORMAT", "yaml")
        .output()
        .unwrap();
    assert_one_line_failure(
        &out,
        "GPU_ATTEST_LOG_FORMAT=\"yaml\" is not a log format: use text or json",
    );
}

/// `validator miners` pointed at the wrong place says what is wrong: an address without a
/// scheme, and a miner's port instead of the validator's API.
#[test]
fn the_operator_cli_names_a_wrong_api_address() {
    let out = miners("127.0.0.1:7071", &["list"]);
    assert_one_line_failure(&out, "no scheme: write http://127.0.0.1:7071 (loopback)");

    let d = Dir::fresh("wrong-api");
    let validator_key = keygen("validator", &d.0.join("v.key"));
    keygen("miner", &d.0.join("m.key"));
    let (_miner, miner_url) = start(serve_miner(&d.0, &validator_key));
    let out = miners(&miner_url, &["list"]);
    assert_one_line_failure(
        &out,
        &format!("the server at {miner_url} does not serve the validator API"),
    );
}
