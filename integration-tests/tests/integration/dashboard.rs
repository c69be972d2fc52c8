//! The Grafana dashboard (`deploy/grafana/gpu-attest.json`) and the Prometheus alert rules
//! beside it (`alerts.yml`) query only metrics the daemons export, with the labels they use. The
//! real binaries run an attestation of each kind the panels show (a pass, a fail with a reason,
//! a retest, an error); the miner reads its GPUs from the fake NVML. Then both endpoints are
//! scraped and every metric and label in every query is looked up.

use crate::common;

use common::fake_driver::{FakeLib, build, library_path};
use common::operated::{attest_via_api, start_logged, validator_serve};
use common::process::{Dir, cmd, keygen, scrape};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Labels Prometheus adds to every series it scrapes: no daemon exports them.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// One query: where it is (for the failure message), the metrics it names and the labels it
/// groups, filters or prints by.
#[derive(Debug)]
struct Query {
    place: String,
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
    /// Whether it reads Prometheus's own `up` series (scrape health, which no daemon exports).
    reads_up: bool,
}

fn grafana_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana")
}

/// The words of `text` that name a metric of ours.
fn metric_names(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("gpu_attest_"))
        .map(str::to_string)
        .collect()
}

/// The labels a PromQL expression uses: in `by (...)`/`without (...)`, in selectors' `{...}`,
/// and as the second argument of `label_values(...)`.
fn label_names(expr: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    let words = |inside: &str| -> Vec<String> {
        inside
            .split(',')
            .map(|w| w.trim().to_string())
            .filter(|w| !w.is_empty())
            .collect()
    };
    for keyword in ["by (", "without ("] {
        for part in expr.split(keyword).skip(1) {
            labels.extend(words(part.split(')').next().unwrap_or("")));
        }
    }
    for part in expr.split('{').skip(1) {
        for matcher in part.split('}').next().unwrap_or("").split(',') {
            let name: String = matcher
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                labels.insert(name);
            }
        }
    }
    if let Some(args) = expr.strip_prefix("label_values(") {
        labels.extend(words(args.trim_end_matches(')')).into_iter().skip(1));
    }
    labels
}

/// Every query of the dashboard: its panels' targets and its template variables.
fn dashboard_queries() -> Vec<Query> {
    let text = std::fs::read_to_string(grafana_dir().join("gpu-attest.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            queries.push(Query {
                place: format!("panel {:?}", panel["title"]),
                metrics: metric_names(expr),
                labels: label_names(expr),
                reads_up: false,
            });
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = variable["definition"].as_str() {
            queries.push(Query {
                place: format!("variable {:?}", variable["name"]),
                metrics: metric_names(definition),
                labels: label_names(definition),
                reads_up: false,
            });
        }
    }
    queries
}

/// Every alert rule's expression, with the labels its annotations print (`$labels.x`).
fn alert_queries() -> Vec<Query> {
    let text = std::fs::read_to_string(grafana_dir().join("alerts.yml")).unwrap();
    let mut queries: Vec<Query> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("- alert:") {
            queries.push(Query {
                place: format!("alert {}", name.trim()),
                metrics: BTreeSet::new(),
                labels: BTreeSet::new(),
                reads_up: false,
            });
            continue;
        }
        let Some(rule) = queries.last_mut() else { continue };
        if let Some(expr) = line.strip_prefix("expr:") {
            rule.metrics = metric_names(expr);
            rule.reads_up = expr.contains("up{job=");
            rule.labels.extend(label_names(expr));
        }
        for part in line.split("$labels.").skip(1) {
            let label: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rule.labels.insert(label);
        }
    }
    queries
}

/// The label names of every sample of `metric` in an exposition.
fn exported(exposition: &str, metric: &str) -> Option<Vec<BTreeSet<String>>> {
    let samples: Vec<BTreeSet<String>> = exposition
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(metric)?;
            let labels = match rest.strip_prefix('{') {
                Some(inside) => inside.split('}').next()?,
                None if rest.starts_with(' ') => "",
                None => return None,
            };
            Some(
                labels
                    .split(',')
                    .filter_map(|pair| pair.split('=').next())
                    .filter(|name| !name.is_empty())
                    .map(str::to_string)
                    .collect(),
            )
        })
        .collect();
    (!samples.is_empty()).then_some(samples)
}

