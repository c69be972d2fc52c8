//! Each kernel's self-check, as both daemons run it before they trust a GPU (and `miner
//! selftest` for every kernel): every kernel on every selected device runs the checks of
//! [`Suite`] and is compared, checkpoint by checkpoint, with the CPU.
//!
//! A kernel that differs or faults is not used: the daemon takes the first kernel, in the fixed
//! order of [`GpuKernel::FASTEST_FIRST`], that passed on every selected GPU
//! ([`choose_gpu_kernel`]). Results are cached on disk per device UUID,
//! driver, kernel source and version, so a restart does not pay again; and a kernel that faulted
//! its GPU is cached as failed, so that the restart such a fault needs (a CUDA fault cannot be
//! cleared inside the process) goes on to the next kernel instead of faulting the GPU again.

use crate::compile::{nvrtc_version, write_atomically};
use crate::detect::{Detection, GpuInfo};
use crate::options::{kernels_all_support, select_gpus};
use crate::{CudaBackend, CudaInitError, CudaOptions, GpuKernel};
use gpu_attest_shared::Backend;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::gemm::KernelKind;
use gpu_attest_shared::selftest::{MID_N, SelftestError, Suite};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// What one kernel on one device showed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// Every checkpoint matched; the mid-sized case ran at this rate.
    Passed { ops_per_sec: f64 },
    /// The first difference, or the fault, in one line.
    Failed { reason: String },
}

impl Outcome {
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Passed { .. })
    }
}

/// One kernel on one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelCheck {
    /// `cpu` or `cuda`.
    pub backend: String,
    /// The device's index among those checked (the partition's, when all of them are).
    pub index: u32,
    /// `cpu`, or `gpu <ordinal> (<name>, <uuid>)`.
    pub device: String,
    pub kernel: String,
    pub outcome: Outcome,
    /// Taken from the cache of an earlier run.
    pub cached: bool,
    /// The check faulted its GPU and left it out of service for the rest of this process (a
    /// CUDA fault cannot be cleared in-process on an H100): no later check or challenge on that
    /// GPU can run until the daemon restarts.
    #[serde(skip)]
    pub faulted_device: bool,
    /// Why the fault could not be remembered in the cache (no cache directory, or writing
    /// failed); None when it was, or when nothing faulted. A restart would then fault the GPU
    /// again on the same kernel, so the daemon must not ask for one.
    #[serde(skip)]
    pub fault_not_remembered: Option<String>,
}

impl std::fmt::Display for KernelCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cached = if self.cached { " (cached)" } else { "" };
        match &self.outcome {
            Outcome::Passed { ops_per_sec } => write!(
                f,
                "{} kernel {}: passed (its check ran at {:.3} TOPS on small steps, not a speed measurement: see `miner bench`){cached}",
                self.device,
                self.kernel,
                ops_per_sec / 1e12
            ),
            Outcome::Failed { reason } => {
                write!(f, "{} kernel {}: FAILED: {reason}{cached}", self.device, self.kernel)
            }
        }
    }
}

/// The checks' reference results, computed once, when first needed: the mid-sized reference
/// takes seconds on the CPU, and a fully cached GPU check needs none.
pub struct LazySuite {
    mid_n: u32,
    threads: usize,
    suite: Option<Result<Suite, String>>,
}

impl LazySuite {
    pub fn new(mid_n: u32, threads: usize) -> Self {
        LazySuite {
            mid_n,
            threads,
            suite: None,
        }
    }

