//! Miner configuration: built-in defaults, then a TOML file, then flags and environment.

use gpu_attest_daemon::config::ConfigError;
use gpu_attest_daemon::config::{config_to_toml, load_config};
use gpu_attest_daemon::health_probe::HealthConfig;
use gpu_attest_daemon::metrics::MetricsConfig;
use gpu_attest_daemon::tls::TlsFiles;
use gpu_attest_kernels::compile::default_cache_dir;
use gpu_attest_kernels::{CudaOptions, GpuKernel};
use gpu_attest_shared::gemm::KernelChoice;
use gpu_attest_shared::params::MIN_N;
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
    /// The fastest kernel every selected GPU runs and passed its self-check on: tma on Hopper
    /// (then wgmma), else tensor, else tiled.
    Auto,
    /// CUDA cores, dp4a, shared-memory tiles (sm_61 and later).
    Tiled,
    /// int8 tensor cores, mma.sync (sm_80 and later).
    Tensor,
    /// int8 warpgroup MMA, Hopper (compute capability 9.0) only.
    Wgmma,
    /// wgmma fed by TMA, warp-specialised, persistent: Hopper only; `auto`'s first choice there.
    Tma,
    /// The TMA kernel on the ping-pong schedule (one consumer's epilogue under the other's
    /// wgmma): Hopper only, opt-in: its step is the fastest, but whole challenges on it ran
    /// slower than on tma (BENCHMARKS.md). Checked like every kernel.
    Pingpong,
    /// The ping-pong kernel in clusters of two blocks that multicast their shared Bt rows (half
    /// the L2 reads of them): Hopper only, opt-in: measured slower than wgmma.
    Multicast,
}

/// What this miner agrees to run. A challenge beyond any limit is refused before work starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_n: u32,
    pub max_chains: u64,
    pub max_iterations: u32,
    /// Longest window accepted, in seconds: a challenge's deadline (or its finish-by time, when it
    /// has one: the devices may be held until then) minus now.
    pub max_duration_secs: u64,
    /// Most openings one OpenChains request may ask for.
    pub max_samples: u32,
    /// Requests a minute one address may make (on average), and the burst it may use at once.
    pub requests_per_minute: u32,
    pub request_burst: u32,
    /// Concurrent gRPC streams per connection.
    pub max_concurrent_streams: u32,
    /// Keep working past a missed deadline until a challenge's finish-by time (PROTOCOL.md
    /// 14.3), so that the validator can state the rate the late work proved. The inventory says
    /// whether this miner does; `false` stops the work at the deadline and frees the devices.
    pub work_past_deadline: bool,
    /// Say protocol version 4 in the inventory (PROTOCOL.md 20) where the backend keeps its
    /// chains' states (the CPU backend, and the CUDA backend once its version 4 walk has passed
    /// a self-check against the CPU's, which this setting runs at start). On by default: a
    /// validator of this release refuses version 3's memory phase. Off, the inventory says 3,
    /// for a validator older than version 4 (a version 4 challenge sent anyway is refused).
    /// Its name before version 4 was the default, `preview_protocol_4`, is still read.
    #[serde(alias = "preview_protocol_4")]
    pub protocol_4: bool,
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
            work_past_deadline: true,
            protocol_4: true,
        }
    }
}

/// The least time a commitment is kept for its openings: an honest validator asks within
/// moments of receiving it, and checks each opening in seconds.
const MIN_KEEP_COMMITMENTS_SECS: u64 = 30;

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
    /// Walk lines on the GPUs when a validator asks for the locality walk (PROTOCOL.md 20.10).
    /// On by default since it ran through whole attestations on an H200, beside a pool filling
    /// 90% of the GPU, at 1.02x the step validators time it by (BENCHMARKS.md). Off, the miner
    /// answers that it cannot walk lines, and its verdicts state no locality bound.
    pub gpu_locality_walk: bool,
    /// The test mode of `--gpu-slots` (each GPU opened as this many slots): a flag only, never
    /// read from a config file, so that no deployed miner runs in it unawares.
    #[serde(skip)]
    pub gpu_slots: u32,
    /// Where compiled kernels are cached; unset: `$XDG_CACHE_HOME/gpu-attest/kernels` or
    /// `~/.cache/gpu-attest/kernels`.
    pub kernel_cache_dir: Option<PathBuf>,
    /// CPU backend threads; 0 uses every core.
    pub cpu_threads: usize,
    /// Memory the CPU backend claims, in MiB, and proves in a version 3 challenge: its pool
    /// fills most of it (PROTOCOL.md 18). Filling costs 2^31 int8 operations per 64 KiB, about
    /// 1.5 s per 16 MiB on two AVX2 cores, so the CPU backend claims little; GPUs claim what
    /// NVML reports.
    pub cpu_memory_mib: u64,
    /// CPU GEMM kernel: "auto" (the fastest this CPU runs) or one of amx, avx512-vnni,
    /// avx-vnni, avx2, portable. The GPU_ATTEST_CPU_KERNEL environment variable overrides it.
    pub cpu_kernel: KernelChoice,
    /// How long a commitment stays openable, in seconds.
    pub keep_commitments_secs: u64,
    /// Accepted nonces, kept on disk until their deadlines so a restart cannot enable a replay.
    /// Unset: `miner-nonces.log` in the key file's directory, so that the log stays with the
    /// identity it protects wherever the miner is started from.
    pub nonce_file: Option<PathBuf>,
    /// TLS for the gRPC server; `ca` set requires validators to present client certificates.
    pub tls: TlsFiles,
    /// Serve plaintext on a non-loopback address (a warning is logged). Loopback is always allowed.
    pub allow_plaintext: bool,
    pub limits: Limits,
    /// Prometheus metrics on their own loopback HTTP listener; off unless `listen` is set.
    pub metrics: MetricsConfig,
    /// The gRPC health service alone, in plaintext, for a supervisor's probe (`health`
    /// command); off unless `listen` is set.
    pub health: HealthConfig,
    /// This miner's own record of what it answered, for `check-transcript`.
    pub answers: AnswersConfig,
}