fn cheater(dir: &Path, name: &str, cheat: &str, validator_key: &str) -> common::operated::Started {
    keygen("miner", &dir.join(format!("{name}.key")));
    let mut command = Command::new(env!("CARGO_BIN_EXE_cheating-miner"));
    command
        .args([
            "--cheat",
            cheat,
            "--memory-mib",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--allow-validator",
            validator_key,
        ])
        .arg("--key-file")
        .arg(dir.join(format!("{name}.key")));
    start_logged(command, dir.join(format!("{name}.log")), false)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_and_alert_query_names_exported_metrics_and_labels() {
    let queries: Vec<Query> = dashboard_queries().into_iter().chain(alert_queries()).collect();
    assert!(queries.len() > 30, "the dashboard and the rules were read: {queries:?}");
    assert!(
        queries.iter().all(|q| q.reads_up || !q.metrics.is_empty()),
        "{queries:?}"
    );

    let dir = Dir::fresh("dashboard");
    let d = &dir.0;
    let validator_key = keygen("validator", &d.join("v.key"));
    // Miners that claim 1 MiB (a version 4 pool of 15 states at n = 256), timed at about one core's rate
    // under a deadline of at least 4 s: the slow-once cheater's commitment 300 ms past it falls
    // in the retest band (1.15), so that the retest series exist.
    std::fs::write(d.join("miner.toml"), "cpu_memory_mib = 1\n").unwrap();
    std::fs::write(
        d.join("validator.toml"),
        format!(
            "key_file = {:?}\nsamples = 4\ncpu_threads = 1\n\
             [challenge]\ncpu_n = 256\niterations = 4\ncheckpoint_every = 2\ntarget_seconds = 0.5\n\
             [deadline]\nmin_ms = 4000\n\
             [[rates]]\nbackend = \"cpu\"\nops_per_sec = 4e10\n",
            d.join("v.key")
        ),
    )
    .unwrap();
    let validator = start_logged(validator_serve(d, &d.join("v.db")), d.join("validator.log"), true);

    // The honest miner reads two GPUs from the fake NVML for its metrics (it computes on the CPU).
    let libs = build(d, &[FakeLib::Nvml]);
    keygen("miner", &d.join("m.key"));
    let mut serve = cmd("miner");
    serve
        .current_dir(d)
        .args([
            "serve",
            "--backend",
            "cpu",
            "--cpu-threads",
            "1",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--allow-validator", &validator_key, "--key-file"])
        .arg(d.join("m.key"))
        .arg("--config")
        .arg(d.join("miner.toml"))
        .env("LD_LIBRARY_PATH", library_path(&libs))
        .env("FAKE_NVML_DEVICES", "2")
        .env("FAKE_NVML_TELEMETRY", "1");
    let honest = start_logged(serve, d.join("miner.log"), true);
    let wrong = cheater(d, "wrong", "wrong-global-checksum", &validator_key);
    let stalled = cheater(d, "stalled", "slow-once", &validator_key);

    for miner in [&honest, &wrong, &stalled] {
        let added = cmd("validator")
            .args(["miners", "--api", &validator.url, "add", &miner.url])
            .output()
            .unwrap();
        assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    }
    // Both daemons are scraped while the miner computes, as Prometheus would, and again at
    // the end: the queries are checked against both.
    let mut during = String::new();
    let pass = attest_via_api(&validator.url, &honest.url, || {
        during = format!(
            "{}\n{}",
            scrape(validator.metrics.as_ref().unwrap()),
            scrape(honest.metrics.as_ref().unwrap())
        )
    })
    .await
    .unwrap();
    assert!(pass.passed, "{:?}", pass.reasons);
    assert!(
        during.contains("gpu_attest_validator_scheduler_running")
            && during.contains("gpu_attest_miner_cpu_load_average_1m"),
        "both endpoints answer mid-attestation: {during}"
    );
    let fail = attest_via_api(&validator.url, &wrong.url, || {}).await.unwrap();
    assert!(!fail.passed);
    let retested = attest_via_api(&validator.url, &stalled.url, || {}).await.unwrap();
    assert!(
        retested.first_run.is_some(),
        "{:?}; {}",
        retested.reasons,
        validator.log()
    );
    let error = attest_via_api(&validator.url, "http://127.0.0.1:1", || {}).await;
    assert_eq!(error.unwrap_err().code(), tonic::Code::Unavailable);

    let exposition = format!(
        "{during}\n{}\n{}",
        scrape(validator.metrics.as_ref().unwrap()),
        scrape(honest.metrics.as_ref().unwrap())
    );
    let mut missing = Vec::new();
    for query in &queries {
        for metric in &query.metrics {
            let Some(samples) = exported(&exposition, metric) else {
                missing.push(format!("{}: {metric} is not exported", query.place));
                continue;
            };
            for label in &query.labels {
                let wanted = label != "le" || metric.ends_with("_bucket");
                if wanted && !TARGET_LABELS.contains(&label.as_str()) && !samples.iter().any(|s| s.contains(label)) {
                    missing.push(format!("{}: {metric} has no label {label}", query.place));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}\n\nexported:\n{exposition}");
}

/// The parser above reads what the queries say (a check of the check).
#[test]
fn queries_are_read_for_their_metrics_and_labels() {
    let expr =
        r#"sum by (le, phase) (rate(gpu_attest_validator_phase_seconds_bucket{miner=~"$miner"}[5m])) / gpu_attest_x"#;
    assert_eq!(
        metric_names(expr),
        BTreeSet::from([
            "gpu_attest_validator_phase_seconds_bucket".to_string(),
            "gpu_attest_x".into()
        ])
    );
    assert_eq!(
        label_names(expr),
        BTreeSet::from(["le".to_string(), "phase".into(), "miner".into()])
    );
    assert_eq!(
        label_names("label_values(gpu_attest_validator_proven_ops_per_second, miner)"),
        BTreeSet::from(["miner".to_string()])
    );
    let exposition = "# TYPE gpu_attest_a counter\ngpu_attest_a_total{outcome=\"pass\",x=\"1\"} 1\ngpu_attest_ab 2\n";
    assert_eq!(
        exported(exposition, "gpu_attest_a_total"),
        Some(vec![BTreeSet::from(["outcome".to_string(), "x".into()])])
    );
    assert_eq!(exported(exposition, "gpu_attest_a"), None);
    assert_eq!(exported(exposition, "gpu_attest_ab"), Some(vec![BTreeSet::new()]));
}
