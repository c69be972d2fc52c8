//! The CPU backend: always available, exact, multi-threaded; what validators without GPUs run.

use crate::backend::{Backend, BackendError, CancelToken, ChainProgress, PoolStates, ResidentPool, check_advance};
use crate::chain::ChainResult;
use crate::device::DeviceInfo;
use crate::digest::Digest;
use crate::gemm::{CpuGemm, GemmError, KernelKind, PackedB};
use crate::matrix::{Matrix, generate_a, generate_b};
use crate::memory::PoolSpec;
use crate::memory::chain_pool::ChainPool;
use crate::memory::pool::{CommittedEntries, HostPool};
use crate::memory::slice_walk::HeldStates;
use crate::memory::walk::{DeviceWalk, WalkSpec, walk_all};
use crate::params::Work;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Below this n a single GEMM has too few tiles to keep every thread busy, so chains run side by
/// side instead (each chain then holds only 4 n^2 bytes = 256 KiB at n = 256).
const CHAIN_PARALLEL_MAX_N: usize = 256;

/// The memory a CPU device claims unless told otherwise: a pool of the host's whole memory
/// would take hours to fill (32768 operations a byte), so the claim is configured
/// (`cpu_memory_mib`), not read from the host.
pub const DEFAULT_CLAIMED_MEMORY_BYTES: u64 = 16 << 20;

pub struct CpuBackend {
    /// Shared with the pools it fills, which walk on the same threads.
    gemm: Arc<CpuGemm>,
    devices: u32,
    /// What each device states (its index aside): see [`CpuBackend::claiming`].
    stated: DeviceInfo,
}

impl CpuBackend {
    /// `threads = 0`: all cores. `kernel = None`: the fastest this CPU supports. Each device
    /// states this CPU's model, the threads as its cores, and
    /// [`DEFAULT_CLAIMED_MEMORY_BYTES`].
    pub fn new(threads: usize, kernel: Option<KernelKind>) -> Result<Self, GemmError> {
        let gemm = Arc::new(CpuGemm::new(threads, kernel)?);
        let stated = host_device(gemm.threads().max(1) as u32, DEFAULT_CLAIMED_MEMORY_BYTES);
        Ok(CpuBackend {
            gemm,
            devices: 1,
            stated,
        })
    }

    /// Presents the CPU as `devices` devices sharing one thread pool. Results are the same for
    /// any count; tests use it to exercise the multi-device partition without GPUs.
    pub fn with_logical_devices(mut self, devices: u32) -> Self {
        self.devices = devices.max(1);
        self
    }

    /// Makes each device state `cores` cores (what a validator sizes a CPU's rate by: normally
    /// the threads it computes on; tests state more to play an under-provisioned miner) and
    /// claim `memory_bytes` of memory (the miner's `cpu_memory_mib`).
    pub fn claiming(mut self, cores: u32, memory_bytes: u64) -> Self {
        self.stated.sm_count = cores.max(1);
        self.stated.memory_bytes = memory_bytes;
        self
    }

    /// Names each device `cpu: {model}` instead of this host's model: for inputs that must be
    /// the same bytes on every host (the fuzz seeds), whatever CPU makes them.
    pub fn named(mut self, model: &str) -> Self {
        self.stated = DeviceInfo {
            name: format!("cpu: {model}"),
            ..self.stated
        }
        .fitted();
        self
    }

    pub fn kernel(&self) -> KernelKind {
        self.gemm.kernel()
    }

    /// The threads it computes on: what a CPU miner states as its cores.
    pub fn threads(&self) -> usize {
        self.gemm.threads()
    }

    /// Runs the chain's `steps` from `x` (holding X_{steps.start}), stopping within a step once
    /// `cancel` is set, and calling `checkpoint` after every step whose number (1-based) is a
    /// multiple of c.
    fn run_steps(
        &self,
        work: &Work,
        b: &PackedB,
        mut x: Matrix,
        steps: Range<u32>,
        cancel: &CancelToken,
        mut checkpoint: impl FnMut(&Matrix),
    ) -> Result<Matrix, BackendError> {
        let mut next = Matrix::zeros(work.n());
        for step in steps {
            cancel.check()?;
            if !self.gemm.step_unless(&x, b, step, &mut next, &|| cancel.is_cancelled()) {
                return Err(BackendError::Cancelled);
            }
            std::mem::swap(&mut x, &mut next);
            if (step + 1) % work.checkpoint_every() == 0 {
                checkpoint(&x);
            }
        }
        Ok(x)
    }

    fn run_chain(&self, work: &Work, chain: u64, cancel: &CancelToken) -> Result<ChainResult, BackendError> {
        self.run_chain_to_end(work, chain, cancel).map(|(result, _)| result)
    }

    /// A chain's checkpoint hashes and its final state `X_K`.
    fn run_chain_to_end(
        &self,
        work: &Work,
        chain: u64,
        cancel: &CancelToken,
    ) -> Result<(ChainResult, Matrix), BackendError> {
        let a = generate_a(work.key(), chain, work.n());
        let b = PackedB::new(&generate_b(work.key(), chain, work.n()));
        let mut checkpoints = Vec::with_capacity(work.checkpoints_per_chain());
        checkpoints.push(a.digest());
        let last = self.run_steps(work, &b, a, 0..work.iterations(), cancel, |x| {
            checkpoints.push(x.digest())
        })?;
        let result = ChainResult {
            index: chain,
            checkpoints,
        };
        Ok((result, last))
    }

