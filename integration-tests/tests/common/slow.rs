//! A backend that takes its time.

use gpu_attest_miner::core::MinerCore;
use gpu_attest_shared::backend::{CancelToken, ChainProgress};
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::params::Work;
use gpu_attest_shared::{Backend, BackendError};
use std::sync::Arc;
use std::time::Duration;

/// The CPU backend, waiting `extra` before each device's share of a challenge: a challenge
/// that runs for as long as a test needs a call to stay open, with honest results.
pub struct SlowBackend {
    pub cpu: gpu_attest_shared::cpu::CpuBackend,
    pub extra: Duration,
}

impl Backend for SlowBackend {
    fn describe(&self) -> String {
        self.cpu.describe()
    }
    fn device_count(&self) -> u32 {
        self.cpu.device_count()
    }
    fn devices(&self) -> Vec<gpu_attest_shared::statement::DeviceInfo> {
        self.cpu.devices()
    }
    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: std::ops::Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        std::thread::sleep(self.extra);
        self.cpu.run_chains(device, work, chains, progress, cancel)
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

/// An honest one-device miner keyed by `seed`, allowing the test validator, whose challenges
/// take `extra` longer than the work.
pub fn slow_miner(seed: u8, extra: Duration) -> Arc<MinerCore> {
    slow_miner_with(seed, extra, gpu_attest_miner::config::Limits::default())
}

/// [`slow_miner`] with its own limits.
pub fn slow_miner_with(seed: u8, extra: Duration, limits: gpu_attest_miner::config::Limits) -> Arc<MinerCore> {
    let cpu = super::test_cpu(super::TEST_CORES as usize);
    let backend = super::selected(cpu.kernel(), Arc::new(SlowBackend { cpu, extra }));
    super::miner_on(
        seed,
        &[super::validator_key()],
        backend,
        limits,
        gpu_attest_miner::nonces::NonceLog::in_memory(),
    )
}
