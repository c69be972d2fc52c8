//! A device's pool held on its GPU (PROTOCOL.md 18.2 to 18.5): filled by the chain pipeline at
//! n = 256 straight into device memory, walked there by `kernels/cuda/walk.cu`, and opened entry by
//! entry. The pool never passes through the host: only its leaves (32 bytes an entry), the walk's
//! checkpoints and the few entries an opening carries come back.

use super::device::{DeviceRuntime, backend_error, free_after_sync};
use super::plan;
use super::raw::device_memory::alloc_uninit;
use super::walk::DeviceWalker;
use super::words::{digest_from_words, key_words};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, sys};
use gpu_attest_shared::backend::{BackendError, CancelToken, ResidentPool};
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::memory::check::CommittedEntries;
use gpu_attest_shared::memory::pool::no_such_entry;
use gpu_attest_shared::memory::walk::{DeviceWalk, WalkSpec, WalkerTrace};
use gpu_attest_shared::memory::{ENTRY_BYTES, MemoryParams, PoolSpec};
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use std::borrow::Cow;
use std::sync::Arc;

/// Most steps in one launch, whatever the walkers (few walkers make short launches anyway).
const MAX_STEPS_PER_LAUNCH: u32 = 4096;

/// How a walk is cut up on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkLimits {
    /// Most bytes one launch reads, `W * steps * 65536`.
    pub launch_bytes: u64,
    /// Most device memory the walk's checkpoints hold at once (and at most half of what is
    /// free beside the pool); more come back in rounds.
    pub checkpoint_bytes: u64,
}

impl Default for WalkLimits {
    /// 2^38 bytes a launch is 0.08 s on an H100 and under a second at 300 GB/s: short of a
    /// display GPU's watchdog, and a cancel is seen within two launches. The default walk (8192
    /// walkers, about 1200 segments) has 300 MiB of checkpoints: on a large GPU they come back
    /// in one copy at the end. Between rounds the device waits for the copy (tens of ms), which
    /// the walk's time includes, so rounds are for small GPUs, where half the memory left
    /// beside the pool is less.
    fn default() -> Self {
        WalkLimits {
            launch_bytes: 1 << 38,
            checkpoint_bytes: 1 << 30,
        }
    }
}

/// One launch of the walk kernel: steps `first_step..first_step + steps` of every walker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Launch {
    first_step: u32,
    steps: u32,
}

/// The walk of `params` cut into launches, and the launches into rounds whose checkpoints fit
/// in a buffer of `buffer_segments` segments per walker: one copy to the host per round.
/// Every launch starts on a checkpoint and takes whole segments, so the checkpoints it writes
/// are the walk's `s_{w, q c_w}`.
fn walk_rounds(params: &MemoryParams, launch_bytes: u64, buffer_segments: u32) -> Vec<Vec<Launch>> {
    let every = params.walk_checkpoint_every;
    let by_bytes = launch_bytes / (u64::from(params.walkers) * ENTRY_BYTES as u64);
    let segments_per_launch = (by_bytes.min(u64::from(MAX_STEPS_PER_LAUNCH)) as u32 / every)
        .min(buffer_segments)
        .max(1);
    let buffer_segments = buffer_segments.max(segments_per_launch);
    let mut rounds: Vec<Vec<Launch>> = Vec::new();
    let mut round_segments = buffer_segments;
    let mut step = 0;
    while step < params.walk_steps {
        let steps = (segments_per_launch * every).min(params.walk_steps - step);
        if round_segments + steps / every > buffer_segments {
            rounds.push(Vec::new());
            round_segments = 0;
        }
        rounds.last_mut().expect("a round was just started").push(Launch {
            first_step: step,
            steps,
        });
        round_segments += steps / every;
        step += steps;
    }
    rounds
}

/// Appends a round's checkpoints, as the device wrote them, to each walker's trace: launch by
/// launch, each launch's part laid out `[walker][its segments]`, 8 little-endian words a state.
fn gather_round(traces: &mut [Vec<Digest>], words: &[u32], round: &[Launch], every: u32) {
    let walkers = traces.len();
    let mut at = 0;
    for launch in round {
        let segments = (launch.steps / every) as usize;
        for (walker, trace) in traces.iter_mut().enumerate() {
            for q in 0..segments {
                let from = at + (walker * segments + q) * 8;
                trace.push(digest_from_words(&words[from..from + 8]));
            }
        }
        at += walkers * segments * 8;
    }
}

