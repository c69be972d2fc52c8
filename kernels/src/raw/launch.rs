//! The kernels' launches. cudarc's `LaunchArgs::launch` is unsafe because nothing checks the
//! arguments pushed against the kernel's parameters: the driver reads one value from the host
//! per parameter the kernel declares, of the size it declares, so a missing, extra or
//! mis-sized argument is read out of bounds on the host. Here each entry point is a type of its
//! own, made only by loading that entry point by name (`load`), and its one `launch` takes an
//! argument struct whose fields are the kernel's parameters, in the CUDA signature's order
//! (quoted on each type), pushed in that order. So a launch from the rest of the crate always
//! matches the kernel it launches.
//!
//! What the types do not fix is how far a kernel reaches into its buffers: that follows from
//! the launch's grid and its numbers. Each `launch` says what its caller keeps within the
//! buffers it passes, and the callers size their buffers and grids so (the walk's launches
//! assert it). The buffers go to cudarc as slices and views, read-only ones by `&` and written
//! ones by `&mut`, so its read and write tracking sees each launch as the kernel uses them (the
//! persistent GEMM's operands, behind tensor maps, by the `device_ptr` guards its caller holds
//! across the launch).

use super::tensor_map::TensorMap;
use crate::kernels::{
    BLAKE3_CHUNKS_FN, BLAKE3_PARENTS_FN, GENERATE_FN, GpuKernel, LOCALITY_GENERATION_FN, LOCALITY_STARTS_FN,
    LOCALITY_WALK_FN, MIX_FN, TRANSPOSE_FN, WALK_BLOCKS_FN, WALK_FN, WALK_ROOTS_FN,
};
use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;

/// `chacha8_generate(u8* out, ChaChaKey key, u64 first_stream, u64 stream_stride,
/// u64 blocks_per_matrix)` (`kernels/cuda/chacha8.cu`; `ChaChaKey` is `u32 w[8]`).
#[derive(Clone)]
pub(crate) struct Chacha8Generate(CudaFunction);

pub(crate) struct GenerateArgs<'a> {
    pub out: &'a mut CudaSlice<i8>,
    pub key: &'a [u32; 8],
    pub first_stream: u64,
    pub stream_stride: u64,
    pub blocks_per_matrix: u64,
}

impl Chacha8Generate {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(GENERATE_FN).map(Self)
    }

    /// Queues the generation of `grid.y` matrices of `blocks_per_matrix` 64-byte blocks: the
    /// caller keeps `out` at least that long.
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: GenerateArgs<'_>,
    ) -> Result<(), DriverError> {
        let GenerateArgs {
            out,
            key,
            first_stream,
            stream_stride,
            blocks_per_matrix,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch
            .arg(out)
            .arg(key)
            .arg(&first_stream)
            .arg(&stream_stride)
            .arg(&blocks_per_matrix);
        // SAFETY: `self` is chacha8_generate, and the arguments are its parameters in order and
        // size: a device pointer, the key's 32 bytes by value, three u64s.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `transpose_i8(const i8* in, i8* out, int n)` (`kernels/cuda/transpose.cu`).
#[derive(Clone)]
pub(crate) struct TransposeI8(CudaFunction);

pub(crate) struct TransposeArgs<'a> {
    pub input: &'a CudaSlice<i8>,
    pub out: &'a mut CudaSlice<i8>,
    pub n: i32,
}

impl TransposeI8 {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(TRANSPOSE_FN).map(Self)
    }

    /// Queues the transpose of `grid.z` n x n matrices in 32 x 32 tiles (`grid.x` and `grid.y`
    /// of them, n a multiple of 32): the caller keeps both buffers `grid.z * n * n` bytes long.
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: TransposeArgs<'_>,
    ) -> Result<(), DriverError> {
        let TransposeArgs { input, out, n } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch.arg(input).arg(out).arg(&n);
        // SAFETY: `self` is transpose_i8, and the arguments are its parameters in order and size:
        // two device pointers and an int.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// A module's GEMM+mix entry point ([`GpuKernel::gemm_fn`]), by the signature its kernel has.
#[derive(Clone)]
pub(crate) enum GemmMix {
    /// The tiled, tensor and wgmma kernels: one block per output tile, plain pointers.
    Pointers(GemmMixPointers),
    /// The TMA kernels ([`GpuKernel::is_persistent`]): a persistent grid, tensor maps.
    Persistent(GemmMixPersistent),
}

impl GemmMix {
    /// `kernel`'s entry point, typed by its signature.
    pub(crate) fn load(module: &Arc<CudaModule>, kernel: GpuKernel) -> Result<Self, DriverError> {
        let function = module.load_function(kernel.gemm_fn())?;
        Ok(if kernel.is_persistent() {
            GemmMix::Persistent(GemmMixPersistent(function))
        } else {
            GemmMix::Pointers(GemmMixPointers(function))
        })
    }

    /// The entry point itself, for its attributes (launching it takes the typed variants).
    pub(crate) fn function(&self) -> &CudaFunction {
        match self {
            GemmMix::Pointers(GemmMixPointers(function)) | GemmMix::Persistent(GemmMixPersistent(function)) => function,
        }
    }
}

/// `gemm_mix_tiled`, `gemm_mix_tensor` and `gemm_mix_wgmma`, all
/// `(const i8* x, const i8* bt, i8* out, int n, u32 step)` (`kernels/cuda/gemm_tiled.cu`,
/// `gemm_tensor.cu`, `gemm_wgmma.cu`).
#[derive(Clone)]
pub(crate) struct GemmMixPointers(CudaFunction);

pub(crate) struct GemmMixArgs<'a> {
    pub x: &'a CudaSlice<i8>,
    pub bt: &'a CudaSlice<i8>,
    pub out: &'a mut CudaSlice<i8>,
    pub n: i32,
    pub step: u32,
}

