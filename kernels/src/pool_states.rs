//! Version 4's pool on a GPU (PROTOCOL.md 20): the final states of the device's pool chains,
//! kept in its memory by the chain pipeline (`DeviceRuntime::run_pool_chains`), walked there
//! and opened there. Nothing of the pool passes through the host on the way to the walk root:
//!
//! 1. each launch of `kernels/cuda/walk.cu` takes every walker a number of steps under version
//!    4's domain and writes every state (a checkpoint every step);
//! 2. `kernels/cuda/walk_tree.cu` folds the launch's states into blocks of 64 (each block's
//!    first state and node: the kept trace a miner opens from), and after the last launch each
//!    walker's blocks into its root;
//! 3. the walker roots (32 bytes a walker) come back, the host makes the walk root over them and
//!    hands it on to be signed, and only then are the kept traces copied back.
//!
//! An opening walks the blocks it needs again on the device (one walker, at most 63 steps a
//! block) and copies back the one state whose slice it opens, to cut the slice's path.

use super::device::{DeviceRuntime, free_after_sync};
use super::states::{StateWalkLimits, StatesOnDevice, self_check_states};
use super::walk::{DeviceWalker, TREE_BLOCK_STATES, tree_blocks};
use super::words::{digest_from_words, key_words};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use gpu_attest_shared::backend::{BackendError, CancelToken, PoolStates};
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::locality::{ChunkPaths, LineWalk, LocalityWalk, SegmentOpening};
use gpu_attest_shared::memory::slice::{SLICE_BYTES, SlicePath, slice_path};
use gpu_attest_shared::memory::slice_walk::{
    DeviceWalk, KeptTrace, OpenSource, SliceWalk, StepOpening, open_kept_step, walk_device,
};
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Most steps in one launch, whatever the walkers (few walkers walk slowly).
const MAX_STEPS_PER_LAUNCH: u32 = 4096;

/// Steps per launch of a walk of `walkers` walkers and `walk_steps` steps: a multiple of 64
/// (the tree's blocks end inside a launch), at least 64, within both limits where 64 is.
fn steps_per_launch(walkers: u32, walk_steps: u32, launch_bytes: u64, states_bytes: u64) -> u32 {
    let by_bytes = launch_bytes / (u64::from(walkers) * SLICE_BYTES as u64);
    let by_states = states_bytes / (u64::from(walkers) * 32);
    let most = by_bytes
        .min(by_states)
        .min(u64::from(MAX_STEPS_PER_LAUNCH))
        .min(u64::from(walk_steps)) as u32;
    (most / TREE_BLOCK_STATES).max(1) * TREE_BLOCK_STATES
}

/// One launch: steps `first_step..first_step + steps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Launch {
    first_step: u32,
    steps: u32,
}

/// The walk's launches: `per_launch` steps each (a multiple of 64), the last taking the rest.
fn launches(walk_steps: u32, per_launch: u32) -> Vec<Launch> {
    (0..walk_steps)
        .step_by(per_launch as usize)
        .map(|first_step| Launch {
            first_step,
            steps: per_launch.min(walk_steps - first_step),
        })
        .collect()
}

/// A device's version 4 pool in its GPU's memory.
pub struct CudaPoolStates {
    pool: ChainPool,
    /// The states side by side, state k of the pool at byte `k * n^2`: slice `e` is at byte
    /// `e * 65536`, as the walk kernel reads entries. `None` once dropped.
    states: Option<CudaSlice<i8>>,
    stream: Arc<CudaStream>,
    walker: DeviceWalker,
    limits: StateWalkLimits,
    /// Whether the runtime the states were made on is still the device's (as `CudaPool`'s).
    runtime_open: Arc<AtomicBool>,
    /// The locality walk's self-check on that runtime (`DeviceRuntime::check_locality`).
    locality_checked: Arc<std::sync::OnceLock<Result<(), String>>>,
    /// Whether the miner walks lines on its GPUs (`CudaOptions::locality_walk`).
    locality_walk: bool,
}

