//! Runs a challenge on a backend: one thread per device, chains split by the canonical
//! partition, device results put back in device order before anything is hashed.

use crate::backend::{Backend, BackendError, CancelToken};
use crate::chain::ChainResult;
use crate::commitment::{AssembleError, DeviceTree, WorkCommitment, device_trees};
use crate::params::Work;
use crate::partition::{DeviceCountError, DeviceSlice, canonical_partition};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EngineError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    DeviceCount(#[from] DeviceCountError),
    #[error("backend returned inconsistent results: {0}")]
    Assemble(#[from] AssembleError),
    #[error("device {0}'s worker thread panicked")]
    WorkerPanicked(u32),
}

/// Progress of one device: `done` of its `total` chains are finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceProgress {
    pub device: u32,
    pub done: u64,
    pub total: u64,
}

/// Everything a miner keeps after running a challenge: the commitment it sends, and the chains
/// and trees it needs to answer openings.
#[derive(Clone, Debug)]
pub struct Execution {
    pub commitment: WorkCommitment,
    pub trees: Vec<DeviceTree>,
    /// All chains, in global index order.
    pub chains: Vec<ChainResult>,
}

/// Runs every chain of `work` on `backend`'s devices and commits to the result with the
/// backend's device count.
pub fn execute(
    backend: &dyn Backend,
    work: &Work,
    progress: &(dyn Fn(DeviceProgress) + Sync),
    cancel: &CancelToken,
) -> Result<Execution, EngineError> {
    let chains = run_all_chains(backend, work, progress, cancel)?;
    commit(work, backend.device_count(), chains)
}

/// Assembles the commitment for `chains` as a miner with `devices` devices would have sent it.
/// The chain results do not depend on who computed them, so a validator re-executing on one
/// device can rebuild the commitment of a miner that used eight.
pub fn commit(work: &Work, devices: u32, chains: Vec<ChainResult>) -> Result<Execution, EngineError> {
    let partition = canonical_partition(work.num_chains(), devices)?;
    let trees = device_trees(&partition, &chains)?;
    let commitment = WorkCommitment::from_trees(work.params().nonce, &trees);
    Ok(Execution {
        commitment,
        trees,
        chains,
    })
}

/// All chains of `work`, each device on its own thread, concatenated in device-index order.
pub fn run_all_chains(
    backend: &dyn Backend,
    work: &Work,
    progress: &(dyn Fn(DeviceProgress) + Sync),
    cancel: &CancelToken,
) -> Result<Vec<ChainResult>, EngineError> {
    let partition = canonical_partition(work.num_chains(), backend.device_count())?;
    let per_device: Vec<(DeviceSlice, Result<Vec<ChainResult>, EngineError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = partition
            .iter()
            .filter(|slice| slice.count > 0)
            .map(|&slice| {
                let handle = std::thread::Builder::new()
                    .name(format!("device-{}", slice.index))
                    .spawn_scoped(scope, move || {
                        let report = |done| {
                            progress(DeviceProgress {
                                device: slice.index,
                                done,
                                total: slice.count,
                            })
                        };
                        let result = backend.run_chains(slice.index, work, slice.chains(), &report, cancel);
                        if result.is_err() {
                            // One device failing ends the challenge: stop the others promptly.
                            cancel.cancel();
                        }
                        result
                    })
                    .expect("spawning a device thread");
                (slice, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(slice, h)| {
                let result = match h.join() {
                    Ok(r) => r.map_err(EngineError::from),
                    Err(_) => Err(EngineError::WorkerPanicked(slice.index)),
                };
                (slice, result)
            })
            .collect()
    });
    // Report the first real failure, not the cancellations it caused on the other devices.
    let mut first_error = None;
    let mut chains = Vec::with_capacity(work.num_chains() as usize);
    for (_, result) in per_device {
        match result {
            Ok(c) => chains.extend(c),
            Err(e) => match (&first_error, &e) {
                (None, _) | (Some(EngineError::Backend(BackendError::Cancelled)), _) => first_error = Some(e),
                _ => {}
            },
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(chains),
    }
}
