// The tensor-core kernel: int8 mma.sync (m16n8k32), sm_80 and later.
//
// out = mix(X * B, step) for every matrix of a batch (blockIdx.z), with Bt = B^T: X is the
// row-major A operand and Bt, row-major, is B in the column-major layout mma's ".col" expects.
// int32 accumulation is exact (|sum| <= 2^27 for n <= 8192), so the result is bit-identical to
// every other backend. The int32 product never leaves registers: mix is the epilogue.
//
// Shape, and why:
// - A block of 128 threads (4 warps, 2 x 2) computes a 128x128 output tile; each warp a 64x64
//   tile as 4 x 8 mma tiles of 16x8. A 64x64 warp tile reads 4 KiB of fragments from shared
//   memory per 32 mma, half the bytes per mma of a 64x32 tile: shared-memory bandwidth, not the
//   tensor cores, is what limits mma.sync kernels with small warp tiles.
// - Fragments come from shared memory with ldmatrix.x4: one instruction per 16x32 A fragment or
//   per pair of 8x32 B fragments, instead of four 32-bit loads each.
// - k advances 64 bytes per stage, three stages deep (cp.async): two tiles are in flight while
//   the third is multiplied. 3 x 16 KiB = 48 KiB, the static shared-memory limit, so two blocks
//   (8 warps) share an SM.
// - Rows are stored unpadded (64 bytes) with their four 16-byte chunks XOR-swizzled by
//   (row / 2) % 4, so the eight rows one ldmatrix phase reads land on eight distinct 16-byte bank
//   groups: no bank conflicts, and no padding to waste the 48 KiB.
// - Rows and columns past n (n is a multiple of 64, not always of 128) are zero-filled on load
//   and skipped on store.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32"), lane = 4 * g + t:
//   A (16x32, row): reg0 = row g,   k 4t..4t+3;  reg1 = row g+8, k 4t..;
//                   reg2 = row g,   k 16+4t..;   reg3 = row g+8, k 16+4t..
//   B (32x8, col):  reg0 = col g,   k 4t..4t+3;  reg1 = col g,   k 16+4t..
//   C (16x8):       c0, c1 = row g, cols 2t, 2t+1;  c2, c3 = row g+8, cols 2t, 2t+1
// ldmatrix.x4 gives lane 4 * g + t, for each of its four 8-row x 16-byte matrices, bytes
// 4t..4t+3 of row g; lanes 8j..8j+7 supply the row addresses of matrix j. So an A fragment is
// matrices (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7, k 16-31), (rows 8-15, k 16-31),
// and a B pair is (cols 0-7, k 0-15), (cols 0-7, k 16-31), (cols 8-15, k 0-15), (cols 8-15, k 16-31).

#define TC_BM 128
#define TC_BN 128
#define TC_BK 64
#define TC_STAGES 3
#define TC_THREADS 128

// The PTX helpers (cp.async ones in cp_async.cuh). A host build
// (kernels/tests/cuda_kernels_on_host.rs) defines GA_HOST_EMULATION and supplies equivalents:
// ldmatrix and mma as warp exchanges following the PTX ISA's layout tables.
#ifndef GA_HOST_EMULATION
__device__ __forceinline__ void tc_ldmatrix_x4(int* r, const void* row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(ga_smem_addr(row_addr)));
}

__device__ __forceinline__ void tc_mma(int* c, int a0, int a1, int a2, int a3, int b0, int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif  // GA_HOST_EMULATION

// One stage of one operand: 128 rows of 64 bytes, chunks swizzled (see above).
typedef i8 tc_tile[TC_BM][TC_BK];

// Byte offset within a row of logical 16-byte chunk `chunk` (0..3) of row `row`.
__device__ __forceinline__ int tc_swizzle(int row, int chunk) {
    return ((chunk ^ (row >> 1)) & 3) * 16;
}

// What one thread copies into every stage: 16-byte chunk tid % 4 of rows tid / 4 + 32 r
// (r = 0..3) of each operand. Everything but k is fixed for the whole kernel, so it is worked
// out once, not per k-tile: each row's source (a row past n reads nothing, src_bytes 0, from the
// matrix's first row, a valid address) and the destination. The swizzle of row tid / 4 + 32 r is
// ((tid / 4 + 32 r) / 2) % 4 = (tid / 8) % 4 for every r, so one shared offset serves all four,
// 2 KiB apart.
struct tc_copy_plan {
    const i8* a[4];  // X at row row0 + tid / 4 + 32 r, byte 16 * (tid % 4)
    const i8* b[4];  // Bt at row col0 + tid / 4 + 32 r, same byte
    int a_bytes[4];  // 16, or 0 past n
    int b_bytes[4];
    int dst;  // byte offset of row tid / 4, chunk tid % 4, in a stage tile
};

__device__ __forceinline__ tc_copy_plan tc_plan_copies(const i8* xm, const i8* bm, int n, int row0, int col0, int tid) {
    const int row = tid >> 2;
    const int chunk = tid & 3;
    tc_copy_plan p;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const bool a_in = row0 + row + 32 * r < n;
        const bool b_in = col0 + row + 32 * r < n;
        p.a[r] = a_in ? xm + (u64)(row0 + row + 32 * r) * n + chunk * 16 : xm;
        p.b[r] = b_in ? bm + (u64)(col0 + row + 32 * r) * n + chunk * 16 : bm;
        p.a_bytes[r] = a_in ? 16 : 0;
        p.b_bytes[r] = b_in ? 16 : 0;
    }
    p.dst = row * TC_BK + tc_swizzle(row, chunk);
    return p;
}

