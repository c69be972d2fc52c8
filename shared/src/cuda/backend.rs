//! The CUDA backend: every chain of a device's share runs on that device, in batches sized from
//! its free memory; checkpoints are hashed on the device (or, as a fallback, copied to the host
//! and hashed there with the blake3 crate).

use super::compile::{self, KernelBuildError};
use super::detect::{self, Detection, GpuDetectError, GpuInfo};
use super::device::{DeviceInitError, DeviceRuntime, hash_scratch_words, reset_primary_context_if_active};
use super::kernels::GpuKernel;
use super::plan;
use crate::backend::{Backend, BackendError, CancelToken, ChainProgress, check_advance};
use crate::chain::ChainResult;
use crate::digest::Digest;
use crate::matrix::Matrix;
use crate::params::Work;
use crate::statement::DeviceInfo;
use cudarc::driver::{CudaEvent, CudaSlice};
use rayon::prelude::*;
use std::collections::VecDeque;
use std::ops::{Deref, Range};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use thiserror::Error;

/// Steps per group the host queues on a device. The host keeps at most two groups queued:
/// before queueing a group it waits for the one before the last, so the device never drains
/// while the host waits, and a cancelled challenge keeps the GPU busy for at most two groups.
const STEPS_IN_FLIGHT: u32 = 8;

/// What to run on: which CUDA ordinals, which kernel, where to cache compiled kernels.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    /// CUDA ordinals (after CUDA_VISIBLE_DEVICES) to use; `None`: all of them. The partition
    /// takes them in ascending ordinal order whatever order they are listed in.
    pub ordinals: Option<Vec<u32>>,
    /// `None`: the fastest kernel every selected device supports.
    pub kernel: Option<GpuKernel>,
    /// Disk cache for compiled kernels; `None`: memory only.
    pub cache_dir: Option<PathBuf>,
    /// Hash checkpoints on the host (copying each X back) instead of on the device. Slower; a
    /// fallback, and a cross-check in the GPU tests.
    pub host_hashing: bool,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CudaInitError {
    #[error(transparent)]
    Detect(#[from] GpuDetectError),
    #[error("CUDA device {ordinal} was asked for, but only {count} are visible")]
    NoSuchOrdinal { ordinal: u32, count: u32 },
    #[error("CUDA device {0} was listed twice")]
    DuplicateOrdinal(u32),
    #[error("no CUDA device was selected")]
    NoneSelected,
    #[error(
        "device {ordinal} ({name}) has compute capability {}.{}; the {kernel} kernel needs {}",
        .compute_capability.0, .compute_capability.1, .kernel.requirement()
    )]
    KernelUnsupported {
        ordinal: u32,
        name: String,
        compute_capability: (u32, u32),
        kernel: GpuKernel,
    },
    #[error(transparent)]
    Build(#[from] KernelBuildError),
    #[error(transparent)]
    Device(#[from] DeviceInitError),
}

pub struct CudaBackend {
    /// One slot per device, in partition order. A slot is empty after a fault whose context
    /// could not be reopened; the next use tries again.
    devices: Vec<Mutex<Option<DeviceRuntime>>>,
    kernel: GpuKernel,
    gpus: Vec<GpuInfo>,
    /// Kept to reopen a device after a fault, as it was first opened.
    options: CudaOptions,
}

/// A locked device with an open runtime (see [`CudaBackend::device`]).
pub(crate) struct DeviceGuard<'a>(MutexGuard<'a, Option<DeviceRuntime>>);

impl Deref for DeviceGuard<'_> {
    type Target = DeviceRuntime;

    fn deref(&self) -> &DeviceRuntime {
        self.0
            .as_ref()
            .expect("a DeviceGuard is only made for a slot holding a runtime")
    }
}

