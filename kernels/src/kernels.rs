//! The CUDA kernel sources (`kernels/*.cu`, embedded at build time) and which GEMM kernel a
//! device runs.
//!
//! Each module NVRTC compiles is `common.cuh`, the generator, the transpose, the mix pass, BLAKE3
//! and one GEMM kernel (after `cp_async.cuh` for the tensor-core ones), concatenated: NVRTC has
//! no file system to resolve `#include` from, and one module per kernel kind keeps the launch
//! code the same for all of them. Kernels that are not part of a GEMM module (the memory walk)
//! are [`AuxModule`]s, compiled on their own.

use std::fmt;

const COMMON: &str = include_str!("../cuda/common.cuh");
const CHACHA8: &str = include_str!("../cuda/chacha8.cu");
const TRANSPOSE: &str = include_str!("../cuda/transpose.cu");
const CP_ASYNC: &str = include_str!("../cuda/cp_async.cuh");
const GEMM_TILED: &str = include_str!("../cuda/gemm_tiled.cu");
const GEMM_TENSOR: &str = include_str!("../cuda/gemm_tensor.cu");
const WGMMA: &str = include_str!("../cuda/wgmma.cuh");
const GEMM_WGMMA: &str = include_str!("../cuda/gemm_wgmma.cu");
const TMA: &str = include_str!("../cuda/tma.cuh");
const TMA_GEMM: &str = include_str!("../cuda/tma_gemm.cuh");
const GEMM_TMA: &str = include_str!("../cuda/gemm_tma.cu");
const GEMM_PINGPONG: &str = include_str!("../cuda/gemm_pingpong.cu");
const MIX: &str = include_str!("../cuda/mix.cu");
const BLAKE3: &str = include_str!("../cuda/blake3.cu");
const WALK: &str = include_str!("../cuda/walk.cu");
const WALK_TREE: &str = include_str!("../cuda/walk_tree.cu");
const LOCALITY: &str = include_str!("../cuda/locality.cu");

/// Entry points every module exports. Each entry point's parameters are written out a second
/// time, as the argument struct of its launch type in `raw/launch.rs`: a change to a kernel's
/// signature changes both.
pub const GENERATE_FN: &str = "chacha8_generate";
pub const TRANSPOSE_FN: &str = "transpose_i8";
/// A standalone mix pass, for the benchmark's cuBLASLt baseline.
pub const MIX_FN: &str = "mix_i32";
/// Checkpoint hashing on the device: chunk chaining values, then one tree level per launch.
pub const BLAKE3_CHUNKS_FN: &str = "blake3_chunks";
pub const BLAKE3_PARENTS_FN: &str = "blake3_parents";

/// The memory walk's entry point (PROTOCOL.md 18.3 and 20.4), in [`AuxModule::Walk`].
pub const WALK_FN: &str = "walk_steps";
/// Version 4's walker trees (PROTOCOL.md 20.4), in [`AuxModule::Walk`]: each block of 64
/// states folded to its node, then each walker's blocks to its root.
pub const WALK_BLOCKS_FN: &str = "walk_blocks";
pub const WALK_ROOTS_FN: &str = "walk_roots";
/// Version 4's locality walk (PROTOCOL.md 20.10), in [`AuxModule::Walk`]: per generation the
/// walkers' starts from the locality tree, one warp a walker over the pool's lines, then the
/// generation's digest pushed onto the tree (`kernels/cuda/locality.cu`).
pub const LOCALITY_STARTS_FN: &str = "locality_starts";
pub const LOCALITY_WALK_FN: &str = "locality_walk";
pub const LOCALITY_GENERATION_FN: &str = "locality_generation";

/// A module that holds no GEMM kernel: compiled on its own, never a device's GEMM kernel (that is
/// [`GpuKernel`]), and compile-checked beside them (tests/cuda_kernels_compile.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuxModule {
    /// The walk over a device's pool (`kernels/cuda/walk.cu`): one block per walker, each step a
    /// 64 KiB entry read with dp4a, then the step's BLAKE3; version 4's walker trees over its
    /// states (`kernels/cuda/walk_tree.cu`); and its locality walk over the pool's 256-byte lines
    /// (`kernels/cuda/locality.cu`).
    Walk,
}

