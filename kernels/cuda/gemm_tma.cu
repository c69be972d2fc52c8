// The Hopper kernel at the hardware limit: int8 wgmma fed by TMA, warp-specialised, on a
// persistent grid. sm_90a only.
//
// out = mix(X * B, step) for every matrix of a batch, with Bt = B^T, as in the other GEMM
// kernels; int32 accumulation is exact, mix is the epilogue, and the int32 product never leaves
// the registers.
//
// Shape, and why (the structure of CUTLASS's sm90 "TMA warp-specialised cooperative" GEMMs,
// written from the PTX ISA):
// - 384 threads = three warpgroups. Warpgroup 0 is the producer: one of its threads issues the
//   tile loads (TMA: one instruction moves a whole 128 x 128 or 256 x 128 box into shared
//   memory, swizzled, zero-filled past the matrix, with no registers and no address arithmetic
//   per byte). Warpgroups 1 and 2 are the consumers: each multiplies 64 rows of the block's
//   128 x 256 output tile with wgmma.m64n256k32, 128 int32 accumulators per thread.
// - setmaxnreg moves registers from the producer (40 a thread) to the consumers (232), which
//   hold the accumulators: 128 x 40 + 256 x 232 = 64512 of the SM's 65536.
// - Four stages of 48 KiB, each guarded by two barriers: `full` (the producer's one arrival and
//   the stage's 49152 bytes of TMA transactions) and `empty` (one arrival from each of the
//   consumers' eight warps once their wgmma on the stage has retired). Consumers wait for a
//   k-tile's wgmma one k-tile late (wgmma.wait_group 1), so the tensor cores are never idle
//   while the next k-tile is issued, and free its stage then.
// - Persistent: the grid is one block per SM (or fewer, for small batches), each walking the
//   output tiles blockIdx.x, blockIdx.x + gridDim.x, ... The producer does not stop between
//   tiles, so while the consumers run a tile's epilogue (the fused mix and the stores) the next
//   tile's first stages are already loading.
// - Both operands are K-major in the 128-byte swizzle, which TMA writes and the wgmma
//   descriptors (wgmma.cuh) read: 16-byte chunk c of row r at chunk c ^ (r % 8), the stages
//   1024-byte aligned.
//
// Phases: a barrier's phases are named by their parity, and each side tracks the phase it
// expects of a stage as a bit that flips whenever its stage counter wraps. The producer waits on
// `empty` with the parity opposite the consumers' `full` waits, so its first pass over the
// stages does not wait (the phase "before" the first counts as complete).
//
// The tensor maps (kernels/src/tma.rs) are 3-d: k (innermost, n bytes), rows (n), matrices
// (count), so a box never reads across matrices: rows and k past n are zeros.

#define TMA_BM 128
#define TMA_BN 256
#define TMA_STAGES 4
#define TMA_THREADS 384
#define TMA_CONSUMER_WARPS 8
#define TMA_A_BYTES (TMA_BM * TMA_BK)
#define TMA_STAGE_BYTES ((TMA_BM + TMA_BN) * TMA_BK)
// One extra KiB to align the stages to the 1024 bytes the swizzle pattern is anchored to.
#define TMA_SMEM_BYTES (TMA_STAGES * TMA_STAGE_BYTES + 1024)
#define TMA_PRODUCER_REGISTERS 40
#define TMA_CONSUMER_REGISTERS 232

// The tile order and the producer are tma_gemm.cuh's, shared with gemm_pingpong.cu.

// A consumer warpgroup (0 or 1): rows 64 * consumer.. of each of this block's tiles.
__device__ __forceinline__ void tma_consume(u8* smem, u64* full, u64* empty, i8* out, int n, u32 step, u32 tiles,
                                            int consumer) {
    const int ktiles = (n + TMA_BK - 1) / TMA_BK;
    const int lane = threadIdx.x & 31;
    // Descriptors of the first stage's operands; another stage and k step add their offset / 16
    // to the start-address field (bits 0-13). Shared addresses stay below 2^18 bytes, so the sum
    // never carries out of the field, and no descriptor is rebuilt in the loop.
    const u64 a_desc = wg_descriptor(ga_smem_addr(smem + consumer * 64 * TMA_BK));
    const u64 b_desc = wg_descriptor(ga_smem_addr(smem + TMA_A_BYTES));
    int stage = 0;
    u32 phase = 0;
    int acc[128];
    for (u32 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const tma_tile t = tma_tile_at<TMA_BM, TMA_BN>(tile, n);
#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0;
        int retiring = -1;  // the stage whose wgmma the next wait_group retires
        for (int kt = 0; kt < ktiles; ++kt) {
            ga_mbar_wait(&full[stage], phase);
            const u64 stage_offset = (u64)(stage * TMA_STAGE_BYTES) >> 4;
            tma_mma_ktile(acc, a_desc + stage_offset, b_desc + stage_offset);
            // k-tile kt's wgmma keeps running; kt - 1's is retired, so its stage is free.
            wg_wait<1>();
            wg_fence_operand(acc);
            if (retiring >= 0 && lane == 0) ga_mbar_arrive(&empty[retiring]);
            retiring = stage;
            if (++stage == TMA_STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
        wg_wait<0>();
        wg_fence_operand(acc);
        if (retiring >= 0 && lane == 0) ga_mbar_arrive(&empty[retiring]);

        // The epilogue, while the producer already loads the next tile.
        wg_store_mixed(acc, out + (u64)t.matrix * (u64)n * (u64)n, n, t.row0 + consumer * 64, t.col0, step);
    }
}

extern "C" __global__ void __launch_bounds__(TMA_THREADS, 1)
gemm_mix_tma(const __grid_constant__ ga_tensor_map x_map, const __grid_constant__ ga_tensor_map bt_map, i8* out,
             int n, int count, u32 step) {
    __shared__ __align__(8) u64 full[TMA_STAGES];
    __shared__ __align__(8) u64 empty[TMA_STAGES];
    // The stages, aligned to 1024 bytes; A then B within each stage.
    u8* smem = wg_smem_raw + ((1024 - (ga_smem_addr(wg_smem_raw) & 1023)) & 1023);
    const u32 tiles = (u32)count * (u32)((n + TMA_BM - 1) / TMA_BM) * (u32)((n + TMA_BN - 1) / TMA_BN);
    // The warpgroup, read from lane 0 so the compiler knows it is the same across the warp (see
    // gemm_pingpong.cu).
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);

    if (threadIdx.x == 0) {
        ga_tma_prefetch_map(&x_map);
        ga_tma_prefetch_map(&bt_map);
#pragma unroll
        for (int s = 0; s < TMA_STAGES; ++s) {
            ga_mbar_init(&full[s], 1);
            ga_mbar_init(&empty[s], TMA_CONSUMER_WARPS);
        }
        ga_mbar_init_fence();
    }
    __syncthreads();

    if (warpgroup == 0) {
        ga_setmaxnreg_dec<TMA_PRODUCER_REGISTERS>();
        if (threadIdx.x == 0) {
            tma_produce<TMA_BM, TMA_BN, TMA_STAGES>(&x_map, &bt_map, smem, full, empty, n, tiles);
        }
    } else {
        ga_setmaxnreg_inc<TMA_CONSUMER_REGISTERS>();
        tma_consume(smem, full, empty, out, n, step, tiles, warpgroup - 1);
    }
}
