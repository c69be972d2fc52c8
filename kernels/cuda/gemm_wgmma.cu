// The Hopper kernel fed by cp.async: int8 wgmma (warpgroup MMA, m64n256k32), sm_90a only. The
// wgmma wrappers and descriptors are in wgmma.cuh; gemm_tma.cu is its TMA-fed, warp-specialised,
// persistent successor.
//
// out = mix(X * B, step) for every matrix of a batch (blockIdx.z), with Bt = B^T, as in the
// other GEMM kernels; int32 accumulation is exact, and mix is the epilogue.
//
// Shape, and why:
// - 256 threads = two warpgroups; a block computes a 128x256 output tile, each warpgroup 64x256
//   with one wgmma.m64n256k32 per 32 bytes of k (128 int32 accumulators per thread). Hopper's
//   tensor cores reach their int8 rate only through wgmma, which reads both operands straight
//   from shared memory: no fragment loads through registers as mma.sync needs.
// - k advances 128 bytes per stage, four stages (cp.async, every thread loading): 48 KiB a
//   stage, 193 KiB in all, dynamic shared memory. Two tiles are loading while one is multiplied
//   and the wgmma of the one before it still runs: a warpgroup waits for its wgmma one k-tile
//   late (wgmma.wait_group 1), so the tensor cores are not idle while the next tile is issued.
// - Both operands are K-major (X rows and Bt rows are k-contiguous) in the 128-byte swizzle
//   wgmma's descriptors name: rows of 128 bytes, groups of eight rows 1024 bytes apart, 16-byte
//   chunk c of row r stored at chunk c ^ (r % 8). That is also free of bank conflicts for the
//   cp.async writes.
// - Rows and k past n (n is a multiple of 64, not always of 128 or 256) are zero-filled on load
//   and rows and columns past n skipped on store.
//
// Accumulator layout (PTX ISA, "wgmma .m64nNk32 register fragment D"): thread lane = 4g + t of
// warp w of a warpgroup holds, in register i, row 16w + g + 8 * ((i / 2) % 2) and column
// 8 * (i / 4) + 2t + (i % 2): the mma.sync C layout repeated across the 256 columns.

#define WG_BM 128
#define WG_BN 256
#define WG_BK 128
#define WG_STAGES 4
#define WG_THREADS 256
#define WG_STAGE_BYTES ((WG_BM + WG_BN) * WG_BK)
// One extra KiB to align the stages to the 1024 bytes the swizzle pattern is anchored to.
#define WG_SMEM_BYTES (WG_STAGES * WG_STAGE_BYTES + 1024)

// Byte offset of logical 16-byte chunk `chunk` (0..7) of row `row` in a swizzled tile.
__device__ __forceinline__ int wg_swizzle(int row, int chunk) {
    return row * WG_BK + ((chunk ^ (row & 7)) * 16);
}

// What one thread copies into every stage: 16-byte chunk tid % 8 of rows tid / 8 + 32 r,
// r = 0..11, of the stage's 384 rows (128 of X from row0, then 256 of Bt from col0). All but k
// is fixed for the kernel, so it is worked out once, not per k-tile: each row's source (a row
// past n reads nothing, src_bytes 0, from the matrix's first row, a valid address) and the
// destination. Rows 32 apart have the same (row % 8), hence the same swizzle, and B's rows
// follow A's in a stage, so one offset serves all twelve copies, 4 KiB apart.
#define WG_COPIES ((WG_BM + WG_BN) * (WG_BK / 16) / WG_THREADS)
struct wg_copy_plan {
    const i8* src[WG_COPIES];  // the row's start (the matrix's first row, past n)
    int bytes[WG_COPIES];  // 16, or 0 past n
    int dst;               // byte offset of row tid / 8, chunk tid % 8, in a stage
    int chunk_k;           // 16 * (tid % 8): this thread's k within a k-tile
};

__device__ __forceinline__ wg_copy_plan wg_plan_copies(const i8* xm, const i8* bm, int n, int row0, int col0,
                                                       int tid) {
    const int row = tid >> 3;
    const int chunk = tid & 7;
    wg_copy_plan p;
#pragma unroll
    for (int r = 0; r < WG_COPIES; ++r) {
        const bool is_a = r < WG_BM / 32;
        const int src_row = (is_a ? row0 + 32 * r : col0 + 32 * (r - WG_BM / 32)) + row;
        const i8* base = is_a ? xm : bm;
        const bool in = src_row < n;
        p.src[r] = in ? base + (u64)src_row * n : base;
        p.bytes[r] = in ? 16 : 0;
    }
    p.dst = wg_swizzle(row, chunk);
    p.chunk_k = chunk * 16;
    return p;
}

