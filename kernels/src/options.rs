//! What the CUDA backend runs on: the options a miner or validator configures, which of the
//! detected GPUs they select (in partition order), and the GEMM kernel all of them run.

use super::compile::KernelBuildError;
use super::detect::{GpuDetectError, GpuInfo};
use super::device::DeviceInitError;
use super::kernels::GpuKernel;
use std::path::PathBuf;
use thiserror::Error;

/// What to run on: which CUDA ordinals, which kernel, where to cache compiled kernels.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    /// CUDA ordinals (after CUDA_VISIBLE_DEVICES) to use; `None`: all of them. The partition
    /// takes them in ascending ordinal order whatever order they are listed in.
    pub ordinals: Option<Vec<u32>>,
    /// `None`: the fastest kernel every selected device supports.
    pub kernel: Option<GpuKernel>,
    /// Disk cache for compiled kernels; `None`: memory only.
    pub cache_dir: Option<PathBuf>,
    /// Hash checkpoints on the host (copying each X back) instead of on the device. Slower; a
    /// fallback, and a cross-check in the GPU tests.
    pub host_hashing: bool,
    /// A test mode (0 and 1: off): each GPU opened as this many slots, each with its own
    /// context, streams and host thread, exactly as separate GPUs are, and a device's chains
    /// split over its slots by the canonical partition with offsets. What the multi-GPU path
    /// does, on a host with one GPU. The claim is unchanged: one device per GPU, so a miner in
    /// this mode states exactly the hardware it has. Slots share a GPU's memory, each sizing its
    /// batches from its share of it, and hold no memory-phase pool (a pool is one device's, and
    /// contexts cannot read each other's memory): such a miner speaks protocol version 2. It
    /// cannot show peer-to-peer copies, PCIe or NVLink topology, or one GPU's fault leaving
    /// another running.
    pub slots_per_gpu: u32,
    /// Walk lines on the GPUs when a validator asks for the locality walk (PROTOCOL.md 20.10).
    /// Off here, so that a library user opts in; the miner's `gpu_locality_walk` (on by
    /// default) sets it. Off, a pool answers that it cannot walk lines and the verdict states no
    /// locality bound.
    pub locality_walk: bool,
}

