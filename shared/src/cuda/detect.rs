//! GPU detection: the CUDA driver for what the work runs on, NVML for what it reports.
//!
//! The device list comes from the CUDA driver, which applies CUDA_VISIBLE_DEVICES (and
//! CUDA_DEVICE_ORDER) itself: ordinal 0 is the first visible device, and that ordinal order is
//! the partition's device order. NVML ignores CUDA_VISIBLE_DEVICES and numbers every GPU in the
//! machine, so NVML's facts are matched to CUDA devices by UUID, or by PCI bus id when a UUID is
//! missing, never by index. NVML is optional: without it the driver's facts are reported alone.

use super::driver::{self, CudaVersion, MIN_DRIVER};
use crate::statement::DeviceInfo;
use cudarc::driver::{result, sys};
use thiserror::Error;

/// One CUDA device as the miner reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// CUDA ordinal after CUDA_VISIBLE_DEVICES.
    pub ordinal: u32,
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it.
    pub uuid: String,
    pub memory_bytes: u64,
    pub sm_count: u32,
    pub compute_capability: (u32, u32),
    /// `dddd:bb:dd.f`, lower case.
    pub pci_bus_id: String,
    /// The NVIDIA driver version from NVML, else the CUDA version the driver supports.
    pub driver_version: String,
    /// From NVML, when it matched this device.
    pub nvml: Option<NvmlFacts>,
}

/// What NVML adds about one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvmlFacts {
    pub uuid: String,
    pub pci_bus_id: String,
    pub name: String,
    pub memory_total: u64,
    pub memory_free: u64,
    pub power_limit_mw: Option<u32>,
    pub max_sm_clock_mhz: Option<u32>,
    pub max_memory_clock_mhz: Option<u32>,
    pub driver_version: String,
}

/// The result of looking for GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    pub gpus: Vec<GpuInfo>,
    /// The CUDA version the driver supports.
    pub driver: CudaVersion,
    /// CUDA_VISIBLE_DEVICES as this process saw it.
    pub visible_devices: Option<String>,
    /// Why NVML's facts are missing, if they are.
    pub nvml_note: Option<String>,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GpuDetectError {
    #[error("no NVIDIA driver: libcuda could not be loaded (install the NVIDIA driver to use GPUs)")]
    NoDriver,
    #[error(
        "NVML sees {gpus} GPU{} (driver {driver}), but the driver's CUDA library (libcuda.so.1) could not be loaded: \
         the driver install is incomplete, or this is a container started without the NVIDIA runtime's compute \
         capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility)",
        if *.gpus == 1 { "" } else { "s" }
    )]
    NvmlWithoutCuda { driver: String, gpus: u32 },
    #[error("the NVIDIA driver could not be used: {0}")]
    DriverVersion(String),
    #[error("the NVIDIA driver here supports CUDA {found}; the miner needs {}", .needed.needed())]
    DriverTooOld { found: CudaVersion, needed: CudaVersion },
    #[error(
        "the NVIDIA driver here (CUDA {driver}) lacks {} that the miner calls: {}; install a driver for {}",
        if .symbols.len() == 1 { "an entry point" } else { "entry points" },
        .symbols.join(", "),
        MIN_DRIVER.needed()
    )]
    MissingEntryPoints { driver: CudaVersion, symbols: Vec<String> },
    #[error("no GPU visible to CUDA{}", visible_hint(.visible_devices))]
    NoDevices { visible_devices: Option<String> },
    #[error("the CUDA driver failed to start: {0}")]
    DriverInit(String),
    #[error("could not query CUDA device {ordinal}: {detail}")]
    Query { ordinal: u32, detail: String },
}

fn visible_hint(visible: &Option<String>) -> String {
    match visible {
        Some(v) => format!(" (CUDA_VISIBLE_DEVICES={v:?} hides the others)"),
        None => String::new(),
    }
}

/// A CUDA driver error as `CUDA_ERROR_NAME: description`.
pub(crate) fn driver_error_text(e: &result::DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(name), Ok(text)) => format!("{name}: {text}"),
        _ => format!("{:?}", e.0),
    }
}