impl AuxModule {
    pub const ALL: [AuxModule; 1] = [AuxModule::Walk];

    /// The oldest compute capability its instructions exist on (dp4a: 6.1).
    pub fn min_compute_capability(self) -> (u32, u32) {
        match self {
            AuxModule::Walk => (6, 1),
        }
    }

    pub fn supports(self, compute_capability: (u32, u32)) -> bool {
        compute_capability >= self.min_compute_capability()
    }

    /// The entry points the host launches.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            AuxModule::Walk => &[
                WALK_FN,
                WALK_BLOCKS_FN,
                WALK_ROOTS_FN,
                LOCALITY_STARTS_FN,
                LOCALITY_WALK_FN,
                LOCALITY_GENERATION_FN,
            ],
        }
    }

    /// Threads per block of its entry points (their `__launch_bounds__`): `WALK_THREADS`,
    /// `TREE_THREADS` for the trees and `LOC_THREADS` for the locality walk.
    pub fn block_threads(self) -> u32 {
        match self {
            AuxModule::Walk => 128,
        }
    }

    /// The complete CUDA source of the module.
    pub fn module_source(self) -> String {
        let parts: &[&str] = match self {
            // The walks hash with blake3.cu's compression function; the locality walk's tree is
            // walk_tree.cu's.
            AuxModule::Walk => &[COMMON, BLAKE3, WALK, WALK_TREE, LOCALITY],
        };
        parts.join("\n")
    }
}

impl fmt::Display for AuxModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuxModule::Walk => "walk",
        })
    }
}

/// The GEMM+mix kernels. All are exact; they differ only in speed and in the GPUs they run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuKernel {
    /// CUDA cores: dp4a on shared-memory tiles. Any GPU from compute capability 6.1.
    Tiled,
    /// int8 tensor cores through `mma.sync.m16n8k32`, fed by ldmatrix from a three-stage
    /// cp.async pipeline. Compute capability 8.0 and later.
    Tensor,
    /// Hopper's warpgroup MMA (`wgmma.m64n256k32`), operands read by the tensor cores straight
    /// from swizzled shared memory. Compute capability 9.0 only (`sm_90a` code runs nowhere
    /// else). Bit-exact against the CPU on an H100 (BENCHMARKS.md), and the fastest there.
    Wgmma,
    /// The same wgmma fed by TMA: a producer warpgroup loads whole tiles into mbarrier-guarded
    /// stages while two consumer warpgroups multiply, on a persistent grid that overlaps one
    /// tile's epilogue with the next tile's loads (`kernels/cuda/gemm_tma.cu`). Compute capability 9.0
    /// only. `auto`'s choice on Hopper: bit-exact on two H200 leases, and 5% faster than wgmma on
    /// chains (BENCHMARKS.md).
    Tma,
    /// The TMA kernel on the ping-pong schedule: each of the two consumer warpgroups takes whole
    /// 64 x 256 tiles of its own, and they take turns on the tensor cores, so one's epilogue
    /// runs under the other's wgmma (`kernels/cuda/gemm_pingpong.cu`). Compute capability 9.0
    /// only. Opt-in (`--gpu-kernel pingpong`) until a GPU run has measured it exact and faster.
    Pingpong,
    /// The ping-pong kernel with its blocks in clusters of two that take adjacent row tiles and
    /// share their Bt rows: each block's producer loads half of them and multicasts it to both,
    /// so each block reads from L2 what the cooperative kernel's blocks do per multiply-add
    /// (`gemm_mix_multicast` in `kernels/cuda/gemm_pingpong.cu`). Compute capability 9.0 only.
    /// Opt-in (`--gpu-kernel multicast`) until a GPU run has measured it exact and faster.
    Multicast,
}

