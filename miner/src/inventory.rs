//! What this host reports about the devices it computes on.

use gpu_attest_shared::statement::DeviceInfo;

/// The CPU as one device: model name, the threads the miner computes on as `sm_count` (its
/// cores: validators expect a CPU's rate per core), the memory it claims (configured: a pool of
/// the host's whole memory would take hours to fill); its text made fit for the protocol
/// (printable ASCII, bounded), whatever the kernel reports.
pub fn cpu_device(threads: usize, memory_bytes: u64) -> DeviceInfo {
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
        sm_count: threads.max(1) as u32,
        ..DeviceInfo::default()
    }
    .fitted()
}