/// Whether the CUDA driver library can be loaded. Asked before any driver call: cudarc panics
/// when the library is missing.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// Finds the CUDA devices of this host, in ordinal order, with NVML's facts where NVML runs.
pub fn detect() -> Result<Detection, GpuDetectError> {
    let visible_devices = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    if !driver_present() {
        return Err(match nvml_summary() {
            Some((driver, gpus)) if gpus > 0 => GpuDetectError::NvmlWithoutCuda { driver, gpus },
            _ => GpuDetectError::NoDriver,
        });
    }
    // Before any call that could panic on a missing entry point: what the driver is and has.
    let driver = driver::version().map_err(GpuDetectError::DriverVersion)?;
    if driver < MIN_DRIVER {
        return Err(GpuDetectError::DriverTooOld {
            found: driver,
            needed: MIN_DRIVER,
        });
    }
    let missing = driver::missing_symbols();
    if !missing.is_empty() {
        return Err(GpuDetectError::MissingEntryPoints {
            driver,
            symbols: missing.into_iter().map(String::from).collect(),
        });
    }
    result::init().map_err(|e| match e.0 {
        sys::CUresult::CUDA_ERROR_NO_DEVICE => GpuDetectError::NoDevices {
            visible_devices: visible_devices.clone(),
        },
        _ => GpuDetectError::DriverInit(driver_error_text(&e)),
    })?;
    let count = result::device::get_count().map_err(|e| GpuDetectError::DriverInit(driver_error_text(&e)))?;
    if count <= 0 {
        return Err(GpuDetectError::NoDevices { visible_devices });
    }
    let cuda_version = format!("CUDA {driver}");
    let (nvml, nvml_note) = match nvml_facts() {
        Ok(facts) => (facts, None),
        Err(note) => (Vec::new(), Some(note)),
    };
    let mut gpus = Vec::with_capacity(count as usize);
    for ordinal in 0..count as u32 {
        let mut gpu = cuda_device(ordinal, &cuda_version)?;
        if let Some(facts) = match_nvml(&gpu.uuid, &gpu.pci_bus_id, &nvml) {
            if !facts.driver_version.is_empty() {
                gpu.driver_version = facts.driver_version.clone();
            }
            gpu.nvml = Some(facts.clone());
        }
        gpus.push(gpu);
    }
    Ok(Detection {
        gpus,
        driver,
        visible_devices,
        nvml_note,
    })
}

fn cuda_device(ordinal: u32, driver_version: &str) -> Result<GpuInfo, GpuDetectError> {
    let query = |e: result::DriverError| GpuDetectError::Query {
        ordinal,
        detail: driver_error_text(&e),
    };
    let dev = result::device::get(ordinal as i32).map_err(query)?;
    let attr = |a| -> Result<u32, GpuDetectError> {
        // SAFETY: dev is a valid device handle from cuDeviceGet.
        let v = unsafe { result::device::get_attribute(dev, a) }.map_err(query)?;
        Ok(v.max(0) as u32)
    };
    use sys::CUdevice_attribute as A;
    let compute_capability = (
        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let pci_bus_id = format_pci_bus_id(
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
        0,
    );
    let uuid = result::device::get_uuid(dev).map_err(query)?;
    Ok(GpuInfo {
        ordinal,
        name: result::device::get_name(dev).map_err(query)?,
        uuid: format_uuid(&uuid.bytes.map(|b| b as u8)),
        // SAFETY: dev is a valid device handle.
        memory_bytes: unsafe { result::device::total_mem(dev) }.map_err(query)? as u64,
        sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        compute_capability,
        pci_bus_id,
        driver_version: driver_version.to_string(),
        nvml: None,
    })
}

/// NVML's driver version and GPU count, when NVML starts: on a host whose libcuda is missing,
/// this tells a broken install from a host without GPUs.
fn nvml_summary() -> Option<(String, u32)> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let gpus = nvml.device_count().ok()?;
    Some((nvml.sys_driver_version().unwrap_or_else(|_| "unknown".into()), gpus))
}

/// Every GPU NVML sees (all of the machine's, whatever CUDA_VISIBLE_DEVICES says), or why not.
fn nvml_facts() -> Result<Vec<NvmlFacts>, String> {
    use nvml_wrapper::Nvml;
    use nvml_wrapper::enum_wrappers::device::Clock;
    let nvml = Nvml::init().map_err(|e| format!("NVML unavailable ({e}); reporting what the CUDA driver knows"))?;
    let driver_version = nvml.sys_driver_version().unwrap_or_default();
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML could not count GPUs: {e}"))?;
    let mut all = Vec::with_capacity(count as usize);
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let memory = device.memory_info().ok();
        all.push(NvmlFacts {
            uuid: device.uuid().unwrap_or_default(),
            pci_bus_id: device
                .pci_info()
                .ok()
                .and_then(|p| parse_pci_bus_id(&p.bus_id))
                .map(|(d, b, dev, f)| format_pci_bus_id(d, b, dev, f))
                .unwrap_or_default(),
            name: device.name().unwrap_or_default(),
            memory_total: memory.as_ref().map_or(0, |m| m.total),
            memory_free: memory.as_ref().map_or(0, |m| m.free),
            power_limit_mw: device.power_management_limit().ok(),
            max_sm_clock_mhz: device.max_clock_info(Clock::SM).ok(),
            max_memory_clock_mhz: device.max_clock_info(Clock::Memory).ok(),
            driver_version: driver_version.clone(),
        });
    }
    Ok(all)
}