    /// The suite, built on first use; Err: why it could not be built.
    pub fn get(&mut self) -> Result<&Suite, String> {
        let (mid_n, threads) = (self.mid_n, self.threads);
        self.suite
            .get_or_insert_with(|| Suite::new(mid_n, threads).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The outcome, and whether it may be cached: a pass or a wrong result is a property of the
    /// device, driver and kernel; a fault or a failure to start may be of the moment.
    fn check(&mut self, backend: &dyn Backend) -> (Outcome, bool) {
        match self.get().map(|suite| suite.check(backend)) {
            Ok(Ok(p)) => (
                Outcome::Passed {
                    ops_per_sec: p.ops_per_sec,
                },
                true,
            ),
            Ok(Err(e)) => {
                let lasting = matches!(e, SelftestError::Differs { .. } | SelftestError::ChainCount { .. });
                (Outcome::Failed { reason: e.to_string() }, lasting)
            }
            Err(e) => (Outcome::Failed { reason: e }, false),
        }
    }
}

/// Every CPU kernel this CPU runs, on `threads` threads.
pub fn cpu_kernels(suite: &mut LazySuite, threads: usize) -> Vec<KernelCheck> {
    KernelKind::ALL
        .into_iter()
        .filter(|k| k.is_available())
        .map(|kernel| {
            let outcome = match CpuBackend::new(threads, Some(kernel)) {
                Ok(backend) => suite.check(&backend).0,
                Err(e) => Outcome::Failed { reason: e.to_string() },
            };
            KernelCheck {
                backend: "cpu".into(),
                index: 0,
                device: "cpu".into(),
                kernel: kernel.to_string(),
                outcome,
                cached: false,
                faulted_device: false,
                fault_not_remembered: None,
            }
        })
        .collect()
}

/// Of `kernels`, those `gpu` supports.
fn kernels_for(gpu: &GpuInfo, kernels: &[GpuKernel]) -> Vec<GpuKernel> {
    kernels
        .iter()
        .copied()
        .filter(|k| k.supports(gpu.compute_capability))
        .collect()
}

fn describe_gpu(gpu: &GpuInfo) -> String {
    format!("gpu {} ({}, {})", gpu.ordinal, gpu.name, gpu.uuid)
}

/// Each of `kernels` on every GPU `options` selects that supports it, from the cache where it
/// has the answer and `fresh` is false. Passes, wrong results and faults that put the GPU out of
/// service are written to the cache. After such a fault the GPU's remaining kernels are not
/// checked in this process (each would fail with the same fault) and the check says so
/// ([`KernelCheck::faulted_device`]): the daemon must restart to use the GPU.
pub fn gpu_kernels(
    suite: &mut LazySuite,
    detection: &Detection,
    options: &CudaOptions,
    kernels: &[GpuKernel],
    fresh: bool,
) -> Result<Vec<KernelCheck>, String> {
    let gpus = select_gpus(&detection.gpus, options.ordinals.as_deref()).map_err(|e| e.to_string())?;
    let cache = options.cache_dir.as_ref().map(|d| d.join("selftest"));
    let mut checks = Vec::new();
    for (index, gpu) in gpus.iter().enumerate() {
        // The kernel that faulted this GPU earlier in this process, if one did.
        let mut faulted_by: Option<GpuKernel> = None;
        for kernel in kernels_for(gpu, kernels) {
            let key = cache_key(gpu, kernel, suite.mid_n, options.host_hashing, options.slots());
            let cached = if fresh {
                None
            } else {
                cache.as_deref().and_then(|d| read_cached(d, &key))
            };
            let checked = match (cached, faulted_by) {
                (Some(outcome), _) => Checked::from_cache(outcome),
                (None, Some(culprit)) => Checked::after_fault_by(culprit),
                (None, None) => {
                    let one = CudaOptions {
                        ordinals: Some(vec![gpu.ordinal]),
                        kernel: Some(kernel),
                        ..options.clone()
                    };
                    check_now(suite, detection, &one, cache.as_deref(), &key)
                }
            };
            if checked.faulted_device {
                faulted_by = Some(kernel);
            }
            checks.push(KernelCheck {
                backend: "cuda".into(),
                index: index as u32,
                device: describe_gpu(gpu),
                kernel: kernel.to_string(),
                outcome: checked.outcome,
                cached: checked.cached,
                faulted_device: checked.faulted_device,
                fault_not_remembered: checked.fault_not_remembered,
            });
        }
    }
    Ok(checks)
}

/// One kernel's check on one GPU, before it is named in a [`KernelCheck`].
struct Checked {
    outcome: Outcome,
    cached: bool,
    faulted_device: bool,
    fault_not_remembered: Option<String>,
}

impl Checked {
    fn from_cache(outcome: Outcome) -> Self {
        Checked {
            outcome,
            cached: true,
            faulted_device: false,
            fault_not_remembered: None,
        }
    }

    /// Every context of this process on the GPU fails now: checking would blame this kernel for
    /// the earlier one's fault. Not cached: a restart checks it.
    fn after_fault_by(culprit: GpuKernel) -> Self {
        Checked {
            outcome: Outcome::Failed {
                reason: format!(
                    "not checked: the {culprit} kernel faulted this GPU earlier in this process; a restart checks it"
                ),
            },
            cached: false,
            faulted_device: false,
            fault_not_remembered: None,
        }
    }
}

/// Checks the one kernel on the one GPU that `one` selects, and remembers a lasting result
/// (a pass, a wrong result, a fault) in `cache` under `key`.
fn check_now(
    suite: &mut LazySuite,
    detection: &Detection,
    one: &CudaOptions,
    cache: Option<&Path>,
    key: &str,
) -> Checked {
    let (mut outcome, mut lasting, faulted_device) = match CudaBackend::from_detection(detection, one) {
        Ok(backend) => {
            let (outcome, lasting) = suite.check(&backend);
            (outcome, lasting, !backend.out_of_service().is_empty())
        }
        Err(e) => (Outcome::Failed { reason: e.to_string() }, false, false),
    };
    if faulted_device {
        // Cached, so that the restart this fault needs goes on to the next kernel instead of
        // faulting the GPU again.
        lasting = true;
        if let Outcome::Failed { reason } = &mut outcome {
            reason.push_str(
                " (it faulted the GPU; remembered until the driver, the kernel source or this software changes: `miner selftest --fresh`, or deleting the cache's selftest folder, checks it again)",
            );
        }
    }
    let written = if lasting {
        remember(cache, key, &outcome)
    } else {
        Ok(())
    };
    Checked {
        outcome,
        cached: false,
        faulted_device,
        // A result that cannot be written costs a rerun next time, nothing more; but a fault
        // that is not remembered would recur at every restart.
        fault_not_remembered: if faulted_device { written.err() } else { None },
    }
}

/// Writes a lasting outcome to the kernel cache.
fn remember(cache: Option<&Path>, key: &str, outcome: &Outcome) -> Result<(), String> {
    match cache {
        Some(dir) => write_cached(dir, key, outcome).map_err(|e| format!("{}: {e}", dir.display())),
        None => {
            Err("no kernel cache directory: set GPU_ATTEST_KERNEL_CACHE, or the miner's kernel_cache_dir".to_string())
        }
    }
}

/// Everything a GPU result depends on: the device, its driver, NVRTC, the kernel's source, this
/// software's version, the size checked and where checkpoints are hashed (device or host: a
/// pass with one says nothing of the other).
pub fn cache_key(gpu: &GpuInfo, kernel: GpuKernel, mid_n: u32, host_hashing: bool, slots: u32) -> String {
    let source = blake3::hash(kernel.module_source().as_bytes()).to_hex();
    let nvrtc = match nvrtc_version() {
        Ok((major, minor)) => format!("{major}.{minor}"),
        Err(_) => "none".to_string(),
    };
    let hashing = if host_hashing { "host" } else { "device" };
    // The test mode of several slots a GPU runs another path (contexts, threads, a split), so
    // a whole GPU's pass is not its; one slot keeps the key it always had.
    let slots = if slots > 1 {
        format!("|{slots} slots")
    } else {
        String::new()
    };
    format!(
        "{}|{}|nvrtc {nvrtc}|{kernel}|{}|{}|n{mid_n}|{hashing} hashing{slots}",
        gpu.uuid,
        gpu.driver_version,
        &source[..32],
        env!("CARGO_PKG_VERSION")
    )
}

#[derive(Serialize, Deserialize)]
struct CachedCheck {
    key: String,
    outcome: Outcome,
}

fn cache_file_name(key: &str) -> String {
    format!("{}.json", &blake3::hash(key.as_bytes()).to_hex()[..32])
}

fn cache_file(dir: &Path, key: &str) -> PathBuf {
    dir.join(cache_file_name(key))
}

/// The cached outcome for `key`; `None` for a missing, damaged or foreign file.
pub fn read_cached(dir: &Path, key: &str) -> Option<Outcome> {
    let text = std::fs::read_to_string(cache_file(dir, key)).ok()?;
    let cached: CachedCheck = serde_json::from_str(&text).ok()?;
    (cached.key == key).then_some(cached.outcome)
}

/// Writes `outcome` under `key`, whole or not at all.
pub fn write_cached(dir: &Path, key: &str, outcome: &Outcome) -> std::io::Result<()> {
    let text = serde_json::to_string(&CachedCheck {
        key: key.to_string(),
        outcome: outcome.clone(),
    })
    .map_err(std::io::Error::other)?;
    write_atomically(dir, &cache_file_name(key), &text)
}

/// The kernel `auto` runs on the GPUs: the first of `candidates` (given fastest first, see
/// [`GpuKernel::FASTEST_FIRST`]) that passed on every device in `checks`. Err: why none can run.
///
/// The order is fixed rather than taken from the rates the checks measured: the mid-sized case
/// is a correctness check whose few small steps time launches and hashing, not the GEMM. On an
/// H100 it rated the tiled kernel above the tensor kernel, which `miner bench` measures at 7x
/// the tiled kernel's speed, and `auto` then mined on the slowest kernel.
pub fn choose_gpu_kernel(checks: &[KernelCheck], candidates: &[GpuKernel]) -> Result<GpuKernel, String> {
    let mut failures = Vec::new();
    for &kernel in candidates {
        let name = kernel.to_string();
        let mine: Vec<&KernelCheck> = checks.iter().filter(|c| c.kernel == name).collect();
        if mine.is_empty() {
            continue;
        }
        let mut passed_everywhere = true;
        for check in &mine {
            if let Outcome::Failed { reason } = &check.outcome {
                failures.push(format!("{kernel} on {}: {reason}", check.device));
                passed_everywhere = false;
            }
        }
        if passed_everywhere {
            return Ok(kernel);
        }
    }
    if failures.is_empty() {
        Err("no GPU kernel was checked".into())
    } else {
        Err(format!("no GPU kernel passed its self-check ({})", failures.join("; ")))
    }
}

/// Why no GPU kernel can be used.
#[derive(Debug, Error)]
pub enum CheckedKernelError {
    #[error(transparent)]
    Cuda(#[from] CudaInitError),
    /// A check faulted a GPU, which only a fresh process can use again. The fault is cached, so
    /// the next start skips the kernel that caused it.
    #[error(
        "{0}: a CUDA fault cannot be cleared inside the process, so the daemon must restart (the next start skips the kernel that faulted)"
    )]
    GpuFaulted(String),
    /// No kernel passed on every GPU, or the checks could not run; why, in one line.
    #[error("{0}")]
    Selftest(String),
}

/// The CUDA backend on the GPUs `options` selects, running `options.kernel` if set, else the
/// first of [`GpuKernel::FASTEST_FIRST`] that every selected GPU runs; either way only once it
/// passed its self-check on every one of them. Returns with it what every check found, for the
/// daemon to report. Both daemons start their GPUs here.
pub fn start_checked(
    detection: &Detection,
    options: &CudaOptions,
    cpu_threads: usize,
) -> Result<(CudaBackend, Vec<KernelCheck>), CheckedKernelError> {
    // What does not depend on the kernel's results is refused once, before any check runs.
    let (gpus, _) = CudaBackend::precheck(detection, options)?;
    // Under auto, only kernels every selected GPU runs: on a host mixing generations, a kernel
    // that passed on the newer GPUs alone cannot run the partition.
    let candidates: Vec<GpuKernel> = match options.kernel {
        Some(kernel) => vec![kernel],
        None => kernels_all_support(&gpus),
    };
    let mut suite = LazySuite::new(MID_N, cpu_threads);
    let checks =
        gpu_kernels(&mut suite, detection, options, &candidates, false).map_err(CheckedKernelError::Selftest)?;
    if let Some(fault) = fault_error(&checks) {
        return Err(fault);
    }
    let kernel = choose_gpu_kernel(&checks, &candidates).map_err(CheckedKernelError::Selftest)?;
    let chosen = CudaOptions {
        kernel: Some(kernel),
        ..options.clone()
    };
    Ok((CudaBackend::from_detection(detection, &chosen)?, checks))
}

/// What a fault in the checks means for the daemon: a restart, when the fault is remembered so
/// that the restart goes on to the next kernel; a stop that names the cache, when it is not,
/// since a restart would fault the GPU again on the same kernel. None when nothing faulted.
fn fault_error(checks: &[KernelCheck]) -> Option<CheckedKernelError> {
    let faulted: Vec<&KernelCheck> = checks.iter().filter(|c| c.faulted_device).collect();
    let what = faulted
        .iter()
        .map(|c| {
            let reason = match &c.outcome {
                Outcome::Failed { reason } => reason.as_str(),
                Outcome::Passed { .. } => "it passed, then the GPU went out of service",
            };
            format!(
                "the {} kernel faulted {} during its self-check: {reason}",
                c.kernel, c.device
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let unremembered: Vec<&str> = faulted
        .iter()
        .filter_map(|c| c.fault_not_remembered.as_deref())
        .collect();
    match (faulted.is_empty(), unremembered.first()) {
        (true, _) => None,
        (false, None) => Some(CheckedKernelError::GpuFaulted(what)),
        (false, Some(why)) => Some(CheckedKernelError::Selftest(format!(
            "{what}; the fault could not be remembered ({why}), so a restart would fault the GPU again: give the daemon a writable kernel cache, or choose another kernel"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(kernel: &str, device: &str, outcome: Outcome) -> KernelCheck {
        KernelCheck {
            backend: "cuda".into(),
            index: 0,
            device: device.into(),
            kernel: kernel.into(),
            outcome,
            cached: false,
            faulted_device: false,
            fault_not_remembered: None,
        }
    }

    fn passed(tops: f64) -> Outcome {
        Outcome::Passed {
            ops_per_sec: tops * 1e12,
        }
    }

    #[test]
    fn auto_takes_the_first_kernel_that_passed_everywhere() {
        let fastest_first = [GpuKernel::Wgmma, GpuKernel::Tensor, GpuKernel::Tiled];
        // The rates the checks measured do not decide (an H100 rated tiled above tensor).
        let checks = [
            check("wgmma", "gpu 0", passed(16.0)),
            check("wgmma", "gpu 1", passed(16.0)),
            check("tensor", "gpu 0", passed(22.0)),
            check("tensor", "gpu 1", passed(22.0)),
            check("tiled", "gpu 0", passed(26.0)),
            check("tiled", "gpu 1", passed(26.0)),
        ];
        assert_eq!(choose_gpu_kernel(&checks, &fastest_first), Ok(GpuKernel::Wgmma));

        // A kernel that differs on one device is out: the next one in the order runs.
        let mut one_bad = checks.clone();
        one_bad[1].outcome = Outcome::Failed {
            reason: "the mid-sized case differs at chain 1, checkpoint 2".into(),
        };
        assert_eq!(choose_gpu_kernel(&one_bad, &fastest_first), Ok(GpuKernel::Tensor));

        // None passed: the reason names each kernel, device and difference.
        let none: Vec<KernelCheck> = one_bad
            .iter()
            .cloned()
            .map(|mut c| {
                c.outcome = Outcome::Failed {
                    reason: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                };
                c
            })
            .collect();
        let err = choose_gpu_kernel(&none, &fastest_first).unwrap_err();
        assert!(
            err.starts_with("no GPU kernel passed its self-check (wgmma on gpu 0: CUDA_ERROR_ILLEGAL_ADDRESS"),
            "{err}"
        );
        assert!(err.contains("tiled on gpu 1: CUDA_ERROR_ILLEGAL_ADDRESS)"), "{err}");
        // Kernels not among the candidates (wgmma on a host that is not all Hopper) are never
        // chosen, however they did.
        let wgmma_only = [check("wgmma", "gpu 0", passed(900.0))];
        assert!(choose_gpu_kernel(&wgmma_only, &[GpuKernel::Tensor, GpuKernel::Tiled]).is_err());
    }

    #[test]
    fn the_cache_key_names_where_checkpoints_are_hashed_and_the_compiler() {
        let gpu = GpuInfo {
            ordinal: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: "GPU-1".into(),
            memory_bytes: 80 << 30,
            sm_count: 132,
            compute_capability: (9, 0),
            pci_bus_id: "0000:01:00.0".into(),
            driver_version: "580.159.04".into(),
            nvml: None,
        };
        let device = cache_key(&gpu, GpuKernel::Wgmma, 1024, false, 1);
        let host = cache_key(&gpu, GpuKernel::Wgmma, 1024, true, 1);
        assert_ne!(
            device, host,
            "a pass hashing on the host says nothing of device hashing"
        );
        assert!(device.contains("|nvrtc ") && device.contains("580.159.04"), "{device}");
        assert_ne!(device, cache_key(&gpu, GpuKernel::Tensor, 1024, false, 1));
        assert_ne!(device, cache_key(&gpu, GpuKernel::Wgmma, 512, false, 1));
        assert_ne!(
            device,
            cache_key(&gpu, GpuKernel::Wgmma, 1024, false, 2),
            "two slots a GPU"
        );
    }

    fn faulted(kernel: &str, not_remembered: Option<&str>) -> KernelCheck {
        KernelCheck {
            faulted_device: true,
            fault_not_remembered: not_remembered.map(str::to_string),
            ..check(
                kernel,
                "gpu 0",
                Outcome::Failed {
                    reason: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                },
            )
        }
    }

    /// A remembered fault asks for a restart (the next start skips the kernel) and names the
    /// driver's error; one that could not be remembered must not, since the restart would fault
    /// the GPU again, and says why.
    #[test]
    fn a_fault_restarts_only_when_it_is_remembered() {
        assert!(fault_error(&[check("wgmma", "gpu 0", passed(1.0))]).is_none());
        match fault_error(&[faulted("wgmma", None), check("tensor", "gpu 0", passed(1.0))]) {
            Some(CheckedKernelError::GpuFaulted(what)) => {
                assert!(
                    what.contains("the wgmma kernel faulted gpu 0") && what.contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
                    "{what}"
                )
            }
            other => panic!("{other:?}"),
        }
        match fault_error(&[faulted("wgmma", Some("/var/cache/x/selftest: Read-only file system"))]) {
            Some(CheckedKernelError::Selftest(why)) => assert!(
                why.contains("could not be remembered (/var/cache/x/selftest: Read-only file system)")
                    && why.contains("CUDA_ERROR_ILLEGAL_ADDRESS")
                    && why.contains("writable kernel cache"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_cache_answers_only_for_its_own_key() {
        let dir = std::env::temp_dir().join(format!("gpu-attest-selftest-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let outcome = passed(123.0);
        write_cached(&dir, "GPU-1|550|tensor|abc|0.1.0|n1024", &outcome).unwrap();
        assert_eq!(read_cached(&dir, "GPU-1|550|tensor|abc|0.1.0|n1024"), Some(outcome));
        assert_eq!(
            read_cached(&dir, "GPU-1|555|tensor|abc|0.1.0|n1024"),
            None,
            "another driver"
        );
        // A damaged file is a miss, not an error.
        let file = cache_file(&dir, "GPU-1|550|tensor|abc|0.1.0|n1024");
        std::fs::write(&file, "{\"key\":").unwrap();
        assert_eq!(read_cached(&dir, "GPU-1|550|tensor|abc|0.1.0|n1024"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
