//! The CPU backend: always available, exact, multi-threaded; what validators without GPUs run.

use crate::backend::{Backend, BackendError, CancelToken, ChainProgress, ResidentPool, check_advance};
use crate::chain::ChainResult;
use crate::digest::Digest;
use crate::gemm::{CpuGemm, GemmError, KernelKind, PackedB};
use crate::matrix::{Matrix, generate_a, generate_b};
use crate::memory::PoolSpec;
use crate::memory::check::{WalkOpening, open_segment};
use crate::memory::pool::HostPool;
use crate::memory::walk::{DeviceWalk, WalkSpec, walk_all};
use crate::params::Work;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Below this n a single GEMM has too few tiles to keep every thread busy, so chains run side by
/// side instead (each chain then holds only 4 n^2 bytes = 256 KiB at n = 256).
const CHAIN_PARALLEL_MAX_N: usize = 256;

pub struct CpuBackend {
    /// Shared with the pools it fills, which walk on the same threads.
    gemm: Arc<CpuGemm>,
    devices: u32,
}

impl CpuBackend {
    /// `threads = 0`: all cores. `kernel = None`: the fastest this CPU supports.
    pub fn new(threads: usize, kernel: Option<KernelKind>) -> Result<Self, GemmError> {
        Ok(CpuBackend {
            gemm: Arc::new(CpuGemm::new(threads, kernel)?),
            devices: 1,
        })
    }

    /// Presents the CPU as `devices` devices sharing one thread pool. Results are the same for
    /// any count; tests use it to exercise the multi-device partition without GPUs.
    pub fn with_logical_devices(mut self, devices: u32) -> Self {
        self.devices = devices.max(1);
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
        let a = generate_a(work.key(), chain, work.n());
        let b = PackedB::new(&generate_b(work.key(), chain, work.n()));
        let mut checkpoints = Vec::with_capacity(work.checkpoints_per_chain());
        checkpoints.push(a.digest());
        self.run_steps(work, &b, a, 0..work.iterations(), cancel, |x| {
            checkpoints.push(x.digest())
        })?;
        Ok(ChainResult {
            index: chain,
            checkpoints,
        })
    }
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!("cpu ({} kernel, {} threads)", self.gemm.kernel(), self.gemm.threads())
    }

    fn device_count(&self) -> u32 {
        self.devices
    }

    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        if device >= self.devices {
            return Err(BackendError::NoSuchDevice {
                device,
                count: self.devices,
            });
        }
        let done = AtomicU64::new(0);
        let one = |chain| {
            let result = self.run_chain(work, chain, cancel)?;
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

    fn holds_pools(&self) -> bool {
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

    fn open(
        &self,
        done: &DeviceWalk,
        walk: &WalkSpec,
        walker: u32,
        segment: u32,
    ) -> Result<Option<WalkOpening>, BackendError> {
        open_segment(&self.pool, done, walk, walker, segment)
    }
}
