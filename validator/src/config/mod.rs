//! Validator configuration: built-in defaults, then a TOML file, then flags and environment.

pub mod calibration;
pub mod identity;
pub mod memory;
pub mod rates;
pub mod transcripts;

use calibration::CalibrationConfig;
use gpu_attest_daemon::config::{ConfigError, config_to_toml, load_config};
use gpu_attest_daemon::health_probe::HealthConfig;
use gpu_attest_daemon::metrics::MetricsConfig;
use gpu_attest_daemon::tls::TlsFiles;
use gpu_attest_shared::gemm::KernelChoice;
use identity::IdentityConfig;
use memory::MemoryConfig;
use rates::RateEntry;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use transcripts::TranscriptConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Full re-execution when this validator computes on a GPU, sampling otherwise.
    Auto,
    /// Open a random sample of chain segments after the commitment (PROTOCOL.md section 9).
    Sampled,
    /// Recompute every chain and compare the global checksum (section 10).
    Full,
}

/// What the validator re-executes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum VerifyBackend {
    /// The CPU: always there; checks samples of GPU-sized challenges.
    Cpu,
    /// This host's GPUs; with `policy = auto` that means full re-execution.
    Cuda,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChallengeConfig {
    /// Matrix size for GPU miners.
    pub gpu_n: u32,
    /// Matrix size for CPU miners (small, so a CPU validator can check samples quickly).
    pub cpu_n: u32,
    pub iterations: u32,
    pub checkpoint_every: u32,
    /// How long an honest miner should compute, in seconds; the chain count follows from it.
    pub target_seconds: f64,
}

