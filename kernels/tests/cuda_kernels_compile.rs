//! Compile-checks every kernel with NVRTC for every architecture it targets, and assembles the
//! PTX with ptxas when one is given, so kernel source errors show up without a GPU: the GEMM
//! modules and the modules beside them (the memory walk).
//!
//! Needs libnvrtc on the library path and, for the ptxas step, `GPU_ATTEST_PTXAS` naming a
//! ptxas binary; `scripts/kernel-check.sh` installs both from the Python package registry and
//! runs this test. With `GPU_ATTEST_CUBIN_DIR` set, the assembled cubins are kept there for the
//! script's SASS counts. Without NVRTC it says it was skipped, unless `GPU_ATTEST_REQUIRE_NVRTC` is
//! set (as that script sets it), when it fails.

mod common;

use common::skipped;
use gpu_attest_kernels::GpuKernel;
use gpu_attest_kernels::compile::{compile_aux_ptx, compile_ptx, nvrtc_present, nvrtc_version, supported_archs};
use gpu_attest_kernels::kernels::AuxModule;
use std::path::PathBuf;
use std::process::Command;

/// The architectures the miner is meant for: Turing (tiled only), Ampere, Ada, Hopper.
const ARCHS: [u32; 5] = [75, 80, 86, 89, 90];

/// Whether NVRTC is here; if not, says the test was skipped, or fails it where
/// `GPU_ATTEST_REQUIRE_NVRTC` says NVRTC must be (CI, through scripts/kernel-check.sh).
fn nvrtc_or_skipped() -> bool {
    if nvrtc_present() {
        return true;
    }
    assert!(
        std::env::var_os("GPU_ATTEST_REQUIRE_NVRTC").is_none(),
        "GPU_ATTEST_REQUIRE_NVRTC is set but libnvrtc cannot be loaded; check LD_LIBRARY_PATH"
    );
    skipped("libnvrtc not found (scripts/kernel-check.sh installs it and runs these tests with it)");
    false
}

