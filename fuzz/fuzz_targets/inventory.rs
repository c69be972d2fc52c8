#![no_main]
//! See `hostile::inventory` in the integration tests' library for what this input is and reaches.

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_attest_integration_tests::hostile::inventory(data));
