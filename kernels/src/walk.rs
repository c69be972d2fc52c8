//! The memory walk's kernels on a device (PROTOCOL.md 18.3 and 20.4): the host side of
//! `kernels/cuda/walk.cu` and `kernels/cuda/walk_tree.cu`, loaded once per device and launched
//! by a pool's walk (`super::pool` for version 3, `super::pool_states` for version 4) and by
//! `miner bench`'s (`super::walk_bench`).

use super::compile::{compile_aux_ptx, supported_archs, target_arch};
use super::device::{DeviceRuntime, WalkFunctions, backend_error};
use super::kernels::AuxModule;
use super::raw::launch::{
    Blake3Chunks, Blake3Parents, LocalityGeneration, LocalityStarts, LocalityWalk, WalkBlocks, WalkBlocksArgs,
    WalkRoots, WalkRootsArgs, WalkSteps, WalkStepsArgs,
};
// A state is a digest as the kernel holds it: eight little-endian words, as a ChaCha8 key is.
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig};
use cudarc::nvrtc::Ptx;
use gpu_attest_shared::backend::BackendError;
use gpu_attest_shared::memory::ENTRY_BYTES;

/// The walk kernels, loaded into one device's context.
#[derive(Clone)]
pub struct DeviceWalker {
    pub(crate) functions: WalkFunctions,
    /// The device's partition index, for errors.
    pub(crate) device: u32,
}

/// Compiles the walk module for the newest architecture NVRTC knows at or below the device's
/// (as the GEMM modules are; NVRTC not cached: the module is small) and loads it.
fn load_walk_functions(rt: &DeviceRuntime) -> Result<WalkFunctions, BackendError> {
    let (major, minor) = rt.gpu.compute_capability;
    let device_error = |detail: String| BackendError::Device {
        device: rt.index,
        detail,
    };
    if !AuxModule::Walk.supports((major, minor)) {
        return Err(device_error(format!(
            "the walk kernel needs compute capability 6.1 or later; this GPU has {major}.{minor}"
        )));
    }
    let supported = supported_archs().map_err(|e| device_error(e.to_string()))?;
    let arch = target_arch(&supported, (major, minor)).ok_or_else(|| {
        device_error(format!(
            "NVRTC knows no architecture at or below compute capability {major}.{minor} (it knows {supported:?})"
        ))
    })?;
    let ptx = compile_aux_ptx(AuxModule::Walk, arch).map_err(|e| device_error(e.to_string()))?;
    let module = rt.ctx.load_module(Ptx::from_src(ptx)).map_err(|e| rt.err(e))?;
    Ok(WalkFunctions {
        steps: WalkSteps::load(&module).map_err(|e| rt.err(e))?,
        blocks: WalkBlocks::load(&module).map_err(|e| rt.err(e))?,
        roots: WalkRoots::load(&module).map_err(|e| rt.err(e))?,
        locality_starts: LocalityStarts::load(&module).map_err(|e| rt.err(e))?,
        locality_walk: LocalityWalk::load(&module).map_err(|e| rt.err(e))?,
        locality_generation: LocalityGeneration::load(&module).map_err(|e| rt.err(e))?,
        blake3_chunks: Blake3Chunks::load(&module).map_err(|e| rt.err(e))?,
        blake3_parents: Blake3Parents::load(&module).map_err(|e| rt.err(e))?,
    })
}

impl DeviceRuntime {
    /// The walk kernel on this device, compiled and loaded on first use and kept: a device that
    /// never walks never builds it.
    pub fn walker(&self) -> Result<DeviceWalker, BackendError> {
        let functions = match self.walk_functions.get() {
            Some(functions) => functions.clone(),
            // One thread drives a runtime at a time (the backend's slots), so nothing else
            // sets it meanwhile.
            None => {
                let loaded = load_walk_functions(self)?;
                self.walk_functions.get_or_init(|| loaded).clone()
            }
        };
        Ok(DeviceWalker {
            functions,
            device: self.index,
        })
    }
}