impl GpuKernel {
    pub const ALL: [GpuKernel; 6] = [
        GpuKernel::Tiled,
        GpuKernel::Tensor,
        GpuKernel::Wgmma,
        GpuKernel::Tma,
        GpuKernel::Pingpong,
        GpuKernel::Multicast,
    ];

    /// Every kernel `auto` may choose, fastest first where a device runs several, by whole
    /// challenges on an H200 (BENCHMARKS.md): tma proved 9.46e14 op/s where wgmma proved
    /// 8.96e14 (its fused step 947 TOPS against 905 at n = 2048, and 5% ahead at 1024 and 4096
    /// too, on two leases), wgmma runs n = 2048 at 1.5x the tensor kernel's rate, and the tensor
    /// kernel at 7x the tiled one's. `auto` takes the first that runs and passes its
    /// self-check. Version 4's pool is the chains' own states, so the chains' rate is the pool's;
    /// version 3's fill on tma is slower than on wgmma, and the validator times it at tma's own
    /// weight (PROTOCOL.md 18.6).
    ///
    /// The ping-pong kernels are not here: `pingpong`'s fused step is the fastest (56% of the
    /// peak at n = 2048), but a whole challenge on it took 1.39x its steps' time and attested at
    /// 7.57e14; `multicast` is slow (26%). Each goes first in this list once a GPU run measures
    /// it bit-exact and faster than tma on whole challenges: that is the whole switch.
    pub const FASTEST_FIRST: [GpuKernel; 4] = [GpuKernel::Tma, GpuKernel::Wgmma, GpuKernel::Tensor, GpuKernel::Tiled];

    /// The oldest compute capability the kernel's instructions exist on.
    pub fn min_compute_capability(self) -> (u32, u32) {
        match self {
            GpuKernel::Tiled => (6, 1),
            GpuKernel::Tensor => (8, 0),
            GpuKernel::Wgmma | GpuKernel::Tma | GpuKernel::Pingpong | GpuKernel::Multicast => (9, 0),
        }
    }

    /// Whether the kernel uses sm_90a's architecture-specific instructions (wgmma, TMA,
    /// setmaxnreg, clusters): they exist on compute capability 9.0 alone, not on later GPUs.
    fn hopper_only(self) -> bool {
        matches!(
            self,
            GpuKernel::Wgmma | GpuKernel::Tma | GpuKernel::Pingpong | GpuKernel::Multicast
        )
    }

    pub fn supports(self, compute_capability: (u32, u32)) -> bool {
        if self.hopper_only() {
            compute_capability == (9, 0)
        } else {
            compute_capability >= self.min_compute_capability()
        }
    }

    /// The compute capabilities the kernel runs on, in words, for error messages.
    pub fn requirement(self) -> String {
        let (major, minor) = self.min_compute_capability();
        if self.hopper_only() {
            format!("compute capability {major}.{minor} exactly (Hopper)")
        } else {
            format!("compute capability {major}.{minor} or later")
        }
    }

