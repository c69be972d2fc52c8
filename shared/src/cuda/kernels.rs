//! The CUDA kernel sources (`kernels/*.cu`, embedded at build time) and which GEMM kernel a
//! device runs.
//!
//! Each module NVRTC compiles is `common.cuh`, the generator, the transpose, the mix pass, BLAKE3
//! and one GEMM kernel,
//! concatenated: NVRTC has no file system to resolve `#include` from, and one module per kernel
//! kind keeps the launch code the same for both.

use std::fmt;

const COMMON: &str = include_str!("../../../kernels/common.cuh");
const CHACHA8: &str = include_str!("../../../kernels/chacha8.cu");
const TRANSPOSE: &str = include_str!("../../../kernels/transpose.cu");
const GEMM_TILED: &str = include_str!("../../../kernels/gemm_tiled.cu");
const GEMM_TENSOR: &str = include_str!("../../../kernels/gemm_tensor.cu");
const MIX: &str = include_str!("../../../kernels/mix.cu");
const BLAKE3: &str = include_str!("../../../kernels/blake3.cu");

/// Entry points every module exports.
pub const GENERATE_FN: &str = "chacha8_generate";
pub const TRANSPOSE_FN: &str = "transpose_i8";
/// A standalone mix pass, for the benchmark's cuBLASLt baseline.
pub const MIX_FN: &str = "mix_i32";
/// Checkpoint hashing on the device: chunk chaining values, then one tree level per launch.
pub const BLAKE3_CHUNKS_FN: &str = "blake3_chunks";
pub const BLAKE3_PARENTS_FN: &str = "blake3_parents";

/// The GEMM+mix kernels. Both are exact; they differ only in speed and in the GPUs they run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuKernel {
    /// CUDA cores: dp4a on shared-memory tiles. Any GPU from compute capability 6.1.
    Tiled,
    /// int8 tensor cores through `mma.sync.m16n8k32`, fed by ldmatrix from a three-stage
    /// cp.async pipeline. Compute capability 8.0 and later.
    Tensor,
}

impl GpuKernel {
    pub const ALL: [GpuKernel; 2] = [GpuKernel::Tiled, GpuKernel::Tensor];

    /// The oldest compute capability the kernel's instructions exist on.
    pub fn min_compute_capability(self) -> (u32, u32) {
        match self {
            GpuKernel::Tiled => (6, 1),
            GpuKernel::Tensor => (8, 0),
        }
    }

    pub fn supports(self, compute_capability: (u32, u32)) -> bool {
        compute_capability >= self.min_compute_capability()
    }

    /// The fastest kernel a device of this compute capability runs, if any.
    pub fn best_for(compute_capability: (u32, u32)) -> Option<GpuKernel> {
        [GpuKernel::Tensor, GpuKernel::Tiled]
            .into_iter()
            .find(|k| k.supports(compute_capability))
    }

    /// Name of the GEMM+mix entry point in the module.
    pub fn gemm_fn(self) -> &'static str {
        match self {
            GpuKernel::Tiled => "gemm_mix_tiled",
            GpuKernel::Tensor => "gemm_mix_tensor",
        }
    }

    /// Output tile edge of one thread block: the launch grid is ceil(n / tile) per dimension.
    pub fn block_tile(self) -> u32 {
        match self {
            GpuKernel::Tiled => 64,
            GpuKernel::Tensor => 128,
        }
    }

    /// Threads per block of the GEMM+mix entry point (its `__launch_bounds__`).
    pub fn block_threads(self) -> u32 {
        match self {
            GpuKernel::Tiled => 256,
            GpuKernel::Tensor => 128,
        }
    }

    /// The complete CUDA source of this kernel's module.
    pub fn module_source(self) -> String {
        let gemm = match self {
            GpuKernel::Tiled => GEMM_TILED,
            GpuKernel::Tensor => GEMM_TENSOR,
        };
        [COMMON, CHACHA8, TRANSPOSE, MIX, BLAKE3, gemm].join("\n")
    }
}

impl fmt::Display for GpuKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuKernel::Tiled => "tiled",
            GpuKernel::Tensor => "tensor",
        })
    }
}

impl std::str::FromStr for GpuKernel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tiled" => Ok(GpuKernel::Tiled),
            "tensor" => Ok(GpuKernel::Tensor),
            other => Err(format!("unknown GPU kernel {other:?}; expected tiled or tensor")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_kernel_follows_compute_capability() {
        assert_eq!(GpuKernel::best_for((6, 0)), None);
        assert_eq!(GpuKernel::best_for((6, 1)), Some(GpuKernel::Tiled));
        assert_eq!(GpuKernel::best_for((7, 5)), Some(GpuKernel::Tiled));
        assert_eq!(GpuKernel::best_for((8, 0)), Some(GpuKernel::Tensor));
        assert_eq!(GpuKernel::best_for((9, 0)), Some(GpuKernel::Tensor));
        assert!(!GpuKernel::Tensor.supports((7, 5)));
    }

    #[test]
    fn every_module_exports_the_entry_points_it_is_launched_by() {
        for kernel in GpuKernel::ALL {
            let src = kernel.module_source();
            for name in [
                GENERATE_FN,
                TRANSPOSE_FN,
                MIX_FN,
                BLAKE3_CHUNKS_FN,
                BLAKE3_PARENTS_FN,
                kernel.gemm_fn(),
            ] {
                assert!(
                    src.contains(&format!("extern \"C\" __global__ void {name}("))
                        || src.contains(&format!("{name}(const i8* x")),
                    "{kernel} module lacks {name}"
                );
            }
            assert!(!src.contains("#include"), "NVRTC cannot resolve includes here");
        }
    }

    #[test]
    fn kernel_names_round_trip() {
        for kernel in GpuKernel::ALL {
            assert_eq!(kernel.to_string().parse::<GpuKernel>(), Ok(kernel));
        }
        assert!("wgmma".parse::<GpuKernel>().is_err());
    }
}