#[test]
fn every_kernel_compiles_for_every_target_architecture() {
    if !nvrtc_or_skipped() {
        return;
    }
    let version = nvrtc_version().unwrap();
    let supported = supported_archs().unwrap();
    let ptxas = std::env::var_os("GPU_ATTEST_PTXAS").map(PathBuf::from);
    println!("NVRTC {}.{}; ptxas: {:?}", version.0, version.1, ptxas);
    let mut checked = 0;
    for kernel in GpuKernel::ALL {
        for arch in ARCHS {
            let cc = (arch / 10, arch % 10);
            if !kernel.supports(cc) || !supported.contains(&arch) {
                continue;
            }
            let ptx = compile_ptx(kernel, arch).unwrap_or_else(|e| panic!("{e}"));
            for entry in [
                "chacha8_generate",
                "transpose_i8",
                "mix_i32",
                "blake3_chunks",
                "blake3_parents",
                kernel.gemm_fn(),
            ] {
                assert!(
                    ptx.contains(&format!(".entry {entry}(")),
                    "{kernel} for compute_{arch} lacks {entry}"
                );
            }
            match kernel {
                GpuKernel::Tensor => {
                    assert!(ptx.contains("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"));
                    assert!(ptx.contains("cp.async.cg.shared.global"));
                    assert!(ptx.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"));
                }
                GpuKernel::Wgmma => {
                    assert!(ptx.contains("wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8"));
                    assert!(ptx.contains("fence.proxy.async.shared::cta"));
                    assert!(ptx.contains(".target sm_90a"), "wgmma needs the sm_90a target");
                }
                GpuKernel::Tma | GpuKernel::Pingpong | GpuKernel::Multicast => {
                    assert!(ptx.contains("wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8"));
                    assert!(ptx.contains("cp.async.bulk.tensor.3d.shared::cluster.global"));
                    assert!(ptx.contains("mbarrier.try_wait.parity.shared::cta.b64"));
                    assert!(ptx.contains("mbarrier.arrive.expect_tx.shared::cta.b64"));
                    assert!(ptx.contains("setmaxnreg.inc.sync.aligned.u32 232"));
                    assert!(ptx.contains("setmaxnreg.dec.sync.aligned.u32 40"));
                    // The tensor maps are read from the parameter space, where the host put them.
                    let param = format!(".param .align 64 .b8 {}_param_0[128]", kernel.gemm_fn());
                    assert!(
                        ptx.contains(&param),
                        "{kernel}: the tensor map is not a 128-byte parameter"
                    );
                    assert!(!ptx.contains("cp.async.cg.shared.global"), "TMA alone feeds it");
                    assert!(ptx.contains(".target sm_90a"), "TMA kernel needs the sm_90a target");
                    // The launch bounds fix the entry register count (384 threads, one block an
                    // SM: 168) that setmaxnreg moves from the producer to the consumers.
                    assert!(ptx.contains(".maxntid 384") && ptx.contains(".minnctapersm 1"));
                    if kernel == GpuKernel::Multicast {
                        assert!(ptx.contains(".multicast::cluster"), "Bt is multicast");
                        assert!(ptx.contains("mapa.shared::cluster.u32"));
                        assert!(ptx.contains("mbarrier.arrive.release.cluster.shared::cluster.b64"));
                        assert!(ptx.contains("barrier.cluster.arrive.release.aligned"));
                        let entry = ptx.split(".entry ").find(|e| e.starts_with(kernel.gemm_fn())).unwrap();
                        let head = &entry[..entry.find('{').unwrap()];
                        assert!(head.contains(".reqnctapercluster 2, 1, 1"), "clusters of two: {head}");
                    }
                }
                GpuKernel::Tiled => assert!(ptx.contains("dp4a.s32.s32"), "the tiled kernel must use dp4a"),
            }
            if let Some(ptxas) = &ptxas {
                let usage = assemble(
                    ptxas,
                    &kernel.to_string(),
                    arch,
                    kernel.arch_suffix(),
                    &ptx,
                    &[kernel.gemm_fn()],
                );
                // setmaxnreg hands the producer's registers to the consumers within the block's
                // allocation: 128 x 40 + 256 x 232 = 64512 = 384 x 168. With fewer registers at
                // entry, the consumers' setmaxnreg.inc would wait for registers that never come,
                // a hang no mbarrier timeout traps.
                if kernel.is_persistent() {
                    assert!(
                        usage.iter().any(|l| l.contains("Used 168 registers")),
                        "{kernel} on sm_{arch}: not 168 registers at entry: {usage:?}"
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 6, "only {checked} kernel/architecture pairs were checkable");
}

#[test]
fn every_aux_module_compiles_for_every_target_architecture() {
    if !nvrtc_or_skipped() {
        return;
    }
    let supported = supported_archs().unwrap();
    let ptxas = std::env::var_os("GPU_ATTEST_PTXAS").map(PathBuf::from);
    let mut checked = 0;
    for module in AuxModule::ALL {
        for arch in ARCHS {
            if !module.supports((arch / 10, arch % 10)) || !supported.contains(&arch) {
                continue;
            }
            let ptx = compile_aux_ptx(module, arch).unwrap_or_else(|e| panic!("{e}"));
            for entry in module.entry_points() {
                assert!(
                    ptx.contains(&format!(".entry {entry}(")),
                    "{module} for compute_{arch} lacks {entry}"
                );
            }
            match module {
                AuxModule::Walk => {
                    // 16-byte loads through the non-coherent path, dp4a, and the shuffles of the
                    // row reduction.
                    assert!(
                        ptx.contains("ld.global.nc.v4.u32"),
                        "the walk must load 16 bytes at a time"
                    );
                    assert!(ptx.contains("dp4a.s32.s32"), "the walk must use dp4a");
                    // Signed by signed only: the host emulation's __dp4a is the signed one, so
                    // an unsigned operand would pass it and compute another walk on a GPU.
                    assert!(
                        !ptx.contains("dp4a.u32") && !ptx.contains("dp4a.s32.u32"),
                        "the walk's dp4a must be signed by signed"
                    );
                    assert!(
                        ptx.contains("shfl.sync.bfly.b32"),
                        "the walk reduces rows with shuffles"
                    );
                    // The locality walk: each lane loads its 8 bytes of the line past L1, and
                    // the lanes' words meet by shuffles (idx: the four folds to every lane).
                    assert!(
                        ptx.contains("ld.global.cg.u64"),
                        "the locality walk loads 8 bytes a lane with __ldcg"
                    );
                    assert!(
                        ptx.contains("shfl.sync.idx.b32"),
                        "the locality walk hands its folds to every lane with shuffles"
                    );
                }
            }
            if let Some(ptxas) = &ptxas {
                assemble(ptxas, &module.to_string(), arch, "", &ptx, module.entry_points());
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} module/architecture pairs were checkable");
}

/// Assembles `ptx` (module `name`) for sm_`arch``suffix` and fails on errors or on register
/// spills in the `checked` functions (the GEMM kernel, or an aux module's entry points); returns
/// ptxas's register and spill lines for them.
fn assemble(ptxas: &PathBuf, name: &str, arch: u32, suffix: &str, ptx: &str, checked: &[&str]) -> Vec<String> {
    // One folder per module and architecture: the tests run in parallel and each removes its own.
    let dir = std::env::temp_dir().join(format!("gpu-attest-ptxas-{}-{name}-{arch}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("{name}-{arch}.ptx"));
    std::fs::write(&input, ptx).unwrap();
    let out = Command::new(ptxas)
        .arg(format!("-arch=sm_{arch}{suffix}"))
        .arg("-v")
        .arg("-o")
        .arg(dir.join(format!("{name}-{arch}.cubin")))
        .arg(&input)
        .output()
        .expect("running ptxas");
    let log = String::from_utf8_lossy(&out.stderr);
    // For the SASS instruction counts of scripts/kernel-check.sh.
    if let Some(keep) = std::env::var_os("GPU_ATTEST_CUBIN_DIR").filter(|_| out.status.success()) {
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::copy(
            dir.join(format!("{name}-{arch}.cubin")),
            PathBuf::from(keep).join(format!("{name}-{arch}.cubin")),
        )
        .unwrap();
    }
    // Removed before any assertion, so that a failing run leaves nothing behind either.
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        out.status.success(),
        "ptxas failed for {name} on sm_{arch}:\n{log}{}",
        if log.contains("writing file") {
            format!(
                "(ptxas could not write its output: is there free space in {}?)",
                dir.display()
            )
        } else {
            String::new()
        }
    );
    // ptxas -v prints, per function, "Compiling entry function 'name'" then its usage lines.
    let usage: Vec<&str> = log
        .split("Compiling entry function")
        .filter(|section| checked.iter().any(|f| section.contains(&format!("'{f}'"))))
        .flat_map(|section| section.lines())
        .filter(|l| l.contains("registers") || l.contains("spill"))
        .collect();
    println!(
        "sm_{arch} {name}: {}",
        usage.join(" | ").replace("ptxas info    : ", "")
    );
    // ptxas warns when it has to serialize wgmma (a wrong fence, accumulators it cannot keep in
    // registers): the kernel would still be exact, but at a fraction of its speed.
    // Without a register count it can rely on at entry, ptxas drops setmaxnreg (C7508, on an info
    // line): the TMA kernel's consumers would then run without the registers it gives them.
    assert!(
        !log.contains("C7508") && !log.contains("'setmaxnreg' ignored"),
        "{name} on sm_{arch}: ptxas ignored setmaxnreg:\n{log}"
    );
    for warning in log.lines().filter(|l| l.contains("warning")) {
        println!("sm_{arch} {name}: {warning}");
        assert!(!warning.contains("wgmma"), "{name} on sm_{arch}: {warning}");
    }
    assert!(
        !usage.is_empty(),
        "ptxas -v said nothing about {checked:?} in {name} on sm_{arch}"
    );
    for line in &usage {
        if line.contains("spill") {
            assert!(
                line.contains("0 bytes spill stores") && line.contains("0 bytes spill loads"),
                "{name} spills on sm_{arch}: {line}"
            );
        }
    }
    usage.into_iter().map(String::from).collect()
}
