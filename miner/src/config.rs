//! Miner configuration: built-in defaults, then a TOML file, then flags and environment.

pub use gpu_attest_daemon::config::ConfigError;
use gpu_attest_daemon::config::{config_to_toml, load_config};
use gpu_attest_daemon::metrics::MetricsConfig;
use gpu_attest_daemon::tls::TlsFiles;
use gpu_attest_shared::gemm::KernelChoice;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// CUDA when a usable GPU is found, the CPU otherwise.
    Auto,
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GpuKernelChoice {
    /// The fastest kernel every selected GPU runs and passed its self-check on: wgmma on
    /// Hopper, else tensor, else tiled.
    Auto,
    /// CUDA cores, dp4a, shared-memory tiles (sm_61 and later).
    Tiled,
    /// int8 tensor cores, mma.sync (sm_80 and later).
    Tensor,
    /// int8 warpgroup MMA, Hopper (compute capability 9.0) only.
    Wgmma,
}

/// What this miner agrees to run. A challenge beyond any limit is refused before work starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_n: u32,
    pub max_chains: u64,
    pub max_iterations: u32,
    /// Longest deadline window (deadline minus now) accepted, in seconds.
    pub max_duration_secs: u64,
    /// Most openings one OpenChains request may ask for.
    pub max_samples: u32,
    /// Requests a minute one address may make (on average), and the burst it may use at once.
    pub requests_per_minute: u32,
    pub request_burst: u32,
    /// Concurrent gRPC streams per connection.
    pub max_concurrent_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_n: 8192,
            max_chains: 1 << 16,
            max_iterations: 1 << 16,
            max_duration_secs: 3600,
            max_samples: 64,
            requests_per_minute: 120,
            request_burst: 30,
            max_concurrent_streams: 16,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MinerConfig {
    /// gRPC listen address. Loopback by default: expose it deliberately.
    pub listen: SocketAddr,
    /// This miner's ed25519 key file (`miner keygen` writes one).
    pub key_file: PathBuf,
    /// Hex public keys of the validators whose challenges this miner runs.
    pub allowed_validators: Vec<String>,
    pub backend: BackendChoice,
    pub gpu_kernel: GpuKernelChoice,
    /// CUDA ordinals (after CUDA_VISIBLE_DEVICES) to mine on; empty: all. The partition takes
    /// them in ascending ordinal order (PROTOCOL.md section 6), whatever the order here.
    pub gpu_devices: Vec<u32>,
    /// Hash checkpoints on the host instead of the GPU (slower; a fallback).
    pub gpu_hash_on_host: bool,
    /// Where compiled kernels are cached; unset: `$XDG_CACHE_HOME/gpu-attest/kernels` or
    /// `~/.cache/gpu-attest/kernels`.
    pub kernel_cache_dir: Option<PathBuf>,
    /// CPU backend threads; 0 uses every core.
    pub cpu_threads: usize,
    /// CPU GEMM kernel: "auto" (the fastest this CPU runs) or one of amx, avx512-vnni,
    /// avx-vnni, avx2, portable. The GPU_ATTEST_CPU_KERNEL environment variable overrides it.
    pub cpu_kernel: KernelChoice,
    /// How long a commitment stays openable, in seconds.
    pub keep_commitments_secs: u64,
    /// Accepted nonces, kept on disk until their deadlines so a restart cannot enable a replay.
    pub nonce_file: PathBuf,
    /// TLS for the gRPC server; `ca` set requires validators to present client certificates.
    pub tls: TlsFiles,
    /// Serve plaintext on a non-loopback address (a warning is logged). Loopback is always allowed.
    pub allow_plaintext: bool,
    pub limits: Limits,
    /// Prometheus metrics on their own loopback HTTP listener; off unless `listen` is set.
    pub metrics: MetricsConfig,
}

impl Default for MinerConfig {
    fn default() -> Self {
        MinerConfig {
            listen: "127.0.0.1:7070".parse().expect("literal address"),
            key_file: PathBuf::from("miner.key"),
            allowed_validators: Vec::new(),
            backend: BackendChoice::Auto,
            gpu_kernel: GpuKernelChoice::Auto,
            gpu_devices: Vec::new(),
            gpu_hash_on_host: false,
            kernel_cache_dir: None,
            cpu_threads: 0,
            cpu_kernel: KernelChoice::Auto,
            keep_commitments_secs: 600,
            nonce_file: PathBuf::from("miner-nonces.log"),
            tls: TlsFiles::default(),
            allow_plaintext: false,
            limits: Limits::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

impl MinerConfig {
    /// Defaults overlaid with `path`'s TOML, if given.
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        load_config(path)
    }

    /// Refuses limits of zero: the inventory advertises these limits, and there zero means "not
    /// stated" (PROTOCOL.md 14.2), which a miner that would refuse everything must not say.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        let zero = [
            ("max_n", l.max_n == 0),
            ("max_chains", l.max_chains == 0),
            ("max_iterations", l.max_iterations == 0),
            ("max_duration_secs", l.max_duration_secs == 0),
            ("max_samples", l.max_samples == 0),
        ];
        match zero.iter().find(|(_, is_zero)| *is_zero) {
            Some((name, _)) => Err(ConfigError::Invalid(format!(
                "[limits] {name} = 0 would refuse every challenge; set a positive limit or leave it out for the default"
            ))),
            None => Ok(()),
        }
    }

    pub fn to_toml(&self) -> String {
        config_to_toml(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_config_parses_back() {
        let mut c = MinerConfig::default();
        c.allowed_validators.push("ab".repeat(32));
        c.limits.max_n = 1024;
        assert_eq!(toml::from_str::<MinerConfig>(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn zero_limits_are_refused() {
        MinerConfig::default().validate().unwrap();
        let mut c = MinerConfig::default();
        c.limits.max_samples = 0;
        assert!(c.validate().unwrap_err().to_string().contains("max_samples = 0"));
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<MinerConfig>("lisen = \"0.0.0.0:1\"").is_err());
    }
}
