//! The CUDA backend over every selected GPU: each device's share of the chains runs on that
//! device (see `pipeline`), in batches sized from its free memory, and a device that faults is
//! reset or taken out of service (see `slots`).

use super::compile;
use super::detect::{self, Detection, GpuInfo};
use super::device::{DeviceRuntime, reset_primary_context_if_active};
use super::kernels::{AuxModule, GpuKernel};
use super::options::{CudaInitError, CudaOptions, choose_kernel, select_gpus};
use super::plan;
use super::pool::CudaPool;
use super::slots::{DeviceSlots, Runtime, SlotGuard};
use gpu_attest_shared::backend::{
    Backend, BackendError, CancelToken, ChainProgress, PoolStates, ResidentPool, check_advance,
};
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::failure::side_by_side;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::PoolSpec;
use gpu_attest_shared::memory::chain_pool::{ChainPool, ChainPoolParams};
use gpu_attest_shared::params::Work;
use gpu_attest_shared::partition::canonical_partition;
use gpu_attest_shared::statement::DeviceInfo;
use std::ops::Range;

pub struct CudaBackend {
    /// One slot per device, in partition order; with `CudaOptions::slots_per_gpu` (a test
    /// mode), that many per device, device `j`'s at `j * slots ..`.
    devices: DeviceSlots<DeviceRuntime>,
    /// Slots per device: 1 but in the test mode.
    slots: u32,
    kernel: GpuKernel,
    gpus: Vec<GpuInfo>,
    /// Kept to reopen a device after a fault, as it was first opened.
    options: CudaOptions,
    /// The outcome of version 4's self-check ([`CudaBackend::check_chain_pools`]), once run:
    /// until it has passed on every device, the backend keeps no chain pools.
    chain_pools_checked: std::sync::OnceLock<Result<(), String>>,
}

impl Runtime for DeviceRuntime {
    fn faulted(&self) -> bool {
        DeviceRuntime::faulted(self)
    }
}

impl CudaBackend {
    /// Detects the GPUs, opens each selected one and loads its kernels.
    pub fn new(options: &CudaOptions) -> Result<Self, CudaInitError> {
        Self::from_detection(&detect::detect()?, options)
    }

    /// Everything [`CudaBackend::from_detection`] checks before it opens a device: the GPUs
    /// selected, a kernel they all support, NVRTC against the driver. Returns the GPUs and the
    /// kernel `options` would run.
    pub fn precheck(detection: &Detection, options: &CudaOptions) -> Result<(Vec<GpuInfo>, GpuKernel), CudaInitError> {
        let gpus = select_gpus(&detection.gpus, options.ordinals.as_deref())?;
        let kernel = choose_kernel(&gpus, options.kernel)?;
        compile::check_against_driver(detection.driver)?;
        if options.slots() > 1 {
            // cudarc makes a context of its own with cuCtxCreate_v4 and panics where the
            // driver lacks it.
            if let Some(missing) = SLOT_SYMBOLS.into_iter().find(|s| !super::driver::exports(s)) {
                return Err(CudaInitError::SlotsUnsupported {
                    slots: options.slots(),
                    missing,
                });
            }
        }
        Ok((gpus, kernel))
    }

    /// As [`CudaBackend::new`], from an earlier detection.
    pub fn from_detection(detection: &Detection, options: &CudaOptions) -> Result<Self, CudaInitError> {
        let (gpus, kernel) = Self::precheck(detection, options)?;
        let slots = options.slots();
        let runtimes = gpus
            .iter()
            .enumerate()
            .flat_map(|(index, gpu)| (0..slots).map(move |_| (index as u32, gpu)))
            .map(|(index, gpu)| open_device(index, gpu, kernel, options))
            .collect::<Result<Vec<_>, CudaInitError>>()?;
        Ok(CudaBackend {
            devices: DeviceSlots::new(runtimes),
            slots,
            kernel,
            gpus,
            options: options.clone(),
            chain_pools_checked: std::sync::OnceLock::new(),
        })
    }

    pub fn kernel(&self) -> GpuKernel {
        self.kernel
    }

    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// How each device got its kernels (memory, disk cache or NVRTC) and any cache warning.
    pub fn module_notes(&self) -> Vec<String> {
        let slots = self.slots;
        self.devices
            .describe(|slot, d| {
                let which = if slots > 1 {
                    format!("device {} slot {}", d.index, slot % slots)
                } else {
                    format!("device {}", d.index)
                };
                let mut note = format!(
                    "{which} ({}): {} kernel for {} ({:?})",
                    d.gpu.name, d.kernel, d.module.arch, d.module.origin
                );
                if let Some(w) = &d.module.cache_warning {
                    note.push_str("; ");
                    note.push_str(w);
                }
                note
            })
            .into_iter()
            .enumerate()
            .map(|(slot, note)| {
                note.unwrap_or_else(|reason| format!("device {}: out of service: {reason}", slot as u32 / slots))
            })
            .collect()
    }