    /// Runs `chains` on device `device`, each through `one` (which gets the chain's index),
    /// in index order: in parallel over chains at small n, one chain at a time above.
    fn each_chain<T: Send>(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        one: impl Fn(u64) -> Result<T, BackendError> + Sync,
    ) -> Result<Vec<T>, BackendError> {
        if device >= self.devices {
            return Err(BackendError::NoSuchDevice {
                device,
                count: self.devices,
            });
        }
        let done = AtomicU64::new(0);
        let one = |chain| {
            let result = one(chain)?;
            progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            Ok(result)
        };
        if work.n() <= CHAIN_PARALLEL_MAX_N {
            // collect() keeps index order whatever order the threads finish in.
            self.gemm.install(|| chains.into_par_iter().map(one).collect())
        } else {
            // One chain at a time, each on the engine's own threads: a step called from
            // outside the pool hands its work over and sleeps until it is done, two thread
            // wake-ups a step (about 5 us on a 2-thread Zen 5: 4-14% of a step at n = 512,
            // 1-3% at 1024). Not the whole range in one `install`: a pool thread waiting
            // inside a step may take up another caller's whole job (another attestation being
            // verified on this backend) and run it before its own step ends, so a job is kept
            // to one chain. (At small n, above, the whole range is one job, as it always was.)
            chains.map(|chain| self.gemm.install(|| one(chain))).collect()
        }
    }
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!("cpu ({} kernel, {} threads)", self.gemm.kernel(), self.gemm.threads())
    }

    fn device_count(&self) -> u32 {
        self.devices
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        (0..self.devices)
            .map(|index| DeviceInfo {
                index,
                ..self.stated.clone()
            })
            .collect()
    }

    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        self.each_chain(device, work, chains, progress, |chain| {
            self.run_chain(work, chain, cancel)
        })
    }

    fn run_pool_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        pool: ChainPool,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<(Vec<ChainResult>, Box<dyn PoolStates>), BackendError> {
        let kept = pool.first_chain..pool.first_chain + pool.chains;
        if pool.device != device || pool.n != work.n() || kept.start != chains.start || kept.end > chains.end {
            return Err(BackendError::PoolOutsideChains {
                pool: format!("{pool:?}"),
                device,
                chains,
            });
        }
        let ran = self.each_chain(device, work, chains, progress, |chain| {
            let (result, last) = self.run_chain_to_end(work, chain, cancel)?;
            // Only the pool chains' states are kept: the others' go as soon as they are hashed.
            Ok((result, kept.contains(&chain).then_some(last)))
        })?;
        let (results, states): (Vec<ChainResult>, Vec<Option<Matrix>>) = ran.into_iter().unzip();
        let states: Vec<Matrix> = states.into_iter().flatten().collect();
        let held = HeldStates::new(pool, states).expect("one state of size n per pool chain");
        Ok((results, Box::new(held)))
    }

    fn holds_pools(&self) -> bool {
        true
    }

    fn keeps_chain_pools(&self) -> bool {
        true
    }

    fn fill_pool(
        &self,
        spec: &PoolSpec,
        progress: &(dyn Fn(u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<Box<dyn ResidentPool>, BackendError> {
        let device = spec.device();
        if device >= self.devices {
            return Err(BackendError::NoSuchDevice {
                device,
                count: self.devices,
            });
        }
        let pool = HostPool::fill(&self.gemm, spec, progress, cancel)?;
        Ok(Box::new(CpuPool {
            pool,
            gemm: Arc::clone(&self.gemm),
        }))
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
        // On the engine's threads, one job as a chain is in `run_chains` (a few steps: a
        // sample's segment).
        self.gemm.install(|| {
            let b = PackedB::new(&generate_b(work.key(), chain, work.n()));
            self.run_steps(work, &b, start, first..first + steps, cancel, |_| {})
        })
    }
}

/// This host's CPU as one device: model name (from `/proc/cpuinfo`), `cores` as `sm_count`
/// (validators expect a CPU's rate per core) and the memory it claims; its text made fit for
/// the protocol (printable ASCII, bounded), whatever the kernel reports.
fn host_device(cores: u32, memory_bytes: u64) -> DeviceInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    DeviceInfo {
        index: 0,
        name: format!("cpu: {model}"),
        memory_bytes,
        sm_count: cores,
        ..DeviceInfo::default()
    }
    .fitted()
}

/// A pool in host memory, walked on the engine's threads.
struct CpuPool {
    pool: HostPool,
    gemm: Arc<CpuGemm>,
}

impl ResidentPool for CpuPool {
    fn spec(&self) -> &PoolSpec {
        self.pool.spec()
    }

    fn root(&self) -> Digest {
        self.pool.root()
    }

    fn walk(&self, walk: &WalkSpec, cancel: &CancelToken) -> Result<DeviceWalk, BackendError> {
        self.gemm.install(|| walk_all(&self.pool, walk, cancel))
    }

    fn committed(&self) -> &dyn CommittedEntries {
        &self.pool
    }
}