/// An address no allocation holds, inside the first page, which no process maps either.
pub(crate) const UNMAPPED_ADDRESS: u64 = 0x10;

impl GemmMixPointers {
    /// Queues one chain step of `grid.z` chains, one block per output tile of the kernel's
    /// (`grid.x` and `grid.y` of them covering n): the caller keeps all three buffers
    /// `grid.z * n * n` bytes long.
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: GemmMixArgs<'_>,
    ) -> Result<(), DriverError> {
        let GemmMixArgs { x, bt, out, n, step } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch.arg(x).arg(bt).arg(out).arg(&n).arg(&step);
        // SAFETY: `self` is one of the three entry points above, and the arguments are their
        // parameters in order and size: three device pointers, an int, a u32.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }

    /// The same launch with all three pointers [`UNMAPPED_ADDRESS`]: an illegal-address fault
    /// of the context, sticky like a real one. For the GPU tests of fault recovery only.
    pub(crate) fn launch_unmapped(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        n: i32,
        step: u32,
    ) -> Result<(), DriverError> {
        let mut launch = stream.launch_builder(&self.0);
        launch
            .arg(&UNMAPPED_ADDRESS)
            .arg(&UNMAPPED_ADDRESS)
            .arg(&UNMAPPED_ADDRESS)
            .arg(&n)
            .arg(&step);
        // SAFETY: the parameters as in `launch`, a u64 address standing for each pointer. The
        // kernel's first access faults on the device and the context with it; it reaches no
        // memory of this process's, and the backend discards the faulted context.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `gemm_mix_tma`, `gemm_mix_pingpong` and `gemm_mix_multicast`, all
/// `(const __grid_constant__ ga_tensor_map x_map, const __grid_constant__ ga_tensor_map bt_map,
/// i8* out, int n, int count, u32 step)` (`kernels/cuda/gemm_tma.cu`, `gemm_pingpong.cu`).
#[derive(Clone)]
pub(crate) struct GemmMixPersistent(CudaFunction);

pub(crate) struct GemmMixPersistentArgs<'a> {
    pub x_map: &'a TensorMap,
    pub bt_map: &'a TensorMap,
    pub out: &'a mut CudaSlice<i8>,
    pub n: i32,
    pub count: i32,
    pub step: u32,
}

impl GemmMixPersistent {
    /// Queues one chain step of `count` chains on a persistent grid, whole clusters where the
    /// kernel has `__cluster_dims__`: the caller keeps `out` `count * n * n` bytes long and
    /// the maps describing `count` n x n matrices in buffers that hold them.
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: GemmMixPersistentArgs<'_>,
    ) -> Result<(), DriverError> {
        let GemmMixPersistentArgs {
            x_map,
            bt_map,
            out,
            n,
            count,
            step,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch.arg(x_map).arg(bt_map).arg(out).arg(&n).arg(&count).arg(&step);
        // SAFETY: `self` is one of the three entry points above, and the arguments are their
        // parameters in order and size: two 128-byte tensor maps by value (`TensorMap` is
        // `CUtensorMap`, the layout of `ga_tensor_map`), a device pointer, two ints, a u32.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `mix_i32(const int* y, i8* out, u64 count, u32 step, u32 n)` (`kernels/cuda/mix.cu`).
#[derive(Clone)]
pub(crate) struct MixI32(CudaFunction);

pub(crate) struct MixArgs<'a> {
    pub y: &'a CudaSlice<i32>,
    pub out: &'a mut CudaSlice<i8>,
    pub count: u64,
    pub step: u32,
    pub n: u32,
}

impl MixI32 {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(MIX_FN).map(Self)
    }

    /// Queues the mix of `count` elements (whole n x n matrices): the caller keeps both buffers
    /// `count` elements long.
    pub(crate) fn launch(&self, stream: &CudaStream, cfg: LaunchConfig, args: MixArgs<'_>) -> Result<(), DriverError> {
        let MixArgs { y, out, count, step, n } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch.arg(y).arg(out).arg(&count).arg(&step).arg(&n);
        // SAFETY: `self` is mix_i32, and the arguments are its parameters in order and size: two
        // device pointers, a u64, two u32s.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `blake3_chunks(const u8* data, u64 matrix_bytes, u32* cvs)` (`kernels/cuda/blake3.cu`).
#[derive(Clone)]
pub(crate) struct Blake3Chunks(CudaFunction);

pub(crate) struct Blake3ChunksArgs<'a> {
    /// The matrices' bytes (`i8`, read as `u8`), from the first matrix hashed.
    pub data: &'a CudaView<'a, i8>,
    pub matrix_bytes: u64,
    pub cvs: &'a mut CudaSlice<u32>,
}

impl Blake3Chunks {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(BLAKE3_CHUNKS_FN).map(Self)
    }

    /// Queues the chunk chaining values of `grid.y` matrices of `matrix_bytes` bytes: the
    /// caller keeps `data` `grid.y * matrix_bytes` bytes long and `cvs` 8 words a 1024-byte
    /// chunk of them.
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: Blake3ChunksArgs<'_>,
    ) -> Result<(), DriverError> {
        let Blake3ChunksArgs {
            data,
            matrix_bytes,
            cvs,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch.arg(data).arg(&matrix_bytes).arg(cvs);
        // SAFETY: `self` is blake3_chunks, and the arguments are its parameters in order and
        // size: a device pointer, a u64, a device pointer.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `blake3_parents(const u32* in, u32* out, u64 in_count, u32 root)`
/// (`kernels/cuda/blake3.cu`).
#[derive(Clone)]
pub(crate) struct Blake3Parents(CudaFunction);

pub(crate) struct Blake3ParentsArgs<'a> {
    pub input: &'a CudaSlice<u32>,
    pub out: &'a mut CudaSlice<u32>,
    pub in_count: u64,
    pub root: u32,
}

impl Blake3Parents {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(BLAKE3_PARENTS_FN).map(Self)
    }

    /// Queues one tree level of `grid.y` matrices, `in_count` nodes each: the caller keeps
    /// `input` `grid.y * in_count * 8` words long and `out` 8 words for each of the
    /// `in_count.div_ceil(2)` nodes of each matrix.
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: Blake3ParentsArgs<'_>,
    ) -> Result<(), DriverError> {
        let Blake3ParentsArgs {
            input,
            out,
            in_count,
            root,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch.arg(input).arg(out).arg(&in_count).arg(&root);
        // SAFETY: `self` is blake3_parents, and the arguments are its parameters in order and
        // size: two device pointers, a u64, a u32.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `walk_steps(const i8* pool, u64 entries, u32* states, u32 first_step, u32 steps,
/// u32 checkpoint_every, u32* checkpoints, u32 walkers, u32 version)` (`kernels/cuda/walk.cu`).
#[derive(Clone)]
pub(crate) struct WalkSteps(CudaFunction);

pub(crate) struct WalkStepsArgs<'a, 'v> {
    pub pool: &'a CudaSlice<i8>,
    pub entries: u64,
    pub states: &'a mut CudaSlice<u32>,
    pub first_step: u32,
    pub steps: u32,
    pub checkpoint_every: u32,
    pub checkpoints: &'a mut CudaViewMut<'v, u32>,
    pub walkers: u32,
    pub version: u32,
}

impl WalkSteps {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(WALK_FN).map(Self)
    }

    /// Queues `steps` steps of `walkers` walkers, one block each: the caller keeps `pool`
    /// `entries` entries long, `states` 8 words a walker and `checkpoints` 8 words a walker
    /// per checkpoint (`crate::walk::DeviceWalker::launch` asserts them).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: WalkStepsArgs<'_, '_>,
    ) -> Result<(), DriverError> {
        let WalkStepsArgs {
            pool,
            entries,
            states,
            first_step,
            steps,
            checkpoint_every,
            checkpoints,
            walkers,
            version,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch
            .arg(pool)
            .arg(&entries)
            .arg(states)
            .arg(&first_step)
            .arg(&steps)
            .arg(&checkpoint_every)
            .arg(checkpoints)
            .arg(&walkers)
            .arg(&version);
        // SAFETY: `self` is walk_steps, and the arguments are its parameters in order and size:
        // a device pointer, a u64, a device pointer, three u32s, a device pointer, two u32s.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `walk_blocks(const u32* firsts, const u32* states, u32 first_step, u32 steps,
/// u32 walk_steps, u32 walkers, u32 blocks, u32* block_starts, u32* block_nodes)`
/// (`kernels/cuda/walk_tree.cu`).
#[derive(Clone)]
pub(crate) struct WalkBlocks(CudaFunction);

pub(crate) struct WalkBlocksArgs<'a> {
    pub firsts: &'a CudaSlice<u32>,
    pub states: &'a CudaView<'a, u32>,
    pub first_step: u32,
    pub steps: u32,
    pub walk_steps: u32,
    pub walkers: u32,
    pub blocks: u32,
    pub block_starts: &'a mut CudaSlice<u32>,
    pub block_nodes: &'a mut CudaSlice<u32>,
}

impl WalkBlocks {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(WALK_BLOCKS_FN).map(Self)
    }

    /// Queues the fold of one walk launch's states into blocks, a thread a block (threads past
    /// them return): the caller keeps `firsts` 8 words a walker, `states` 8 words a walker per
    /// step, and both outputs 8 words a walker per block
    /// (`crate::walk::DeviceWalker::launch_blocks` asserts them).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: WalkBlocksArgs<'_>,
    ) -> Result<(), DriverError> {
        let WalkBlocksArgs {
            firsts,
            states,
            first_step,
            steps,
            walk_steps,
            walkers,
            blocks,
            block_starts,
            block_nodes,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch
            .arg(firsts)
            .arg(states)
            .arg(&first_step)
            .arg(&steps)
            .arg(&walk_steps)
            .arg(&walkers)
            .arg(&blocks)
            .arg(block_starts)
            .arg(block_nodes);
        // SAFETY: `self` is walk_blocks, and the arguments are its parameters in order and size:
        // two device pointers, five u32s, two device pointers.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `walk_roots(const u32* block_nodes, u32 blocks, u32 walkers, u32* roots)`
/// (`kernels/cuda/walk_tree.cu`).
#[derive(Clone)]
pub(crate) struct WalkRoots(CudaFunction);

pub(crate) struct WalkRootsArgs<'a> {
    pub block_nodes: &'a CudaSlice<u32>,
    pub blocks: u32,
    pub walkers: u32,
    pub roots: &'a mut CudaSlice<u32>,
}

impl WalkRoots {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(WALK_ROOTS_FN).map(Self)
    }

    /// Queues each walker's root, a thread a walker (threads past them return): the caller
    /// keeps `block_nodes` 8 words a walker per block and `roots` 8 words a walker
    /// (`crate::walk::DeviceWalker::launch_roots` asserts them).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: WalkRootsArgs<'_>,
    ) -> Result<(), DriverError> {
        let WalkRootsArgs {
            block_nodes,
            blocks,
            walkers,
            roots,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch.arg(block_nodes).arg(&blocks).arg(&walkers).arg(roots);
        // SAFETY: `self` is walk_roots, and the arguments are its parameters in order and size:
        // a device pointer, two u32s, a device pointer.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `locality_starts(const u32* key, u32 device, u32 generation, u32 walkers, const u32* edge,
/// u64* starts)` (`kernels/cuda/locality.cu`).
#[derive(Clone)]
pub(crate) struct LocalityStarts(CudaFunction);

pub(crate) struct LocalityStartsArgs<'a> {
    pub key: &'a CudaSlice<u32>,
    pub device: u32,
    pub generation: u32,
    pub walkers: u32,
    pub edge: &'a CudaSlice<u32>,
    pub starts: &'a mut CudaSlice<u64>,
}

impl LocalityStarts {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(LOCALITY_STARTS_FN).map(Self)
    }

    /// Queues every walker's start of one generation, a thread a walker (threads past them
    /// return): the caller keeps `key` 24 words, `edge` 8 words a level (32 levels) and `starts`
    /// 4 words a walker (`crate::locality::LocalityKernels::launch_starts` asserts them).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: LocalityStartsArgs<'_>,
    ) -> Result<(), DriverError> {
        let LocalityStartsArgs {
            key,
            device,
            generation,
            walkers,
            edge,
            starts,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch
            .arg(key)
            .arg(&device)
            .arg(&generation)
            .arg(&walkers)
            .arg(edge)
            .arg(starts);
        // SAFETY: `self` is locality_starts, and the arguments are its parameters in order and
        // size: a device pointer, three u32s, two device pointers.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `locality_walk(const u64* pool, u64 pool_slices, const u64* starts, u32 walkers, u32 steps,
/// u64* ends)` (`kernels/cuda/locality.cu`).
#[derive(Clone)]
pub(crate) struct LocalityWalk(CudaFunction);

pub(crate) struct LocalityWalkArgs<'a, 'v> {
    pub pool: &'a CudaSlice<i8>,
    pub pool_slices: u64,
    pub starts: &'a CudaSlice<u64>,
    pub walkers: u32,
    pub steps: u32,
    pub ends: &'a mut CudaViewMut<'v, u64>,
}

impl LocalityWalk {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(LOCALITY_WALK_FN).map(Self)
    }

    /// Queues `steps` steps of every walker, a warp a walker (warps past them return): the
    /// caller keeps `pool` at least `pool_slices` slices of 65536 bytes (the kernel reads slice
    /// `s mod pool_slices`), and `starts` and `ends` 4 words a walker
    /// (`crate::locality::LocalityKernels::launch_walk` asserts them).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: LocalityWalkArgs<'_, '_>,
    ) -> Result<(), DriverError> {
        let LocalityWalkArgs {
            pool,
            pool_slices,
            starts,
            walkers,
            steps,
            ends,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch
            .arg(pool)
            .arg(&pool_slices)
            .arg(starts)
            .arg(&walkers)
            .arg(&steps)
            .arg(ends);
        // SAFETY: `self` is locality_walk, and the arguments are its parameters in order and
        // size: a device pointer, a u64, a device pointer, two u32s, a device pointer.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}

/// `locality_generation(const u32* key, u32 device, u32 generation, u32 walkers,
/// const u64* ends, u32* digests, u32* edge)` (`kernels/cuda/locality.cu`).
#[derive(Clone)]
pub(crate) struct LocalityGeneration(CudaFunction);

pub(crate) struct LocalityGenerationArgs<'a, 'v> {
    pub key: &'a CudaSlice<u32>,
    pub device: u32,
    pub generation: u32,
    pub walkers: u32,
    pub ends: &'a CudaView<'v, u64>,
    pub digests: &'a mut CudaSlice<u32>,
    pub edge: &'a mut CudaSlice<u32>,
}

impl LocalityGeneration {
    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self, DriverError> {
        module.load_function(LOCALITY_GENERATION_FN).map(Self)
    }

    /// Queues one generation's digest and its push onto the tree's edge, on one block: the
    /// caller keeps `key` 24 words, `ends` 4 words a walker, `digests` 8 words a generation up
    /// to this one, and `edge` 8 words a level (32 levels)
    /// (`crate::locality::LocalityKernels::launch_generation` asserts them).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: LocalityGenerationArgs<'_, '_>,
    ) -> Result<(), DriverError> {
        let LocalityGenerationArgs {
            key,
            device,
            generation,
            walkers,
            ends,
            digests,
            edge,
        } = args;
        let mut launch = stream.launch_builder(&self.0);
        launch
            .arg(key)
            .arg(&device)
            .arg(&generation)
            .arg(&walkers)
            .arg(ends)
            .arg(digests)
            .arg(edge);
        // SAFETY: `self` is locality_generation, and the arguments are its parameters in order
        // and size: a device pointer, three u32s, three device pointers.
        unsafe { launch.launch(cfg) }.map(|_| ())
    }
}