/// Device memory a walk of `walkers` walkers and `walk_steps` steps takes beside the states:
/// the walkers' states (three copies), one launch's states, and the kept traces (block starts
/// and nodes). Not the tree kernels' local memory (their right edges, up to 512 bytes a thread
/// for every thread the GPU holds at once: 138 MB on an H100): the driver reserved it when the
/// version 4 self-check launched them at start, and keeps it, so it is already out of what is
/// free.
pub fn walk_buffer_bytes(walkers: u32, walk_steps: u32) -> u64 {
    let limits = StateWalkLimits::default();
    let per_launch = steps_per_launch(walkers, walk_steps, limits.launch_bytes, limits.states_bytes);
    let walkers = u64::from(walkers);
    let trees = 2 * walkers * u64::from(tree_blocks(walk_steps)) * 32;
    3 * walkers * 32 + walkers * u64::from(per_launch) * 32 + trees
}

impl DeviceRuntime {
    /// Why `pool`'s states, with `beside` bytes more (the walk's buffers, where known), do not
    /// fit in this device's free memory beside one chain's batch at `n` and the reserve kept
    /// beside a pool (`plan::POOL_RESERVE_BYTES`, as version 3's).
    pub(crate) fn chain_pool_room(&self, pool: &ChainPool, beside: u64) -> Result<(), BackendError> {
        let bytes = pool.chains.saturating_mul(pool.state_bytes());
        let free = self.free_memory()?;
        let left = free.saturating_sub(bytes.saturating_add(beside));
        super::plan::batch_size_beside(self.index, pool.n, 1, left, super::plan::POOL_RESERVE_BYTES)
            .map(|_| ())
            .map_err(|_| BackendError::OutOfMemory {
                device: self.index,
                detail: format!(
                    "the challenge's pool of {} MiB ({} final states of n = {}), {} MiB for its walk, and one \
                     chain of n = {} with the {} MiB kept in reserve do not fit in the {} MiB free; the pool is a \
                     share of the memory this device claims, so anything else holding its memory (another \
                     process, a MIG slice) makes the claim fail",
                    bytes >> 20,
                    pool.chains,
                    pool.n,
                    beside >> 20,
                    pool.n,
                    super::plan::POOL_RESERVE_BYTES >> 20,
                    free >> 20
                ),
            })
    }

    /// Room for `pool`'s states in this device's memory, with the walk kernels loaded first (a
    /// device that cannot walk should not run its chains to find out).
    pub(crate) fn pool_states(&self, pool: ChainPool) -> Result<CudaPoolStates, BackendError> {
        let walker = self.walker()?;
        self.chain_pool_room(&pool, 0)?;
        let len =
            usize::try_from(pool.chains.saturating_mul(pool.state_bytes())).map_err(|_| BackendError::OutOfMemory {
                device: self.index,
                detail: format!(
                    "a pool of {} states of n = {} is past this host's address space",
                    pool.chains, pool.n
                ),
            })?;
        Ok(CudaPoolStates {
            pool,
            states: Some(self.alloc(len)?),
            stream: Arc::clone(&self.stream),
            walker,
            limits: StateWalkLimits::default(),
            runtime_open: Arc::clone(&self.open),
            locality_checked: Arc::clone(&self.locality_checked),
            locality_walk: self.locality_walk,
        })
    }
}