/// A pool in one GPU's memory, walked and opened on that GPU's main stream (after anything
/// queued there before, so never beside the device's chains).
pub struct CudaPool {
    spec: PoolSpec,
    tree: MerkleTree,
    /// P entries of 65536 bytes, entry e at byte e * 65536; `None` once dropped.
    entries: Option<CudaSlice<i8>>,
    stream: Arc<CudaStream>,
    walker: DeviceWalker,
    /// The device's partition index, for errors.
    device: u32,
    limits: WalkLimits,
    /// Whether the runtime the pool was made on is still the device's (`DeviceRuntime::open`):
    /// after a fault and a reset, the pool's memory and stream went with the old context.
    runtime_open: Arc<std::sync::atomic::AtomicBool>,
}

impl DeviceRuntime {
    /// Fills `spec`'s pool in this device's memory (PROTOCOL.md 18.2).
    pub(crate) fn fill_pool(
        &self,
        spec: &PoolSpec,
        progress: &(dyn Fn(u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<CudaPool, BackendError> {
        // Loaded first: a device that cannot walk should not spend its fill finding out.
        let walker = self.walker()?;
        let len = self.pool_room(spec)?;
        let mut entries = self.alloc(len)?;
        let leaves = self.make_entries(spec.key(), 0..spec.entries(), &mut entries, progress, cancel)?;
        self.synchronize()?;
        Ok(CudaPool {
            spec: spec.clone(),
            tree: MerkleTree::new(&leaves),
            entries: Some(entries),
            stream: Arc::clone(&self.stream),
            walker,
            device: self.index,
            limits: WalkLimits::default(),
            runtime_open: Arc::clone(&self.open),
        })
    }

    /// The pool's length in bytes if it fits in this device's free memory beside the reserve
    /// that the fill's batches and the walk need; why not, if it does not.
    pub(crate) fn pool_room(&self, spec: &PoolSpec) -> Result<usize, BackendError> {
        let bytes = spec.bytes();
        let free = self.free_memory()?;
        let len = usize::try_from(bytes)
            .ok()
            .filter(|_| bytes.saturating_add(plan::POOL_RESERVE_BYTES) <= free);
        len.ok_or_else(|| BackendError::OutOfMemory {
            device: self.index,
            detail: format!(
                "the challenge's pool of {} MiB ({} entries) and the {} MiB kept in reserve do not fit in the \
                 {} MiB free; the pool is a share of the memory this device claims, so anything else holding \
                 its memory (another process, a MIG slice) makes the claim fail",
                bytes >> 20,
                spec.entries(),
                plan::POOL_RESERVE_BYTES >> 20,
                free >> 20
            ),
        })
    }
}

impl CudaPool {
    /// The same pool, walked in launches and rounds of other sizes: the GPU tests walk small
    /// pools in several of each.
    pub fn with_walk_limits(mut self, limits: WalkLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The entries where the device holds them, for the walk bench's own launches.
    pub(super) fn device_entries(&self) -> &CudaSlice<i8> {
        self.entries.as_ref().expect("taken only on drop")
    }

    fn err(&self, e: cudarc::driver::DriverError) -> BackendError {
        backend_error(self.device, e)
    }

    /// An error if the device was reset since the pool was made: its entries are gone.
    fn check_open(&self) -> Result<(), BackendError> {
        if self.runtime_open.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err(BackendError::Device {
                device: self.device,
                detail: "the device faulted after this pool was made; its context, and the pool with it, are gone"
                    .into(),
            })
        }
    }

    fn mark(&self) -> Result<CudaEvent, BackendError> {
        self.stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| self.err(e))
    }

    /// Segments per walker the checkpoint buffer holds: at most the limit's bytes and half of
    /// what is free beside the pool.
    fn buffer_segments(&self, walkers: u32) -> Result<u32, BackendError> {
        let free = free_after_sync(self.stream.context(), self.device)?;
        let bytes = self.limits.checkpoint_bytes.min(free / 2);
        Ok((bytes / (u64::from(walkers) * 32)).min(u64::from(u32::MAX)) as u32)
    }
}

impl CudaPool {
    /// A walk this pool can take: the pool still open, the walk's parameters within PROTOCOL.md
    /// 18.1, and over this device's pool of these entries.
    fn check_walk(&self, walk: &WalkSpec) -> Result<(), BackendError> {
        self.check_open()?;
        walk.params.validate().map_err(|e| BackendError::Device {
            device: self.device,
            detail: format!("a walk of {e}"),
        })?;
        if walk.entries != self.spec.entries() || walk.device != self.spec.device() {
            return Err(BackendError::Device {
                device: self.device,
                detail: format!(
                    "a walk over device {}'s {} entries asked of device {}'s pool of {}",
                    walk.device,
                    walk.entries,
                    self.spec.device(),
                    self.spec.entries()
                ),
            });
        }
        Ok(())
    }
}

impl ResidentPool for CudaPool {
    fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    fn root(&self) -> Digest {
        self.tree.root()
    }

    fn walk(&self, walk: &WalkSpec, cancel: &CancelToken) -> Result<DeviceWalk, BackendError> {
        self.check_walk(walk)?;
        let params = walk.params;
        let (walkers, every) = (params.walkers, params.walk_checkpoint_every);
        let rounds = walk_rounds(&params, self.limits.launch_bytes, self.buffer_segments(walkers)?);
        let most_segments = rounds
            .iter()
            .map(|round| round.iter().map(|l| l.steps / every).sum::<u32>())
            .max()
            .unwrap_or(0);
        let words_per_segment = walkers as usize * 8;
        // Undefined contents are enough: both are written before they are read, the states by
        // the copy just below, the checkpoints by the launches of a round before that round's
        // copy reads them.
        let mut states = alloc_uninit::<u32>(&self.stream, words_per_segment).map_err(|e| self.err(e))?;
        let mut checkpoints =
            alloc_uninit::<u32>(&self.stream, words_per_segment * most_segments as usize).map_err(|e| self.err(e))?;
        let starts: Vec<Digest> = (0..walkers).map(|w| walk.start_state(w)).collect();
        let start_words: Vec<u32> = starts.iter().flat_map(|s| key_words(&s.0)).collect();
        self.stream
            .memcpy_htod(&start_words, &mut states)
            .map_err(|e| self.err(e))?;
        let mut traces: Vec<Vec<Digest>> = starts
            .into_iter()
            .map(|start| {
                let mut trace = Vec::with_capacity(params.walk_segments() as usize + 1);
                trace.push(start);
                trace
            })
            .collect();
        for round in &rounds {
            // At most two launches queued: the device never waits for the host, and a cancel
            // stops the walk within two launches.
            let mut queued: std::collections::VecDeque<CudaEvent> = std::collections::VecDeque::new();
            let mut at = 0;
            for launch in round {
                cancel.check()?;
                if queued.len() == 2 {
                    let oldest = queued.pop_front().expect("two queued");
                    oldest.synchronize().map_err(|e| self.err(e))?;
                }
                let len = words_per_segment * (launch.steps / every) as usize;
                self.walker.launch(
                    &self.stream,
                    self.device_entries(),
                    self.spec.entries(),
                    &mut states,
                    launch.first_step,
                    launch.steps,
                    every,
                    &mut checkpoints.slice_mut(at..at + len),
                    walkers,
                    3,
                )?;
                queued.push_back(self.mark()?);
                at += len;
            }
            let mut words = vec![0u32; at];
            self.stream
                .memcpy_dtoh(&checkpoints.slice(0..at), &mut words)
                .map_err(|e| self.err(e))?;
            self.stream.synchronize().map_err(|e| self.err(e))?;
            gather_round(&mut traces, &words, round, every);
        }
        Ok(DeviceWalk::new(
            traces
                .into_iter()
                .enumerate()
                .map(|(walker, checkpoints)| WalkerTrace {
                    walker: walker as u32,
                    checkpoints,
                })
                .collect(),
        ))
    }

    fn committed(&self) -> &dyn CommittedEntries {
        self
    }
}

/// The pool's memory is freed in its stream's order; waiting for that here gives it back to the
/// device before the next challenge sizes its batches from the free memory (and it is the
/// memory the next pool is made in).
impl Drop for CudaPool {
    fn drop(&mut self) {
        let entries = self.entries.take();
        if self.check_open().is_err() {
            // Freed with its context by the reset; freeing it again, on a stream of that context,
            // could name memory of the fresh one.
            std::mem::forget(entries);
            return;
        }
        drop(entries);
        // A device that faulted has nothing to give back; its error is reported where it is used.
        let _ = self.stream.synchronize();
    }
}

/// An opening's entries come from device memory, one 64 KiB copy each.
impl CommittedEntries for CudaPool {
    fn entry(&self, entry: u64) -> Result<(Cow<'_, [u8]>, MerkleProof), BackendError> {
        self.check_open()?;
        let proof = self
            .tree
            .proof(entry)
            .filter(|_| entry < self.spec.entries())
            .ok_or_else(|| no_such_entry(&self.spec, entry))?;
        let at = entry as usize * ENTRY_BYTES;
        let mut bytes = vec![0i8; ENTRY_BYTES];
        self.stream
            .memcpy_dtoh(&self.device_entries().slice(at..at + ENTRY_BYTES), &mut bytes)
            .map_err(|e| self.err(e))?;
        self.stream.synchronize().map_err(|e| self.err(e))?;
        Ok((Cow::Owned(bytes.into_iter().map(|b| b as u8).collect()), proof))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(walkers: u32, walk_steps: u32, walk_checkpoint_every: u32) -> MemoryParams {
        MemoryParams {
            pool_permille: 950,
            walkers,
            walk_steps,
            walk_checkpoint_every,
        }
    }

    /// Launches cover every step once, in order, each from a checkpoint for whole segments,
    /// none reading more than the bound, and no round holding more than its buffer.
    #[test]
    fn walk_rounds_cover_the_walk_in_whole_segments_within_both_bounds() {
        let cases = [
            (params(8192, 9304, 8), 1024),
            (params(8192, 9304, 8), 3),
            (params(1, 8, 8), 1),
            (params(65536, 4096 * 8, 8), 256),
            (params(3, 35, 7), 2),
            (params(100, 1000, 1), 0),
        ];
        let launch_bytes = WalkLimits::default().launch_bytes;
        for (p, buffer) in cases {
            let rounds = walk_rounds(&p, launch_bytes, buffer);
            let every = p.walk_checkpoint_every;
            let launches: Vec<Launch> = rounds.iter().flatten().copied().collect();
            let mut next = 0;
            for l in &launches {
                assert_eq!(l.first_step, next, "{p:?}: launches in order, no gap");
                assert!(l.steps > 0 && l.steps.is_multiple_of(every), "{p:?}: whole segments");
                let bytes = u64::from(p.walkers) * u64::from(l.steps) * ENTRY_BYTES as u64;
                assert!(
                    bytes <= launch_bytes || l.steps == every,
                    "{p:?}: a launch over the bound takes one segment"
                );
                next += l.steps;
            }
            assert_eq!(next, p.walk_steps, "{p:?}: every step");
            for round in &rounds {
                assert!(!round.is_empty());
                let segments: u32 = round.iter().map(|l| l.steps / every).sum();
                assert!(
                    segments <= buffer.max(round[0].steps / every),
                    "{p:?}: round of {segments} segments in a buffer of {buffer}"
                );
            }
        }
        // The default walk on a large GPU (the whole checkpoint limit free): one round of
        // launches of 512 steps; with a quarter of that buffer, two rounds.
        let default_buffer = (WalkLimits::default().checkpoint_bytes / (8192 * 32)) as u32;
        let rounds = walk_rounds(&params(8192, 9304, 8), launch_bytes, default_buffer);
        assert_eq!(rounds.len(), 1);
        assert_eq!(rounds[0][0].steps, 512);
        let rounds = walk_rounds(&params(8192, 9304, 8), launch_bytes, default_buffer / 4);
        assert_eq!(rounds.len(), 2);
    }

    /// The device's layout, made up with every state naming its walker and step, comes back as
    /// each walker's checkpoints in step order.
    #[test]
    fn gathered_checkpoints_are_each_walkers_in_step_order() {
        let every = 4;
        let round = [
            Launch {
                first_step: 8,
                steps: 8,
            },
            Launch {
                first_step: 16,
                steps: 4,
            },
        ];
        let walkers = 3usize;
        let state = |walker: usize, step: u32| {
            let mut s = [0u32; 8];
            s[0] = walker as u32;
            s[7] = step;
            s
        };
        let mut words = Vec::new();
        for launch in &round {
            for walker in 0..walkers {
                for q in 1..=launch.steps / every {
                    words.extend(state(walker, launch.first_step + q * every));
                }
            }
        }
        let mut traces = vec![Vec::new(); walkers];
        gather_round(&mut traces, &words, &round, every);
        for (walker, trace) in traces.iter().enumerate() {
            let want: Vec<Digest> = [12, 16, 20]
                .iter()
                .map(|&step| digest_from_words(&state(walker, step)))
                .collect();
            assert_eq!(trace, &want, "walker {walker}");
        }
    }
}