impl Default for ChallengeConfig {
    fn default() -> Self {
        ChallengeConfig {
            gpu_n: 2048,
            cpu_n: 256,
            iterations: 16,
            checkpoint_every: 4,
            target_seconds: 30.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadlineConfig {
    /// Deadline = expected time x slack, for classes whose rate was observed (calibrated here
    /// or imported): tight, so that hardware slower than claimed misses it. BENCHMARKS.md has
    /// the measurements this default was chosen from.
    pub slack: f64,
    /// The same for the CPU backend: CPUs on shared machines time far less steadily than
    /// dedicated GPUs (BENCHMARKS.md, "Deadline slack").
    pub cpu_slack: f64,
    /// The slack for a class at first contact, timed by the shipped table's guess: wide, so an
    /// honest miner passes while the validator learns its class. The verdict says which applied.
    pub first_contact_slack: f64,
    /// The shortest deadline set, in milliseconds: a shorter one would time the network rather
    /// than the work. The planner gives a challenge enough chains to reach it, so the deadline
    /// is always the slack times the expected time, never a floor that loosens it.
    pub min_ms: u64,
    /// How long a miner has, from the sending of a challenge, to accept or refuse it (never more
    /// than a quarter of the deadline). Within it a refusal is an error and stores no verdict (a
    /// busy miner says so at once); past it the challenge stands issued and its outcome is a
    /// failing verdict (`not-accepted`), so a miner cannot compute first and refuse only the
    /// runs it would fail.
    pub accept_ms: u64,
    /// How long a miner has to be reached, in milliseconds: the TCP connect, TLS and HTTP/2
    /// handshakes together, and then again its answer to `GetInventory`. Past it the attempt
    /// fails as `timed-out` and the scheduler backs off, so a host that accepts connections and
    /// never answers (or is stopped) holds a scheduler slot this long, not for as long as its
    /// socket stays open.
    pub connect_ms: u64,
    /// How long a miner that misses the deadline may go on, as a multiple of the deadline
    /// (PROTOCOL.md 14.3): a commitment by then is still a FAIL, but it is verified and the
    /// verdict says what rate it proved (how much compute, not which hardware: only device
    /// evidence names that). 1.0 sends no finish-by time: the work stops at the deadline.
    pub finish_by: f64,
    /// A graded miss whose commitment came within this many deadlines gets one immediate
    /// retest with a fresh challenge, and the verdict is the retest's (PROTOCOL.md 14.7): an
    /// honest host that stalled once is not stored as a FAIL. SECURITY.md has what it costs.
    /// 1.0: no retests. At most `finish_by` (a later miss is never graded).
    pub retest_band: f64,
}

/// The largest `finish_by`: past it a miner with a tenth of its claim still holds the validator's
/// attention, and its own devices, for ten deadlines.
pub const MAX_FINISH_BY: f64 = 4.0;

impl DeadlineConfig {
    /// What is wrong with these settings, for a person: the first problem found.
    pub fn problem(&self) -> Option<String> {
        for (name, slack) in [
            ("slack", self.slack),
            ("cpu_slack", self.cpu_slack),
            ("first_contact_slack", self.first_contact_slack),
        ] {
            if !(slack.is_finite() && slack >= 1.0) {
                return Some(format!("deadline.{name} = {slack} must be at least 1.0"));
            }
        }
        let finish_by = self.finish_by;
        if !(finish_by.is_finite() && (1.0..=MAX_FINISH_BY).contains(&finish_by)) {
            return Some(format!(
                "deadline.finish_by = {finish_by} must be in 1.0..={MAX_FINISH_BY} (a multiple of the deadline; 1.0 stops a miner's work at the deadline)"
            ));
        }
        let band = self.retest_band;
        if !(band.is_finite() && band >= 1.0 && band <= finish_by) {
            return Some(format!(
                "deadline.retest_band = {band} must be in 1.0..=deadline.finish_by ({finish_by}): a retest follows only a miss whose late work was verified (1.0: no retests)"
            ));
        }
        if !(250..=60_000).contains(&self.accept_ms) {
            return Some(format!(
                "deadline.accept_ms = {} must be in 250..=60000 (a slow network's round trip or two, up to a minute): a miner accepts or refuses a challenge at once, and time past that is time to compute and then refuse",
                self.accept_ms
            ));
        }
        if !(250..=15_000).contains(&self.connect_ms) {
            return Some(format!(
                "deadline.connect_ms = {} must be in 250..=15000: long enough for a TLS handshake over a slow link, and short enough that a host that never answers cannot hold a scheduler slot for long (and that registering a miner, which dials it and asks its inventory, fits the operator's 30 s call)",
                self.connect_ms
            ));
        }
        None
    }

    /// The tight slack for an observed rate on `backend`.
    pub fn observed_slack(&self, backend: &str) -> f64 {
        if backend == "cpu" { self.cpu_slack } else { self.slack }
    }
}

impl Default for DeadlineConfig {
    fn default() -> Self {
        DeadlineConfig {
            slack: 1.25,
            cpu_slack: 1.75,
            first_contact_slack: 3.0,
            min_ms: 2_000,
            accept_ms: 2_000,
            connect_ms: 10_000,
            finish_by: 2.0,
            retest_band: 1.15,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleConfig {
    pub enabled: bool,
    /// Seconds between attestations of each registered miner.
    pub interval_secs: u64,
    /// Attestations running at once.
    pub concurrency: usize,
    /// Each wait moves randomly by up to this fraction of it, so miners are not challenged in
    /// step (0 to below 1).
    pub jitter: f64,
    /// After a miner could not be attested (unreachable, refusing): the first retry delay,
    /// doubling on each failure in a row up to `backoff_max_secs`.
    pub backoff_initial_secs: u64,
    pub backoff_max_secs: u64,
    /// How long a validator's claim on a miner it is attesting lasts without renewal (it renews
    /// every third of this while it works). Validators sharing a PostgreSQL database split the
    /// miners by these leases; one that dies mid-attestation loses its miners this long after.
    pub lease_secs: u64,
}

impl ScheduleConfig {
    /// What is wrong with these settings, for a person: the first problem found.
    pub fn problem(&self) -> Option<String> {
        if self.interval_secs == 0 {
            return Some(
                "schedule.interval_secs = 0 would attest every miner again the moment it is done; at least 1".into(),
            );
        }
        if self.concurrency == 0 {
            return Some("schedule.concurrency = 0 would attest no miner at all".into());
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Some(format!(
                "schedule.jitter = {} must be at least 0 and below 1",
                self.jitter
            ));
        }
        if self.backoff_initial_secs == 0 || self.backoff_max_secs < self.backoff_initial_secs {
            return Some(format!(
                "schedule.backoff_initial_secs = {} must be at least 1 and at most backoff_max_secs = {}",
                self.backoff_initial_secs, self.backoff_max_secs
            ));
        }
        // Bounded so that every time computed from them fits (and a lease always runs out).
        const A_MONTH_SECS: u64 = 31 * 86_400;
        for (name, secs) in [
            ("interval_secs", self.interval_secs),
            ("backoff_max_secs", self.backoff_max_secs),
            ("lease_secs", self.lease_secs),
        ] {
            if secs > A_MONTH_SECS {
                return Some(format!(
                    "schedule.{name} = {secs} is more than a month ({A_MONTH_SECS} s)"
                ));
            }
        }
        if self.lease_secs < 3 {
            return Some(format!(
                "schedule.lease_secs = {} must be at least 3 (a lease is renewed every third of it)",
                self.lease_secs
            ));
        }
        None
    }
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            enabled: true,
            interval_secs: 600,
            concurrency: 4,
            jitter: 0.1,
            backoff_initial_secs: 30,
            backoff_max_secs: 3600,
            lease_secs: 60,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValidatorConfig {
    /// gRPC API listen address. Loopback by default: the API has no authentication of its own.
    pub listen: SocketAddr,
    pub key_file: PathBuf,
    /// SQLite database file (WAL mode).
    pub database: PathBuf,
    pub policy: Policy,
    /// Openings per sampled verification.
    pub samples: u32,
    /// Fewest openings accepted when a miner advertises a `max_samples` below `samples`: the
    /// validator asks for fewer, down to this floor (or `samples`, if lower), and refuses to
    /// attest a miner that allows fewer still.
    pub min_samples: u32,
    /// Where verification runs.
    pub backend: VerifyBackend,
    /// Threads for verification on the CPU; 0 uses every core.
    pub cpu_threads: usize,
    /// CPU GEMM kernel for verification: "auto" (the fastest this CPU runs) or one of amx,
    /// avx512-vnni, avx-vnni, avx2, portable. GPU_ATTEST_CPU_KERNEL overrides it.
    pub cpu_kernel: KernelChoice,
    pub challenge: ChallengeConfig,
    pub deadline: DeadlineConfig,
    pub schedule: ScheduleConfig,
    /// TLS for the validator's own API; `ca` set requires client certificates (mutual TLS).
    pub tls: TlsFiles,
    /// Serve the API in plaintext on a non-loopback address (logged as a warning).
    pub allow_plaintext: bool,
    /// TLS towards miners at https:// URLs: `ca` the miners' CA; `cert`/`key` this validator's
    /// client certificate for miners that require mutual TLS.
    pub miner_tls: TlsFiles,
    /// Talk plaintext (http://) to miners that are not on loopback.
    pub allow_plaintext_miners: bool,
    /// API requests a minute per address, and the burst allowed at once.
    pub requests_per_minute: u32,
    pub request_burst: u32,
    /// Rate rows of this validator's own (per device on GPUs, per core on CPUs), tried before the
    /// shipped table for classes this validator has not yet calibrated.
    pub rates: Vec<RateEntry>,
    pub calibration: CalibrationConfig,
    /// The memory phase (protocol version 3, PROTOCOL.md 18).
    pub memory: MemoryConfig,
    /// Device evidence (PROTOCOL.md 19): `policy` and the operator's chip and SKU tables.
    pub identity: IdentityConfig,
    /// Attestation transcripts (PROTOCOL.md 21): which verdicts keep theirs, within what budget.
    pub transcripts: TranscriptConfig,
    /// Prometheus metrics on their own loopback HTTP listener; off unless `listen` is set.
    pub metrics: MetricsConfig,
    /// The gRPC health service alone, in plaintext, for a supervisor's probe (`health`
    /// command); off unless `listen` is set.
    pub health: HealthConfig,
}

impl Default for ValidatorConfig {
    fn default() -> Self {
        ValidatorConfig {
            listen: "127.0.0.1:7071".parse().expect("literal address"),
            key_file: PathBuf::from("validator.key"),
            database: PathBuf::from("validator.db"),
            policy: Policy::Auto,
            samples: 16,
            min_samples: 8,
            backend: VerifyBackend::Cpu,
            cpu_threads: 0,
            cpu_kernel: KernelChoice::Auto,
            challenge: ChallengeConfig::default(),
            deadline: DeadlineConfig::default(),
            schedule: ScheduleConfig::default(),
            tls: TlsFiles::default(),
            allow_plaintext: false,
            miner_tls: TlsFiles::default(),
            allow_plaintext_miners: false,
            requests_per_minute: 600,
            request_burst: 60,
            rates: Vec::new(),
            calibration: CalibrationConfig::default(),
            memory: MemoryConfig::default(),
            identity: IdentityConfig::default(),
            transcripts: TranscriptConfig::default(),
            metrics: MetricsConfig::default(),
            health: HealthConfig::default(),
        }
    }
}

impl ValidatorConfig {
    /// Defaults overlaid with `path`'s TOML, if given.
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        load_config(path)
    }

    /// Refuses settings that would make verification meaningless or challenges invalid.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problem = self
            .verification_problem()
            .or_else(|| self.memory.problem())
            .or_else(|| self.identity.problem())
            .or_else(|| self.transcripts.problem())
            .or_else(|| self.deadline.problem())
            .or_else(|| self.schedule.problem())
            .or_else(|| self.calibration_problem())
            .or_else(|| self.challenge_problem());
        match problem {
            Some(problem) => Err(ConfigError::Invalid(problem)),
            None => Ok(()),
        }
    }

    /// What is wrong with how the validator verifies: its sample counts and threads.
    fn verification_problem(&self) -> Option<String> {
        if self.policy != Policy::Full && !(1..=1024).contains(&self.samples) {
            return Some(format!(
                "samples = {} must be in 1..=1024 (0 would check no work at all)",
                self.samples
            ));
        }
        if self.policy != Policy::Full && self.min_samples == 0 {
            return Some("min_samples = 0 would let a miner be attested with no opening at all".into());
        }
        if self.cpu_threads > gpu_attest_daemon::config::MAX_CPU_THREADS {
            return Some(format!(
                "cpu_threads = {} is more than {}; 0 uses every core",
                self.cpu_threads,
                gpu_attest_daemon::config::MAX_CPU_THREADS
            ));
        }
        None
    }

    fn calibration_problem(&self) -> Option<String> {
        (self.calibration.min_miners == 0).then(|| {
            "calibration.min_miners = 0 would learn a rate from no miner at all; 1 trusts a single miner".into()
        })
    }

    /// What is wrong with the challenges this config sizes: the target time, the rate rows and
    /// the shape of the work at both sizes.
    fn challenge_problem(&self) -> Option<String> {
        if self.challenge.target_seconds.is_nan() || self.challenge.target_seconds < 0.0 {
            return Some(format!(
                "challenge.target_seconds = {} must be >= 0",
                self.challenge.target_seconds
            ));
        }
        let sane = |r: &RateEntry| {
            r.ops_per_sec.is_finite()
                && r.ops_per_sec > 0.0
                && r.peak_ops_per_sec.is_finite()
                && r.peak_ops_per_sec >= 0.0
        };
        if let Some(r) = self.rates.iter().find(|r| !sane(r)) {
            return Some(format!(
                "[[rates]] row for backend {:?} model {:?}: ops_per_sec must be positive and peak_ops_per_sec positive or 0",
                r.backend, r.model
            ));
        }
        [self.challenge.gpu_n, self.challenge.cpu_n]
            .into_iter()
            .find_map(|n| {
                let probe = gpu_attest_shared::ChallengeParams {
                    nonce: [0; 32],
                    seed: [0; 32],
                    miner_key: [0; 32],
                    n,
                    num_chains: 1,
                    iterations: self.challenge.iterations,
                    checkpoint_every: self.challenge.checkpoint_every,
                };
                probe.validate().err().map(|e| format!("[challenge]: {e}"))
            })
            .or_else(|| self.memory_n_problem())
    }

    /// Version 4's memory phase walks whole 64 KiB slices of each `n x n` state, so with the
    /// memory phase on, both sizes must be multiples of 256 (PROTOCOL.md 20.9): refused at start
    /// rather than at every attestation of a miner that says 4.
    fn memory_n_problem(&self) -> Option<String> {
        if !self.memory.enabled {
            return None;
        }
        [("gpu_n", self.challenge.gpu_n), ("cpu_n", self.challenge.cpu_n)]
            .into_iter()
            .find(|(_, n)| n % 256 != 0)
            .map(|(name, n)| {
                format!(
                    "[challenge] {name} = {n} is not a multiple of 256, which version 4's memory phase needs (it walks whole 64 KiB slices of each n x n state): set {name} to a multiple of 256 (the defaults are 2048 and 256), or [memory] enabled = false to attest compute only"
                )
            })
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
        let c = ValidatorConfig::default();
        assert_eq!(toml::from_str::<ValidatorConfig>(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn settings_that_would_check_nothing_are_refused() {
        ValidatorConfig::default().validate().unwrap();
        let no_samples = ValidatorConfig {
            samples: 0,
            ..ValidatorConfig::default()
        };
        assert!(no_samples.validate().unwrap_err().to_string().contains("samples"));
        let mut bad_chain = ValidatorConfig::default();
        bad_chain.challenge.checkpoint_every = 3;
        assert!(
            bad_chain
                .validate()
                .unwrap_err()
                .to_string()
                .contains("does not divide")
        );
        let mut bad_n = ValidatorConfig::default();
        bad_n.challenge.cpu_n = 100;
        assert!(bad_n.validate().is_err());
        // n = 64 is a valid challenge, but not with the memory phase, whose states are walked
        // in 64 KiB slices.
        let mut small = ValidatorConfig::default();
        small.challenge.cpu_n = 64;
        let err = small.validate().unwrap_err().to_string();
        assert!(
            err.contains("cpu_n = 64 is not a multiple of 256") && err.contains("enabled = false"),
            "{err}"
        );
        small.memory.enabled = false;
        assert!(small.validate().is_ok());
        let mut loose = ValidatorConfig::default();
        loose.deadline.slack = 0.5;
        assert!(loose.validate().is_err());
        // An observed walk may not be timed more loosely than a first-contact one, on any backend.
        for name in ["slack", "cpu_slack"] {
            let mut inverted = ValidatorConfig::default();
            let memory = &mut inverted.memory;
            *(if name == "slack" {
                &mut memory.slack
            } else {
                &mut memory.cpu_slack
            }) = 2.5;
            let err = inverted.validate().unwrap_err().to_string();
            assert!(
                err.contains(&format!("[memory] {name} = 2.5 exceeds first_contact_slack")),
                "{err}"
            );
        }
        for accept_ms in [0, 249, 60_001] {
            let mut window = ValidatorConfig::default();
            window.deadline.accept_ms = accept_ms;
            let err = window.validate().unwrap_err().to_string();
            assert!(err.contains("deadline.accept_ms"), "{accept_ms}: {err}");
        }
        for connect_ms in [0, 249, 15_001] {
            let mut reach = ValidatorConfig::default();
            reach.deadline.connect_ms = connect_ms;
            let err = reach.validate().unwrap_err().to_string();
            assert!(err.contains("deadline.connect_ms"), "{connect_ms}: {err}");
        }
        for band in [0.99, 2.01, f64::INFINITY] {
            let mut retest = ValidatorConfig::default();
            retest.deadline.retest_band = band;
            let err = retest.validate().unwrap_err().to_string();
            assert!(err.contains("deadline.retest_band"), "{band}: {err}");
        }
        for finish_by in [0.99, 4.01, f64::NAN] {
            let mut late = ValidatorConfig::default();
            late.deadline.finish_by = finish_by;
            let err = late.validate().unwrap_err().to_string();
            assert!(err.contains("deadline.finish_by"), "{finish_by}: {err}");
        }
    }

    #[test]
    fn thread_counts_and_intervals_that_cannot_work_are_refused() {
        let threads = ValidatorConfig {
            cpu_threads: 100_000,
            ..ValidatorConfig::default()
        };
        assert!(
            threads
                .validate()
                .unwrap_err()
                .to_string()
                .contains("cpu_threads = 100000")
        );
        let mut busy = ValidatorConfig::default();
        busy.schedule.interval_secs = 0;
        assert!(busy.validate().unwrap_err().to_string().contains("interval_secs = 0"));
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let c: ValidatorConfig = toml::from_str("samples = 4\n[challenge]\ncpu_n = 128\n").unwrap();
        assert_eq!(c.samples, 4);
        assert_eq!(c.challenge.cpu_n, 128);
        assert_eq!(c.challenge.iterations, ChallengeConfig::default().iterations);
    }

    /// The guide's way of giving GPU models a locality step: a table under `[memory.locality]`,
    /// read with the rest of the walk's defaults, written back the same, and checked.
    #[test]
    fn gpu_locality_steps_read_from_their_own_table() {
        let text = "[memory.locality]\nenabled = true\n[memory.locality.gpu_step_ns]\n\"H100 SXM\" = 700\nH200 = 650\n";
        let c: ValidatorConfig = toml::from_str(text).unwrap();
        let steps: Vec<(&str, u64)> = c
            .memory
            .locality
            .gpu_step_ns
            .iter()
            .map(|(m, &ns)| (m.as_str(), ns))
            .collect();
        assert_eq!(steps, [("H100 SXM", 700), ("H200", 650)]);
        assert_eq!(c.memory.locality.step_ns, 600);
        c.validate().unwrap();
        assert_eq!(toml::from_str::<ValidatorConfig>(&c.to_toml()).unwrap(), c);
        let typo: ValidatorConfig = toml::from_str(&text.replace("H200", "\"H 200\"")).unwrap();
        assert!(typo.validate().unwrap_err().to_string().contains("\"H 200\""));
        // A table written here replaces the shipped one whole (the guide says so): one that names
        // only another model leaves the H200 out, and a file without the table keeps it.
        let other: ValidatorConfig = toml::from_str("[memory.locality.gpu_step_ns]\n\"H100 SXM\" = 700\n").unwrap();
        assert_eq!(
            other.memory.locality.gpu_step_ns.keys().collect::<Vec<_>>(),
            ["H100 SXM"]
        );
        let none: ValidatorConfig = toml::from_str("[memory.locality]\nenabled = true\n").unwrap();
        assert_eq!(none.memory.locality.gpu_step_ns.get("H200"), Some(&1134));
    }
}