/// The GPUs `options` selects from `detected`, in partition order: ascending CUDA ordinal
/// (PROTOCOL.md section 6), whatever order `ordinals` lists them in.
pub fn select_gpus(detected: &[GpuInfo], ordinals: Option<&[u32]>) -> Result<Vec<GpuInfo>, CudaInitError> {
    let Some(ordinals) = ordinals else {
        return Ok(detected.to_vec());
    };
    let mut chosen: Vec<GpuInfo> = Vec::with_capacity(ordinals.len());
    for &ordinal in ordinals {
        let gpu = detected
            .iter()
            .find(|g| g.ordinal == ordinal)
            .ok_or(CudaInitError::NoSuchOrdinal {
                ordinal,
                count: detected.len() as u32,
            })?;
        if chosen.iter().any(|g| g.ordinal == ordinal) {
            return Err(CudaInitError::DuplicateOrdinal(ordinal));
        }
        chosen.push(gpu.clone());
    }
    if chosen.is_empty() {
        return Err(CudaInitError::NoneSelected);
    }
    chosen.sort_by_key(|g| g.ordinal);
    Ok(chosen)
}

/// The kernel all of `gpus` run: the one asked for, or the best the oldest of them supports.
pub fn choose_kernel(gpus: &[GpuInfo], wanted: Option<GpuKernel>) -> Result<GpuKernel, CudaInitError> {
    let oldest = gpus
        .iter()
        .min_by_key(|g| g.compute_capability)
        .ok_or(CudaInitError::NoneSelected)?;
    let kernel = wanted
        .or_else(|| GpuKernel::best_for(oldest.compute_capability))
        .unwrap_or(GpuKernel::Tiled);
    match gpus.iter().find(|g| !kernel.supports(g.compute_capability)) {
        Some(g) => Err(CudaInitError::KernelUnsupported {
            ordinal: g.ordinal,
            name: g.name.clone(),
            compute_capability: g.compute_capability,
            kernel,
        }),
        None => Ok(kernel),
    }
}

impl CudaBackend {
    /// Detects the GPUs, opens each selected one and loads its kernels.
    pub fn new(options: &CudaOptions) -> Result<Self, CudaInitError> {
        Self::from_detection(&detect::detect()?, options)
    }

    /// As [`CudaBackend::new`], from an earlier detection.
    pub fn from_detection(detection: &Detection, options: &CudaOptions) -> Result<Self, CudaInitError> {
        let gpus = select_gpus(&detection.gpus, options.ordinals.as_deref())?;
        let kernel = choose_kernel(&gpus, options.kernel)?;
        compile::check_against_driver(detection.driver)?;
        let devices = gpus
            .iter()
            .enumerate()
            .map(|(index, gpu)| Ok(Mutex::new(Some(open_device(index as u32, gpu, kernel, options)?))))
            .collect::<Result<Vec<_>, CudaInitError>>()?;
        Ok(CudaBackend {
            devices,
            kernel,
            gpus,
            options: options.clone(),
        })
    }

