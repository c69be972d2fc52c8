//! The `validator` command line. Flags read environment variables too, and override the config
//! file, which overrides the defaults.

use crate::config::{Policy, ValidatorConfig, VerifyBackend};
use clap::{Args, Parser, Subcommand};
use gpu_attest_shared::gemm::KernelChoice;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "validator",
    version,
    about = "gpu-attest validator: challenges miners and verifies their GPU work"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the validator API and attest registered miners on a schedule until SIGINT or SIGTERM.
    Serve {
        #[command(flatten)]
        settings: Settings,
        #[arg(long, env = "GPU_ATTEST_VALIDATOR_LISTEN")]
        listen: Option<SocketAddr>,
        /// Serve the API only; do not attest registered miners on a schedule.
        #[arg(long)]
        no_schedule: bool,
        /// Serve Prometheus metrics on this address (loopback unless the config allows another).
        #[arg(long, env = "GPU_ATTEST_VALIDATOR_METRICS_LISTEN")]
        metrics_listen: Option<SocketAddr>,
        /// Print the effective configuration as TOML and exit.
        #[arg(long)]
        print_config: bool,
    },
    /// Ask the running validator's health probe (`[health] listen`) whether it serves: prints
    /// SERVING and exits 0, else one line saying why and exits 1. For a container's HEALTHCHECK.
    Health {
        /// The validator's config file, for its `[health] listen` address.
        #[arg(long, env = "GPU_ATTEST_VALIDATOR_CONFIG")]
        config: Option<PathBuf>,
        /// The probe's address, instead of the config's.
        #[arg(long)]
        address: Option<SocketAddr>,
    },
    /// Attest one miner now, print the verdict and store it. Exit code: 0 pass, 1 fail, 2 error.
    Attest {
        #[command(flatten)]
        settings: Settings,
        /// The miner's gRPC address, e.g. http://127.0.0.1:7070.
        #[arg(long)]
        miner: String,
        /// Print the verdict as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List stored verdicts, newest first; or export one's transcript.
    Verdicts {
        #[arg(long, env = "GPU_ATTEST_VALIDATOR_DATABASE", default_value = "validator.db")]
        database: PathBuf,
        #[command(flatten)]
        filter: VerdictFilterArgs,
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        action: Option<VerdictsAction>,
    },
    /// Check a verdict again from its transcript (`verdicts export`), offline: no database, no
    /// network, no GPU. Exit code: 0 confirmed, 3 confirmed in part (what was taken as stated is
    /// listed), 1 a part differs or a signature fails, 2 the file cannot be read.
    Audit {
        /// The transcript file.
        file: PathBuf,
        /// The validator key (64 hex digits) the transcript must be signed by; without it the
        /// audit names the key it is signed by, for you to compare.
        #[arg(long)]
        validator_key: Option<String>,
        /// Threads for recomputing openings; 0 uses every core.
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Under the full policy, re-execute every chain here (as long as the miner's work
        /// took, on this CPU: minutes to hours for a GPU's); without it that part is taken as
        /// stated.
        #[arg(long)]
        reexecute: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Register, list, remove or revoke miners on a running validator, through its API.
    Miners {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        action: MinersAction,
    },
    /// The expected rate of each hardware class: learned from passing verdicts, imported, or
    /// shipped. Export it as TOML for other validators, or import theirs.
    Rates {
        /// TOML config file (its database, [[rates]] rows and [calibration] settings).
        #[arg(long, env = "GPU_ATTEST_VALIDATOR_CONFIG")]
        config: Option<PathBuf>,
        /// SQLite database file; default: the config's `database`.
        #[arg(long, env = "GPU_ATTEST_VALIDATOR_DATABASE")]
        database: Option<PathBuf>,
        #[command(subcommand)]
        action: Option<RatesAction>,
    },
    /// Print the public key of an existing key file (for allow-lists and registration).
    PublicKey {
        #[arg(long, env = "GPU_ATTEST_VALIDATOR_KEY_FILE", default_value = "validator.key")]
        key_file: PathBuf,
    },
    /// Create this validator's ed25519 key file (owner-only; never overwrites).
    Keygen {
        #[arg(long, env = "GPU_ATTEST_VALIDATOR_KEY_FILE", default_value = "validator.key")]
        key_file: PathBuf,
        /// Keep a key file that is already there (checked, its public key printed) and exit
        /// 0, instead of refusing: for a service manager's "create on first start" step.
        #[arg(long)]
        if_missing: bool,
    },
    /// Make a private CA and the TLS certificates of a small deployment in an empty directory:
    /// the validator's (server, and client towards miners), one per miner host, and an
    /// operator's client certificate. For a first deployment; a PKI of your own works as well.
    TlsCerts {
        /// The directory to write into (created; files there are never overwritten).
        #[arg(long)]
        out: PathBuf,
        /// A host name or address miners reach the validator's API by; repeatable. Default:
        /// localhost.
        #[arg(long = "validator-host")]
        validator_hosts: Vec<String>,
        /// A miner host name or address, as the validator's miner URLs name it; repeatable.
        #[arg(long = "miner-host")]
        miner_hosts: Vec<String>,
        /// Days the certificates are valid.
        #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(u32).range(1..=3650))]
        days: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum RatesAction {
    /// Print the table (the default).
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Write the observed rates as a TOML rate file (standard output unless --output).
    Export {
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Import another validator's rate file; its rows are used where this validator has not
    /// calibrated a class itself.
    Import { file: PathBuf },
}

/// The address a client on this host reaches `config`'s API at.
pub fn api_address(config: &crate::config::ValidatorConfig) -> String {
    let mut listen = config.listen;
    if listen.ip().is_unspecified() {
        listen.set_ip(match listen {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let scheme = if config.tls.cert.is_some() { "https" } else { "http" };
    format!("{scheme}://{listen}")
}

/// Which stored verdicts to list, from the database or over the API alike.
#[derive(Debug, Args)]
pub struct VerdictFilterArgs {
    /// Only the verdicts of the miner at this URL (as `miners list` shows it).
    #[arg(long, value_parser = miner_url_arg)]
    pub miner: Option<String>,
    #[arg(long, conflicts_with = "failed")]
    pub passed: bool,
    #[arg(long)]
    pub failed: bool,
    /// How many verdicts, newest first (at least 1).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Print each verdict as it is stored, oldest first, until stopped (with --json, one object
    /// a line), instead of the newest stored ones. --miner applies; --passed, --failed and
    /// --limit do not.
    #[arg(long, conflicts_with_all = ["passed", "failed"])]
    pub follow: bool,
    /// With --follow: first the stored verdicts with ids above this one (the last one seen
    /// before), so that nothing stored meanwhile is missed.
    #[arg(long, requires = "follow")]
    pub after: Option<u64>,
}

/// A miner URL for `--miner`; a miner key given instead is refused with what to give, rather
/// than matching nothing.
fn miner_url_arg(text: &str) -> Result<String, String> {
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("this is a miner key; --miner takes the miner's URL, as `validator miners list` shows it".into());
    }
    Ok(text.to_string())
}

impl VerdictFilterArgs {
    pub fn filter(&self) -> crate::store::VerdictFilter {
        crate::store::VerdictFilter {
            miner_url: self.miner.as_deref().map(crate::attest::normalise_url),
            passed: (self.passed || self.failed).then_some(self.passed),
            limit: self.limit,
            ..Default::default()
        }
    }
}

/// Where the installed validator's config is, read by `validator miners` for the API's address
/// when neither `--api` nor `--config` is given.
pub const INSTALLED_CONFIG: &str = "/etc/gpu-attest/validator.toml";

/// The API address when nothing names one: `validator serve`'s default `listen`.
pub const DEFAULT_API: &str = "http://127.0.0.1:7071";

/// How to reach a running validator's API.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// The API's address (`validator serve --listen`). Default: the `listen` address of the
    /// validator's config (--config, else /etc/gpu-attest/validator.toml when it exists), else
    /// http://127.0.0.1:7071.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_API", global = true)]
    pub api: Option<String>,
    /// The validator's config file, read for its API address (`listen`, https when it has [tls])
    /// and, for https, its `[tls] ca` when --api-ca is not given.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// CA certificate (PEM) the API's certificate is checked against, for an https:// address.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_API_CA", global = true)]
    pub api_ca: Option<PathBuf>,
    /// Client certificate (PEM), for an API that requires mutual TLS.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_API_CERT", global = true, requires = "api_key")]
    pub api_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_API_KEY", global = true, requires = "api_cert")]
    pub api_key: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

impl ApiArgs {
    /// The API address: `--api`, else the config's `listen` (a wildcard address read as
    /// loopback, https when the config serves TLS), else [`DEFAULT_API`].
    pub fn address(&self) -> Result<String, gpu_attest_daemon::config::ConfigError> {
        if let Some(api) = &self.api {
            return Ok(api.clone());
        }
        Ok(match self.validator_config()? {
            Some(config) => api_address(&config),
            None => DEFAULT_API.into(),
        })
    }

    /// The validator config the API's address comes from, when it comes from one: --config,
    /// else the installed one where it exists; `None` under --api.
    fn validator_config(
        &self,
    ) -> Result<Option<crate::config::ValidatorConfig>, gpu_attest_daemon::config::ConfigError> {
        if self.api.is_some() {
            return Ok(None);
        }
        let installed = std::path::Path::new(INSTALLED_CONFIG);
        let path = match &self.config {
            Some(path) => path.as_path(),
            None if installed.exists() => installed,
            None => return Ok(None),
        };
        crate::config::ValidatorConfig::load(Some(path)).map(Some)
    }

    /// The TLS files for the API: the flags', and for an address taken from a config that serves
    /// TLS, that config's `[tls] ca` unless --api-ca names another (`validator tls-certs` signs
    /// the validator's certificate and the operator's with the one CA).
    pub fn tls(&self) -> Result<gpu_attest_daemon::tls::TlsFiles, gpu_attest_daemon::config::ConfigError> {
        let ca = match &self.api_ca {
            Some(ca) => Some(ca.clone()),
            None => self.validator_config()?.and_then(|config| config.tls.ca),
        };
        Ok(gpu_attest_daemon::tls::TlsFiles {
            cert: self.api_cert.clone(),
            key: self.api_key.clone(),
            ca,
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum MinersAction {
    /// Register a miner: the validator fetches its inventory and binds the URL to its key.
    Add {
        /// The miner's gRPC address, e.g. http://gpu-host:7070.
        url: String,
        /// A name for people. Not given: a new miner is named by its URL, a registered one keeps
        /// its name.
        #[arg(long, default_value = "")]
        name: String,
        /// Accept a new key for an already registered URL (after a key rotation).
        #[arg(long)]
        replace_key: bool,
    },
    /// List the registered miners.
    List,
    /// Stop attesting a miner (its verdicts stay).
    Remove { url: String },
    /// List the revoked miner keys, newest first, with their reasons.
    Revoked,
    /// The rate table the running validator plans with (`validator rates show` reads the
    /// database file instead).
    Rates,
    /// Attest a miner now, through the running validator (registered or not): its phases and
    /// progress, then the stored verdict. Exit status 0 pass, 1 fail, 2 could not attest.
    Attest { url: String },
    /// Stored verdicts, newest first (`validator verdicts` reads the database file instead).
    Verdicts {
        #[command(flatten)]
        filter: VerdictFilterArgs,
    },
    /// Write verdict ID's kept transcript, read through the API, to a file for `validator audit`
    /// (`validator verdicts export` reads the database file instead).
    Transcript {
        /// The verdict's id.
        id: u64,
        /// Where to write it; an existing file is not overwritten.
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Never challenge or register this miner key again, whatever its URL.
    Revoke {
        /// The miner's public key, 64 hex digits.
        key: String,
        /// Why, for the record.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum VerdictsAction {
    /// Write verdict ID's kept transcript to a file, for `validator audit` (PROTOCOL.md 21).
    Export {
        /// The verdict's id (`validator verdicts` lists them).
        id: u64,
        /// Where to write it; an existing file is not overwritten.
        #[arg(long, short)]
        out: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct Settings {
    /// TOML config file; flags and environment override it.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_CONFIG")]
    pub config: Option<PathBuf>,
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// SQLite database file.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_DATABASE")]
    pub database: Option<PathBuf>,
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_POLICY", value_enum)]
    pub policy: Option<Policy>,
    /// Openings per sampled verification.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_SAMPLES")]
    pub samples: Option<u32>,
    /// Target seconds of miner work per challenge.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_TARGET_SECONDS")]
    pub target_seconds: Option<f64>,
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_CPU_THREADS")]
    pub cpu_threads: Option<usize>,
    /// CPU GEMM kernel for verification: auto, amx, avx512-vnni, avx-vnni, avx2 or portable.
    #[arg(long, env = "GPU_ATTEST_CPU_KERNEL")]
    pub cpu_kernel: Option<KernelChoice>,
    /// Verify on the CPU (default) or on this host's GPUs.
    #[arg(long, env = "GPU_ATTEST_VALIDATOR_BACKEND", value_enum)]
    pub backend: Option<VerifyBackend>,
}

impl Settings {
    pub fn resolve(&self) -> Result<ValidatorConfig, gpu_attest_daemon::config::ConfigError> {
        let mut c = ValidatorConfig::load(self.config.as_deref())?;
        if let Some(v) = &self.key_file {
            c.key_file = v.clone();
        }
        if let Some(v) = &self.database {
            c.database = v.clone();
        }
        if let Some(v) = self.policy {
            c.policy = v;
        }
        if let Some(v) = self.samples {
            c.samples = v;
        }
        if let Some(v) = self.target_seconds {
            c.challenge.target_seconds = v;
        }
        if let Some(v) = self.cpu_threads {
            c.cpu_threads = v;
        }
        if let Some(v) = self.cpu_kernel {
            c.cpu_kernel = v;
        }
        if let Some(v) = self.backend {
            c.backend = v;
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_address_comes_from_the_flag_then_the_config() {
        let mut config = crate::config::ValidatorConfig {
            listen: "0.0.0.0:7171".parse().unwrap(),
            ..Default::default()
        };
        assert_eq!(api_address(&config), "http://127.0.0.1:7171");
        config.tls.cert = Some("validator.pem".into());
        config.listen = "[::]:7171".parse().unwrap();
        assert_eq!(api_address(&config), "https://[::1]:7171");
        config.listen = "10.1.2.3:7171".parse().unwrap();
        assert_eq!(api_address(&config), "https://10.1.2.3:7171");

        let dir = std::env::temp_dir().join(format!("gpu-attest-api-address-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("validator.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:7272\"\n").unwrap();
        let args = |api: Option<&str>, config: Option<&std::path::Path>| ApiArgs {
            api: api.map(str::to_string),
            config: config.map(std::path::Path::to_path_buf),
            api_ca: None,
            api_cert: None,
            api_key: None,
            json: false,
        };
        assert_eq!(args(None, Some(&file)).address().unwrap(), "http://127.0.0.1:7272");
        assert_eq!(args(Some("http://h:1"), Some(&file)).address().unwrap(), "http://h:1");
        assert!(args(None, Some(&dir.join("missing.toml"))).address().is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