impl CudaOptions {
    /// Slots each GPU is opened as: 1 unless the test mode asks for more.
    pub fn slots(&self) -> u32 {
        self.slots_per_gpu.max(1)
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CudaInitError {
    #[error(transparent)]
    Detect(#[from] GpuDetectError),
    #[error("CUDA device {ordinal} was asked for, but only {count} are visible")]
    NoSuchOrdinal { ordinal: u32, count: u32 },
    #[error("CUDA device {0} was listed twice")]
    DuplicateOrdinal(u32),
    #[error("no CUDA device was selected")]
    NoneSelected,
    #[error(
        "device {ordinal} ({name}) has compute capability {}.{}; the {kernel} kernel needs {}",
        .compute_capability.0, .compute_capability.1, .kernel.requirement()
    )]
    KernelUnsupported {
        ordinal: u32,
        name: String,
        compute_capability: (u32, u32),
        kernel: GpuKernel,
    },
    #[error(
        "the test mode of {slots} slots a GPU needs {missing} from the driver (CUDA 12.5 or newer, driver R555 or \
         newer) to give each slot a context of its own; this driver does not export it"
    )]
    SlotsUnsupported { slots: u32, missing: &'static str },
    #[error(transparent)]
    Build(#[from] KernelBuildError),
    #[error(transparent)]
    Device(#[from] DeviceInitError),
}

/// The GPUs `options` selects from `detected`, in partition order: ascending CUDA ordinal
/// (PROTOCOL.md section 6), whatever order `ordinals` lists them in.
pub fn select_gpus(detected: &[GpuInfo], ordinals: Option<&[u32]>) -> Result<Vec<GpuInfo>, CudaInitError> {
    let Some(ordinals) = ordinals else {
        return Ok(detected.to_vec());
    };
    let mut chosen: Vec<GpuInfo> = Vec::with_capacity(ordinals.len());
    for &ordinal in ordinals {
        let gpu = detected
            .iter()
            .find(|g| g.ordinal == ordinal)
            .ok_or(CudaInitError::NoSuchOrdinal {
                ordinal,
                count: detected.len() as u32,
            })?;
        if chosen.iter().any(|g| g.ordinal == ordinal) {
            return Err(CudaInitError::DuplicateOrdinal(ordinal));
        }
        chosen.push(gpu.clone());
    }
    if chosen.is_empty() {
        return Err(CudaInitError::NoneSelected);
    }
    chosen.sort_by_key(|g| g.ordinal);
    Ok(chosen)
}

/// The kernels every one of `gpus` supports, fastest first (on a host mixing Hopper with other
/// GPUs, neither tma nor wgmma): what `auto` may choose among.
pub fn kernels_all_support(gpus: &[GpuInfo]) -> Vec<GpuKernel> {
    GpuKernel::FASTEST_FIRST
        .into_iter()
        .filter(|k| gpus.iter().all(|g| k.supports(g.compute_capability)))
        .collect()
}

/// The kernel all of `gpus` run: the one asked for, or the fastest that every one of them
/// supports.
pub fn choose_kernel(gpus: &[GpuInfo], wanted: Option<GpuKernel>) -> Result<GpuKernel, CudaInitError> {
    if gpus.is_empty() {
        return Err(CudaInitError::NoneSelected);
    }
    let kernel = wanted
        .or_else(|| kernels_all_support(gpus).first().copied())
        .unwrap_or(GpuKernel::Tiled);
    match gpus.iter().find(|g| !kernel.supports(g.compute_capability)) {
        Some(g) => Err(CudaInitError::KernelUnsupported {
            ordinal: g.ordinal,
            name: g.name.clone(),
            compute_capability: g.compute_capability,
            kernel,
        }),
        None => Ok(kernel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(ordinal: u32, cc: (u32, u32)) -> GpuInfo {
        GpuInfo {
            ordinal,
            name: format!("gpu{ordinal}"),
            uuid: format!("GPU-{ordinal}"),
            memory_bytes: 80 << 30,
            sm_count: 132,
            compute_capability: cc,
            pci_bus_id: format!("0000:{ordinal:02x}:00.0"),
            driver_version: "test".into(),
            nvml: None,
        }
    }

    #[test]
    fn selection_is_in_ascending_ordinal_order_and_refuses_bad_lists() {
        let detected = [gpu(0, (9, 0)), gpu(1, (9, 0)), gpu(2, (9, 0))];
        let chosen = select_gpus(&detected, Some(&[2, 0])).unwrap();
        assert_eq!(chosen.iter().map(|g| g.ordinal).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(select_gpus(&detected, None).unwrap().len(), 3);
        assert_eq!(
            select_gpus(&detected, Some(&[3])),
            Err(CudaInitError::NoSuchOrdinal { ordinal: 3, count: 3 })
        );
        assert_eq!(
            select_gpus(&detected, Some(&[1, 1])),
            Err(CudaInitError::DuplicateOrdinal(1))
        );
        assert_eq!(select_gpus(&detected, Some(&[])), Err(CudaInitError::NoneSelected));
    }

    #[test]
    fn kernel_choice_suits_the_oldest_device() {
        let hopper = [gpu(0, (9, 0)), gpu(1, (9, 0))];
        assert_eq!(choose_kernel(&hopper, None), Ok(GpuKernel::Tma));
        assert_eq!(choose_kernel(&hopper, Some(GpuKernel::Tiled)), Ok(GpuKernel::Tiled));
        let mixed = [gpu(0, (9, 0)), gpu(1, (7, 5))];
        assert_eq!(choose_kernel(&mixed, None), Ok(GpuKernel::Tiled));
        let err = choose_kernel(&mixed, Some(GpuKernel::Tensor)).unwrap_err();
        assert!(err.to_string().contains("compute capability 7.5"), "{err}");
        assert!(
            err.to_string().contains("needs compute capability 8.0 or later"),
            "{err}"
        );
        // Hopper beside a newer GPU: tma and wgmma are not for both, the tensor kernel is.
        let hopper_and_blackwell = [gpu(0, (9, 0)), gpu(1, (10, 0))];
        assert_eq!(choose_kernel(&hopper_and_blackwell, None), Ok(GpuKernel::Tensor));
        // wgmma refuses anything but Hopper.
        assert_eq!(choose_kernel(&hopper, Some(GpuKernel::Wgmma)), Ok(GpuKernel::Wgmma));
        let blackwell = [gpu(0, (10, 0))];
        let err = choose_kernel(&blackwell, Some(GpuKernel::Wgmma)).unwrap_err();
        assert!(
            err.to_string().contains("needs compute capability 9.0 exactly"),
            "{err}"
        );
    }
}
