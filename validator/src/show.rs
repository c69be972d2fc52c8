//! What the `validator` commands print: verdicts (one in full, many as lines), verdict
//! summaries from a running validator's API, and the rate table. Kept apart from the binary so
//! that it stays a thin dispatch over the library.

use crate::rates::report::RateTable;
use crate::verdict::Verdict;
use crate::verdict::throughput::{Expectation, show_rate};
use gpu_attest_daemon::command::utc;

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
    let finish_by = match v.finish_by_ms {
        0 => String::new(),
        f => format!(", finish-by {f} ms"),
    };
    println!(
        "  answered in {} ms (expected {} ms, deadline {} ms{finish_by})",
        v.measured_ms, v.expected_ms, v.deadline_ms
    );
    if let (false, Some(ratio)) = (v.passed, v.throughput.proven_to_expected) {
        println!("  {}", too_slow(ratio));
    }
    if let Some(first) = &v.first_run {
        println!(
            "  a retest: the first run (nonce {}) answered in {} ms of a {} ms deadline, within the retest band",
            first.nonce, first.measured_ms, first.deadline_ms
        );
    }
    println!("  {}", v.throughput);
    if let Some(memory) = &v.memory {
        println!("  {memory}");
    }
    println!("  backend {} ({} kernel)", v.backend, v.kernel);
    for d in &v.inventory {
        println!("  device {}: {}", d.index, d.name);
    }
    if let Some(identity) = &v.identity {
        for d in &identity.devices {
            println!(
                "  identity of device {} ({} policy): {}",
                d.index, identity.policy, d.line
            );
        }
    }
    for r in &v.reasons {
        println!("  reason: {r}");
    }
    println!("  verdict #{} stored in {database}", v.id);
    if let Some(bytes) = v.transcript_bytes {
        println!(
            "  its transcript is kept ({bytes} bytes): `validator verdicts export {} --out FILE`, then `validator audit FILE`",
            v.id
        );
    }
}

/// Stored verdicts, one line each, as `validator verdicts` and `validator miners verdicts` print
/// them (from the database or from the API: one reading serves both).
pub fn print_stored_verdicts(verdicts: &[Verdict]) {
    if verdicts.is_empty() {
        println!("no verdicts");
    }
    for v in verdicts {
        println!("{}", stored_verdict_line(v));
    }
}

fn stored_verdict_line(v: &Verdict) -> String {
    let t = &v.throughput;
    let reasons: Vec<String> = v.reasons.iter().map(ToString::to_string).collect();
    verdict_line(&VerdictLine {
        id: v.id,
        passed: v.passed,
        created_at_ms: v.created_at_ms,
        miner_url: &v.miner_url,
        measured_ms: v.measured_ms,
        deadline_ms: v.deadline_ms,
        proven_ops_per_sec: t.proven_ops_per_sec.unwrap_or(0.0),
        proven_to_expected: t.proven_to_expected.unwrap_or(0.0),
        expectation: t.expectation(),
        reasons: &reasons,
    })
}

/// One verdict as `validator verdicts --follow` prints it: its line, or with `json` the verdict
/// as one line of JSON. Flushed, since the output may be a pipe a script reads as it comes.
/// `false` once the output is gone (the reader closed the pipe): time to stop.
pub fn print_followed_verdict(v: &Verdict, json: bool) -> bool {
    print_followed(if json {
        serde_json::to_string(v).unwrap_or_default()
    } else {
        stored_verdict_line(v)
    })
}

fn print_followed(line: String) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

