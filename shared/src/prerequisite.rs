//! Tests whose prerequisite is missing (a C++ compiler, NVRTC, a PostgreSQL server, a host
//! without a GPU for the fake-driver tests): skipped, and saying so, on a developer's machine;
//! failed in CI, which installs every prerequisite (`.ci/run` sets [`REQUIRE_ENV`]). A test that
//! passes without running would be a defect.

/// Set (to anything) where every test must run: a missing prerequisite then fails its test.
pub const REQUIRE_ENV: &str = "GPU_ATTEST_REQUIRE_TEST_PREREQUISITES";

/// Says `test` was skipped because `missing`, on the terminal even when the test harness
/// captures output (a skipped check must never read as a pass), or panics with the same words
/// where [`REQUIRE_ENV`] is set.
pub fn skip(test: &str, missing: &str) {
    assert!(
        std::env::var_os(REQUIRE_ENV).is_none(),
        "{test}: {missing}, and {REQUIRE_ENV} says every test must run here"
    );
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {missing}");
}