/// NVML's entry for a CUDA device: same UUID, else same PCI bus id. Never by position: NVML's
/// numbering ignores CUDA_VISIBLE_DEVICES.
pub fn match_nvml<'a>(uuid: &str, pci_bus_id: &str, nvml: &'a [NvmlFacts]) -> Option<&'a NvmlFacts> {
    let by_uuid = nvml
        .iter()
        .find(|f| !uuid.is_empty() && f.uuid.eq_ignore_ascii_case(uuid));
    by_uuid.or_else(|| {
        let want = parse_pci_bus_id(pci_bus_id)?;
        nvml.iter().find(|f| parse_pci_bus_id(&f.pci_bus_id) == Some(want))
    })
}

/// `GPU-` and the 16 bytes grouped 4-2-2-2-6 in hex, as nvidia-smi and NVML print UUIDs.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let h = hex::encode(bytes);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// `dddd:bb:dd.f` in lower-case hex.
pub fn format_pci_bus_id(domain: u32, bus: u32, device: u32, function: u32) -> String {
    format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")
}

/// Parses `domain:bus:device.function` whatever the width of the domain (NVML pads it to 8 hex
/// digits, the driver's own format to 4) or the case.
pub fn parse_pci_bus_id(id: &str) -> Option<(u32, u32, u32, u32)> {
    let (domain, rest) = id.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

impl GpuInfo {
    /// What the commitment reports for this GPU as device `index` of the partition.
    pub fn device_info(&self, index: u32) -> DeviceInfo {
        DeviceInfo {
            index,
            name: self.name.clone(),
            uuid: self.uuid.clone(),
            memory_bytes: self.memory_bytes,
            sm_count: self.sm_count,
            compute_capability: self.compute_capability,
            pci_bus_id: self.pci_bus_id.clone(),
            driver_version: self.driver_version.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(uuid: &str, pci: &str, name: &str) -> NvmlFacts {
        NvmlFacts {
            uuid: uuid.into(),
            pci_bus_id: pci.into(),
            name: name.into(),
            ..NvmlFacts::default()
        }
    }

    #[test]
    fn uuid_is_formatted_like_nvidia_smi() {
        let bytes: [u8; 16] = core::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(format_uuid(&bytes), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn pci_ids_compare_across_nvml_and_driver_formats() {
        assert_eq!(parse_pci_bus_id("00000000:19:00.0"), Some((0, 0x19, 0, 0)));
        assert_eq!(parse_pci_bus_id("0000:19:00.0"), parse_pci_bus_id("00000000:19:00.0"));
        assert_eq!(parse_pci_bus_id("0001:AB:1F.0"), Some((1, 0xab, 0x1f, 0)));
        assert_eq!(format_pci_bus_id(1, 0xab, 0x1f, 0), "0001:ab:1f.0");
        for bad in ["", "19:00.0", "zz:19:00.0", "0000:19:00", "0000:19:00.x"] {
            assert_eq!(parse_pci_bus_id(bad), None, "{bad:?}");
        }
    }

    /// CUDA_VISIBLE_DEVICES=2 makes the machine's third GPU CUDA ordinal 0; NVML still calls it
    /// index 2. The match must find it by identity, not by position.
    #[test]
    fn nvml_match_ignores_position() {
        let nvml = [
            facts("GPU-aaaa", "00000000:17:00.0", "gpu0"),
            facts("GPU-bbbb", "00000000:2a:00.0", "gpu1"),
            facts("GPU-cccc", "00000000:3b:00.0", "gpu2"),
        ];
        assert_eq!(match_nvml("GPU-cccc", "0000:3b:00.0", &nvml).unwrap().name, "gpu2");
        // No UUID from the driver (or a mismatch): the PCI bus id decides.
        assert_eq!(match_nvml("", "0000:2a:00.0", &nvml).unwrap().name, "gpu1");
        assert_eq!(match_nvml("GPU-zzzz", "0000:17:00.0", &nvml).unwrap().name, "gpu0");
        assert_eq!(match_nvml("GPU-zzzz", "0000:99:00.0", &nvml), None);
        assert_eq!(match_nvml("GPU-aaaa", "", &[]), None);
    }

    /// Without a driver (CI, any CPU-only host) detection is an error value with a clear
    /// message, not a panic.
    #[test]
    fn no_driver_is_a_clear_error() {
        if driver_present() {
            println!("skipped: this host has a CUDA driver");
            return;
        }
        let err = detect().unwrap_err();
        assert_eq!(err, GpuDetectError::NoDriver);
        assert!(err.to_string().contains("no NVIDIA driver"), "{err}");
    }
}