    pub fn kernel(&self) -> GpuKernel {
        self.kernel
    }

    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// What each device reports in a commitment, in partition order.
    pub fn inventory(&self) -> Vec<DeviceInfo> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| g.device_info(i as u32))
            .collect()
    }

    /// How each device got its kernels (memory, disk cache or NVRTC) and any cache warning.
    pub fn module_notes(&self) -> Vec<String> {
        self.devices
            .iter()
            .enumerate()
            .map(|(index, slot)| {
                let slot = lock(slot);
                let Some(d) = slot.as_ref() else {
                    return format!("device {index}: not open (lost after a fault)");
                };
                let mut note = format!(
                    "device {} ({}): {} kernel for {} ({:?})",
                    d.index, d.gpu.name, d.kernel, d.module.arch, d.module.origin
                );
                if let Some(w) = &d.module.cache_warning {
                    note.push_str("; ");
                    note.push_str(w);
                }
                note
            })
            .collect()
    }

    /// Device `device`, locked, reopened first if an earlier fault left it closed.
    pub(crate) fn device(&self, device: u32) -> Result<DeviceGuard<'_>, BackendError> {
        let slot = self.devices.get(device as usize).ok_or(BackendError::NoSuchDevice {
            device,
            count: self.devices.len() as u32,
        })?;
        let mut slot = lock(slot);
        if slot.is_none() {
            self.reopen(device, &mut slot).map_err(|detail| BackendError::Device {
                device,
                detail: format!("could not be reopened after an earlier fault ({detail}); if this persists, check the GPU (nvidia-smi) and restart the daemon"),
            })?;
        }
        Ok(DeviceGuard(slot))
    }

    /// Runs `work` on device `device`. A device error that leaves the context unusable (an
    /// illegal address, a lost device: CUDA faults are sticky) closes the runtime and opens a
    /// fresh context, so the error ends this challenge only, and the device serves the next.
    pub(crate) fn on_device<T>(
        &self,
        device: u32,
        work: impl FnOnce(&DeviceRuntime) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut guard = self.device(device)?;
        let result = work(&guard);
        match result {
            Err(BackendError::Device { detail, .. }) if guard.faulted() => {
                let outcome = match self.reopen(device, &mut guard.0) {
                    Ok(()) => "the device was reset and is ready for the next challenge".to_string(),
                    Err(e) => format!("the device could not be reset ({e}); the next challenge tries again"),
                };
                Err(BackendError::Device {
                    device,
                    detail: format!("{detail}; {outcome}"),
                })
            }
            other => other,
        }
    }

    /// Drops device `device`'s runtime (its context with it) and opens a fresh one. The driver
    /// keeps a faulted primary context until its last holder lets go; if anything else in the
    /// process still holds it, it is reset outright.
    fn reopen(&self, device: u32, slot: &mut Option<DeviceRuntime>) -> Result<(), String> {
        drop(slot.take());
        let gpu = &self.gpus[device as usize];
        reset_primary_context_if_active(gpu.ordinal).map_err(|e| e.to_string())?;
        *slot = Some(open_device(device, gpu, self.kernel, &self.options).map_err(|e| e.to_string())?);
        Ok(())
    }

    /// Makes device `device`'s context unusable, as a kernel fault would: the GPU tests use it
    /// to check that a faulted device recovers. Not for production use.
    #[doc(hidden)]
    pub fn inject_fault(&self, device: u32) -> Result<(), BackendError> {
        self.device(device)?.inject_fault()
    }
}

fn open_device(
    index: u32,
    gpu: &GpuInfo,
    kernel: GpuKernel,
    options: &CudaOptions,
) -> Result<DeviceRuntime, CudaInitError> {
    let mut device = DeviceRuntime::new(index, gpu.clone(), kernel, options.cache_dir.as_deref())?;
    device.host_hashing = options.host_hashing;
    Ok(device)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a device leaves nothing half-written that a later run relies on:
    // every run allocates and fills its own buffers.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The matrix key as the eight little-endian words ChaCha's state takes.
pub fn key_words(key: &[u8; 32]) -> [u32; 8] {
    core::array::from_fn(|i| u32::from_le_bytes(key[4 * i..4 * i + 4].try_into().unwrap()))
}

/// blake3 of each n x n matrix in `host`, in order.
fn hash_matrices(host: &[i8], nn: usize) -> Vec<Digest> {
    host.par_chunks(nn)
        .map(|m| Digest::hash(bytemuck::cast_slice(m)))
        .collect()
}

/// Checkpoint digests in the order the device writes them: slots (see `plan::DIGEST_SLOTS`), each
/// holding `count` 8-word digests (one per chain of the batch), one `Vec` per checkpoint.
fn digests_by_checkpoint(words: &[u32], count: usize) -> Vec<Vec<Digest>> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes
        .chunks(count * 32)
        .map(|slot| {
            slot.chunks(32)
                .map(|d| Digest::from_slice(d).expect("32 bytes"))
                .collect()
        })
        .collect()
}

/// The first step that writes over a checkpoint taken before step `next_step`: X and the next X
/// swap every step, so `next_step` reads the checkpoint into the other buffer, and the step
/// after it writes into the checkpoint's.
fn overwriting_step(next_step: u32) -> u32 {
    next_step + 1
}