impl DeviceRuntime {
    /// Version 4's walk and openings on this device against the CPU's, bit for bit: a pool of
    /// 37 states at n = 256 (two of them the int8 extremes), 300 walkers of 300 steps in
    /// launches of 128, 128 and 44 (each launch folding two blocks, the walk's first states
    /// carried from launch to launch, the last block partial), every walker's kept trace and
    /// root, the walk root, and four openings (one whose two states lie in different blocks).
    /// What the chain pipeline keeps is checked by the GPU tests (tests/cuda_backend.rs).
    pub fn v4_walk_matches_cpu(&self) -> Result<bool, BackendError> {
        const SLICES: usize = 37;
        let pool = ChainPool::new(self.index, 0, SLICES as u64, 256).map_err(|e| BackendError::Device {
            device: self.index,
            detail: e.to_string(),
        })?;
        let (bytes, held) = self_check_states(pool);
        let mut device = self.pool_states(pool)?.with_walk_limits(StateWalkLimits {
            launch_bytes: 1 << 38,
            states_bytes: 300 * 128 * 32,
        });
        self.upload(bytemuck::cast_slice(&bytes), device.device_states_mut())?;
        let walk = SliceWalk {
            nonce: [1; 32],
            walk_seed: [2; 32],
            global: Digest::hash(b"the version 4 walk's self-check"),
            walkers: 300,
            steps: 300,
        };
        let told = std::sync::Mutex::new(None);
        let got = device.walk(&walk, &CancelToken::new(), &|root| {
            *told.lock().unwrap_or_else(|p| p.into_inner()) = Some(root)
        })?;
        let want = walk_device(&walk, &held);
        let told = *told.lock().unwrap_or_else(|p| p.into_inner());
        if got != want || told != Some(want.root) {
            return Ok(false);
        }
        let no_chain = |_: u64| (Vec::new(), MerkleProof::default());
        for (walker, step) in [(0, 0), (7, 127), (150, 200), (299, 299)] {
            let opened = device.open(&walk, &got, walker, step, &no_chain)?;
            if opened.is_none() || opened != open_kept_step(&walk, &held, &want, walker, step, no_chain)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl CudaPoolStates {
    /// The same states, walked in launches of other sizes: the GPU tests walk small pools in
    /// several.
    pub fn with_walk_limits(mut self, limits: StateWalkLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The states where the device holds them, for the chain pipeline to copy into.
    pub(crate) fn device_states_mut(&mut self) -> &mut CudaSlice<i8> {
        self.states.as_mut().expect("taken only on drop")
    }

    /// An error if the device was reset since the states were kept: they are gone.
    fn check_open(&self) -> Result<(), BackendError> {
        if self.runtime_open.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(BackendError::Device {
                device: self.pool.device,
                detail: "the device faulted after this pool was kept; its context, and the pool with it, are gone"
                    .into(),
            })
        }
    }

    /// The states as the walk and the openings read them.
    fn on_device(&self) -> Result<StatesOnDevice<'_>, BackendError> {
        self.check_open()?;
        Ok(StatesOnDevice {
            stream: &self.stream,
            walker: &self.walker,
            states: self.states.as_ref().expect("taken only on drop"),
            pool: self.pool,
            limits: self.limits,
        })
    }
}

impl StatesOnDevice<'_> {
    /// Refuses a walk the kernels cannot take over this pool, in words.
    fn check_walk(&self, walk: &SliceWalk) -> Result<(), BackendError> {
        let fits = (1..=gpu_attest_shared::memory::params::MAX_WALKERS).contains(&walk.walkers)
            && (1..=gpu_attest_shared::memory::chain_pool::MAX_WALK_STEPS).contains(&walk.steps);
        if fits {
            Ok(())
        } else {
            Err(self.device_error(format!(
                "a walk of {} walkers and {} steps is outside what version 4 allows",
                walk.walkers, walk.steps
            )))
        }
    }

    /// Version 4's walk of `walk` over these states (see the module's header), `ended` told the
    /// walk root before the kept traces are copied back.
    pub fn walk(
        &self,
        walk: &SliceWalk,
        cancel: &CancelToken,
        ended: &(dyn Fn(Digest) + Sync),
    ) -> Result<DeviceWalk, BackendError> {
        self.check_walk(walk)?;
        let (walkers, walk_steps) = (walk.walkers, walk.steps);
        let blocks = tree_blocks(walk_steps) as usize;
        let tree_words = walkers as usize * blocks * 8;
        let per_launch = self.launch_steps(walkers, walk_steps, tree_words)?;
        let words = walkers as usize * 8;
        // Written before read: `states` by the upload below, `firsts` by the copy before each
        // launch, `launch_states` by each walk launch before its tree launch reads it, the
        // trees by the tree launches (every block of every walker once), `roots` by walk_roots.
        let mut states = self.alloc_words(words)?;
        let mut firsts = self.alloc_words(words)?;
        let mut launch_states = self.alloc_words(words * per_launch as usize)?;
        let mut block_starts = self.alloc_words(tree_words)?;
        let mut block_nodes = self.alloc_words(tree_words)?;
        let mut roots = self.alloc_words(words)?;
        let starts: Vec<u32> = (0..walkers)
            .flat_map(|w| key_words(&walk.start_state(self.pool.device, w).0))
            .collect();
        self.stream.memcpy_htod(&starts, &mut states).map_err(|e| self.err(e))?;
        let slices = self.pool.slices();
        // At most two launches queued: the device never waits for the host, and a cancel stops
        // the walk within two launches.
        let mut queued: VecDeque<CudaEvent> = VecDeque::new();
        for launch in launches(walk_steps, per_launch) {
            cancel.check()?;
            if queued.len() == 2 {
                let oldest = queued.pop_front().expect("two queued");
                oldest.synchronize().map_err(|e| self.err(e))?;
            }
            self.stream.memcpy_dtod(&states, &mut firsts).map_err(|e| self.err(e))?;
            let len = words * launch.steps as usize;
            let mut written = launch_states.slice_mut(0..len);
            self.walker.launch(
                self.stream,
                self.states,
                slices,
                &mut states,
                launch.first_step,
                launch.steps,
                1,
                &mut written,
                walkers,
                4,
            )?;
            self.walker.launch_blocks(
                self.stream,
                &firsts,
                &launch_states.slice(0..len),
                launch.first_step,
                launch.steps,
                walk_steps,
                walkers,
                &mut block_starts,
                &mut block_nodes,
            )?;
            queued.push_back(self.mark()?);
        }
        self.walker
            .launch_roots(self.stream, &block_nodes, walk_steps, walkers, &mut roots)?;
        let walker_roots = digests(&self.download_words(&roots)?);
        let root = MerkleTree::new(&walker_roots).root();
        // The root is signed and sent before the kept traces cross to the host.
        ended(root);
        let kept = self.kept_traces(&block_starts, &block_nodes, blocks)?;
        Ok(DeviceWalk::new(walker_roots, root, kept))
    }

    /// Steps each walk launch takes: within the launch limit, and with the launch's states
    /// within what is free beside the walk's two trees (the states limit, at most).
    fn launch_steps(&self, walkers: u32, walk_steps: u32, tree_words: usize) -> Result<u32, BackendError> {
        let free = free_after_sync(self.stream.context(), self.pool.device)?;
        Ok(steps_per_launch(
            walkers,
            walk_steps,
            self.limits.launch_bytes,
            self.limits
                .states_bytes
                .min(free.saturating_sub(2 * tree_words as u64 * 4) / 4),
        ))
    }

    /// Each walker's kept trace, `blocks` block starts and nodes, from the tree launches'
    /// buffers.
    fn kept_traces(
        &self,
        block_starts: &CudaSlice<u32>,
        block_nodes: &CudaSlice<u32>,
        blocks: usize,
    ) -> Result<Vec<KeptTrace>, BackendError> {
        let starts = digests(&self.download_words(block_starts)?);
        let nodes = digests(&self.download_words(block_nodes)?);
        Ok(starts
            .chunks(blocks)
            .zip(nodes.chunks(blocks))
            .map(|(starts, nodes)| KeptTrace {
                block_starts: starts.to_vec(),
                block_nodes: nodes.to_vec(),
            })
            .collect())
    }
}

/// `digests` of 8 little-endian words each, as the kernels write them.
fn digests(words: &[u32]) -> Vec<Digest> {
    words.chunks_exact(8).map(digest_from_words).collect()
}

impl PoolStates for CudaPoolStates {
    fn pool(&self) -> &ChainPool {
        &self.pool
    }

