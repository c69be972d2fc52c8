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

/// `work` on every one of `items` (one a device, or one a slot of a device), each on a thread
/// of its own, the results in the items' order. The first failure cancels the others, and is
/// the error returned, rather than the cancellations it caused on them; `panicked(i)` is the
/// error of item `i`'s thread panicking.
pub fn side_by_side<T: Sync, U: Send>(
    items: &[T],
    cancel: &CancelToken,
    work: impl Fn(&T) -> Result<U, BackendError> + Sync,
    panicked: impl Fn(usize) -> BackendError,
) -> Result<Vec<U>, BackendError> {
    let results: Vec<_> = std::thread::scope(|scope| {
        let running: Vec<_> = items
            .iter()
            .map(|item| {
                let work = &work;
                scope.spawn(move || {
                    let done = work(item);
                    if done.is_err() {
                        // The others' work is of no use without this one's.
                        cancel.cancel();
                    }
                    done
                })
            })
            .collect();
        running
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.join().unwrap_or_else(|_| Err(panicked(i))))
            .collect()
    });
    let mut done = Vec::with_capacity(results.len());
    let mut cancelled = false;
    for result in results {
        match result {
            Ok(value) => done.push(value),
            Err(BackendError::Cancelled) => cancelled = true,
            Err(own) => return Err(own),
        }
    }
    if cancelled {
        return Err(BackendError::Cancelled);
    }
    Ok(done)
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