    /// What NVRTC's target name needs after `compute_NN`: `a` for architecture-specific
    /// instructions (wgmma, TMA, setmaxnreg), nothing for the portable ones.
    pub fn arch_suffix(self) -> &'static str {
        if self.hopper_only() { "a" } else { "" }
    }

    /// The fastest kernel a device of this compute capability runs, if any.
    pub fn best_for(compute_capability: (u32, u32)) -> Option<GpuKernel> {
        GpuKernel::FASTEST_FIRST
            .into_iter()
            .find(|k| k.supports(compute_capability))
    }

    /// Name of the GEMM+mix entry point in the module.
    pub fn gemm_fn(self) -> &'static str {
        match self {
            GpuKernel::Tiled => "gemm_mix_tiled",
            GpuKernel::Tensor => "gemm_mix_tensor",
            GpuKernel::Wgmma => "gemm_mix_wgmma",
            GpuKernel::Tma => "gemm_mix_tma",
            GpuKernel::Pingpong => "gemm_mix_pingpong",
            GpuKernel::Multicast => "gemm_mix_multicast",
        }
    }

    /// Output tile of one thread block, (rows, columns): the launch grid is
    /// (ceil(n / columns), ceil(n / rows)), but for a persistent kernel, whose blocks walk the
    /// tiles (see [`GpuKernel::is_persistent`]).
    pub fn block_tile(self) -> (u32, u32) {
        match self {
            GpuKernel::Tiled => (64, 64),
            GpuKernel::Tensor => (128, 128),
            GpuKernel::Wgmma | GpuKernel::Tma => (128, 256),
            // One consumer warpgroup's tile: each of the two takes tiles of its own.
            GpuKernel::Pingpong | GpuKernel::Multicast => (64, 256),
        }
    }

    /// Blocks of one cluster (the kernel's `__cluster_dims__`): its grid is a multiple of this,
    /// and a cluster's blocks take adjacent row tiles of one output tile of `rows * cluster` rows.
    pub fn cluster_blocks(self) -> u32 {
        match self {
            GpuKernel::Multicast => 2,
            _ => 1,
        }
    }

    /// Rows of one tensor-map box of X and of Bt, for a persistent kernel: the block tile's rows
    /// and columns, but where a cluster's blocks each load a share of the Bt rows they all use.
    pub fn box_rows(self) -> (u32, u32) {
        let (rows, columns) = self.block_tile();
        (rows, columns / self.cluster_blocks())
    }

    /// Whether the kernel runs a persistent grid (at most one block per SM, each taking the
    /// output tiles of the whole batch in turn) and reads its operands through tensor maps,
    /// rather than one block per output tile reading plain pointers.
    pub fn is_persistent(self) -> bool {
        matches!(self, GpuKernel::Tma | GpuKernel::Pingpong | GpuKernel::Multicast)
    }

    /// Dynamic shared memory the GEMM+mix entry point needs (beyond its static arrays); above
    /// 48 KiB it must be opted into per function.
    pub fn dynamic_shared_bytes(self) -> u32 {
        match self {
            GpuKernel::Tiled | GpuKernel::Tensor => 0,
            // WG_SMEM_BYTES in gemm_wgmma.cu: four stages of (128 + 256) x 128 bytes, plus 1 KiB
            // of alignment.
            GpuKernel::Wgmma => 4 * (128 + 256) * 128 + 1024,
            // TMA_SMEM_BYTES in gemm_tma.cu: the same stages (its barriers are static).
            GpuKernel::Tma => 4 * (128 + 256) * 128 + 1024,
            // PP_SMEM_BYTES in gemm_pingpong.cu: five stages of (64 + 256) x 128 bytes, the
            // barriers' 128 bytes, and 1 KiB of alignment.
            GpuKernel::Pingpong | GpuKernel::Multicast => 5 * (64 + 256) * 128 + 128 + 1024,
        }
    }

    /// Threads per block of the GEMM+mix entry point (its `__launch_bounds__`).
    pub fn block_threads(self) -> u32 {
        match self {
            GpuKernel::Tiled => 256,
            GpuKernel::Tensor => 128,
            GpuKernel::Wgmma => 256,
            // A producer warpgroup and two consumer warpgroups.
            GpuKernel::Tma | GpuKernel::Pingpong | GpuKernel::Multicast => 384,
        }
    }

    /// The complete CUDA source of this kernel's module.
    pub fn module_source(self) -> String {
        // cp.async exists from sm_80, so only the modules of the kernels that use it carry it.
        let gemm: &[&str] = match self {
            GpuKernel::Tiled => &[GEMM_TILED],
            GpuKernel::Tensor => &[CP_ASYNC, GEMM_TENSOR],
            GpuKernel::Wgmma => &[CP_ASYNC, WGMMA, GEMM_WGMMA],
            // cp_async.cuh for its shared-address conversion; the kernel issues no cp.async.
            GpuKernel::Tma => &[CP_ASYNC, WGMMA, TMA, TMA_GEMM, GEMM_TMA],
            // One file holds both ping-pong entry points.
            GpuKernel::Pingpong | GpuKernel::Multicast => &[CP_ASYNC, WGMMA, TMA, TMA_GEMM, GEMM_PINGPONG],
        };
        [COMMON, CHACHA8, TRANSPOSE, MIX, BLAKE3]
            .iter()
            .chain(gemm)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl fmt::Display for GpuKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuKernel::Tiled => "tiled",
            GpuKernel::Tensor => "tensor",
            GpuKernel::Wgmma => "wgmma",
            GpuKernel::Tma => "tma",
            GpuKernel::Pingpong => "pingpong",
            GpuKernel::Multicast => "multicast",
        })
    }
}

