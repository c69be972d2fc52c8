// The TMA kernel on CUTLASS's sm90 "ping-pong" schedule: each consumer warpgroup takes whole
// output tiles of its own, and the two take turns on the tensor cores, so that one's epilogue
// (the fused mix and the stores) runs while the other's wgmma keeps the tensor cores busy.
// sm_90a only.
//
// out = mix(X * B, step) for every matrix of a batch, with Bt = B^T, as in the other GEMM
// kernels; int32 accumulation is exact, mix is the epilogue, and the int32 product never leaves
// the registers.
//
// Why: gemm_tma.cu's two consumers split one 128 x 256 tile, so they reach its epilogue together
// and the tensor cores idle while both mix and store (a profile on an H200 showed the tensor pipe
// busy 55% of the time). Here the tile is 64 x 256, one wgmma.m64n256k32 per 32 bytes of k, and
// a consumer's tiles are every other one of its block's: consumer 0 takes the block's tiles 0,
// 2, 4, ..., consumer 1 tiles 1, 3, 5, ...
//
// Shape (structure after CUTLASS's sm90_gemm_tma_warpspecialized_pingpong, written from the PTX
// ISA; the machinery is tma.cuh's and wgmma.cuh's, the tile order and producer tma_gemm.cuh's):
// - 384 threads = three warpgroups: the producer (one thread issues every load, 40 registers a
//   thread after setmaxnreg) and two consumers (232 registers: 128 accumulators each).
// - Five stages of 40 KiB (64 rows of X and 256 of Bt by 128 bytes of k), each guarded by `full`
//   (the producer's arrival and the stage's 40960 transaction bytes) and `empty` (one arrival
//   from each of the four warps of the consumer that read it; see below for clusters).
// - The producer loads the block's tiles in order, k-tile after k-tile, into one ring of stages;
//   the consumers read it in turn: consumer 0 a tile's k-tiles, then consumer 1 the next tile's,
//   and so on. So each consumer starts its pipeline position `consumer * ktiles` k-tiles in, and
//   after each of its tiles skips the other consumer's ktiles.
// - The turns: `turn[c]` is the barrier consumer c waits on before its tile's first wgmma; the
//   other consumer arrives on it (one arrival a warp) once it has issued its own tile's last
//   wgmma. Consumer 0's first wait passes at once (the phase "before" the first counts as
//   complete, as the producer's first `empty` waits do).
// - The turns are also what keeps the ring's parity waits exact. A barrier phase is named only by
//   its parity, so a wait is right only if the barrier is at most one phase from the one awaited.
//   Consumer 1's first k-tile is at position ktiles; without the turn it would wait on a stage
//   the ring has not yet come round to, see the parity of a phase several passes old, and read a
//   stage still holding another tile (the mutant the host test builds). Once the other consumer
//   has issued its tile, every position before this consumer's first has been filled, and the
//   producer cannot be more than one pass ahead of the position it is waited on at.
//
// Two entry points share this code: gemm_mix_pingpong, a block alone, and gemm_mix_multicast,
// blocks in clusters of two on adjacent 64-row tiles of one 128 x 256 output tile. Those two
// need the same Bt rows, so each block's producer loads half of them and multicasts it into both
// blocks' stages (tma_produce_pair): a block then reads from L2 per multiply-add what the
// cooperative kernel's 128 x 256 tiles read, where a lone 64 x 256 tile reads 1.67x that. In a
// cluster, a stage's `empty` counts the arrivals of both blocks' consumer warps (eight), since
// both producers write into it.
//
// Registers: the epilogue's mix (ga_mix, a few integer operations a byte) runs on the same 232
// registers as the accumulators, one pair at a time, so it adds no live state to the 128
// accumulators; kernel-check.sh shows ptxas's count and no spills.

#define PP_BM 64
#define PP_BN 256
#define PP_STAGES 5
#define PP_THREADS 384
#define PP_CONSUMER_WARPS 4
#define PP_A_BYTES (PP_BM * TMA_BK)
#define PP_STAGE_BYTES ((PP_BM + PP_BN) * TMA_BK)
// The barriers (full and empty per stage, two turns) live after the stages, in dynamic shared
// memory: a cluster's blocks address each other's barriers at the same offsets.
#define PP_BARRIER_BYTES 128
// One extra KiB to align the stages to the 1024 bytes the swizzle pattern is anchored to.
#define PP_SMEM_BYTES (PP_STAGES * PP_STAGE_BYTES + PP_BARRIER_BYTES + 1024)
#define PP_PRODUCER_REGISTERS 40
#define PP_CONSUMER_REGISTERS 232