    fn walk(
        &self,
        walk: &SliceWalk,
        cancel: &CancelToken,
        ended: &(dyn Fn(Digest) + Sync),
    ) -> Result<DeviceWalk, BackendError> {
        self.on_device()?.walk(walk, cancel, ended)
    }

    fn open(
        &self,
        walk: &SliceWalk,
        walked: &DeviceWalk,
        walker: u32,
        step: u32,
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Result<Option<StepOpening>, BackendError> {
        open_kept_step(walk, &self.on_device()?, walked, walker, step, chain)
    }

    /// On the device (`crate::locality`), where the miner walks lines on its GPUs and the
    /// locality walk has passed its self-check on this runtime (run here if it has not yet).
    /// Otherwise [`BackendError::Unsupported`]: the miner answers that it cannot walk lines, and
    /// the verdict states no locality bound, as for a miner of an earlier release.
    fn walk_lines(&self, walk: &LocalityWalk, cancel: &CancelToken) -> Result<LineWalk, BackendError> {
        if !self.locality_walk {
            return Err(BackendError::Unsupported {
                what: "walk lines on a GPU: the miner's gpu_locality_walk is off (on by default)",
            });
        }
        let states = self.on_device()?;
        let checked = self
            .locality_checked
            .get_or_init(|| crate::locality::self_check(states.stream, states.walker, self.pool.device));
        if checked.is_err() {
            return Err(BackendError::Unsupported {
                what: "walk lines on this GPU: its locality walk did not match the CPU's in the self-check (the miner's start-up notes and `miner bench` say how)",
            });
        }
        states.walk_lines(walk, cancel)
    }

    fn open_lines(
        &self,
        walk: &LocalityWalk,
        walked: &LineWalk,
        segment: (u32, u32),
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
        paths: &ChunkPaths,
    ) -> Result<Option<SegmentOpening>, BackendError> {
        self.on_device()?.open_lines(walk, walked, segment, chain, paths)
    }
}

/// An opening's blocks are walked again on the device, and its slice's state copied back.
impl OpenSource for StatesOnDevice<'_> {
    fn pool(&self) -> &ChainPool {
        &self.pool
    }

