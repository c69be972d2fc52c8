//! How work on a device ends early: a [`CancelToken`] that stops it, and the [`BackendError`]s
//! it fails with. Apart from the [`Backend`](crate::Backend) trait so that what a backend runs
//! (chains, pools, walks) can stop and fail without depending on the trait itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use thiserror::Error;

/// Shared flag that stops long work (the CPU backend within a GEMM step, the CUDA backend
/// between launches): set it when the validator disconnects, the deadline passes, or the daemon
/// shuts down.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `Err(Cancelled)` once cancelled, for `?` between steps.
    pub fn check(&self) -> Result<(), BackendError> {
        if self.is_cancelled() {
            Err(BackendError::Cancelled)
        } else {
            Ok(())
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    #[error("the work was cancelled")]
    Cancelled,
    #[error("device {device} has no memory for this work: {detail}")]
    OutOfMemory { device: u32, detail: String },
    #[error("device {device} failed: {detail}")]
    Device { device: u32, detail: String },
    #[error("device {device} is out of service: {detail}")]
    OutOfService { device: u32, detail: String },
    #[error("device {device} does not exist; this backend has {count}")]
    NoSuchDevice { device: u32, count: u32 },
    #[error("matrix of size {got} given for a challenge of size {want}")]
    WrongMatrixSize { got: usize, want: usize },
    #[error("steps {first}..{end} lie outside the chain's {iterations} iterations")]
    StepsOutOfRange { first: u32, end: u64, iterations: u32 },
    #[error("this backend cannot {what} yet")]
    Unsupported { what: &'static str },
    #[error("the pool {pool} is not the first chains of device {device}'s chains {chains:?}")]
    PoolOutsideChains {
        pool: String,
        device: u32,
        chains: std::ops::Range<u64>,
    },
}