// Loads 128 bytes of k from k0 of the stage's rows into `stage`. k past n (the last k-tile when
// n is an odd multiple of 64) reads nothing, from the row's start: an address inside the matrix
// even for its last row.
__device__ __forceinline__ void wg_load_stage(u8* stage, const wg_copy_plan& p, int n, int k0) {
    const bool k_in = k0 + p.chunk_k < n;
    const int k = k_in ? k0 + p.chunk_k : 0;
    const int k_bytes = k_in ? 16 : 0;
#pragma unroll
    for (int r = 0; r < WG_COPIES; ++r) {
        ga_cp_async16(stage + p.dst + r * 32 * WG_BK, p.src[r] + k, p.bytes[r] & k_bytes);
    }
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
gemm_mix_wgmma(const i8* x, const i8* bt, i8* out, int n, u32 step) {
    // The stages, aligned to 1024 bytes; A then B within each stage.
    u8* smem = wg_smem_raw + ((1024 - (ga_smem_addr(wg_smem_raw) & 1023)) & 1023);

    const u64 matrix = (u64)blockIdx.z * (u64)n * (u64)n;
    const i8* xm = x + matrix;
    const i8* bm = bt + matrix;
    const int row0 = blockIdx.y * WG_BM;
    const int col0 = blockIdx.x * WG_BN;
    const int tid = threadIdx.x;
    const int warpgroup = tid >> 7;

    int acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0;

    const int ktiles = (n + WG_BK - 1) / WG_BK;
    const wg_copy_plan copies = wg_plan_copies(xm, bm, n, row0, col0, tid);
    // Tiles are loaded WG_STAGES - 2 ahead, not WG_STAGES - 1: one stage is left to the wgmma
    // group still running from the previous k-tile, so the tensor cores multiply tile kt - 1
    // while tile kt is issued (see the wait at the end of the loop).
#pragma unroll
    for (int s = 0; s < WG_STAGES - 2; ++s) {
        if (s < ktiles) {
            wg_load_stage(smem + s * WG_STAGE_BYTES, copies, n, s * WG_BK);
        }
        ga_cp_async_commit();
    }
    // The stage tile kt is in, and the one tile kt + WG_STAGES - 2 goes to: counters that wrap.
    int stage = 0;
    int refill = WG_STAGES - 2;
    for (int kt = 0; kt < ktiles; ++kt) {
        // Tile kt has landed once at most WG_STAGES - 3 younger groups are pending. Each thread
        // hands its copies to the async proxy, and the barrier makes them everyone's. The
        // barrier also proves that every warpgroup's wgmma on tile kt - 2 has finished (each
        // leaves at most one group, tile kt - 1's, running at the end of an iteration), so tile
        // kt - 2's stage, the one refilled below, is free; tile kt - 1's is not touched.
        ga_cp_async_wait<WG_STAGES - 3>();
        wg_fence_proxy_async();
        __syncthreads();
        const int next = kt + WG_STAGES - 2;
        if (next < ktiles) {
            wg_load_stage(smem + refill * WG_STAGE_BYTES, copies, n, next * WG_BK);
        }
        ga_cp_async_commit();
        refill = refill == WG_STAGES - 1 ? 0 : refill + 1;

        const u8* tile = smem + stage * WG_STAGE_BYTES;
        stage = stage == WG_STAGES - 1 ? 0 : stage + 1;
        const u32 a_addr = ga_smem_addr(tile + warpgroup * 64 * WG_BK);
        const u32 b_addr = ga_smem_addr(tile + WG_BM * WG_BK);
        wg_fence_operand(acc);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 32; ++kk) {
            wg_mma_m64n256k32(acc, wg_descriptor(a_addr + kk * 32), wg_descriptor(b_addr + kk * 32));
        }
        wg_commit();
        // Tile kt's wgmma keeps running into the next iteration; tile kt - 1's must be done.
        wg_wait<1>();
        wg_fence_operand(acc);
    }
    wg_wait<0>();
    wg_fence_operand(acc);

    wg_store_mixed(acc, out + matrix, n, row0 + warpgroup * 64, col0, step);
}