impl DeviceWalker {
    /// Queues on `stream` the advance of `walkers` walkers by `steps` steps, numbered from
    /// `first_step`, over the `entries` entries of `pool` (slices, under version 4): `states`
    /// holds each walker's state (8 words) before and after; every `every` steps a walker's
    /// state goes to `checkpoints`, laid out `[walker][steps / every]` (8 words each). `version`
    /// (3 or 4) is the step's domain.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        stream: &CudaStream,
        pool: &CudaSlice<i8>,
        entries: u64,
        states: &mut CudaSlice<u32>,
        first_step: u32,
        steps: u32,
        every: u32,
        checkpoints: &mut CudaViewMut<'_, u32>,
        walkers: u32,
        version: u32,
    ) -> Result<(), BackendError> {
        assert!(version == 3 || version == 4, "a walk of protocol version 3 or 4");
        // The kernel reads entry `e` at byte e * 65536 of the pool and takes `mod entries` of a
        // state: a pool shorter than its entries, or none, would read out of bounds.
        assert!(entries > 0 && pool.len() as u64 >= entries * ENTRY_BYTES as u64);
        // Checkpoints are counted within the launch: they are the walk's s_{w, q c_w} only when
        // the launch starts on one.
        assert!(every > 0 && steps.is_multiple_of(every) && first_step.is_multiple_of(every));
        assert!(walkers > 0, "a grid of no blocks is not a launch");
        assert!(states.len() >= walkers as usize * 8);
        assert!(checkpoints.len() >= walkers as usize * (steps / every) as usize * 8);
        let config = LaunchConfig {
            grid_dim: (walkers, 1, 1),
            block_dim: (AuxModule::Walk.block_threads(), 1, 1),
            shared_mem_bytes: 0,
        };
        // The buffers' sizes are asserted above; one block of the module's block size per walker.
        let args = WalkStepsArgs {
            pool,
            entries,
            states,
            first_step,
            steps,
            checkpoint_every: every,
            checkpoints,
            walkers,
            version,
        };
        self.functions
            .steps
            .launch(stream, config, args)
            .map_err(|e| backend_error(self.device, e))
    }

    /// Queues on `stream` the fold of the blocks of 64 states that end in one version 4 walk
    /// launch (`kernels/cuda/walk_tree.cu`): `firsts` holds each walker's state at
    /// `first_step`, `states` the launch's states `[walker][steps]` as [`DeviceWalker::launch`]
    /// wrote them with a checkpoint every step; block `b` of walker `w` goes to `[w][b]` of
    /// `block_starts` and `block_nodes`, `walk_steps / 64 + 1` blocks a walker.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_blocks(
        &self,
        stream: &CudaStream,
        firsts: &CudaSlice<u32>,
        states: &CudaView<'_, u32>,
        first_step: u32,
        steps: u32,
        walk_steps: u32,
        walkers: u32,
        block_starts: &mut CudaSlice<u32>,
        block_nodes: &mut CudaSlice<u32>,
    ) -> Result<(), BackendError> {
        let blocks = tree_blocks(walk_steps);
        let ends_the_walk = first_step + steps == walk_steps;
        // The kernel reads whole blocks of the launch's states: a launch that does not end the
        // walk must end on a block.
        assert!(first_step.is_multiple_of(TREE_BLOCK_STATES) && first_step + steps <= walk_steps);
        assert!(steps > 0 && (ends_the_walk || steps.is_multiple_of(TREE_BLOCK_STATES)));
        assert!(firsts.len() >= walkers as usize * 8);
        assert!(states.len() >= walkers as usize * steps as usize * 8);
        let tree_words = walkers as usize * blocks as usize * 8;
        assert!(block_starts.len() >= tree_words && block_nodes.len() >= tree_words);
        let launch_blocks = if ends_the_walk {
            blocks - first_step / TREE_BLOCK_STATES
        } else {
            steps / TREE_BLOCK_STATES
        };
        let threads = u64::from(walkers) * u64::from(launch_blocks);
        let config = LaunchConfig {
            grid_dim: (threads.div_ceil(u64::from(TREE_THREADS)) as u32, 1, 1),
            block_dim: (TREE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // The buffers' sizes and the launch's alignment are asserted above; the kernel returns
        // from threads past walkers * launch_blocks.
        let args = WalkBlocksArgs {
            firsts,
            states,
            first_step,
            steps,
            walk_steps,
            walkers,
            blocks,
            block_starts,
            block_nodes,
        };
        self.functions
            .blocks
            .launch(stream, config, args)
            .map_err(|e| backend_error(self.device, e))
    }

    /// Queues on `stream` each walker's root over its `walk_steps / 64 + 1` block nodes.
    pub fn launch_roots(
        &self,
        stream: &CudaStream,
        block_nodes: &CudaSlice<u32>,
        walk_steps: u32,
        walkers: u32,
        roots: &mut CudaSlice<u32>,
    ) -> Result<(), BackendError> {
        let blocks = tree_blocks(walk_steps);
        assert!(block_nodes.len() >= walkers as usize * blocks as usize * 8);
        assert!(roots.len() >= walkers as usize * 8);
        let config = LaunchConfig {
            grid_dim: (walkers.div_ceil(TREE_THREADS), 1, 1),
            block_dim: (TREE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // The buffers' sizes are asserted above; the kernel returns from threads past `walkers`.
        let args = WalkRootsArgs {
            block_nodes,
            blocks,
            walkers,
            roots,
        };
        self.functions
            .roots
            .launch(stream, config, args)
            .map_err(|e| backend_error(self.device, e))
    }
}

/// States per block of a walker's tree (walk_tree.cu's `TREE_BLOCK_STATES`: the kept trace's
/// [`KEPT_EVERY`](gpu_attest_shared::memory::slice_walk::KEPT_EVERY)).
pub const TREE_BLOCK_STATES: u32 = gpu_attest_shared::memory::slice_walk::KEPT_EVERY;
/// Threads per block of the tree kernels (`TREE_THREADS`).
const TREE_THREADS: u32 = 128;

/// Blocks in a walker's tree of `walk_steps + 1` states: `walk_steps / 64 + 1`.
pub fn tree_blocks(walk_steps: u32) -> u32 {
    walk_steps / TREE_BLOCK_STATES + 1
}
