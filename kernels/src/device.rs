//! One GPU as the backend drives it: its context, streams, loaded kernels and the launches.
//!
//! Two streams: `stream` runs generation and the chain steps, `hash_stream` hashes checkpoints
//! beside them. Work on one stream that depends on the other is ordered by explicit events
//! (see `blake3_into` and the backend's `run_steps`), not by cudarc's per-buffer tracking: that
//! keeps one read event per buffer, and a checkpoint is read on both streams at once.
//!
//! Every method runs on the calling thread with this device's context made current by cudarc;
//! the backend holds each `DeviceRuntime` behind a mutex, so one thread drives a device at a time.

use super::compile::{self, CompiledModule, KernelBuildError};
use super::detect::{GpuInfo, driver_error_text};
use super::kernels::GpuKernel;
use super::raw;
use super::raw::launch::{
    Blake3Chunks, Blake3ChunksArgs, Blake3Parents, Blake3ParentsArgs, Chacha8Generate, GemmMix, GemmMixArgs,
    GemmMixPersistent, GemmMixPersistentArgs, GenerateArgs, LocalityGeneration, LocalityStarts, LocalityWalk, MixI32,
    TransposeArgs, TransposeI8, UNMAPPED_ADDRESS, WalkBlocks, WalkRoots, WalkSteps,
};
use super::tma::OperandMap;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, result, sys,
};
use cudarc::nvrtc::Ptx;
use gpu_attest_shared::backend::BackendError;
use gpu_attest_shared::matrix::{a_stream, b_stream};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// The walk module's entry points, loaded into one device's context.
#[derive(Clone)]
pub struct WalkFunctions {
    pub(crate) steps: WalkSteps,
    pub(crate) blocks: WalkBlocks,
    pub(crate) roots: WalkRoots,
    pub(crate) locality_starts: LocalityStarts,
    pub(crate) locality_walk: LocalityWalk,
    pub(crate) locality_generation: LocalityGeneration,
    /// blake3.cu's, from the walk's module: a locality opening hashes a state's slices where
    /// the state lies.
    pub(crate) blake3_chunks: Blake3Chunks,
    pub(crate) blake3_parents: Blake3Parents,
}