/// `[answers]`: the miner's record of each challenge it answered (`crate::answers`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnswersConfig {
    pub enabled: bool,
    /// Unset: `answers/` beside the key file, like the nonce log.
    pub dir: Option<PathBuf>,
    /// Records older than this are removed (at start, and as each new challenge is recorded).
    /// A record is about 100-200 KB (its openings' digests), so a miner attested every ten
    /// minutes keeps about 200 MB at 7 days.
    pub keep_days: u64,
}

impl Default for AnswersConfig {
    fn default() -> Self {
        AnswersConfig {
            enabled: true,
            dir: None,
            keep_days: 7,
        }
    }
}

/// The CPU backend's memory claim unless configured: a pool of 15 MiB, filled in seconds.
pub const DEFAULT_CPU_MEMORY_MIB: u64 = 16;
/// The most the CPU backend may claim: 1 TiB, the largest pool the protocol allows.
pub const MAX_CPU_MEMORY_MIB: u64 = 1 << 20;

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
            gpu_locality_walk: true,
            gpu_slots: 1,
            kernel_cache_dir: None,
            cpu_threads: 0,
            cpu_memory_mib: DEFAULT_CPU_MEMORY_MIB,
            cpu_kernel: KernelChoice::Auto,
            keep_commitments_secs: 600,
            nonce_file: None,
            tls: TlsFiles::default(),
            allow_plaintext: false,
            limits: Limits::default(),
            metrics: MetricsConfig::default(),
            health: HealthConfig::default(),
            answers: AnswersConfig::default(),
        }
    }
}

impl MinerConfig {
    /// The CUDA options this configuration asks for.
    pub fn cuda_options(&self) -> CudaOptions {
        CudaOptions {
            ordinals: (!self.gpu_devices.is_empty()).then(|| self.gpu_devices.clone()),
            kernel: match self.gpu_kernel {
                GpuKernelChoice::Auto => None,
                GpuKernelChoice::Tiled => Some(GpuKernel::Tiled),
                GpuKernelChoice::Tensor => Some(GpuKernel::Tensor),
                GpuKernelChoice::Wgmma => Some(GpuKernel::Wgmma),
                GpuKernelChoice::Tma => Some(GpuKernel::Tma),
                GpuKernelChoice::Pingpong => Some(GpuKernel::Pingpong),
                GpuKernelChoice::Multicast => Some(GpuKernel::Multicast),
            },
            cache_dir: self.kernel_cache_dir.clone().or_else(default_cache_dir),
            host_hashing: self.gpu_hash_on_host,
            locality_walk: self.gpu_locality_walk,
            slots_per_gpu: self.gpu_slots,
        }
    }

