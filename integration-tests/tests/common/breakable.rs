//! A backend whose device 0 can be taken out of service on demand.

/// The CPU backend with a switch that takes device 0 out of service, as the CUDA backend does
/// with a GPU that faulted and could not be reset (that state machine is unit-tested in the
/// CUDA backend's `slots`, and a real fault runs in the GPU tests). The daemons' side is what
/// the tests that use it check.
pub struct BreakableBackend {
    pub cpu: gpu_attest_shared::cpu::CpuBackend,
    pub broken: std::sync::atomic::AtomicBool,
}

impl gpu_attest_shared::Backend for BreakableBackend {
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
        work: &gpu_attest_shared::params::Work,
        chains: std::ops::Range<u64>,
        progress: gpu_attest_shared::backend::ChainProgress<'_>,
        cancel: &gpu_attest_shared::backend::CancelToken,
    ) -> Result<Vec<gpu_attest_shared::chain::ChainResult>, gpu_attest_shared::BackendError> {
        self.cpu.run_chains(device, work, chains, progress, cancel)
    }
    fn advance(
        &self,
        work: &gpu_attest_shared::params::Work,
        chain: u64,
        start: gpu_attest_shared::matrix::Matrix,
        first: u32,
        steps: u32,
        cancel: &gpu_attest_shared::backend::CancelToken,
    ) -> Result<gpu_attest_shared::matrix::Matrix, gpu_attest_shared::BackendError> {
        self.cpu.advance(work, chain, start, first, steps, cancel)
    }
    fn out_of_service(&self) -> Vec<(u32, String)> {
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            vec![(0, "CUDA_ERROR_ILLEGAL_ADDRESS, and the reset failed".into())]
        } else {
            Vec::new()
        }
    }
}
