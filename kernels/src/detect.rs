//! GPU detection: the CUDA driver for what the work runs on, NVML for what it reports.
//!
//! The device list comes from the CUDA driver, which applies CUDA_VISIBLE_DEVICES (and
//! CUDA_DEVICE_ORDER) itself: ordinal 0 is the first visible device, and that ordinal order is
//! the partition's device order. NVML ignores CUDA_VISIBLE_DEVICES and numbers every GPU in the
//! machine, so NVML's facts are matched to CUDA devices by UUID, or by PCI bus id when a UUID is
//! missing, never by index. NVML is optional: without it the driver's facts are reported alone.

use super::driver::{self, CudaVersion, MIN_DRIVER};
use super::raw;
use cudarc::driver::{result, sys};
use gpu_attest_shared::statement::DeviceInfo;
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
    /// Where this entry sits in MIG (Multi-Instance GPU) partitioning.
    pub mig: MigRole,
}

/// A GPU split by MIG shows CUDA its instances, never the whole GPU: the instances share the
/// parent's PCI bus id and have UUIDs of their own (`MIG-...`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MigRole {
    /// An ordinary GPU.
    #[default]
    None,
    /// A GPU in MIG mode: what CUDA sees at its PCI bus id are instances, not this GPU.
    Parent,
    /// One MIG instance, with its own memory and name (`... MIG 1g.10gb`).
    Instance,
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
    raw::driver::library_present()
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
        gpus.push(apply_nvml(cuda_device(ordinal, &cuda_version)?, &nvml));
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
        let v = raw::driver::device_attribute(dev, a).map_err(query)?;
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
        memory_bytes: raw::driver::total_memory(dev).map_err(query)? as u64,
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
        let in_mig_mode = device.mig_mode().is_ok_and(|m| m.current == 1);
        if in_mig_mode {
            all.extend(mig_instances(&device, &driver_version));
        }
        all.push(NvmlFacts {
            uuid: device.uuid().unwrap_or_default(),
            pci_bus_id: nvml_pci_bus_id(&device),
            name: device.name().unwrap_or_default(),
            memory_total: memory.as_ref().map_or(0, |m| m.total),
            memory_free: memory.as_ref().map_or(0, |m| m.free),
            power_limit_mw: device.power_management_limit().ok(),
            max_sm_clock_mhz: device.max_clock_info(Clock::SM).ok(),
            max_memory_clock_mhz: device.max_clock_info(Clock::Memory).ok(),
            driver_version: driver_version.clone(),
            mig: if in_mig_mode { MigRole::Parent } else { MigRole::None },
        });
    }
    Ok(all)
}

/// NVML's PCI bus id of `device` in this module's `dddd:bb:dd.f` form; empty when unknown.
fn nvml_pci_bus_id(device: &nvml_wrapper::Device<'_>) -> String {
    device
        .pci_info()
        .ok()
        .and_then(|p| parse_pci_bus_id(&p.bus_id))
        .map(|(d, b, dev, f)| format_pci_bus_id(d, b, dev, f))
        .unwrap_or_default()
}

/// The MIG instances of a GPU in MIG mode, each with its own UUID, name and memory.
fn mig_instances(parent: &nvml_wrapper::Device<'_>, driver_version: &str) -> Vec<NvmlFacts> {
    let pci_bus_id = nvml_pci_bus_id(parent);
    let slots = parent.mig_device_count().unwrap_or(0);
    (0..slots)
        .filter_map(|i| parent.mig_device_by_index(i).ok())
        .map(|mig| {
            let memory = mig.memory_info().ok();
            NvmlFacts {
                uuid: mig.uuid().unwrap_or_default(),
                pci_bus_id: pci_bus_id.clone(),
                name: mig.name().unwrap_or_default(),
                memory_total: memory.as_ref().map_or(0, |m| m.total),
                memory_free: memory.as_ref().map_or(0, |m| m.free),
                power_limit_mw: None,
                max_sm_clock_mhz: None,
                max_memory_clock_mhz: None,
                driver_version: driver_version.to_string(),
                mig: MigRole::Instance,
            }
        })
        .collect()
}

/// NVML's entry for a CUDA device: same UUID, else same PCI bus id. Never by position: NVML's
/// numbering ignores CUDA_VISIBLE_DEVICES. UUIDs compare without their `GPU-`/`MIG-` prefix (the
/// driver's bytes carry none). The PCI fallback never takes a GPU in MIG mode or one of its
/// instances: several CUDA devices share that bus id, and the parent's facts are not theirs.
pub fn match_nvml<'a>(uuid: &str, pci_bus_id: &str, nvml: &'a [NvmlFacts]) -> Option<&'a NvmlFacts> {
    let bare = uuid_body(uuid);
    let by_uuid = nvml
        .iter()
        .find(|f| !bare.is_empty() && uuid_body(&f.uuid).eq_ignore_ascii_case(bare));
    by_uuid.or_else(|| {
        let want = parse_pci_bus_id(pci_bus_id)?;
        nvml.iter()
            .find(|f| parse_pci_bus_id(&f.pci_bus_id) == Some(want))
            .filter(|f| f.mig == MigRole::None)
    })
}