pub struct DeviceRuntime {
    /// Position in the backend's device list: the partition's device index.
    pub index: u32,
    pub gpu: GpuInfo,
    pub kernel: GpuKernel,
    pub module: CompiledModule,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// Checkpoint hashing, beside the chain steps on `stream`.
    hash_stream: Arc<CudaStream>,
    generate: Chacha8Generate,
    transpose: TransposeI8,
    gemm: GemmMix,
    pub(crate) mix: MixI32,
    blake3_chunks: Blake3Chunks,
    blake3_parents: Blake3Parents,
    /// Hash checkpoints on the host instead of the device (`CudaOptions::host_hashing`).
    pub host_hashing: bool,
    /// Walk lines when asked (`CudaOptions::locality_walk`).
    pub locality_walk: bool,
    /// The slots its GPU is opened as (`CudaOptions::slots_per_gpu`), which share its memory.
    memory_share: u64,
    /// The memory walk's kernel, once a pool or the bench has needed it (`DeviceRuntime::walker`).
    pub(crate) walk_functions: std::sync::OnceLock<WalkFunctions>,
    /// The outcome of the locality walk's self-check on this runtime, once run
    /// (`DeviceRuntime::check_locality`); shared with the pools kept here, which run it on
    /// their first locality walk if nothing has yet.
    pub(crate) locality_checked: Arc<std::sync::OnceLock<Result<(), String>>>,
    /// Cleared when this runtime is dropped: a pool made on it (`super::pool`) outlives it only
    /// when the device faulted and is being reset, which frees the pool's memory with the context.
    pub(crate) open: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for DeviceRuntime {
    fn drop(&mut self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Threads per block of the hashing kernels.
const HASH_THREADS: u32 = 128;

/// 32-bit words of scratch the device hash of one n x n matrix needs per buffer (two buffers).
pub fn hash_scratch_words(n: usize) -> usize {
    n * n / 1024 * 8
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DeviceInitError {
    #[error(transparent)]
    Build(#[from] KernelBuildError),
    #[error("CUDA device {ordinal}: {detail}")]
    Driver { ordinal: u32, detail: String },
}

/// A driver error on device `index` as the engine reports it: out of memory is its own case.
pub fn backend_error(index: u32, e: DriverError) -> BackendError {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        BackendError::OutOfMemory {
            device: index,
            detail: driver_error_text(&e),
        }
    } else {
        BackendError::Device {
            device: index,
            detail: driver_error_text(&e),
        }
    }
}

/// Free memory of device `index` (its context `ctx`) in bytes, once everything queued on it is
/// done. Buffers are freed in their stream's order into the driver's memory pool, which gives
/// them back to the device only at a synchronisation: without one, the memory of the last batch
/// (or of a pool dropped after a failed fill) would still count as used.
pub fn free_after_sync(ctx: &CudaContext, index: u32) -> Result<u64, BackendError> {
    ctx.synchronize().map_err(|e| backend_error(index, e))?;
    ctx.mem_get_info()
        .map(|(free, _)| free as u64)
        .map_err(|e| backend_error(index, e))
}

/// Resets CUDA device `ordinal`'s primary context if the driver still has it active. Called
/// after this process's runtime for the device is dropped: a primary context outlives its last
/// release only when something else still holds it, and a faulted one is useless to them too.
pub fn reset_primary_context_if_active(ordinal: u32) -> Result<(), DeviceInitError> {
    let driver = |e: DriverError| DeviceInitError::Driver {
        ordinal,
        detail: driver_error_text(&e),
    };
    let device = result::device::get(ordinal as i32).map_err(driver)?;
    if raw::driver::primary_context_active(device).map_err(driver)? {
        // The backend's own runtime for this device is already dropped; whatever else holds
        // the context shares its fault and gets errors from it.
        raw::driver::reset_primary_context(device).map_err(driver)?;
    }
    Ok(())
}

impl DeviceRuntime {
    /// Opens the device's context and loads `kernel`'s module, compiled or from the cache.
    pub fn new(index: u32, gpu: GpuInfo, kernel: GpuKernel, cache_dir: Option<&Path>) -> Result<Self, DeviceInitError> {
        Self::open(index, gpu, kernel, cache_dir, 1)
    }

    /// As [`DeviceRuntime::new`], as one of `slots` slots of its GPU (the test mode of
    /// `CudaOptions::slots_per_gpu`): with more than one, a context of its own (not the GPU's
    /// primary one) and a `1 / slots` share of the GPU's free memory to size its work by.
    pub fn open(
        index: u32,
        gpu: GpuInfo,
        kernel: GpuKernel,
        cache_dir: Option<&Path>,
        slots: u32,
    ) -> Result<Self, DeviceInitError> {
        let ordinal = gpu.ordinal;
        let driver = |e: DriverError| DeviceInitError::Driver {
            ordinal,
            detail: driver_error_text(&e),
        };
        let ctx = if slots > 1 {
            CudaContext::new_non_primary(ordinal as usize, 0).map_err(|e| DeviceInitError::Driver {
                ordinal,
                detail: format!(
                    "a context of its own for a slot of the test mode ({}); a GPU in exclusive-process \
                     compute mode allows one context a process (nvidia-smi -c DEFAULT lifts it)",
                    driver_error_text(&e)
                ),
            })?
        } else {
            CudaContext::new(ordinal as usize).map_err(driver)?
        };
        let stream = ctx.new_stream().map_err(driver)?;
        let hash_stream = ctx.new_stream().map_err(driver)?;
        let mut module = compile::load_or_compile(kernel, gpu.compute_capability, cache_dir)?;
        let loaded = match ctx.load_module(Ptx::from_src(module.ptx.to_string())) {
            Ok(m) => m,
            Err(_) if module.origin != compile::ModuleOrigin::Compiled => {
                // A cached build the driver rejects (another driver, a damaged file): rebuild once.
                compile::forget(&module, cache_dir);
                module = compile::load_or_compile(kernel, gpu.compute_capability, cache_dir)?;
                ctx.load_module(Ptx::from_src(module.ptx.to_string())).map_err(driver)?
            }
            Err(e) => return Err(driver(e)),
        };
        let gemm = GemmMix::load(&loaded, kernel).map_err(driver)?;
        let dynamic_shared = kernel.dynamic_shared_bytes();
        if dynamic_shared > 0 {
            // Above 48 KiB a function only gets the dynamic shared memory it opted into.
            gemm.function()
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic_shared as i32,
                )
                .map_err(driver)?;
        }
        Ok(DeviceRuntime {
            index,
            kernel,
            generate: Chacha8Generate::load(&loaded).map_err(driver)?,
            transpose: TransposeI8::load(&loaded).map_err(driver)?,
            gemm,
            mix: MixI32::load(&loaded).map_err(driver)?,
            blake3_chunks: Blake3Chunks::load(&loaded).map_err(driver)?,
            blake3_parents: Blake3Parents::load(&loaded).map_err(driver)?,
            host_hashing: false,
            locality_walk: false,
            memory_share: u64::from(slots.max(1)),
            walk_functions: std::sync::OnceLock::new(),
            locality_checked: Arc::default(),
            open: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            module,
            gpu,
            ctx,
            stream,
            hash_stream,
        })
    }

    pub(crate) fn err(&self, e: DriverError) -> BackendError {
        backend_error(self.index, e)
    }

    /// Free device memory in bytes, once everything queued is done ([`free_after_sync`]): this
    /// runtime's share of it, where its GPU is opened as several slots.
    pub fn free_memory(&self) -> Result<u64, BackendError> {
        Ok(free_after_sync(&self.ctx, self.index)? / self.memory_share)
    }

    /// A device buffer of `len` bytes, contents undefined (every kernel writes before it reads).
    pub fn alloc(&self, len: usize) -> Result<CudaSlice<i8>, BackendError> {
        // Undefined is enough: the buffer is written by a kernel or a copy before anything
        // reads it.
        raw::device_memory::alloc_uninit::<i8>(&self.stream, len).map_err(|e| self.err(e))
    }

    /// Scratch words for device hashing, contents undefined (written before read).
    pub fn alloc_words(&self, len: usize) -> Result<CudaSlice<u32>, BackendError> {
        // Undefined is enough: every word is written by a hashing kernel before it is read.
        raw::device_memory::alloc_uninit::<u32>(&self.stream, len).map_err(|e| self.err(e))
    }

    /// Fills `count` matrices of `out` with ChaCha8 output: matrix z is stream
    /// `first_stream + 2 z` (the A or the B matrices of consecutive chains).
    pub fn generate(
        &self,
        out: &mut CudaSlice<i8>,
        key: &[u32; 8],
        first_stream: u64,
        count: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        let blocks_per_matrix = (n * n / 64) as u64;
        let stride = 2u64;
        let cfg = LaunchConfig {
            grid_dim: (blocks_per_matrix.div_ceil(256) as u32, count as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // `out` holds count * n * n bytes.
        let args = GenerateArgs {
            out,
            key,
            first_stream,
            stream_stride: stride,
            blocks_per_matrix,
        };
        self.generate.launch(&self.stream, cfg, args).map_err(|e| self.err(e))
    }

    /// B_i transposed, for `chains`, into `bt`; `scratch` receives B on the way and is free
    /// again afterwards.
    pub fn load_transposed_b(
        &self,
        key: &[u32; 8],
        chains: Range<u64>,
        n: usize,
        scratch: &mut CudaSlice<i8>,
        bt: &mut CudaSlice<i8>,
    ) -> Result<(), BackendError> {
        let count = (chains.end - chains.start) as usize;
        self.generate(scratch, key, b_stream(chains.start), count, n)?;
        self.transpose(scratch, bt, count, n)
    }

    /// The start of `chains` on the device: X_0 = A_i into `x`, and B_i transposed into `bt`
    /// (through `scratch`).
    pub fn load_chains(
        &self,
        key: &[u32; 8],
        chains: Range<u64>,
        n: usize,
        x: &mut CudaSlice<i8>,
        scratch: &mut CudaSlice<i8>,
        bt: &mut CudaSlice<i8>,
    ) -> Result<(), BackendError> {
        let count = (chains.end - chains.start) as usize;
        self.generate(x, key, a_stream(chains.start), count, n)?;
        self.load_transposed_b(key, chains, n, scratch, bt)
    }

    /// `out[z] = input[z]^T` for `count` matrices.
    pub fn transpose(
        &self,
        input: &CudaSlice<i8>,
        out: &mut CudaSlice<i8>,
        count: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        let n_arg = n as i32;
        let cfg = LaunchConfig {
            grid_dim: ((n / 32) as u32, (n / 32) as u32, count as u32),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        // Both buffers hold count * n * n bytes.
        let args = TransposeArgs { input, out, n: n_arg };
        self.transpose.launch(&self.stream, cfg, args).map_err(|e| self.err(e))
    }

    /// One chain step for `count` chains: `out[z] = mix(x[z] * B[z], step)`, with `bt[z] = B[z]^T`.
    pub fn gemm_mix(
        &self,
        x: &CudaSlice<i8>,
        bt: &CudaSlice<i8>,
        out: &mut CudaSlice<i8>,
        count: usize,
        n: usize,
        step: u32,
    ) -> Result<(), BackendError> {
        let gemm = match &self.gemm {
            GemmMix::Persistent(gemm) => {
                // The guards record cudarc's read events once the launch is queued.
                let (x_base, _x_read) = x.device_ptr(&self.stream);
                let (bt_base, _bt_read) = bt.device_ptr(&self.stream);
                return self.launch_persistent(gemm, x_base, bt_base, out, count, n, step);
            }
            GemmMix::Pointers(gemm) => gemm,
        };
        let (tile_rows, tile_cols) = self.kernel.block_tile();
        let n_arg = n as i32;
        let cfg = LaunchConfig {
            grid_dim: (
                (n as u32).div_ceil(tile_cols),
                (n as u32).div_ceil(tile_rows),
                count as u32,
            ),
            block_dim: (self.kernel.block_threads(), 1, 1),
            shared_mem_bytes: self.kernel.dynamic_shared_bytes(),
        };
        // All three buffers hold count * n * n bytes.
        let args = GemmMixArgs {
            x,
            bt,
            out,
            n: n_arg,
            step,
        };
        gemm.launch(&self.stream, cfg, args).map_err(|e| self.err(e))
    }

    /// A persistent kernel's launch (`gemm_mix_tma`, `gemm_mix_pingpong`, `gemm_mix_multicast`):
    /// X and Bt through tensor maps encoded for this launch's buffers, one block per SM or per
    /// output tile, whichever is fewer, in whole clusters where the kernel's blocks pair up.
    #[allow(clippy::too_many_arguments)]
    fn launch_persistent(
        &self,
        gemm: &GemmMixPersistent,
        x_base: u64,
        bt_base: u64,
        out: &mut CudaSlice<i8>,
        count: usize,
        n: usize,
        step: u32,
    ) -> Result<(), BackendError> {
        let (tile_rows, tile_cols) = self.kernel.block_tile();
        let (x_rows, bt_rows) = self.kernel.box_rows();
        let cluster = u64::from(self.kernel.cluster_blocks());
        let map = |base: u64, rows: u32| {
            OperandMap::new(n, count, rows)
                .and_then(|m| m.encode(base))
                .map_err(|e| BackendError::Device {
                    device: self.index,
                    detail: e.to_string(),
                })
        };
        let (x_map, bt_map) = (map(x_base, x_rows)?, map(bt_base, bt_rows)?);
        // The output tiles of a cluster (of one block, or of several on adjacent row tiles): the
        // grid is whole clusters, no more than the SMs hold, and no more than there are tiles.
        let tiles = (n as u64).div_ceil(u64::from(tile_rows) * cluster)
            * (n as u64).div_ceil(u64::from(tile_cols))
            * count as u64;
        let clusters = tiles.min((u64::from(self.gpu.sm_count) / cluster).max(1));
        let cfg = LaunchConfig {
            grid_dim: ((clusters * cluster) as u32, 1, 1),
            block_dim: (self.kernel.block_threads(), 1, 1),
            shared_mem_bytes: self.kernel.dynamic_shared_bytes(),
        };
        let (n_arg, count_arg) = (n as i32, count as i32);
        // The kernel's __cluster_dims__ divides the grid; the maps describe count n x n matrices
        // at the bases of buffers that hold them, and `out` holds count * n * n bytes.
        let args = GemmMixPersistentArgs {
            x_map: &x_map,
            bt_map: &bt_map,
            out,
            n: n_arg,
            count: count_arg,
            step,
        };
        gemm.launch(&self.stream, cfg, args).map_err(|e| self.err(e))
    }

    /// blake3 of each of the first `count` n x n matrices of `data`, hashed on the device on the
    /// hash stream, after everything queued so far on the main stream (which wrote `data`): the
    /// 8-word digests land in `digests` at slot `slot` (words `slot * count * 8..`, one digest per
    /// matrix, in order), where they wait for [`DeviceRuntime::download_words`]. Nothing waits for
    /// the device here. Returns an event marking the end of the hash: the main stream must wait
    /// for it (`DeviceRuntime::after`) before it overwrites `data`. `scratch_a` and `scratch_b`
    /// each hold at least `count * hash_scratch_words(n)` words.
    #[allow(clippy::too_many_arguments)]
    pub fn blake3_into(
        &self,
        data: &CudaSlice<i8>,
        count: usize,
        n: usize,
        scratch_a: &mut CudaSlice<u32>,
        scratch_b: &mut CudaSlice<u32>,
        digests: &mut CudaSlice<u32>,
        slot: usize,
    ) -> Result<CudaEvent, BackendError> {
        let written = self.mark()?;
        self.hash_stream.wait(&written).map_err(|e| self.err(e))?;
        // n >= 64 gives at least four chunks, so the root is a parent node (blake3.cu).
        let bytes = (n * n) as u64;
        let chunks = bytes / 1024;
        let grid = |nodes: u64| LaunchConfig {
            grid_dim: (nodes.div_ceil(u64::from(HASH_THREADS)) as u32, count as u32, 1),
            block_dim: (HASH_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // scratch_a holds count * chunks * 8 words.
        let matrices = data.slice(0..data.len());
        let args = Blake3ChunksArgs {
            data: &matrices,
            matrix_bytes: bytes,
            cvs: &mut *scratch_a,
        };
        self.blake3_chunks
            .launch(&self.hash_stream, grid(chunks), args)
            .map_err(|e| self.err(e))?;
        let (mut level, mut next_level) = (scratch_a, scratch_b);
        let mut nodes = chunks;
        while nodes > 1 {
            let root = u32::from(nodes == 2);
            // Both buffers hold count * nodes * 8 words.
            let args = Blake3ParentsArgs {
                input: &*level,
                out: &mut *next_level,
                in_count: nodes,
                root,
            };
            self.blake3_parents
                .launch(&self.hash_stream, grid(nodes.div_ceil(2)), args)
                .map_err(|e| self.err(e))?;
            std::mem::swap(&mut level, &mut next_level);
            nodes = nodes.div_ceil(2);
        }
        let words = count * 8;
        self.hash_stream
            .memcpy_dtod(
                &level.slice(0..words),
                &mut digests.slice_mut(slot * words..(slot + 1) * words),
            )
            .map_err(|e| self.err(e))?;
        self.hash_stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| self.err(e))
    }

    /// Copies the first `host.len()` digest words of `src` (written on the hash stream) into
    /// `host` and waits for the copy.
    pub fn download_words(&self, src: &CudaSlice<u32>, host: &mut [u32]) -> Result<(), BackendError> {
        self.hash_stream
            .memcpy_dtoh(&src.slice(0..host.len()), host)
            .map_err(|e| self.err(e))?;
        self.hash_stream.synchronize().map_err(|e| self.err(e))
    }

    /// Makes the main stream's later work wait for `event` (recorded on either stream).
    pub fn after(&self, event: &CudaEvent) -> Result<(), BackendError> {
        self.stream.wait(event).map_err(|e| self.err(e))
    }

    /// An event at the current end of this device's main stream (see [`DeviceRuntime::wait_for`]).
    pub fn mark(&self) -> Result<CudaEvent, BackendError> {
        self.stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| self.err(e))
    }

    /// Waits until the work queued before `mark` is done; reports a kernel fault here.
    pub fn wait_for(&self, mark: &CudaEvent) -> Result<(), BackendError> {
        mark.synchronize().map_err(|e| self.err(e))
    }

    /// Copies the first `host.len()` bytes of `src` into `host` and waits for the copy.
    pub fn download(&self, src: &CudaSlice<i8>, host: &mut [i8]) -> Result<(), BackendError> {
        let view = src.slice(0..host.len());
        self.stream.memcpy_dtoh(&view, host).map_err(|e| self.err(e))?;
        self.synchronize()
    }

    pub fn upload(&self, host: &[i8], dst: &mut CudaSlice<i8>) -> Result<(), BackendError> {
        self.stream.memcpy_htod(host, dst).map_err(|e| self.err(e))
    }

    /// Whether the context is unusable: CUDA faults (an illegal address, a lost device) are
    /// sticky, and every later call on the context fails with them.
    pub fn faulted(&self) -> bool {
        self.ctx.synchronize().is_err() || self.ctx.check_err().is_err()
    }

    /// Launches the GEMM kernel on an address no allocation holds: an illegal-address fault,
    /// sticky like a real one. For the GPU tests of fault recovery only.
    pub(crate) fn inject_fault(&self) -> Result<(), BackendError> {
        let (n, step) = (64i32, 0u32);
        let gemm = match &self.gemm {
            GemmMix::Persistent(gemm) => {
                let mut out = self.alloc(64 * 64)?;
                self.launch_persistent(gemm, UNMAPPED_ADDRESS, UNMAPPED_ADDRESS, &mut out, 1, 64, step)?;
                return self.synchronize();
            }
            GemmMix::Pointers(gemm) => gemm,
        };
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (self.kernel.block_threads(), 1, 1),
            shared_mem_bytes: self.kernel.dynamic_shared_bytes(),
        };
        gemm.launch_unmapped(&self.stream, cfg, n, step)
            .map_err(|e| self.err(e))?;
        self.synchronize()
    }

    /// Waits for everything queued on this device's streams; reports a kernel fault here.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        self.stream.synchronize().map_err(|e| self.err(e))?;
        self.hash_stream.synchronize().map_err(|e| self.err(e))
    }
}
