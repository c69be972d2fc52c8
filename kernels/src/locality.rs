//! Version 4's locality walk on a GPU (PROTOCOL.md 20.10): the host side of
//! `kernels/cuda/locality.cu`, over a pool's states where the device holds them.
//!
//! The walk queues, per generation, the walkers' starts from the locality tree, the walk (one
//! warp a walker) and the generation's digest with its push onto the tree, all on the pool's
//! stream: no state crosses to the host until the last generation has ended. Then the ends and
//! the digests come back and the host makes the root over the digests, as `walk_lines` does on
//! the CPU.
//!
//! An opening walks its segment again on the host, copying back the slice of each step's line
//! (64 KiB a step). Each state a line lies in is made known to the round's [`ChunkPaths`] by its
//! slices' chaining values, hashed where the state lies (2 KiB back rather than 4 MiB at
//! n = 2048). The shared `open_segment` then cuts every proof from those, as the CPU's opening
//! does from host memory.

use super::device::backend_error;
use super::kernels::AuxModule;
use super::raw::device_memory::alloc_uninit;
use super::raw::launch::{
    Blake3ChunksArgs, Blake3ParentsArgs, LocalityGenerationArgs, LocalityStartsArgs, LocalityWalkArgs,
};
use super::states::StatesOnDevice;
use super::walk::DeviceWalker;
use super::words::key_words;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig};
use gpu_attest_shared::backend::{BackendError, CancelToken};
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::locality::{
    ChunkPaths, LineWalk, LocalityWalk, SegmentOpening, State, open_segment, segment_start, step,
};
use gpu_attest_shared::memory::slice::{CHUNKS_PER_SLICE, SLICE_BYTES, StateSlices};
use gpu_attest_shared::memory::slice_walk::SliceSource;
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};

/// Walkers a block of the locality walk holds: a warp each (`LOC_WARPS`).
const WARPS_PER_BLOCK: u32 = 4;
/// Levels of the locality tree's right edge the kernels keep (`LOC_EDGE_LEVELS`).
const EDGE_LEVELS: usize = 32;
/// Generations queued between two looks at the cancel token; at most two such batches are
/// queued, so that the device never waits for the host and a cancel stops the walk within two.
const GENERATIONS_PER_BATCH: u32 = 64;

impl DeviceWalker {
    fn launch_error(&self, e: cudarc::driver::DriverError) -> BackendError {
        backend_error(self.device, e)
    }

