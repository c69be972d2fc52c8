//! What the gpu-attest miner and validator daemons share, so that both behave alike on the
//! network and on the host: how freed memory goes back to the system (`allocator`), one gRPC
//! server stack (`stack`), the transport policy (`tls`, `rate_limit`, `requests`), dialling a
//! peer with one bound on connect and handshake together (`dial`), the refusal log, which
//! connection a call came on (`connect_info`), config files, the shape of a command's failure
//! and its exit status (`command`), the key file commands (`key_files`), logs, the listening socket,
//! signals, the Prometheus metrics endpoint, the health probe for supervisors, errors on one line (`errors`), places for long
//! calls bounded per client (`slots`), and stopping when a device goes out of service
//! (`devices`).
//! The wire types live apart, in `gpu-attest-proto`, for peers that want only those.

// glibc's mallopt and malloc_trim.
#[allow(unsafe_code)]
pub mod allocator;
pub mod certs;
pub mod command;
pub mod config;
mod connect_info;
// getrlimit/setrlimit for the open-files limit, and shutdown(2) of a socket being written to.
#[allow(unsafe_code)]
pub mod connections;
pub mod devices;
pub mod dial;
pub mod errors;
pub mod exit;
pub mod health_probe;
pub mod key_files;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod rate_limit;
pub mod refusal_log;
pub mod requests;
pub mod run;
// SIGPIPE's disposition and the worker threads' signal masks.
#[allow(unsafe_code)]
pub mod signals;
pub mod slots;
pub mod stack;
pub mod tls;

pub use rate_limit::PeerRateLimiter;
pub use stack::{ServeOptions, serve};
