//! Live readings of the GPUs from NVML (temperature, power, utilisation, memory, clocks), for
//! the miner's metrics. Each reading that NVML cannot give is left out, not guessed.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};

/// One GPU's readings at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReading {
    /// NVML's index of the GPU (all of the machine's GPUs, whatever CUDA_VISIBLE_DEVICES says).
    pub index: u32,
    pub uuid: String,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
    /// Share of the last sample period in which a kernel ran, 0..1.
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub sm_clock_hertz: Option<f64>,
    pub memory_clock_hertz: Option<f64>,
}

/// NVML, started once and read on every scrape.
pub struct Telemetry {
    nvml: Nvml,
}

impl Telemetry {
    /// NVML, or why it cannot start (no NVIDIA driver here).
    pub fn open() -> Result<Self, String> {
        Nvml::init()
            .map(|nvml| Telemetry { nvml })
            .map_err(|e| format!("NVML unavailable: {e}"))
    }

    pub fn read(&self) -> Vec<GpuReading> {
        let count = self.nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|index| {
                let device = self.nvml.device_by_index(index).ok()?;
                let mhz = |clock| device.clock_info(clock).ok().map(|m| f64::from(m) * 1e6);
                Some(GpuReading {
                    index,
                    uuid: device.uuid().unwrap_or_default(),
                    temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
                    power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1e3),
                    utilization: device.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
                    memory_used_bytes: device.memory_info().ok().map(|m| m.used as f64),
                    sm_clock_hertz: mhz(Clock::SM),
                    memory_clock_hertz: mhz(Clock::Memory),
                })
            })
            .collect()
    }
}