    /// Queues every walker's start of generation `generation`; `edge` holds the tree's right
    /// edge after generation `generation - 1` (nothing is read of it for generation 0).
    #[allow(clippy::too_many_arguments)]
    fn launch_locality_starts(
        &self,
        stream: &CudaStream,
        key: &CudaSlice<u32>,
        device: u32,
        generation: u32,
        walkers: u32,
        edge: &CudaSlice<u32>,
        starts: &mut CudaSlice<u64>,
    ) -> Result<(), BackendError> {
        assert!(walkers > 0 && key.len() >= 24 && edge.len() >= EDGE_LEVELS * 8);
        assert!(starts.len() >= walkers as usize * 4);
        let threads = AuxModule::Walk.block_threads();
        let config = LaunchConfig {
            grid_dim: (walkers.div_ceil(threads), 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // The buffers' sizes are asserted above; the kernel returns from threads past `walkers`.
        let args = LocalityStartsArgs {
            key,
            device,
            generation,
            walkers,
            edge,
            starts,
        };
        self.functions
            .locality_starts
            .launch(stream, config, args)
            .map_err(|e| self.launch_error(e))
    }

    /// Queues `steps` steps of every walker from `starts` over the `pool_slices` slices of
    /// `pool`, each walker's end into `ends`.
    #[allow(clippy::too_many_arguments)]
    fn launch_locality_walk(
        &self,
        stream: &CudaStream,
        pool: &CudaSlice<i8>,
        pool_slices: u64,
        starts: &CudaSlice<u64>,
        walkers: u32,
        steps: u32,
        ends: &mut CudaViewMut<'_, u64>,
    ) -> Result<(), BackendError> {
        // The kernel reads slice `s mod pool_slices` at byte 65536 times it: none, or a pool
        // shorter than its slices, would read out of bounds.
        assert!(pool_slices > 0 && pool.len() as u64 >= pool_slices * SLICE_BYTES as u64);
        assert!(walkers > 0 && starts.len() >= walkers as usize * 4 && ends.len() >= walkers as usize * 4);
        let config = LaunchConfig {
            grid_dim: (walkers.div_ceil(WARPS_PER_BLOCK), 1, 1),
            block_dim: (AuxModule::Walk.block_threads(), 1, 1),
            shared_mem_bytes: 0,
        };
        // The buffers' sizes are asserted above; warps past `walkers` return.
        let args = LocalityWalkArgs {
            pool,
            pool_slices,
            starts,
            walkers,
            steps,
            ends,
        };
        self.functions
            .locality_walk
            .launch(stream, config, args)
            .map_err(|e| self.launch_error(e))
    }

    /// Queues generation `generation`'s digest from its `ends` into `digests[generation]`, and
    /// its leaf node's push onto the tree's right edge `edge`, on one block.
    #[allow(clippy::too_many_arguments)]
    fn launch_locality_generation(
        &self,
        stream: &CudaStream,
        key: &CudaSlice<u32>,
        device: u32,
        generation: u32,
        walkers: u32,
        ends: &CudaView<'_, u64>,
        digests: &mut CudaSlice<u32>,
        edge: &mut CudaSlice<u32>,
    ) -> Result<(), BackendError> {
        // The kernel's shared memory holds the chunks of at most MAX_WALKERS walkers' ends.
        assert!(walkers > 0 && walkers <= gpu_attest_shared::memory::locality::MAX_WALKERS);
        assert!(key.len() >= 24 && edge.len() >= EDGE_LEVELS * 8 && ends.len() >= walkers as usize * 4);
        assert!(digests.len() >= (generation as usize + 1) * 8);
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (AuxModule::Walk.block_threads(), 1, 1),
            shared_mem_bytes: 0,
        };
        // The buffers' sizes are asserted above.
        let args = LocalityGenerationArgs {
            key,
            device,
            generation,
            walkers,
            ends,
            digests,
            edge,
        };
        self.functions
            .locality_generation
            .launch(stream, config, args)
            .map_err(|e| self.launch_error(e))
    }
}

/// The walk's key as the kernels take it: nonce, seed and global root, 24 little-endian words.
fn walk_key(walk: &LocalityWalk) -> Vec<u32> {
    [walk.nonce, walk.seed, walk.global.0]
        .iter()
        .flat_map(key_words)
        .collect()
}

impl StatesOnDevice<'_> {
    /// The locality walk of `walk` over these states (see the module's header): every end
    /// state, every generation digest and the root over them, bit for bit `walk_lines`'s.
    /// Stops within two batches of generations after `cancel` is cancelled.
    pub fn walk_lines(&self, walk: &LocalityWalk, cancel: &CancelToken) -> Result<LineWalk, BackendError> {
        walk.check_shape()
            .map_err(|e| self.device_error(format!("locality walk refused: {e}")))?;
        let slices = self.pool.slices();
        if slices == 0 {
            return Err(self.device_error("a locality walk over a pool of no slices".into()));
        }
        let (walkers, generations) = (walk.walkers, walk.generations);
        let ends_words = walkers as usize * generations as usize * 4;
        // Written before read: `key` by the upload, `starts` by each generation's starts, `ends`
        // by each generation's walk, `digests` and `edge` by the generations (the starts read
        // only the edge's levels that generations before wrote).
        let mut key = self.alloc_words(24)?;
        self.stream
            .memcpy_htod(&walk_key(walk), &mut key)
            .map_err(|e| self.err(e))?;
        let mut edge = self.alloc_words(EDGE_LEVELS * 8)?;
        let mut digests = self.alloc_words(generations as usize * 8)?;
        let mut starts = alloc_uninit::<u64>(self.stream, walkers as usize * 4).map_err(|e| self.err(e))?;
        let mut ends = alloc_uninit::<u64>(self.stream, ends_words).map_err(|e| self.err(e))?;
        let device = self.pool.device;
        let per_generation = walkers as usize * 4;
        let mut queued: VecDeque<CudaEvent> = VecDeque::new();
        for g in 0..generations {
            if g % GENERATIONS_PER_BATCH == 0 {
                cancel.check()?;
                if queued.len() == 2 {
                    let oldest = queued.pop_front().expect("two queued");
                    oldest.synchronize().map_err(|e| self.err(e))?;
                }
            }
            let at = g as usize * per_generation;
            self.walker
                .launch_locality_starts(self.stream, &key, device, g, walkers, &edge, &mut starts)?;
            self.walker.launch_locality_walk(
                self.stream,
                self.states,
                slices,
                &starts,
                walkers,
                walk.steps,
                &mut ends.slice_mut(at..at + per_generation),
            )?;
            self.walker.launch_locality_generation(
                self.stream,
                &key,
                device,
                g,
                walkers,
                &ends.slice(at..at + per_generation),
                &mut digests,
                &mut edge,
            )?;
            if (g + 1) % GENERATIONS_PER_BATCH == 0 {
                queued.push_back(self.mark()?);
            }
        }
        let digests: Vec<Digest> = self
            .download_words(&digests)?
            .chunks_exact(8)
            .map(super::words::digest_from_words)
            .collect();
        let mut end_words = vec![0u64; ends_words];
        self.stream
            .memcpy_dtoh(&ends, &mut end_words)
            .map_err(|e| self.err(e))?;
        self.stream.synchronize().map_err(|e| self.err(e))?;
        let ends = end_words
            .chunks_exact(4)
            .map(|w| State([w[0], w[1], w[2], w[3]]))
            .collect();
        let root = MerkleTree::new(&digests).root();
        Ok(LineWalk {
            walkers,
            ends,
            digests,
            root,
        })
    }