/// A registered miner and where it stands (`validator miners list`): its line, then what is
/// known of it, indented.
pub fn print_miner(m: &crate::operator::Miner) {
    println!("{}  {}  key {}", m.url, m.name, m.miner_key);
    if m.revoked {
        println!("    REVOKED: never challenged again");
    }
    if m.last_verdict_id == 0 {
        println!("    not attested yet");
    } else {
        let passed = if m.last_pass_at_unix_ms == 0 {
            "never passed".to_string()
        } else {
            format!("last pass {}", utc(m.last_pass_at_unix_ms))
        };
        println!(
            "    last verdict #{} {} {}; {passed}",
            m.last_verdict_id,
            if m.last_verdict_passed { "PASS" } else { "FAIL" },
            utc(m.last_verdict_at_unix_ms)
        );
    }
    if m.failures_in_a_row > 0 {
        println!(
            "    backing off: {} scheduled attempts in a row could not attest it; latest: {}",
            m.failures_in_a_row, m.last_error
        );
    }
    if m.next_due_unix_ms > 0 {
        println!("    next attestation due {}", utc(m.next_due_unix_ms));
    }
}

/// Revoked keys, one line each (`validator miners revoked`).
pub fn print_revoked(keys: &[crate::operator::Revoked]) {
    if keys.is_empty() {
        println!("no miner key is revoked");
    }
    for k in keys {
        println!("{}  revoked {}  {}", k.miner_key, utc(k.revoked_at_unix_ms), k.reason);
    }
}

/// One event of an attestation through the API (`validator miners attest`), on stderr: each
/// phase, and each device's progress once it has computed all its chains (every step of it
/// would flood a terminal or a log).
pub fn print_attest_event(event: &gpu_attest_proto::v1::attest_event::Event, lines: &mut ProgressLines) {
    use gpu_attest_proto::v1::attest_event::Event;
    match event {
        Event::Phase(phase) => eprintln!("{}: {}", phase.name, phase.detail),
        Event::Progress(p) if p.total > 0 && p.done == p.total => {
            eprintln!("device {}: {} of {} chains computed", p.device, p.done, p.total)
        }
        Event::Progress(p) if p.total > 0 && lines.due() => {
            eprintln!("device {}: {} of {} chains so far", p.device, p.done, p.total)
        }
        _ => return,
    }
    lines.printed();
}

/// When progress may have a line of its own, off a terminal: at most one every 5 s after the
/// last line printed, so that a long challenge does not look hung and a log is not flooded.
pub struct ProgressLines {
    last: std::time::Instant,
}

impl ProgressLines {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(5);

    pub fn new() -> Self {
        ProgressLines {
            last: std::time::Instant::now(),
        }
    }

    /// A line was printed: the next progress line waits its interval from now.
    pub fn printed(&mut self) {
        self.last = std::time::Instant::now();
    }

    /// Whether a progress line is due; one that is, is counted as printed.
    pub fn due(&mut self) -> bool {
        let due = self.last.elapsed() >= Self::EVERY;
        if due {
            self.printed();
        }
        due
    }
}

impl Default for ProgressLines {
    fn default() -> Self {
        Self::new()
    }
}

/// What one verdict line shows, wherever the verdict was read from.
struct VerdictLine<'a> {
    id: u64,
    passed: bool,
    /// When the verdict was stored, Unix milliseconds.
    created_at_ms: u64,
    miner_url: &'a str,
    measured_ms: u64,
    deadline_ms: u64,
    proven_ops_per_sec: f64,
    /// The share of the class's rate proven, the fill at its weight (0 when none).
    proven_to_expected: f64,
    expectation: Expectation,
    /// Each as "message (code)".
    reasons: &'a [String],
}

/// `#12    PASS  2026-11-25T11:04:34Z  http://rig:7070  840 ms (deadline 2100 ms)  proved ...,
/// expected ... (basis)`, the time in UTC; a failure ends with its reasons instead.
fn verdict_line(v: &VerdictLine) -> String {
    let proved = format!(
        "proved {}, expected {} ({})",
        show_rate(v.proven_ops_per_sec),
        show_rate(v.expectation.ops_per_sec),
        v.expectation.basis()
    );
    let detail = if v.passed {
        proved
    } else if v.proven_to_expected > 0.0 {
        // A graded miss: a failure that still proved a rate.
        format!("{}: {proved}; {}", too_slow(v.proven_to_expected), v.reasons.join("; "))
    } else {
        v.reasons.join("; ")
    };
    format!(
        "#{:<5} {}  {}  {}  {} ms (deadline {} ms)  {detail}",
        v.id,
        if v.passed { "PASS" } else { "FAIL" },
        utc(v.created_at_ms),
        v.miner_url,
        v.measured_ms,
        v.deadline_ms
    )
}