/// Removes from `hashing` (in order) and returns the hashes that must be done before step
/// `step` runs: those whose matrix that step overwrites, and any before them.
fn due_before<E>(hashing: &mut VecDeque<(E, u32)>, step: u32) -> Vec<E> {
    let due = hashing.iter().take_while(|(_, overwrite)| *overwrite <= step).count();
    hashing.drain(..due).map(|(hash, _)| hash).collect()
}

/// The device buffers of one batch: X, the next X, B transposed, hashing scratch, and the
/// checkpoint digests not yet copied to the host.
struct BatchBuffers {
    x: CudaSlice<i8>,
    next: CudaSlice<i8>,
    bt: CudaSlice<i8>,
    hash_a: CudaSlice<u32>,
    hash_b: CudaSlice<u32>,
    /// `plan::DIGEST_SLOTS` slots of one digest per chain.
    digests: CudaSlice<u32>,
    /// Slots of `digests` filled since the last copy to the host.
    digests_pending: usize,
    /// Checkpoint hashes still running on the hash stream: the event that ends each, and the
    /// first step whose GEMM overwrites the matrix it reads (the main stream waits there).
    hashing: VecDeque<(CudaEvent, u32)>,
    /// Host copy of X, for hashing on the host (and for `advance`'s result).
    host: Vec<i8>,
    /// `host` holds a checkpoint that is not hashed yet.
    hash_pending: bool,
}

/// Where a batch's checkpoint digests go: one call per checkpoint, one digest per chain.
type Record<'a> = &'a mut dyn FnMut(Vec<Digest>);

impl DeviceRuntime {
    fn buffers(&self, chains: usize, n: usize, host_copy: bool) -> Result<BatchBuffers, BackendError> {
        let len = chains * n * n;
        let words = chains * hash_scratch_words(n);
        Ok(BatchBuffers {
            x: self.alloc(len)?,
            next: self.alloc(len)?,
            bt: self.alloc(len)?,
            hash_a: self.alloc_words(words)?,
            hash_b: self.alloc_words(words)?,
            digests: self.alloc_words(chains * plan::DIGEST_SLOTS * 8)?,
            digests_pending: 0,
            hashing: VecDeque::new(),
            host: if host_copy { vec![0; len] } else { Vec::new() },
            hash_pending: false,
        })
    }

    /// Takes the checkpoint of X in `buf.x`: hashed on the device into the next digest slot
    /// (copied to the host when the slots are full, see `flush_device_digests`), or copied to
    /// the host to be hashed while the next step runs (see `flush_host_hash`).
    /// `next_step` is the step the chains run next.
    fn checkpoint(
        &self,
        buf: &mut BatchBuffers,
        count: usize,
        n: usize,
        next_step: u32,
        record: Record<'_>,
    ) -> Result<(), BackendError> {
        if self.host_hashing {
            self.download(&buf.x, &mut buf.host[..count * n * n])?;
            buf.hash_pending = true;
        } else {
            let slot = buf.digests_pending;
            let hashed = self.blake3_into(
                &buf.x,
                count,
                n,
                &mut buf.hash_a,
                &mut buf.hash_b,
                &mut buf.digests,
                slot,
            )?;
            buf.hashing.push_back((hashed, overwriting_step(next_step)));
            buf.digests_pending += 1;
            if buf.digests_pending == plan::DIGEST_SLOTS {
                self.flush_device_digests(buf, count, record)?;
            }
        }
        Ok(())
    }

    /// Copies the digests waiting in `buf.digests` to the host and records them, in order.
    fn flush_device_digests(
        &self,
        buf: &mut BatchBuffers,
        count: usize,
        record: Record<'_>,
    ) -> Result<(), BackendError> {
        if buf.digests_pending == 0 {
            return Ok(());
        }
        let mut words = vec![0u32; buf.digests_pending * count * 8];
        self.download_words(&buf.digests, &mut words)?;
        buf.digests_pending = 0;
        for checkpoint in digests_by_checkpoint(&words, count) {
            record(checkpoint);
        }
        Ok(())
    }