    /// Device `device` (its first slot), locked; an error if it is out of service.
    pub(crate) fn device(&self, device: u32) -> Result<SlotGuard<'_, DeviceRuntime>, BackendError> {
        let slot = self.first_slot(device)?;
        self.devices.get(slot).map_err(|e| self.as_device_error(e, device))
    }

    /// Runs `work` on device `device` (its first slot), resetting the device after a sticky
    /// fault (see `slots`).
    pub(crate) fn on_device<T>(
        &self,
        device: u32,
        work: impl FnOnce(&DeviceRuntime) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.on_slot(self.first_slot(device)?, work)
    }

    /// Where device `device`'s slots begin among `devices`.
    fn first_slot(&self, device: u32) -> Result<u32, BackendError> {
        if device >= self.device_count() {
            return Err(BackendError::NoSuchDevice {
                device,
                count: self.device_count(),
            });
        }
        Ok(device * self.slots)
    }

    /// Runs `work` on slot `slot` of `devices`; its errors name the device, not the slot.
    fn on_slot<T>(
        &self,
        slot: u32,
        work: impl FnOnce(&DeviceRuntime) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.devices
            .with(slot, |slot| self.reopen(slot), work)
            .map_err(|e| self.as_device_error(e, slot / self.slots))
    }

    /// `DeviceSlots` numbers what it reports by slot; the protocol, and anyone reading an
    /// error, knows devices. (The same with one slot a device.)
    fn as_device_error(&self, e: BackendError, device: u32) -> BackendError {
        match e {
            BackendError::OutOfService { detail, .. } => BackendError::OutOfService { device, detail },
            BackendError::Device { detail, .. } => BackendError::Device { device, detail },
            BackendError::OutOfMemory { detail, .. } => BackendError::OutOfMemory { device, detail },
            BackendError::NoSuchDevice { .. } => BackendError::NoSuchDevice {
                device,
                count: self.device_count(),
            },
            other => other,
        }
    }

    /// A fresh runtime for slot `slot`. The driver keeps a faulted primary context until its
    /// last holder lets go; if anything else in the process still holds it, it is reset
    /// outright. (A slot of the test mode has a context of its own, which goes with it.)
    fn reopen(&self, slot: u32) -> Result<DeviceRuntime, String> {
        let device = slot / self.slots;
        let gpu = &self.gpus[device as usize];
        if self.slots == 1 {
            reset_primary_context_if_active(gpu.ordinal).map_err(|e| e.to_string())?;
        }
        open_device(device, gpu, self.kernel, &self.options).map_err(|e| e.to_string())
    }

    /// Runs device `device`'s `chains` split over its slots (the test mode), each slot's share
    /// (the canonical partition of the chains over the slots, at its offset) on a host thread
    /// of its own, exactly as separate GPUs run theirs; the results in chain order.
    fn run_chains_on_slots(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        let first = self.first_slot(device)?;
        let shares: Vec<(u32, Range<u64>)> = (first..).zip(slot_shares(&chains, self.slots)).collect();
        // Each slot adds what it finished since it last said: the last addition returns the
        // whole, so progress always reaches every chain.
        let total = AtomicU64::new(0);
        let ran = side_by_side(
            &shares,
            cancel,
            |(slot, share)| {
                let said = AtomicU64::new(0);
                let report = |n: u64| {
                    let more = n.saturating_sub(said.swap(n, Ordering::Relaxed));
                    progress(total.fetch_add(more, Ordering::Relaxed) + more);
                };
                self.on_slot(*slot, |d| d.run_chains(work, share.clone(), &report, cancel))
            },
            |k| {
                cancel.cancel();
                BackendError::Device {
                    device,
                    detail: format!("the host thread of slot {k} panicked"),
                }
            },
        )?;
        Ok(ran.into_iter().flatten().collect())
    }

    /// [`Backend::fill_pool`], with the pool as it is on its GPU.
    pub fn fill_device_pool(
        &self,
        spec: &PoolSpec,
        progress: &(dyn Fn(u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<CudaPool, BackendError> {
        self.on_device(spec.device(), |d| d.fill_pool(spec, progress, cancel))
    }

    /// Runs version 4's walk and openings on every device against the CPU's
    /// (`DeviceRuntime::v4_walk_matches_cpu`), once, and says why a device failed. Until it
    /// has passed, [`Backend::keeps_chain_pools`] is false: a miner says 4 only on GPUs whose
    /// walk was checked on arrival.
    pub fn check_chain_pools(&self) -> Result<(), String> {
        self.chain_pools_checked
            .get_or_init(|| {
                if !self.holds_pools() {
                    return Err(
                        "these GPUs hold no pool (each opened as slots, a test mode, or one older than compute \
                         capability 6.1)"
                            .into(),
                    );
                }
                (0..self.device_count()).try_for_each(|device| {
                    match self.on_device(device, |d| d.v4_walk_matches_cpu()) {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(format!("device {device}: the version 4 walk differs from the CPU's")),
                        Err(e) => Err(format!("device {device}: the version 4 walk could not run: {e}")),
                    }
                })
            })
            .clone()
    }

    /// Runs the locality walk and its openings on every device against the CPU's
    /// (`DeviceRuntime::check_locality`), and says why a device failed. A failure turns off only
    /// that walk on the device (its pools then answer that they cannot walk lines); the outcome
    /// is kept with the device's runtime, and one reopened after a fault runs it again before
    /// its first locality walk.
    pub fn check_locality(&self) -> Result<(), String> {
        (0..self.device_count()).try_for_each(|device| {
            self.on_device(device, |d| Ok(d.check_locality()))
                .map_err(|e| e.to_string())
                .and_then(|checked| checked)
                .map_err(|why| format!("device {device}: {why}"))
        })
    }

    /// Makes device `device`'s context unusable, as a kernel fault would: the GPU tests use it
    /// to check that a faulted device recovers. Not for production use.
    #[doc(hidden)]
    pub fn inject_fault(&self, device: u32) -> Result<(), BackendError> {
        self.device(device)?.inject_fault()
    }
}

/// The driver entry points a slot of the test mode needs beyond `driver::REQUIRED_SYMBOLS`: a
/// context of its own, and its end.
const SLOT_SYMBOLS: [&str; 2] = ["cuCtxCreate_v4", "cuCtxDestroy_v2"];

/// Device `chains` split over `slots` slots: the canonical partition (PROTOCOL.md section 6) of
/// its chains over them, each share at its offset from the device's first chain; empty shares
/// left out.
fn slot_shares(chains: &Range<u64>, slots: u32) -> Vec<Range<u64>> {
    let count = chains.end.saturating_sub(chains.start);
    canonical_partition(count, slots)
        .map(|parts| {
            parts
                .into_iter()
                .filter(|p| p.count > 0)
                .map(|p| chains.start + p.offset..chains.start + p.offset + p.count)
                .collect()
        })
        .unwrap_or_else(|_| vec![chains.clone()])
}

fn open_device(
    index: u32,
    gpu: &GpuInfo,
    kernel: GpuKernel,
    options: &CudaOptions,
) -> Result<DeviceRuntime, CudaInitError> {
    let mut device = DeviceRuntime::open(
        index,
        gpu.clone(),
        kernel,
        options.cache_dir.as_deref(),
        options.slots(),
    )?;
    device.host_hashing = options.host_hashing;
    device.locality_walk = options.locality_walk;
    Ok(device)
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        let mut names: Vec<&str> = self.gpus.iter().map(|g| g.name.as_str()).collect();
        names.dedup();
        let slots = if self.slots > 1 {
            format!(", each opened as {} slots (a test mode)", self.slots)
        } else {
            String::new()
        };
        format!(
            "cuda ({} kernel, {} x {}{slots})",
            self.kernel,
            self.gpus.len(),
            names.join(" + ")
        )
    }

    /// One device per GPU, in the test mode of several slots a GPU too: the claim is the
    /// hardware.
    fn device_count(&self) -> u32 {
        self.gpus.len() as u32
    }

    /// As the driver and NVML name them, made fit for the protocol's text rules (printable
    /// ASCII, bounded), so that a validator never refuses this miner's own inventory.
    fn devices(&self) -> Vec<DeviceInfo> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| g.device_info(i as u32).fitted())
            .collect()
    }

    /// A device is out of service when any of its slots is.
    fn out_of_service(&self) -> Vec<(u32, String)> {
        let mut out: Vec<(u32, String)> = Vec::new();
        for (slot, reason) in self.devices.out_of_service() {
            let device = slot / self.slots;
            if out.last().is_none_or(|(last, _)| *last != device) {
                out.push((device, reason));
            }
        }
        out
    }

    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        if self.slots > 1 {
            return self.run_chains_on_slots(device, work, chains, progress, cancel);
        }
        self.on_device(device, |d| d.run_chains(work, chains, progress, cancel))
    }

    /// Every device that gets chains must hold at least one chain besides its reserve.
    fn check_capacity(&self, work: &Work) -> Result<(), BackendError> {
        let partition = gpu_attest_shared::partition::canonical_partition(work.num_chains(), self.device_count())
            .map_err(|e| BackendError::Device {
                device: 0,
                detail: e.to_string(),
            })?;
        for slice in partition.iter().filter(|s| s.count > 0) {
            // A slot's share of the memory, for its share of the chains.
            let free = self.on_device(slice.index, |d| d.free_memory())?;
            plan::batch_size(slice.index, work.n(), slice.count.div_ceil(u64::from(self.slots)), free)?;
        }
        Ok(())
    }

    /// The pool chains' final states stay in the GPU's memory, walked and opened there
    /// (`super::pool_states`).
    fn run_pool_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        pool: ChainPool,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<(Vec<ChainResult>, Box<dyn PoolStates>), BackendError> {
        let (results, states) = self.on_device(device, |d| d.run_pool_chains(work, chains, pool, progress, cancel))?;
        Ok((results, Box::new(states)))
    }

    /// The states, the walk's buffers and one chain's batch in what is free now (the kept
    /// pools of an earlier commitment are released before this is asked).
    fn check_chain_pool_capacity(
        &self,
        _work: &Work,
        pool: &ChainPool,
        params: &ChainPoolParams,
    ) -> Result<(), BackendError> {
        let walk = super::pool_states::walk_buffer_bytes(params.walkers, params.walk_steps);
        self.on_device(pool.device, |d| d.chain_pool_room(pool, walk))
    }

    /// The version 4 self-check passed ([`CudaBackend::check_chain_pools`]), which it does only
    /// where the GPUs hold pools.
    fn keeps_chain_pools(&self) -> bool {
        matches!(self.chain_pools_checked.get(), Some(Ok(())))
    }

    /// Every selected GPU runs the walk kernel (compute capability 6.1 and later), each opened
    /// whole: a GPU opened as several slots (the test mode) holds no pool.
    fn holds_pools(&self) -> bool {
        self.slots == 1 && self.gpus.iter().all(|g| AuxModule::Walk.supports(g.compute_capability))
    }

    fn check_pool_capacity(&self, spec: &PoolSpec) -> Result<(), BackendError> {
        self.on_device(spec.device(), |d| d.pool_room(spec).map(|_| ()))
    }

    fn fill_pool(
        &self,
        spec: &PoolSpec,
        progress: &(dyn Fn(u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<Box<dyn ResidentPool>, BackendError> {
        Ok(Box::new(self.fill_device_pool(spec, progress, cancel)?))
    }

    fn advance(
        &self,
        work: &Work,
        chain: u64,
        start: Matrix,
        first: u32,
        steps: u32,
        cancel: &CancelToken,
    ) -> Result<Matrix, BackendError> {
        check_advance(work, &start, first, steps)?;
        self.on_device(0, |d| d.advance(work, chain, &start, first, steps, cancel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device's chains over its slots (the test mode): every chain once, in order, each
    /// share at its offset as the canonical partition gives it, and none empty.
    #[test]
    fn slot_shares_cover_the_device_chains_in_order() {
        for (chains, slots) in [
            (10..17u64, 2u32),
            (0..1, 2),
            (5..5, 3),
            (100..1101, 3),
            (0..4, 4),
            (7..9, 1),
        ] {
            let shares = slot_shares(&chains, slots);
            let mut next = chains.start;
            for share in &shares {
                assert_eq!(share.start, next, "{chains:?} over {slots}: in order, no gap");
                assert!(share.end > share.start, "{chains:?} over {slots}: no empty share");
                next = share.end;
            }
            assert_eq!(
                next,
                chains.end.max(chains.start),
                "{chains:?} over {slots}: every chain"
            );
            assert!(shares.len() <= slots as usize);
            let parts = canonical_partition(chains.end - chains.start, slots).unwrap();
            for (share, part) in shares.iter().zip(parts.iter().filter(|p| p.count > 0)) {
                assert_eq!(share.start - chains.start, part.offset);
                assert_eq!(share.end - share.start, part.count);
            }
        }
    }
}