    /// Opens walker `walker` of generation `generation` of `walked` (see the module's header).
    /// `Ok(None)` for a segment outside the walk.
    pub fn open_lines(
        &self,
        walk: &LocalityWalk,
        walked: &LineWalk,
        (generation, walker): (u32, u32),
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
        paths: &ChunkPaths,
    ) -> Result<Option<SegmentOpening>, BackendError> {
        let Some(mut state) = segment_start(walk, walked, self.pool.device, (generation, walker)) else {
            return Ok(None);
        };
        let slices = self.pool.slices();
        let mut fetched = FetchedSlices {
            pool: self.pool,
            slices: HashMap::new(),
            missed: AtomicBool::new(false),
        };
        for _ in 0..walk.steps {
            let line = state.names(slices);
            let slice = match fetched.slices.entry(line.slice) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(new) => new.insert(self.download_slice(line.slice)?),
            };
            state = step(&state, line.of(slice));
            let (chain, _) = self.pool.locate(line.slice);
            paths.keep_state(chain, || self.state_slices(chain))?;
        }
        let opened = open_segment(walk, &fetched, walked, (generation, walker), chain, paths)?;
        if fetched.missed.load(Ordering::SeqCst) {
            return Err(
                self.device_error("a locality opening read a slice its walk on the host had not copied back".into())
            );
        }
        Ok(opened)
    }

    /// Pool slice `e`'s 65536 bytes, copied back.
    fn download_slice(&self, e: u64) -> Result<Vec<u8>, BackendError> {
        let at = e as usize * SLICE_BYTES;
        let mut bytes = vec![0i8; SLICE_BYTES];
        self.stream
            .memcpy_dtoh(&self.states.slice(at..at + SLICE_BYTES), &mut bytes)
            .map_err(|e| self.err(e))?;
        self.stream.synchronize().map_err(|e| self.err(e))?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// State `chain`'s slices by their chaining values, hashed where the state lies: its
    /// chunks' chaining values (blake3.cu's `blake3_chunks`, counted within the state), merged a
    /// level at a time (`blake3_parents`, none of them the root) up to the slices, each a
    /// complete subtree of 64 chunks. A state of one slice needs none.
    fn state_slices(&self, chain: u64) -> Result<StateSlices, BackendError> {
        let per_state = self.pool.slices_per_state();
        let broken = |e: gpu_attest_shared::memory::slice::SliceError| {
            self.device_error(format!("pool state {chain} is not whole slices: {e}"))
        };
        if per_state == 1 {
            return StateSlices::from_cvs(1, Vec::new()).map_err(broken);
        }
        let bytes = self.pool.state_bytes() as usize;
        let at = (chain - self.pool.first_chain) as usize * bytes;
        let chunks = per_state * CHUNKS_PER_SLICE;
        // Written before read: `level` by the chunks' launch, `next` by each parents' launch.
        let mut level = self.alloc_words(chunks as usize * 8)?;
        let mut next = self.alloc_words(chunks.div_ceil(2) as usize * 8)?;
        let threads = AuxModule::Walk.block_threads();
        let grid = |nodes: u64| LaunchConfig {
            grid_dim: (nodes.div_ceil(u64::from(threads)) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // `level` holds `chunks` chaining values; the view is the state's bytes.
        let state = self.states.slice(at..at + bytes);
        let args = Blake3ChunksArgs {
            data: &state,
            matrix_bytes: bytes as u64,
            cvs: &mut level,
        };
        self.walker
            .functions
            .blake3_chunks
            .launch(self.stream, grid(chunks), args)
            .map_err(|e| self.err(e))?;
        let mut nodes = chunks;
        while nodes > per_state {
            // Both hold `nodes` and `nodes / 2` chaining values; never the root: the slices are
            // at least two.
            let args = Blake3ParentsArgs {
                input: &level,
                out: &mut next,
                in_count: nodes,
                root: 0,
            };
            self.walker
                .functions
                .blake3_parents
                .launch(self.stream, grid(nodes.div_ceil(2)), args)
                .map_err(|e| self.err(e))?;
            std::mem::swap(&mut level, &mut next);
            nodes = nodes.div_ceil(2);
        }
        let words = self.download_words(&level)?;
        let cvs = words[..per_state as usize * 8]
            .chunks_exact(8)
            .map(|w| super::words::digest_from_words(w).0)
            .collect();
        StateSlices::from_cvs(per_state, cvs).map_err(broken)
    }
}

/// The slices an opening's walk on the host copied back: all that `open_segment`, walking the
/// same segment again, reads.
struct FetchedSlices {
    pool: ChainPool,
    slices: HashMap<u64, Vec<u8>>,
    /// Set if a slice was read that was not copied back: the opening is then refused, not sent.
    missed: AtomicBool,
}

impl SliceSource for FetchedSlices {
    fn pool(&self) -> &ChainPool {
        &self.pool
    }

    fn slice(&self, e: u64) -> &[u8] {
        static NONE: [u8; SLICE_BYTES] = [0; SLICE_BYTES];
        match self.slices.get(&e) {
            Some(slice) => slice,
            None => {
                self.missed.store(true, Ordering::SeqCst);
                &NONE
            }
        }
    }
}

impl super::device::DeviceRuntime {
    /// The locality walk and its openings on this device against the CPU's (`self_check`), once
    /// per runtime; the pools kept here share the outcome, and a pool whose runtime never ran it
    /// runs it before its first locality walk.
    pub fn check_locality(&self) -> Result<(), String> {
        let walker = self.walker().map_err(|e| e.to_string())?;
        self.locality_checked
            .get_or_init(|| self_check(&self.stream, &walker, self.index))
            .clone()
    }
}

/// The locality walk and three openings on the device against the CPU's, bit for bit: three
/// states of n = 512 (four slices each, so that the openings hash slices on the device; one
/// state all -128, one all 127), 70 walkers a generation (a leaf message of three chunks, the
/// third promoted a level), five generations (starts from one and two of the tree's nodes) of
/// 33 steps. `Err` says what differed or why it could not run.
pub(crate) fn self_check(
    stream: &std::sync::Arc<CudaStream>,
    walker: &DeviceWalker,
    device: u32,
) -> Result<(), String> {
    use gpu_attest_shared::memory::locality::walk_lines;
    let pool = ChainPool::new(device, 0, 3, 512).map_err(|e| e.to_string())?;
    let (bytes, held) = super::states::self_check_states(pool);
    let failed = |e: BackendError| format!("the self-check could not run: {e}");
    let mut states = alloc_uninit::<i8>(stream, bytes.len()).map_err(|e| failed(backend_error(device, e)))?;
    stream
        .memcpy_htod(bytemuck::cast_slice::<u8, i8>(&bytes), &mut states)
        .map_err(|e| failed(backend_error(device, e)))?;
    let on_device = StatesOnDevice {
        stream,
        walker,
        states: &states,
        pool,
        limits: Default::default(),
    };
    let walk = LocalityWalk {
        nonce: [1; 32],
        seed: [2; 32],
        global: Digest::hash(b"the locality walk's self-check"),
        walkers: 70,
        generations: 5,
        steps: 33,
    };
    let want = walk_lines(&walk, &held, &CancelToken::new()).map_err(failed)?;
    let got = on_device.walk_lines(&walk, &CancelToken::new()).map_err(failed)?;
    if got != want {
        return Err("the locality walk differs from the CPU's".into());
    }
    let no_chain = |_: u64| (Vec::new(), MerkleProof::default());
    let (device_paths, host_paths) = (ChunkPaths::default(), ChunkPaths::default());
    for segment in [(0, 0), (4, 69), (2, 35)] {
        let opened = on_device
            .open_lines(&walk, &got, segment, &no_chain, &device_paths)
            .map_err(failed)?;
        let expected = open_segment(&walk, &held, &want, segment, &no_chain, &host_paths).map_err(failed)?;
        if opened.is_none() || opened != expected {
            return Err(format!(
                "the opening of generation {}, walker {} differs from the CPU's",
                segment.0, segment.1
            ));
        }
    }
    Ok(())
}
