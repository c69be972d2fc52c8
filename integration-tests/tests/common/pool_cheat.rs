//! The CPU backend with its version 4 pool changed: what every version 4 cheater of these tests
//! shares. The chains are the CPU's, run honestly; a cheat sees each device's chain results and
//! its honest pool states, and returns the pool that the walk and the openings read (changing
//! the results where it commits to other states).

use gpu_attest_shared::backend::{ChainProgress, PoolStates};
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::gemm::KernelKind;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::chain_pool::{ChainPool, ChainPoolParams};
use gpu_attest_shared::memory::slice_walk::SliceSource;
use gpu_attest_shared::statement::DeviceInfo;
use gpu_attest_shared::{Backend, BackendError, CancelToken, Work};
use std::ops::Range;
use std::sync::Arc;

/// The honest states a cheat starts from, slice by slice: the CPU backend's are in host memory.
pub fn host_slices(states: &dyn PoolStates) -> &dyn SliceSource {
    states
        .host_states()
        .expect("the CPU backend's states are in host memory")
}

/// What one cheater does to a device's pool once its chains have run.
pub trait PoolCheat: Send + Sync {
    /// The pool device `device` walks and opens, from its honest `states`; `results` are the
    /// device's chain results, pool chains first, which the commitment is built from.
    fn cheat(
        &self,
        cpu: &Arc<CpuBackend>,
        device: u32,
        work: &Work,
        pool: ChainPool,
        results: &mut [ChainResult],
        states: Box<dyn PoolStates>,
    ) -> Box<dyn PoolStates>;

    /// What the backend says of room for `pool` before a challenge is accepted (a GPU's free
    /// memory); room for every pool unless a cheat says otherwise.
    fn room(&self, _pool: &ChainPool) -> Result<(), BackendError> {
        Ok(())
    }
}

/// The CPU backend with `cheat`, its devices named `cpu: {names[j]}` where names are given.
pub struct CheatingCpu<C> {
    pub cpu: Arc<CpuBackend>,
    pub cheat: C,
    pub names: Vec<&'static str>,
}

impl<C: PoolCheat> CheatingCpu<C> {
    pub fn new(cpu: CpuBackend, cheat: C) -> Self {
        CheatingCpu {
            cpu: Arc::new(cpu),
            cheat,
            names: Vec::new(),
        }
    }

    pub fn kernel(&self) -> KernelKind {
        self.cpu.kernel()
    }
}

impl<C: PoolCheat> Backend for CheatingCpu<C> {
    fn describe(&self) -> String {
        self.cpu.describe()
    }
    fn device_count(&self) -> u32 {
        self.cpu.device_count()
    }
    fn devices(&self) -> Vec<DeviceInfo> {
        let mut devices = self.cpu.devices();
        for (device, name) in devices.iter_mut().zip(&self.names) {
            device.name = format!("cpu: {name}");
        }
        devices
    }
    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        self.cpu.run_chains(device, work, chains, progress, cancel)
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
        let (mut results, states) = self.cpu.run_pool_chains(device, work, chains, pool, progress, cancel)?;
        let states = self.cheat.cheat(&self.cpu, device, work, pool, &mut results, states);
        Ok((results, states))
    }
    fn keeps_chain_pools(&self) -> bool {
        true
    }
    fn check_chain_pool_capacity(&self, _: &Work, pool: &ChainPool, _: &ChainPoolParams) -> Result<(), BackendError> {
        self.cheat.room(pool)
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
        self.cpu.advance(work, chain, start, first, steps, cancel)
    }
}
