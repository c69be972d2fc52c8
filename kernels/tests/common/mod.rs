//! What the GPU and kernel tests share.

/// Says a check was skipped (or fails it in CI): see [`gpu_attest_shared::prerequisite`].
pub fn skipped(why: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    gpu_attest_shared::prerequisite::skip(&test, why);
}
