// The Hopper kernel: int8 wgmma (warpgroup MMA, m64n256k32), sm_90a only.
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

// The PTX helpers (cp.async ones in cp_async.cuh). A host build
// (shared/tests/cuda_kernels_on_host.rs) defines GA_HOST_EMULATION and supplies equivalents
// (wgmma computed from the descriptors the kernel builds, by the PTX ISA's layout tables), and
// the dynamic shared memory.
#ifndef GA_HOST_EMULATION
extern __shared__ __align__(16) u8 wg_smem_raw[];

// Makes this thread's completed shared-memory writes visible to the async proxy wgmma reads
// through.
__device__ __forceinline__ void wg_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Tells the compiler the accumulators may change here, so it neither reads them before a wait
// that retires the wgmma writing them nor moves or copies them while a group runs (CUTLASS's
// warpgroup_fence_operand).
__device__ __forceinline__ void wg_fence_operand(int (&d)[128]) {
#pragma unroll
    for (int i = 0; i < 128; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Waits until at most `Pending` committed wgmma groups of this warpgroup are still running.
template <int Pending>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

// d += A * B^T over 32 bytes of k, A (64 rows) and B (256 rows) K-major in shared memory.
__device__ __forceinline__ void wg_mma_m64n256k32(int (&d)[128], u64 a_desc, u64 b_desc) {
    asm volatile(
        "{\n"
        ".reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, accumulate;\n"
        "}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
          "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
          "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
          "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
          "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
          "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]),
          "+r"(d[103]), "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]),
          "+r"(d[110]), "+r"(d[111]), "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]),
          "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]),
          "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
        : "l"(a_desc), "l"(b_desc), "r"(1));
}
#endif  // GA_HOST_EMULATION

// A shared-memory matrix descriptor for a K-major operand in the 128-byte swizzle: start
// address / 16 in bits 0-13, leading byte offset (unused by swizzled K-major layouts; 1 by
// convention) in bits 16-29, stride byte offset 1024 / 16 (eight 128-byte rows) in bits 32-45,
// and swizzle mode 1 (128 bytes) in bits 62-63. A k step of 32 bytes inside the rows adds 32 to
// the address; the swizzle is applied to address bits, so groups must be 1024-byte aligned.
__device__ __forceinline__ u64 wg_descriptor(u32 smem_address) {
    return (u64)((smem_address & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

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

    i8* om = out + matrix;
    const int lane = tid & 31;
    const int warp = (tid >> 5) & 3;
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
        const int row = row0 + warpgroup * 64 + 16 * warp + g + 8 * ((i / 2) % 2);
        const int col = col0 + 8 * (i / 4) + 2 * t;
        if (row < n && col < n) {
            *(char2*)(om + (u64)row * n + col) =
                make_char2(ga_mix(acc[i], step, row, col), ga_mix(acc[i + 1], step, row, col + 1));
        }
    }
}
