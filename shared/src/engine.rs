//! Runs a challenge on a backend: one thread per device, chains split by the canonical
//! partition, device results put back in device order before anything is hashed.

use crate::backend::{Backend, BackendError, CancelToken, ChainProgress, PoolStates};
use crate::chain::ChainResult;
use crate::commitment::{AssembleError, DeviceTree, WorkCommitment, device_trees};
use crate::memory::chain_pool::{ChainPoolParamsError, chain_pools};
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
    #[error(transparent)]
    Pool(#[from] ChainPoolParamsError),
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
    let per_device = on_every_device(&partition, progress, cancel, |slice, report| {
        backend.run_chains(slice.index, work, slice.chains(), report, cancel)
    })?;
    Ok(per_device.into_iter().flatten().collect())
}

/// A version 4 execution: the chains as [`execute`] runs and commits them, and each device's
/// pool, the final states of its first `pool_chains[j]` chains kept where the device holds
/// them (PROTOCOL.md 20.1), in device order.
pub struct PoolExecution {
    pub execution: Execution,
    pub pools: Vec<Box<dyn PoolStates>>,
}

/// Runs every chain of `work` as [`execute`] does, keeping on device `j` the final states of
/// its first `pool_chains[j]` chains (`1 <= N_j <= count_j`, one count per device) as its pool.
pub fn execute_with_pools(
    backend: &dyn Backend,
    work: &Work,
    pool_chains: &[u64],
    progress: &(dyn Fn(DeviceProgress) + Sync),
    cancel: &CancelToken,
) -> Result<PoolExecution, EngineError> {
    let devices = backend.device_count();
    let partition = canonical_partition(work.num_chains(), devices)?;
    let pools = chain_pools(work, &partition, pool_chains)?;
    let per_device = on_every_device(&partition, progress, cancel, |slice, report| {
        let pool = pools[slice.index as usize];
        backend.run_pool_chains(slice.index, work, slice.chains(), pool, report, cancel)
    })?;
    let (chains, pools): (Vec<Vec<ChainResult>>, Vec<Box<dyn PoolStates>>) = per_device.into_iter().unzip();
    let execution = commit(work, devices, chains.into_iter().flatten().collect())?;
    Ok(PoolExecution { execution, pools })
}

/// Runs `run` for every device of `partition` with chains to run, each on its own thread, and
/// returns what each gave, in device order. One device failing cancels the others; the error
/// returned is the first real failure, not the cancellations it caused.
fn on_every_device<T: Send>(
    partition: &[DeviceSlice],
    progress: &(dyn Fn(DeviceProgress) + Sync),
    cancel: &CancelToken,
    run: impl Fn(DeviceSlice, ChainProgress<'_>) -> Result<T, BackendError> + Sync,
) -> Result<Vec<T>, EngineError> {
    let run = &run;
    let per_device: Vec<Result<T, EngineError>> = std::thread::scope(|scope| {
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
                        let result = run(slice, &report);
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
            .map(|(slice, h)| match h.join() {
                Ok(r) => r.map_err(EngineError::from),
                Err(_) => Err(EngineError::WorkerPanicked(slice.index)),
            })
            .collect()
    });
    // Report the first real failure, not the cancellations it caused on the other devices.
    let mut first_error = None;
    let mut done = Vec::with_capacity(per_device.len());
    for result in per_device {
        match result {
            Ok(t) => done.push(t),
            Err(e) => match (&first_error, &e) {
                (None, _) | (Some(EngineError::Backend(BackendError::Cancelled)), _) => first_error = Some(e),
                _ => {}
            },
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(done),
    }
}