/// A graded miss for people: "too slow: proved 0.61x of the class rate".
fn too_slow(proven_to_expected: f64) -> String {
    format!("too slow: proved {proven_to_expected:.2}x of the class rate")
}

/// The rate table, as `validator rates` shows it.
pub fn print_rate_table(table: &RateTable) {
    println!(
        "observed classes (a class is calibrated once {} distinct miners have passed):",
        table.calibration_min_miners
    );
    if table.classes.is_empty() {
        println!("  none yet");
    }
    for c in &table.classes {
        // A class not yet calibrated still shows what this validator saw of it.
        let seen = if c.source != "calibrated" && c.seen_observations > 0 {
            format!(
                "; seen here: {} passes from {} of the {} miners it calibrates at",
                c.seen_observations, c.seen_miners, table.calibration_min_miners
            )
        } else {
            String::new()
        };
        println!(
            "  {:<10} {}/{}  {} per {}  {} miners, {} observations{}  (ceiling {}){seen}",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::reason::{Reason, ReasonCode};
    use crate::verdict_wire::{verdict_from_wire, verdict_to_wire};

    #[test]
    fn a_verdict_reads_the_same_from_the_file_and_from_the_api() {
        let mut passed = crate::store::test_support::passing_verdict([1; 32]);
        passed.id = 7;
        let mut failed = passed.clone();
        failed.id = 8;
        failed.passed = false;
        failed.throughput.proven_ops_per_sec = None;
        failed.reasons = vec![Reason::new(ReasonCode::GlobalChecksumMismatch, "chain 3 differs")];
        let mut graded = crate::store::test_support::passing_verdict([1; 32]);
        graded.id = 9;
        graded.passed = false;
        graded.reasons = vec![Reason::new(ReasonCode::LateCommitment, "after 400 ms")];
        graded.finish_by_ms = 600;
        for v in [passed, failed, graded] {
            let from_file = stored_verdict_line(&v);
            let from_api = stored_verdict_line(&verdict_from_wire(&verdict_to_wire(&v)));
            assert_eq!(from_file, from_api);
            assert!(from_file.starts_with(&format!("#{:<5} ", v.id)), "{from_file}");
        }
    }

    #[test]
    fn a_graded_miss_says_how_much_of_the_class_rate_it_proved() {
        let mut v = crate::store::test_support::passing_verdict([1; 32]);
        v.passed = false;
        v.reasons = vec![Reason::new(ReasonCode::LateCommitment, "after 400 ms")];
        let t = &mut v.throughput;
        t.proven_ops_per_sec = Some(0.4 * t.expected_ops_per_sec);
        // The share states the class's rate, the fill at its weight: not proven over expected.
        t.proven_to_expected = Some(0.61);
        let line = stored_verdict_line(&v);
        assert!(
            line.contains("FAIL") && line.contains("too slow: proved 0.61x of the class rate"),
            "{line}"
        );
        assert!(line.contains("after 400 ms"), "the reasons follow: {line}");
        // Any other failure proves nothing and says only why.
        v.throughput.proven_ops_per_sec = None;
        v.throughput.proven_to_expected = None;
        assert!(!stored_verdict_line(&v).contains("too slow"));
    }

    #[test]
    fn a_verdict_line_says_when_in_utc() {
        let mut v = crate::store::test_support::passing_verdict([1; 32]);
        v.created_at_ms = 1_795_000_000_123;
        let line = stored_verdict_line(&v);
        assert!(line.contains("  PASS  2026-11-18T11:06:40Z  "), "{line}");
    }
}