    fn flush_host_hash(buf: &mut BatchBuffers, count: usize, n: usize, record: Record<'_>) {
        if buf.hash_pending {
            record(hash_matrices(&buf.host[..count * n * n], n * n));
            buf.hash_pending = false;
        }
    }

    /// Runs steps `steps` on the `count` chains in `buf` (X in `buf.x`, B^T in `buf.bt`). With
    /// `record`, takes a checkpoint after every step whose number is a multiple of c.
    fn run_steps(
        &self,
        work: &Work,
        buf: &mut BatchBuffers,
        count: usize,
        steps: Range<u32>,
        cancel: &CancelToken,
        mut record: Option<Record<'_>>,
    ) -> Result<(), BackendError> {
        let n = work.n();
        let c = work.checkpoint_every();
        // A mark at the start of the group queued last, which is the end of the group before it.
        let mut last_group: Option<CudaEvent> = None;
        for step in steps {
            if step.is_multiple_of(STEPS_IN_FLIGHT) {
                cancel.check()?;
                // Wait for the group before the last one: the last stays queued, so the device
                // keeps working while this one is queued behind it.
                if let Some(mark) = last_group.take() {
                    self.wait_for(&mark)?;
                }
                last_group = Some(self.mark()?);
            }
            // A checkpoint hashed beside the steps must be read before this step overwrites it.
            for hashed in due_before(&mut buf.hashing, step) {
                self.after(&hashed)?;
            }
            self.gemm_mix(&buf.x, &buf.bt, &mut buf.next, count, n, step)?;
            std::mem::swap(&mut buf.x, &mut buf.next);
            if let Some(record) = record.as_mut() {
                // The host hashes the previous checkpoint while the device runs this step.
                Self::flush_host_hash(buf, count, n, *record);
                if (step + 1).is_multiple_of(c) {
                    self.checkpoint(buf, count, n, step + 1, *record)?;
                }
            }
        }
        if let Some(record) = record {
            Self::flush_host_hash(buf, count, n, record);
            self.flush_device_digests(buf, count, record)?;
        }
        self.synchronize()?;
        buf.hashing.clear();
        Ok(())
    }

    /// Chains `first..first + count`, from generation to the last checkpoint.
    fn run_batch(
        &self,
        work: &Work,
        first: u64,
        count: usize,
        buf: &mut BatchBuffers,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        let n = work.n();
        // B passes through `next`, which is free until the first step.
        let chains = first..first + count as u64;
        self.load_chains(
            &key_words(work.key()),
            chains,
            n,
            &mut buf.x,
            &mut buf.next,
            &mut buf.bt,
        )?;
        let mut checkpoints: Vec<Vec<Digest>> = (0..count)
            .map(|_| Vec::with_capacity(work.checkpoints_per_chain()))
            .collect();
        let mut record = |digests: Vec<Digest>| {
            for (chain, digest) in checkpoints.iter_mut().zip(digests) {
                chain.push(digest);
            }
        };
        // h_0 = blake3(A_i).
        buf.digests_pending = 0;
        self.checkpoint(buf, count, n, 0, &mut record)?;
        self.run_steps(work, buf, count, 0..work.iterations(), cancel, Some(&mut record))?;
        Ok(checkpoints
            .into_iter()
            .enumerate()
            .map(|(i, checkpoints)| ChainResult {
                index: first + i as u64,
                checkpoints,
            })
            .collect())
    }