    /// Defaults overlaid with `path`'s TOML, if given.
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        load_config(path)
    }

    /// Refuses values that would refuse every challenge, or fail every honest attestation, with
    /// the reason. Limits of zero among them: the inventory advertises these limits, and there
    /// zero means "not stated" (PROTOCOL.md 14.2), which a miner that would refuse everything
    /// must not say.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |what: String| Err(ConfigError::Invalid(what));
        let l = &self.limits;
        let zero = [
            ("max_n", l.max_n == 0),
            ("max_chains", l.max_chains == 0),
            ("max_iterations", l.max_iterations == 0),
            ("max_duration_secs", l.max_duration_secs == 0),
            ("max_samples", l.max_samples == 0),
            ("requests_per_minute", l.requests_per_minute == 0),
            ("request_burst", l.request_burst == 0),
            ("max_concurrent_streams", l.max_concurrent_streams == 0),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, is_zero)| *is_zero) {
            return invalid(format!(
                "[limits] {name} = 0 would refuse every challenge; set a positive limit or leave it out for the default"
            ));
        }
        if self.gpu_slots > 1 && self.backend != BackendChoice::Cuda {
            return invalid(format!(
                "--gpu-slots {} is a test mode of the cuda backend: add --backend cuda (under auto, a host whose GPU \
                 cannot run it would mine on the CPU instead, unnoticed)",
                self.gpu_slots
            ));
        }
        if l.max_n < MIN_N {
            return invalid(format!(
                "[limits] max_n = {} is below {MIN_N}, the smallest n a challenge has (PROTOCOL.md): every challenge would be refused",
                l.max_n
            ));
        }
        if self.keep_commitments_secs < MIN_KEEP_COMMITMENTS_SECS {
            return invalid(format!(
                "keep_commitments_secs = {} must be at least {MIN_KEEP_COMMITMENTS_SECS}: a validator opens a commitment after it arrives, and one already dropped fails the attestation",
                self.keep_commitments_secs
            ));
        }
        if !(1..=MAX_CPU_MEMORY_MIB).contains(&self.cpu_memory_mib) {
            return invalid(format!(
                "cpu_memory_mib = {} must be in 1..={MAX_CPU_MEMORY_MIB}: the CPU backend claims and proves that much memory",
                self.cpu_memory_mib
            ));
        }
        if self.cpu_threads > gpu_attest_daemon::config::MAX_CPU_THREADS {
            return invalid(format!(
                "cpu_threads = {} is more than {}; 0 uses every core",
                self.cpu_threads,
                gpu_attest_daemon::config::MAX_CPU_THREADS
            ));
        }
        Ok(())
    }

    /// Where the nonce log is: `nonce_file`, or beside the key file.
    pub fn nonce_file(&self) -> PathBuf {
        self.nonce_file
            .clone()
            .unwrap_or_else(|| self.key_file.with_file_name("miner-nonces.log"))
    }

    /// Where the answer log is: `[answers] dir`, or `answers/` beside the key file.
    pub fn answers_dir(&self) -> PathBuf {
        self.answers
            .dir
            .clone()
            .unwrap_or_else(|| self.key_file.with_file_name("answers"))
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
    fn values_that_would_refuse_or_fail_everything_are_refused() {
        MinerConfig::default().validate().unwrap();
        let refused = |change: fn(&mut MinerConfig), says: &str| {
            let mut c = MinerConfig::default();
            change(&mut c);
            let message = c.validate().unwrap_err().to_string();
            assert!(message.contains(says), "{message}");
        };
        refused(|c| c.limits.max_samples = 0, "max_samples = 0");
        refused(|c| c.limits.request_burst = 0, "request_burst = 0");
        refused(|c| c.limits.requests_per_minute = 0, "requests_per_minute = 0");
        refused(|c| c.limits.max_concurrent_streams = 0, "max_concurrent_streams = 0");
        refused(|c| c.limits.max_n = 10, "max_n = 10 is below 64");
        refused(|c| c.keep_commitments_secs = 0, "keep_commitments_secs = 0");
        refused(|c| c.cpu_threads = 100_000, "cpu_threads = 100000");
        refused(|c| c.cpu_memory_mib = 0, "cpu_memory_mib = 0");
    }

    #[test]
    fn the_nonce_log_defaults_to_the_key_files_directory() {
        let mut c = MinerConfig {
            key_file: PathBuf::from("/var/lib/miner/miner.key"),
            ..MinerConfig::default()
        };
        assert_eq!(c.nonce_file(), PathBuf::from("/var/lib/miner/miner-nonces.log"));
        assert_eq!(MinerConfig::default().nonce_file(), PathBuf::from("miner-nonces.log"));
        c.nonce_file = Some(PathBuf::from("/elsewhere/n.log"));
        assert_eq!(c.nonce_file(), PathBuf::from("/elsewhere/n.log"));
    }

    #[test]
    fn the_gpu_locality_walk_is_on_by_default_and_a_config_turns_it_off() {
        let on = MinerConfig::default();
        assert!(on.gpu_locality_walk && on.cuda_options().locality_walk);
        let off: MinerConfig = toml::from_str("gpu_locality_walk = false").unwrap();
        assert!(!off.gpu_locality_walk && !off.cuda_options().locality_walk);
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<MinerConfig>("lisen = \"0.0.0.0:1\"").is_err());
    }
}
