//! What the `validator` commands print: verdicts (one in full, many as lines), verdict
//! summaries from a running validator's API, and the rate table. Kept apart from the binary so
//! that it stays a thin dispatch over the library.

use crate::ValidatorConfig;
use crate::operator::VerdictSummary;
use crate::rates::report::RateTable;
use crate::store::Verdict;
use crate::throughput::show_rate;

/// One verdict in full, as `validator attest` prints it.
pub fn print_verdict(v: &Verdict, database: &str) {
    println!(
        "{}  miner {} (key {})",
        if v.passed { "PASS" } else { "FAIL" },
        v.miner_url,
        v.miner_key
    );
    let samples = if v.policy == "full" {
        String::new()
    } else {
        format!(", {} samples", v.samples)
    };
    println!(
        "  challenge n={} chains={} iterations={} checkpoint every {}; policy {}{}",
        v.params.n, v.params.num_chains, v.params.iterations, v.params.checkpoint_every, v.policy, samples
    );
    println!(
        "  answered in {} ms (expected {} ms, deadline {} ms)",
        v.measured_ms, v.expected_ms, v.deadline_ms
    );
    println!("  {}", v.throughput);
    println!("  backend {} ({} kernel)", v.backend, v.kernel);
    for d in &v.inventory {
        println!("  device {}: {}", d.index, d.name);
    }
    for r in &v.reasons {
        println!("  reason: {r}");
    }
    println!("  verdict #{} stored in {database}", v.id);
}

/// Stored verdicts, one line each, as `validator verdicts` prints them.
pub fn print_stored_verdicts(verdicts: &[Verdict]) {
    if verdicts.is_empty() {
        println!("no verdicts");
    }
    for v in verdicts {
        println!(
            "#{:<5} {}  {}  {} ms (deadline {} ms)  {}",
            v.id,
            if v.passed { "PASS" } else { "FAIL" },
            v.miner_url,
            v.measured_ms,
            v.deadline_ms,
            if v.passed {
                v.throughput.to_string()
            } else {
                v.reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; ")
            }
        );
    }
}

/// Verdicts from a running validator's API, one line each (`validator miners verdicts`).
pub fn print_verdict_summaries(verdicts: &[VerdictSummary]) {
    if verdicts.is_empty() {
        println!("no verdicts");
    }
    for v in verdicts {
        let detail = if v.passed {
            format!(
                "proved {:.2e} op/s, expected {:.2e} ({}, slack {:.2})",
                v.proven_ops_per_sec, v.expected_ops_per_sec, v.rate_source, v.slack
            )
        } else {
            let reasons: Vec<String> = v
                .reasons
                .iter()
                .map(|r| format!("{} ({})", r.message, r.code))
                .collect();
            reasons.join("; ")
        };
        println!(
            "#{:<5} {}  {}  {} ms (deadline {} ms)  {detail}",
            v.id,
            if v.passed { "PASS" } else { "FAIL" },
            v.miner_url,
            v.measured_ms,
            v.deadline_ms
        );
    }
}

/// The rate table, as `validator rates` shows it.
pub fn print_rate_table(table: &RateTable, config: &ValidatorConfig) {
    println!(
        "observed classes (a class is calibrated once {} distinct miners have passed):",
        config.calibration.min_miners
    );
    if table.classes.is_empty() {
        println!("  none yet");
    }
    for c in &table.classes {
        println!(
            "  {:<10} {}/{}  {} per {}  {} miners, {} observations{}  (ceiling {})",
            c.source,
            c.class,
            c.unit,
            show_rate(c.ops_per_sec),
            c.unit,
            c.miners,
            c.observations,
            if c.capped { ", capped at the ceiling" } else { "" },
            show_rate(c.ceiling)
        );
    }
    println!("shipped table (first contact; first matching row wins):");
    for r in &table.shipped {
        let kernel = if r.kernel.is_empty() { "*" } else { &r.kernel };
        let model = if r.model.is_empty() { "*" } else { &r.model };
        println!(
            "  {:<5} {:<12} {:<10} {:>14}  ceiling {:>14}  {}",
            r.backend,
            kernel,
            model,
            show_rate(r.ops_per_sec),
            if r.peak_ops_per_sec > 0.0 {
                show_rate(r.peak_ops_per_sec)
            } else {
                "backend's".into()
            },
            r.source
        );
    }
}