// A position in the ring of stages: the stage, and the parity of the pass over the ring.
struct pp_position {
    int stage;
    u32 phase;
};

// `position` moved on by `k` k-tiles (k >= 0).
__device__ __forceinline__ pp_position pp_advance(pp_position position, int k) {
    position.stage += k % PP_STAGES;
    position.phase ^= (u32)(k / PP_STAGES) & 1u;
    if (position.stage >= PP_STAGES) {
        position.stage -= PP_STAGES;
        position.phase ^= 1u;
    }
    return position;
}

// Frees a stage: one arrival per warp on its `empty` barrier, in this block, and with CLUSTER
// blocks sharing Bt in every block of the cluster (whose producers multicast into it).
template <int CLUSTER>
__device__ __forceinline__ void pp_release(u64* empty) {
    if (CLUSTER == 1) {
        ga_mbar_arrive(empty);
    } else {
#pragma unroll
        for (u32 cta = 0; cta < CLUSTER; ++cta) ga_mbar_arrive_cluster(empty, cta);
    }
}

// Consumer warpgroup `consumer` (0 or 1): the block's tiles consumer, consumer + 2, ... of the
// `tiles` of CLUSTER * PP_BM x PP_BN its cluster (or, alone, itself) takes, rows rank * PP_BM..
// of each.
template <int CLUSTER>
__device__ __forceinline__ void pp_consume(u8* smem, u64* full, u64* empty, u64* turn, i8* out, int n, u32 step,
                                           u32 tiles, int consumer, u32 rank) {
    const int ktiles = (n + TMA_BK - 1) / TMA_BK;
    const int lane = threadIdx.x & 31;
    // Descriptors of the first stage's operands; another stage and k step add their offset / 16
    // to the start-address field (bits 0-13). Shared addresses stay below 2^18 bytes, so the sum
    // never carries out of the field.
    const u64 a_desc = wg_descriptor(ga_smem_addr(smem));
    const u64 b_desc = wg_descriptor(ga_smem_addr(smem + PP_A_BYTES));
    // Consumer 1's first k-tile comes after consumer 0's first tile.
    pp_position at = pp_advance(pp_position{0, 0}, consumer * ktiles);
    const u32 first = blockIdx.x / CLUSTER;
    const u32 stride = gridDim.x / CLUSTER;
    u32 turns = 0;  // this consumer's tiles so far
    int acc[128];
    for (u32 tile = first + (u32)consumer * stride; tile < tiles; tile += 2 * stride, ++turns) {
        const tma_tile t = tma_tile_at<CLUSTER * PP_BM, PP_BN>(tile, n);
#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0;
        // This consumer's turn-th tile follows the other consumer's tile before it: consumer 1
        // waits for phase `turns` of its barrier, consumer 0 for phase `turns - 1` of its own
        // (its first wait, on the phase before the first, passes at once).
        ga_mbar_wait(&turn[consumer], (turns & 1u) ^ (consumer == 0 ? 1u : 0u));
        int retiring = -1;  // the stage whose wgmma the next wait_group retires
        for (int kt = 0; kt < ktiles; ++kt) {
            ga_mbar_wait(&full[at.stage], at.phase);
            const u64 stage_offset = (u64)(at.stage * PP_STAGE_BYTES) >> 4;
            tma_mma_ktile(acc, a_desc + stage_offset, b_desc + stage_offset);
            // k-tile kt's wgmma keeps running; kt - 1's is retired, so its stage is free.
            wg_wait<1>();
            wg_fence_operand(acc);
            if (retiring >= 0 && lane == 0) pp_release<CLUSTER>(&empty[retiring]);
            retiring = at.stage;
            at = pp_advance(at, 1);
        }
        // Every wgmma of this tile is issued: the other consumer may start its tile while the
        // last k-tile's still runs.
        if (lane == 0) ga_mbar_arrive(&turn[consumer ^ 1]);
        wg_wait<0>();
        wg_fence_operand(acc);
        if (retiring >= 0 && lane == 0) pp_release<CLUSTER>(&empty[retiring]);
        // The other consumer's tile comes next in the ring.
        at = pp_advance(at, ktiles);

        // The epilogue, under the other consumer's wgmma.
        wg_store_mixed(acc, out + (u64)t.matrix * (u64)n * (u64)n, n, t.row0 + (int)rank * PP_BM, t.col0, step);
    }
}