    fn rewalk(&self, walk: &SliceWalk, start: Digest, first: u32, count: u32) -> Result<Vec<Digest>, BackendError> {
        let steps = count.saturating_sub(1).min(walk.steps.saturating_sub(first));
        let mut states = vec![start];
        if steps == 0 {
            return Ok(states);
        }
        // Written before read: `state` by the upload, `trace` by the walk launch.
        let mut state = self.alloc_words(8)?;
        let mut trace = self.alloc_words(8 * steps as usize)?;
        self.stream
            .memcpy_htod(&key_words(&start.0), &mut state)
            .map_err(|e| self.err(e))?;
        self.walker.launch(
            self.stream,
            self.states,
            self.pool.slices(),
            &mut state,
            first,
            steps,
            1,
            &mut trace.as_view_mut(),
            1,
            4,
        )?;
        states.extend(digests(&self.download_words(&trace)?));
        Ok(states)
    }

    fn slice_and_path(&self, e: u64) -> Result<(Vec<u8>, SlicePath), BackendError> {
        let (chain, q) = self.pool.locate(e);
        let bytes = self.pool.state_bytes() as usize;
        let at = (chain - self.pool.first_chain) as usize * bytes;
        let mut state = vec![0i8; bytes];
        self.stream
            .memcpy_dtoh(&self.states.slice(at..at + bytes), &mut state)
            .map_err(|e| self.err(e))?;
        self.stream.synchronize().map_err(|e| self.err(e))?;
        let state: &[u8] = bytemuck::cast_slice(&state);
        let path = slice_path(state, q).map_err(|e| self.device_error(format!("pool state {chain}: {e}")))?;
        let from = q as usize * SLICE_BYTES;
        Ok((state[from..from + SLICE_BYTES].to_vec(), path))
    }
}

/// As `CudaPool`'s: the memory goes back in the stream's order, waited for, so that the next
/// challenge sizes its batches from what is really free.
impl Drop for CudaPoolStates {
    fn drop(&mut self) {
        let states = self.states.take();
        if self.check_open().is_err() {
            // Freed with its context by the reset; freeing it again could name the fresh one's.
            std::mem::forget(states);
            return;
        }
        drop(states);
        let _ = self.stream.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Launches cover the walk once, in order, every one but the last a whole number of blocks,
    /// and none past either limit where a block's worth fits.
    #[test]
    fn launches_cover_the_walk_in_whole_blocks_within_both_limits() {
        let defaults = StateWalkLimits::default();
        for (walkers, walk_steps) in [(8192u32, 9304u32), (1, 63), (3, 150), (65536, 1 << 20), (100, 64)] {
            for states_bytes in [defaults.states_bytes, 1 << 20, 0] {
                let per = steps_per_launch(walkers, walk_steps, defaults.launch_bytes, states_bytes);
                assert!(per >= TREE_BLOCK_STATES && per.is_multiple_of(TREE_BLOCK_STATES));
                let fits_a_block = u64::from(walkers) * u64::from(TREE_BLOCK_STATES) * 32 <= states_bytes;
                if fits_a_block {
                    assert!(
                        u64::from(walkers) * u64::from(per) * 32 <= states_bytes,
                        "{walkers} x {per}"
                    );
                }
                let all = launches(walk_steps, per);
                let mut next = 0;
                for (i, l) in all.iter().enumerate() {
                    assert_eq!(l.first_step, next);
                    assert!(l.steps > 0);
                    if i + 1 < all.len() {
                        assert!(
                            l.steps.is_multiple_of(TREE_BLOCK_STATES),
                            "only the last launch is partial"
                        );
                    }
                    next += l.steps;
                }
                assert_eq!(next, walk_steps);
            }
        }
        // The default walk on a large GPU: launches of 128 steps (32 MiB of states at 8192
        // walkers; 2^38 bytes would allow 512).
        assert_eq!(
            steps_per_launch(8192, 9304, defaults.launch_bytes, defaults.states_bytes),
            128
        );
    }
}