/// A UUID without its `GPU-` or `MIG-` prefix.
fn uuid_body(uuid: &str) -> &str {
    uuid.strip_prefix("GPU-")
        .or_else(|| uuid.strip_prefix("MIG-"))
        .unwrap_or(uuid)
}

/// Whether a CUDA device at `pci_bus_id` is a MIG instance: NVML has that GPU in MIG mode.
fn on_mig_parent(pci_bus_id: &str, nvml: &[NvmlFacts]) -> bool {
    let want = parse_pci_bus_id(pci_bus_id);
    want.is_some()
        && nvml
            .iter()
            .any(|f| f.mig == MigRole::Parent && parse_pci_bus_id(&f.pci_bus_id) == want)
}

/// `gpu` with what NVML says about it. A MIG instance is reported as itself: its `MIG-` UUID,
/// its name with the profile (`... MIG 1g.10gb`), and the memory and SMs CUDA gives the
/// instance, never its parent's. An instance NVML could not describe still gets the `MIG-`
/// prefix and `MIG` in its name, so no one takes it for the whole GPU.
pub fn apply_nvml(mut gpu: GpuInfo, nvml: &[NvmlFacts]) -> GpuInfo {
    let is_mig = on_mig_parent(&gpu.pci_bus_id, nvml);
    if let Some(facts) = match_nvml(&gpu.uuid, &gpu.pci_bus_id, nvml) {
        if !facts.driver_version.is_empty() {
            gpu.driver_version = facts.driver_version.clone();
        }
        if facts.mig == MigRole::Instance {
            gpu.uuid = facts.uuid.clone();
            if !facts.name.is_empty() {
                gpu.name = facts.name.clone();
            }
        }
        gpu.nvml = Some(facts.clone());
    }
    if is_mig {
        if let Some(body) = gpu.uuid.strip_prefix("GPU-") {
            gpu.uuid = format!("MIG-{body}");
        }
        if !gpu.name.contains("MIG") {
            gpu.name.push_str(" MIG");
        }
    }
    gpu
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

    fn cuda_gpu(uuid: &str, pci: &str) -> GpuInfo {
        GpuInfo {
            ordinal: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: uuid.into(),
            memory_bytes: 10 << 30,
            sm_count: 16,
            compute_capability: (9, 0),
            pci_bus_id: pci.into(),
            driver_version: "CUDA 12.4".into(),
            nvml: None,
        }
    }

    /// Under MIG, CUDA sees an instance: its own UUID, a seventh of the SMs and memory. It must
    /// be reported as that instance, never with its parent's facts found by PCI bus id.
    #[test]
    fn a_mig_instance_is_reported_as_itself_not_its_parent() {
        let parent = NvmlFacts {
            mig: MigRole::Parent,
            memory_total: 80 << 30,
            ..facts(
                "GPU-aaaa0000-0000-0000-0000-000000000000",
                "00000000:19:00.0",
                "NVIDIA H100 80GB HBM3",
            )
        };
        let instance = NvmlFacts {
            mig: MigRole::Instance,
            memory_total: 10 << 30,
            ..facts(
                "MIG-bbbb0000-0000-0000-0000-000000000000",
                "00000000:19:00.0",
                "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            )
        };
        let nvml = [instance.clone(), parent.clone()];
        // The driver's bytes of the instance's UUID, formatted the one way the driver knows.
        let gpu = apply_nvml(
            cuda_gpu("GPU-bbbb0000-0000-0000-0000-000000000000", "0000:19:00.0"),
            &nvml,
        );
        assert_eq!(gpu.uuid, "MIG-bbbb0000-0000-0000-0000-000000000000");
        assert_eq!(gpu.name, "NVIDIA H100 80GB HBM3 MIG 1g.10gb");
        assert_eq!(gpu.nvml.as_ref().unwrap().memory_total, 10 << 30);
        assert_eq!(
            (gpu.memory_bytes, gpu.sm_count),
            (10 << 30, 16),
            "CUDA's own figures stay"
        );

        // An instance NVML did not list: no parent's facts, and still marked as MIG.
        let gpu = apply_nvml(
            cuda_gpu("GPU-cccc0000-0000-0000-0000-000000000000", "0000:19:00.0"),
            &[parent],
        );
        assert_eq!(gpu.nvml, None, "the parent's facts are not the instance's");
        assert_eq!(gpu.uuid, "MIG-cccc0000-0000-0000-0000-000000000000");
        assert_eq!(gpu.name, "NVIDIA H100 80GB HBM3 MIG");

        // A GPU not in MIG mode keeps its UUID and name, and NVML's facts by PCI bus id.
        let plain = facts("GPU-dddd", "00000000:2a:00.0", "NVIDIA A100");
        let gpu = apply_nvml(cuda_gpu("GPU-zzzz", "0000:2a:00.0"), &[plain]);
        assert_eq!(
            (gpu.uuid.as_str(), gpu.nvml.unwrap().name.as_str()),
            ("GPU-zzzz", "NVIDIA A100")
        );
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
