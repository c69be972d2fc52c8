//! What the GPU and kernel tests share.

/// Says a check was skipped, on the terminal even when the test harness captures output: a
/// skipped GPU check must never read as a pass.
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}