// The kernel, alone (CLUSTER 1) or as one block of a cluster of two sharing their Bt rows.
template <int CLUSTER>
__device__ __forceinline__ void pp_gemm(const ga_tensor_map* x_map, const ga_tensor_map* bt_map, i8* out, int n,
                                        int count, u32 step) {
    // The stages, aligned to 1024 bytes; A then B within each stage; the barriers after them.
    u8* smem = wg_smem_raw + ((1024 - (ga_smem_addr(wg_smem_raw) & 1023)) & 1023);
    u64* full = (u64*)(smem + PP_STAGES * PP_STAGE_BYTES);
    u64* empty = full + PP_STAGES;
    u64* turn = empty + PP_STAGES;
    const u32 tiles =
        (u32)count * (u32)((n + CLUSTER * PP_BM - 1) / (CLUSTER * PP_BM)) * (u32)((n + PP_BN - 1) / PP_BN);
    // The warpgroup, read from lane 0 so the compiler knows it is the same across the warp: the
    // consumer's ring position, and with it every wgmma descriptor, then stays in uniform
    // registers (CUTLASS's canonical_warp_group_idx does the same).
    const int warpgroup = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);
    const u32 rank = CLUSTER == 1 ? 0u : ga_cluster_rank();

    if (threadIdx.x == 0) {
        ga_tma_prefetch_map(x_map);
        ga_tma_prefetch_map(bt_map);
#pragma unroll
        for (int s = 0; s < PP_STAGES; ++s) {
            ga_mbar_init(&full[s], 1);
            ga_mbar_init(&empty[s], CLUSTER * PP_CONSUMER_WARPS);
        }
        ga_mbar_init(&turn[0], PP_CONSUMER_WARPS);
        ga_mbar_init(&turn[1], PP_CONSUMER_WARPS);
        ga_mbar_init_fence();
    }
    // Every block's barriers are initialised before any block of the cluster arrives on them or
    // multicasts into its stages. (Warp 0 reconverges first: the cluster barrier is .aligned.)
    if (CLUSTER == 1) {
        __syncthreads();
    } else {
        __syncwarp();
        ga_cluster_sync();
    }

    if (warpgroup == 0) {
        ga_setmaxnreg_dec<PP_PRODUCER_REGISTERS>();
        if (threadIdx.x == 0) {
            if (CLUSTER == 1) {
                tma_produce<PP_BM, PP_BN, PP_STAGES>(x_map, bt_map, smem, full, empty, n, tiles);
            } else {
                tma_produce_pair<PP_BM, PP_BN, PP_STAGES>(x_map, bt_map, smem, full, empty, n, tiles, rank);
            }
        }
    } else {
        ga_setmaxnreg_inc<PP_CONSUMER_REGISTERS>();
        pp_consume<CLUSTER>(smem, full, empty, turn, out, n, step, tiles, warpgroup - 1, rank);
    }
}

extern "C" __global__ void __launch_bounds__(PP_THREADS, 1)
gemm_mix_pingpong(const __grid_constant__ ga_tensor_map x_map, const __grid_constant__ ga_tensor_map bt_map,
                  i8* out, int n, int count, u32 step) {
    pp_gemm<1>(&x_map, &bt_map, out, n, count, step);
}

// Blocks in clusters of two (the grid is even): both take the same output tiles' Bt columns, and
// each block's producer loads half of them for both (tma_produce_pair). Its Bt tensor map has
// boxes of PP_BN / 2 rows.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(PP_THREADS, 1)
gemm_mix_multicast(const __grid_constant__ ga_tensor_map x_map, const __grid_constant__ ga_tensor_map bt_map,
                   i8* out, int n, int count, u32 step) {
    pp_gemm<2>(&x_map, &bt_map, out, n, count, step);
}
