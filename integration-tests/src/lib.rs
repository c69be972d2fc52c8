//! End-to-end tests live in `tests/`. The library holds what tests and test helpers share and
//! what no production crate may carry: the test PKI that stands in for NVIDIA's.

pub mod test_pki;
