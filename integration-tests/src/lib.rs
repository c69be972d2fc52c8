//! End-to-end tests live in `tests/`. The library holds what tests, test helpers and the fuzz
//! targets share and what no production crate may carry: the test PKI that stands in for
//! NVIDIA's, and the entry points through which hostile inputs reach the daemons' checks.

pub mod cheats;
pub mod hostile;
pub mod test_pki;
