//! The `miner` command line. Every `serve` flag also reads an environment variable, and overrides
//! the config file, which overrides the defaults.

use crate::config::{BackendChoice, GpuKernelChoice, MinerConfig};
use clap::{Args, Parser, Subcommand};
use gpu_attest_shared::gemm::KernelChoice;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "miner",
    version,
    about = "gpu-attest miner: proves this host's GPUs by running signed matrix challenges"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve challenges over gRPC until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// Print the inventory this host would report to a validator.
    Info {
        #[command(flatten)]
        settings: Settings,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Measure GEMM throughput per backend, kernel and device.
    Bench {
        #[command(flatten)]
        settings: Settings,
        /// Matrix sizes to time [default: 1024,2048,4096 on GPUs, 256,1024,2048 on the CPU].
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Seconds to spend on each size and kernel.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// CPU only: also time what a validator does to check an n = 2048 challenge by 32
        /// samples of 4 steps each (the default sampling), on the chosen kernel.
        #[arg(long)]
        sampled_verify: bool,
        /// The memory phase's buffers in MiB: on the CPU, read and copy bandwidth, the walk's
        /// bandwidth against them and the fill's rate; on GPUs, the walk over a pool of this
        /// size (at most 90% of free memory) against the device's copy bandwidth, and a small
        /// walk checked against the CPU's. 0 skips it.
        #[arg(long, default_value_t = 512)]
        memory_mib: usize,
        #[arg(long)]
        json: bool,
    },
    /// Check every kernel on every device against the CPU: PROTOCOL.md's vector challenge and a
    /// mid-sized one, checkpoint by checkpoint. GPU results are cached per device, driver and
    /// kernel source; `miner serve` runs the GPU part itself before it serves.
    Selftest {
        #[command(flatten)]
        settings: Settings,
        /// Size of the mid-sized challenge (a multiple of 64).
        #[arg(long, default_value_t = crate::selftest::DEFAULT_MID_N)]
        mid_n: u32,
        /// Run the GPU checks again even where the cache has an answer.
        #[arg(long)]
        fresh: bool,
        #[arg(long)]
        json: bool,
    },
    /// Ask every NVIDIA GPU for confidential-computing evidence over a fresh nonce and check it
    /// as a validator would (PROTOCOL.md 19): per GPU its CC state, and `genuine NVIDIA ...` or
    /// why not. Needs only the NVIDIA driver (NVML), not CUDA.
    Evidence {
        /// Trust the root certificates in this PEM file instead of NVIDIA's pinned device root.
        #[arg(long, value_name = "PEM")]
        roots: Option<std::path::PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Print the public key of an existing key file (for allow-lists and registration).
    PublicKey {
        #[arg(long, env = "GPU_ATTEST_MINER_KEY_FILE", default_value = "miner.key")]
        key_file: PathBuf,
    },
    /// Create this miner's ed25519 key file (owner-only; never overwrites).
    Keygen {
        #[arg(long, env = "GPU_ATTEST_MINER_KEY_FILE", default_value = "miner.key")]
        key_file: PathBuf,
        /// Keep a key file that is already there (checked, its public key printed) and exit
        /// 0, instead of refusing: for a service manager's "create on first start" step.
        #[arg(long)]
        if_missing: bool,
    },
    /// Hold a validator's transcript of an attestation of this miner (PROTOCOL.md 21; `validator
    /// verdicts export`) against this miner's own record of what it answered (`[answers]`):
    /// every message in it that this miner sent or received must be in the record. Exit code:
    /// 0 they match, 1 they differ, 2 the file or the record cannot be read.
    CheckTranscript {
        /// The transcript file.
        file: PathBuf,
        /// The answer log's directory; default: the config's `[answers] dir`, or `answers/`
        /// beside the key file.
        #[arg(long)]
        answers: Option<PathBuf>,
        /// The miner's config file, for its answer log's directory.
        #[arg(long, env = "GPU_ATTEST_MINER_CONFIG")]
        config: Option<PathBuf>,
        /// The key file, whose directory holds the answer log by default.
        #[arg(long, env = "GPU_ATTEST_MINER_KEY_FILE")]
        key_file: Option<PathBuf>,
    },
    /// Ask the running miner's health probe (`[health] listen`) whether it serves: prints
    /// SERVING and exits 0, else one line saying why and exits 1. For a container's HEALTHCHECK.
    Health {
        /// The miner's config file, for its `[health] listen` address.
        #[arg(long, env = "GPU_ATTEST_MINER_CONFIG")]
        config: Option<PathBuf>,
        /// The probe's address, instead of the config's.
        #[arg(long)]
        address: Option<SocketAddr>,
    },
}

/// Settings shared by the commands that choose a backend.
#[derive(Clone, Debug, Args)]
pub struct Settings {
    /// TOML config file; flags and environment override it.
    #[arg(long, env = "GPU_ATTEST_MINER_CONFIG")]
    pub config: Option<PathBuf>,
    #[arg(long, env = "GPU_ATTEST_MINER_BACKEND", value_enum)]
    pub backend: Option<BackendChoice>,
    #[arg(long, env = "GPU_ATTEST_MINER_GPU_KERNEL", value_enum)]
    pub gpu_kernel: Option<GpuKernelChoice>,
    /// CUDA ordinals to mine on, comma-separated (default: every visible GPU).
    #[arg(long, env = "GPU_ATTEST_MINER_GPU_DEVICES", value_delimiter = ',')]
    pub gpu_devices: Vec<u32>,
    /// CPU backend threads (0: every core).
    #[arg(long, env = "GPU_ATTEST_MINER_CPU_THREADS")]
    pub cpu_threads: Option<usize>,
    /// CPU GEMM kernel: auto, amx, avx512-vnni, avx-vnni, avx2 or portable.
    #[arg(long, env = "GPU_ATTEST_CPU_KERNEL")]
    pub cpu_kernel: Option<KernelChoice>,
    /// A test mode, not for production: open each GPU as this many slots, each with its own
    /// context, streams and host thread, as separate GPUs are, its chains split over them.
    /// The claim stays one device per GPU, and such a miner holds no memory-phase pool, so it
    /// speaks protocol version 2 (compute only).
    #[arg(long, hide = true, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub gpu_slots: Option<u32>,
}

#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub settings: Settings,
    /// Listen address, e.g. 127.0.0.1:7070 (port 0 picks a free port and prints it).
    #[arg(long, env = "GPU_ATTEST_MINER_LISTEN")]
    pub listen: Option<SocketAddr>,
    #[arg(long, env = "GPU_ATTEST_MINER_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Hex public key of a validator allowed to challenge this miner; repeat for several.
    #[arg(
        long = "allow-validator",
        env = "GPU_ATTEST_MINER_ALLOW_VALIDATORS",
        value_delimiter = ','
    )]
    pub allow_validators: Vec<String>,
    /// Serve Prometheus metrics on this address (loopback unless the config allows another).
    #[arg(long, env = "GPU_ATTEST_MINER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl Settings {
    /// Loads the config file and applies these flags.
    pub fn resolve(&self) -> Result<MinerConfig, gpu_attest_daemon::config::ConfigError> {
        let mut config = MinerConfig::load(self.config.as_deref())?;
        if let Some(b) = self.backend {
            config.backend = b;
        }
        if let Some(k) = self.gpu_kernel {
            config.gpu_kernel = k;
        }
        if !self.gpu_devices.is_empty() {
            config.gpu_devices = self.gpu_devices.clone();
        }
        if let Some(t) = self.cpu_threads {
            config.cpu_threads = t;
        }
        if let Some(k) = self.cpu_kernel {
            config.cpu_kernel = k;
        }
        if let Some(slots) = self.gpu_slots {
            config.gpu_slots = slots;
        }
        config.validate()?;
        Ok(config)
    }
}

impl ServeArgs {
    pub fn resolve(&self) -> Result<MinerConfig, gpu_attest_daemon::config::ConfigError> {
        let mut config = self.settings.resolve()?;
        if let Some(l) = self.listen {
            config.listen = l;
        }
        if let Some(k) = &self.key_file {
            config.key_file = k.clone();
        }
        config.allowed_validators.extend(self.allow_validators.iter().cloned());
        if let Some(m) = self.metrics_listen {
            config.metrics.listen = Some(m);
        }
        Ok(config)
    }
}
