//! What the miner tells Prometheus: challenges and openings by outcome, compute time and chains
//! per second, and, read at each scrape, every GPU's temperature, power, utilisation, memory and
//! clocks from NVML (the CPU's load average on a host without them).

use gpu_attest_daemon::metrics::prometheus_client::metrics::counter::Counter;
use gpu_attest_daemon::metrics::prometheus_client::metrics::family::Family;
use gpu_attest_daemon::metrics::prometheus_client::metrics::histogram::Histogram;
use gpu_attest_daemon::metrics::prometheus_client::registry::Registry;
use gpu_attest_daemon::metrics::{Exposition, Labels, RealGauge, duration_histogram};
use gpu_attest_kernels::telemetry::{GpuReading, Telemetry};
use std::time::Duration;

/// How a challenge ended, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChallengeOutcome {
    Committed,
    /// Refused before any work (the label carries the gRPC code).
    Refused,
    /// The validator went away; the work was cancelled.
    Cancelled,
    DeadlineReached,
    Failed,
}

impl ChallengeOutcome {
    fn name(self) -> &'static str {
        match self {
            ChallengeOutcome::Committed => "committed",
            ChallengeOutcome::Refused => "refused",
            ChallengeOutcome::Cancelled => "cancelled",
            ChallengeOutcome::DeadlineReached => "deadline-reached",
            ChallengeOutcome::Failed => "failed",
        }
    }
}

#[derive(Clone)]
pub struct MinerMetrics {
    challenges: Family<Labels, Counter>,
    openings: Family<Labels, Counter>,
    compute: Histogram,
    chains_per_second: RealGauge,
    gpu: GpuGauges,
    cpu_load: RealGauge,
}

/// The per-GPU gauges, set from NVML at each scrape.
#[derive(Clone, Default)]
struct GpuGauges {
    temperature: Family<Labels, RealGauge>,
    power: Family<Labels, RealGauge>,
    utilization: Family<Labels, RealGauge>,
    memory_used: Family<Labels, RealGauge>,
    sm_clock: Family<Labels, RealGauge>,
    memory_clock: Family<Labels, RealGauge>,
}

impl GpuGauges {
    fn set(&self, reading: &GpuReading) {
        let labels = vec![("gpu", reading.index.to_string()), ("uuid", reading.uuid.clone())];
        for (family, value) in [
            (&self.temperature, reading.temperature_celsius),
            (&self.power, reading.power_watts),
            (&self.utilization, reading.utilization),
            (&self.memory_used, reading.memory_used_bytes),
            (&self.sm_clock, reading.sm_clock_hertz),
            (&self.memory_clock, reading.memory_clock_hertz),
        ] {
            if let Some(value) = value {
                family.get_or_create(&labels).set(value);
            }
        }
    }
}

impl Default for MinerMetrics {
    fn default() -> Self {
        MinerMetrics {
            challenges: Family::default(),
            openings: Family::default(),
            compute: duration_histogram(),
            chains_per_second: RealGauge::default(),
            gpu: GpuGauges::default(),
            cpu_load: RealGauge::default(),
        }
    }
}

impl MinerMetrics {
    pub fn challenge(&self, outcome: ChallengeOutcome, code: Option<tonic::Code>) {
        let mut labels = vec![("outcome", outcome.name().to_string())];
        if let Some(code) = code {
            labels.push(("code", format!("{code:?}")));
        }
        self.challenges.get_or_create(&labels).inc();
    }

    /// A commitment sent: `chains` chains computed in `took`.
    pub fn computed(&self, chains: u64, took: Duration) {
        self.compute.observe(took.as_secs_f64());
        if took > Duration::ZERO {
            self.chains_per_second.set(chains as f64 / took.as_secs_f64());
        }
    }

    pub fn opening(&self, served: bool) {
        let outcome = if served { "served" } else { "refused" };
        self.openings.get_or_create(&vec![("outcome", outcome.into())]).inc();
    }

    /// The endpoint's exposition: these metrics, with the GPUs (through NVML, when it starts)
    /// and the CPU's load read at each scrape.
    pub fn exposition(&self) -> Exposition {
        let mut r = Registry::with_prefix("gpu_attest_miner");
        gpu_attest_daemon::metrics::register_build_info(&mut r);
        r.register(
            "challenges",
            "Challenges by outcome (refusals with their gRPC code)",
            self.challenges.clone(),
        );
        r.register("openings", "Chain openings by outcome", self.openings.clone());
        r.register(
            "compute_seconds",
            "Time from accepting a challenge to its commitment",
            self.compute.clone(),
        );
        r.register(
            "chains_per_second",
            "Chains per second in the latest committed challenge",
            self.chains_per_second.clone(),
        );
        let g = &self.gpu;
        r.register(
            "gpu_temperature_celsius",
            "GPU temperature (NVML)",
            g.temperature.clone(),
        );
        r.register("gpu_power_watts", "GPU power draw (NVML)", g.power.clone());
        r.register(
            "gpu_utilization_ratio",
            "Share of the last sample period in which a kernel ran on the GPU (NVML)",
            g.utilization.clone(),
        );
        r.register(
            "gpu_memory_used_bytes",
            "GPU memory in use (NVML)",
            g.memory_used.clone(),
        );
        r.register("gpu_sm_clock_hertz", "GPU SM clock (NVML)", g.sm_clock.clone());
        r.register(
            "gpu_memory_clock_hertz",
            "GPU memory clock (NVML)",
            g.memory_clock.clone(),
        );
        r.register(
            "cpu_load_average_1m",
            "The host's one-minute load average",
            self.cpu_load.clone(),
        );
        let telemetry = match Telemetry::open() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::info!("no GPU readings in the metrics: {e}");
                None
            }
        };
        let (gpu, cpu_load) = (self.gpu.clone(), self.cpu_load.clone());
        Exposition::new(r, move || {
            if let Some(telemetry) = &telemetry {
                for reading in telemetry.read() {
                    gpu.set(&reading);
                }
            }
            if let Some(load) = load_average() {
                cpu_load.set(load);
            }
        })
    }
}

/// The one-minute load average, where the system gives it (`/proc/loadavg` on Linux).
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}