// Loads the 128 x 64-byte tiles of X and Bt at k0 into one stage.
__device__ __forceinline__ void tc_load_stage(tc_tile& as, tc_tile& bs, const tc_copy_plan& p, int k0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        ga_cp_async16(&as[0][0] + p.dst + r * 32 * TC_BK, p.a[r] + k0, p.a_bytes[r]);
        ga_cp_async16(&bs[0][0] + p.dst + r * 32 * TC_BK, p.b[r] + k0, p.b_bytes[r]);
    }
}

extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
gemm_mix_tensor(const i8* x, const i8* bt, i8* out, int n, u32 step) {
    __shared__ __align__(128) tc_tile As[TC_STAGES];
    __shared__ __align__(128) tc_tile Bs[TC_STAGES];

    const u64 matrix = (u64)blockIdx.z * (u64)n * (u64)n;
    const i8* xm = x + matrix;
    const i8* bm = bt + matrix;
    const int row0 = blockIdx.y * TC_BM;
    const int col0 = blockIdx.x * TC_BN;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int warp_row = (warp >> 1) * 64;
    const int warp_col = (warp & 1) * 64;
    // This lane's ldmatrix row within a 16-row A fragment or a 16-column B pair, and which 16-byte
    // half of the fragment's 32 k it addresses (see the layouts above).
    const int a_ld_row = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int a_ld_half = lane >> 4;
    const int b_ld_col = (lane & 7) + (lane >> 4) * 8;
    const int b_ld_half = (lane >> 3) & 1;
    // This lane's ldmatrix address in a stage tile, per 32-byte k step ks, for fragment mi = 0
    // (A) or pair nj = 0 (B); fragment mi adds 1 KiB (16 rows), as pair nj does. The swizzle
    // does not change with mi, nj or the warp: ((warp_row + 16 mi + a_ld_row) / 2) % 4 is
    // (a_ld_row / 2) % 4, warp_row and 16 mi being multiples of 8 (the same for B).
    int a_frag[TC_BK / 32], b_frag[TC_BK / 32];
#pragma unroll
    for (int ks = 0; ks < TC_BK / 32; ++ks) {
        a_frag[ks] = (warp_row + a_ld_row) * TC_BK + tc_swizzle(a_ld_row, ks * 2 + a_ld_half);
        b_frag[ks] = (warp_col + b_ld_col) * TC_BK + tc_swizzle(b_ld_col, ks * 2 + b_ld_half);
    }
    const tc_copy_plan copies = tc_plan_copies(xm, bm, n, row0, col0, tid);

    int acc[4][8][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0;

    const int ktiles = n / TC_BK;
    // Prologue: the first TC_STAGES - 1 tiles in flight, one commit group each (empty past the end,
    // so that group kt is always tile kt).
#pragma unroll
    for (int s = 0; s < TC_STAGES - 1; ++s) {
        if (s < ktiles) {
            tc_load_stage(As[s], Bs[s], copies, s * TC_BK);
        }
        ga_cp_async_commit();
    }
    // The stage tile kt is in, and the one tile kt + TC_STAGES - 1 goes to: counters that wrap,
    // not a division by 3 per k-tile.
    int stage = 0;
    int refill = TC_STAGES - 1;
    for (int kt = 0; kt < ktiles; ++kt) {
        // Tile kt has landed once at most TC_STAGES - 2 younger groups are pending; the barrier
        // makes every thread's copies visible, and proves every warp is done with tile kt - 1,
        // whose stage the load below refills.
        ga_cp_async_wait<TC_STAGES - 2>();
        __syncthreads();
        const int next = kt + TC_STAGES - 1;
        if (next < ktiles) {
            tc_load_stage(As[refill], Bs[refill], copies, next * TC_BK);
        }
        ga_cp_async_commit();
        refill = refill == TC_STAGES - 1 ? 0 : refill + 1;

        const i8* a_tile = &As[stage][0][0];
        const i8* b_tile = &Bs[stage][0][0];
        stage = stage == TC_STAGES - 1 ? 0 : stage + 1;
#pragma unroll
        for (int ks = 0; ks < TC_BK / 32; ++ks) {
            int b[8][2];
#pragma unroll
            for (int nj = 0; nj < 4; ++nj) {
                int r[4];
                tc_ldmatrix_x4(r, b_tile + b_frag[ks] + nj * 16 * TC_BK);
                b[2 * nj][0] = r[0];
                b[2 * nj][1] = r[1];
                b[2 * nj + 1][0] = r[2];
                b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                int a[4];
                tc_ldmatrix_x4(a, a_tile + a_frag[ks] + mi * 16 * TC_BK);
#pragma unroll
                for (int ni = 0; ni < 8; ++ni) tc_mma(acc[mi][ni], a[0], a[1], a[2], a[3], b[ni][0], b[ni][1]);
            }
        }
    }

    i8* om = out + matrix;
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) {
            const int row = row0 + warp_row + mi * 16 + g;
            const int col = col0 + warp_col + ni * 8 + 2 * t;
            if (col >= n) {
                continue;
            }
            if (row < n) {
                char2 v = make_char2(ga_mix(acc[mi][ni][0], step, row, col), ga_mix(acc[mi][ni][1], step, row, col + 1));
                *(char2*)(om + (u64)row * n + col) = v;
            }
            if (row + 8 < n) {
                char2 v = make_char2(ga_mix(acc[mi][ni][2], step, row + 8, col),
                                     ga_mix(acc[mi][ni][3], step, row + 8, col + 1));
                *(char2*)(om + (u64)(row + 8) * n + col) = v;
            }
        }
    }
}
