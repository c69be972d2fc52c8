// The tiled kernel: CUDA cores, dp4a, shared-memory tiles; any GPU from sm_61.
//
// out = mix(X * B, step) for every matrix of a batch (blockIdx.z), with Bt = B^T so that both
// operands are contiguous along k and four int8 products fold into one dp4a. Exact: int8 x int8
// products summed in int32 cannot overflow for n <= 8192 (|sum| <= 8192 * 128 * 128 = 2^27).
//
// A block computes a 64x64 tile of the output with 256 threads, 4x4 outputs each, walking k in
// steps of 32 bytes (8 words). The int32 product never leaves registers: mix is the epilogue.

#define TILED_BM 64
#define TILED_BN 64
#define TILED_BK_WORDS 8  // 32 int8 values along k
#define TILED_THREADS 256

extern "C" __global__ void __launch_bounds__(TILED_THREADS)
gemm_mix_tiled(const i8* x, const i8* bt, i8* out, int n, u32 step) {
    // One padding word per row keeps the column reads of Bs free of bank conflicts.
    __shared__ int As[TILED_BM][TILED_BK_WORDS + 1];
    __shared__ int Bs[TILED_BN][TILED_BK_WORDS + 1];

    const u64 matrix = (u64)blockIdx.z * (u64)n * (u64)n;
    const i8* xm = x + matrix;
    const i8* bm = bt + matrix;
    const int row0 = blockIdx.y * TILED_BM;
    const int col0 = blockIdx.x * TILED_BN;
    const int tid = threadIdx.x;
    const int tx = tid % 16;  // output columns tx, tx+16, tx+32, tx+48
    const int ty = tid / 16;  // output rows ty, ty+16, ty+32, ty+48

    int acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0;

    for (int k0 = 0; k0 < n; k0 += 4 * TILED_BK_WORDS) {
        // 64 rows x 8 words per operand = 512 words: two per thread each.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int w = tid + r * TILED_THREADS;
            const int row = w / TILED_BK_WORDS;
            const int word = w % TILED_BK_WORDS;
            As[row][word] = *(const int*)(xm + (u64)(row0 + row) * n + k0 + word * 4);
            Bs[row][word] = *(const int*)(bm + (u64)(col0 + row) * n + k0 + word * 4);
        }
        __syncthreads();
#pragma unroll
        for (int kw = 0; kw < TILED_BK_WORDS; ++kw) {
            int a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[ty + 16 * i][kw];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[tx + 16 * j][kw];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    i8* om = out + matrix;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int row = row0 + ty + 16 * i;
            const int col = col0 + tx + 16 * j;
            om[(u64)row * n + col] = ga_mix(acc[i][j], step, row, col);
        }
}