    pub(crate) fn run_chains(
        &self,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        let total = chains.end.saturating_sub(chains.start);
        if total == 0 {
            return Ok(Vec::new());
        }
        let batch = plan::batch_size(self.index, work.n(), total, self.free_memory()?)?;
        let mut buf = self.buffers(batch as usize, work.n(), self.host_hashing)?;
        let mut results = Vec::with_capacity(total as usize);
        let mut first = chains.start;
        while first < chains.end {
            let count = batch.min(chains.end - first) as usize;
            match self.run_batch(work, first, count, &mut buf, cancel) {
                Ok(batch_results) => results.extend(batch_results),
                Err(e) => {
                    // The buffers are freed in the main stream's order; a hash still reading
                    // them on the other stream must finish first. Its own error, if any, is
                    // the one already in hand.
                    let _ = self.synchronize();
                    return Err(e);
                }
            }
            first += count as u64;
            progress(first - chains.start);
        }
        Ok(results)
    }

    fn advance(
        &self,
        work: &Work,
        chain: u64,
        start: &Matrix,
        first: u32,
        steps: u32,
        cancel: &CancelToken,
    ) -> Result<Matrix, BackendError> {
        let n = work.n();
        let mut buf = self.buffers(1, n, true)?;
        self.upload(start.as_slice(), &mut buf.x)?;
        self.load_transposed_b(&key_words(work.key()), chain..chain + 1, n, &mut buf.next, &mut buf.bt)?;
        self.run_steps(work, &mut buf, 1, first..first + steps, cancel, None)?;
        self.download(&buf.x, &mut buf.host)?;
        Ok(Matrix::from_vec(n, buf.host).expect("a buffer of n * n bytes"))
    }
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        let mut names: Vec<&str> = self.gpus.iter().map(|g| g.name.as_str()).collect();
        names.dedup();
        format!(
            "cuda ({} kernel, {} x {})",
            self.kernel,
            self.gpus.len(),
            names.join(" + ")
        )
    }

    fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        self.on_device(device, |d| d.run_chains(work, chains, progress, cancel))
    }

    /// Every device that gets chains must hold at least one chain besides its reserve.
    fn check_capacity(&self, work: &Work) -> Result<(), BackendError> {
        let partition = crate::partition::canonical_partition(work.num_chains(), self.device_count()).map_err(|e| {
            BackendError::Device {
                device: 0,
                detail: e.to_string(),
            }
        })?;
        for slice in partition.iter().filter(|s| s.count > 0) {
            let free = self.on_device(slice.index, |d| d.free_memory())?;
            plan::batch_size(slice.index, work.n(), slice.count, free)?;
        }
        Ok(())
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

    fn gpu(ordinal: u32, cc: (u32, u32)) -> GpuInfo {
        GpuInfo {
            ordinal,
            name: format!("gpu{ordinal}"),
            uuid: format!("GPU-{ordinal}"),
            memory_bytes: 80 << 30,
            sm_count: 132,
            compute_capability: cc,
            pci_bus_id: format!("0000:{ordinal:02x}:00.0"),
            driver_version: "test".into(),
            nvml: None,
        }
    }

    #[test]
    fn device_digest_slots_come_back_one_vec_per_checkpoint_in_chain_order() {
        // Three checkpoints of a batch of two chains, as blake3_into lays them out: slot-major,
        // then chain, 8 little-endian words per digest.
        let (count, slots) = (2usize, 3usize);
        let digest = |slot: usize, chain: usize| Digest::hash(&[slot as u8, chain as u8]);
        let mut words = Vec::new();
        for slot in 0..slots {
            for chain in 0..count {
                let bytes = digest(slot, chain);
                words.extend(
                    bytes
                        .as_bytes()
                        .chunks(4)
                        .map(|w| u32::from_le_bytes(w.try_into().unwrap())),
                );
            }
        }
        let got = digests_by_checkpoint(&words, count);
        let want: Vec<Vec<Digest>> = (0..slots)
            .map(|slot| (0..count).map(|chain| digest(slot, chain)).collect())
            .collect();
        assert_eq!(got, want);
    }

    /// The run_steps schedule on a model of its two buffers: each checkpoint's hash is waited for
    /// before the step that overwrites its matrix, and not a step sooner (that step is the
    /// overlap).
    #[test]
    fn checkpoint_hashes_are_waited_for_exactly_before_their_matrix_is_overwritten() {
        for c in [1u32, 2, 3, 4] {
            let (mut x, mut next) = (0usize, 1usize);
            // (buffer hashed, step it was taken before) stands in for the hash's event.
            let mut hashing: VecDeque<((usize, u32), u32)> = VecDeque::new();
            let mut unfinished: Vec<(usize, u32)> = Vec::new();
            let checkpoint = |x: usize, next_step: u32, hashing: &mut VecDeque<_>, unfinished: &mut Vec<_>| {
                hashing.push_back(((x, next_step), overwriting_step(next_step)));
                unfinished.push((x, next_step));
            };
            checkpoint(x, 0, &mut hashing, &mut unfinished);
            for step in 0..12u32 {
                for done in due_before(&mut hashing, step) {
                    assert_ne!(done.1, step, "c={c}: the hash taken before step {step} blocks it");
                    unfinished.retain(|&u| u != done);
                }
                assert!(
                    unfinished.iter().all(|&(buffer, _)| buffer != next),
                    "c={c}: step {step} overwrites a matrix still being hashed: {unfinished:?}"
                );
                std::mem::swap(&mut x, &mut next);
                if (step + 1).is_multiple_of(c) {
                    checkpoint(x, step + 1, &mut hashing, &mut unfinished);
                }
            }
        }
    }

    #[test]
    fn key_words_are_little_endian() {
        let key: [u8; 32] = core::array::from_fn(|i| i as u8);
        let words = key_words(&key);
        assert_eq!(words[0], 0x0302_0100);
        assert_eq!(words[7], 0x1f1e_1d1c);
    }

    #[test]
    fn selection_is_in_ascending_ordinal_order_and_refuses_bad_lists() {
        let detected = [gpu(0, (9, 0)), gpu(1, (9, 0)), gpu(2, (9, 0))];
        let chosen = select_gpus(&detected, Some(&[2, 0])).unwrap();
        assert_eq!(chosen.iter().map(|g| g.ordinal).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(select_gpus(&detected, None).unwrap().len(), 3);
        assert_eq!(
            select_gpus(&detected, Some(&[3])),
            Err(CudaInitError::NoSuchOrdinal { ordinal: 3, count: 3 })
        );
        assert_eq!(
            select_gpus(&detected, Some(&[1, 1])),
            Err(CudaInitError::DuplicateOrdinal(1))
        );
        assert_eq!(select_gpus(&detected, Some(&[])), Err(CudaInitError::NoneSelected));
    }

    #[test]
    fn kernel_choice_suits_the_oldest_device() {
        let hopper = [gpu(0, (9, 0)), gpu(1, (9, 0))];
        assert_eq!(choose_kernel(&hopper, None), Ok(GpuKernel::Tensor));
        assert_eq!(choose_kernel(&hopper, Some(GpuKernel::Tiled)), Ok(GpuKernel::Tiled));
        let mixed = [gpu(0, (9, 0)), gpu(1, (7, 5))];
        assert_eq!(choose_kernel(&mixed, None), Ok(GpuKernel::Tiled));
        let err = choose_kernel(&mixed, Some(GpuKernel::Tensor)).unwrap_err();
        assert!(err.to_string().contains("compute capability 7.5"), "{err}");
        assert!(
            err.to_string().contains("needs compute capability 8.0 or later"),
            "{err}"
        );
        // wgmma is never chosen on its own, and refuses anything but Hopper.
        assert_eq!(choose_kernel(&hopper, None), Ok(GpuKernel::Tensor));
        assert_eq!(choose_kernel(&hopper, Some(GpuKernel::Wgmma)), Ok(GpuKernel::Wgmma));
        let blackwell = [gpu(0, (10, 0))];
        let err = choose_kernel(&blackwell, Some(GpuKernel::Wgmma)).unwrap_err();
        assert!(
            err.to_string().contains("needs compute capability 9.0 exactly"),
            "{err}"
        );
    }
}