impl std::str::FromStr for GpuKernel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tiled" => Ok(GpuKernel::Tiled),
            "tensor" => Ok(GpuKernel::Tensor),
            "wgmma" => Ok(GpuKernel::Wgmma),
            "tma" => Ok(GpuKernel::Tma),
            "pingpong" => Ok(GpuKernel::Pingpong),
            "multicast" => Ok(GpuKernel::Multicast),
            other => Err(format!(
                "unknown GPU kernel {other:?}; expected tiled, tensor, wgmma, tma, pingpong or multicast"
            )),
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
        assert_eq!(GpuKernel::best_for((8, 9)), Some(GpuKernel::Tensor));
        assert_eq!(GpuKernel::best_for((9, 0)), Some(GpuKernel::Tma));
        assert_eq!(GpuKernel::best_for((10, 0)), Some(GpuKernel::Tensor));
        assert!(!GpuKernel::Tensor.supports((7, 5)));
        // wgmma exists on Hopper alone: sm_90a code runs on no other architecture.
        assert!(GpuKernel::Wgmma.supports((9, 0)));
        assert!(!GpuKernel::Wgmma.supports((8, 9)));
        assert!(!GpuKernel::Wgmma.supports((10, 0)));
        assert!(GpuKernel::Tma.supports((9, 0)));
        assert!(!GpuKernel::Tma.supports((10, 0)));
    }

    /// `auto` takes tma on Hopper, the fastest on whole challenges there; the ping-pong kernels
    /// stay opt-in until a GPU run measures them faster on whole challenges.
    #[test]
    fn auto_chooses_tma_on_hopper_and_never_the_ping_pong_kernels() {
        for kernel in [GpuKernel::Pingpong, GpuKernel::Multicast] {
            assert!(!GpuKernel::FASTEST_FIRST.contains(&kernel));
            assert!(
                GpuKernel::ALL.contains(&kernel),
                "the self-check and bench still cover {kernel}"
            );
            assert!(kernel.supports((9, 0)) && !kernel.supports((10, 0)));
        }
        assert_eq!(GpuKernel::best_for((9, 0)), Some(GpuKernel::Tma));
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
                        || src.contains(&format!("{name}(const i8* x"))
                        || src.contains(&format!("{name}(const __grid_constant__ ga_tensor_map x_map")),
                    "{kernel} module lacks {name}"
                );
            }
            assert!(!src.contains("#include"), "NVRTC cannot resolve includes here");
        }
    }

    #[test]
    fn every_aux_module_exports_its_entry_points() {
        for module in AuxModule::ALL {
            let src = module.module_source();
            for name in module.entry_points() {
                assert!(src.contains(&format!("{name}(const ")), "{module} module lacks {name}");
            }
            assert!(!src.contains("#include"), "NVRTC cannot resolve includes here");
        }
    }

    #[test]
    fn kernel_names_round_trip() {
        for kernel in GpuKernel::ALL {
            assert_eq!(kernel.to_string().parse::<GpuKernel>(), Ok(kernel));
        }
        assert!("wmma".parse::<GpuKernel>().is_err());
    }
}
