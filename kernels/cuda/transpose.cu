// Bt = B^T for every matrix of a batch (blockIdx.z), so that both GEMM operands are read along
// k: row i of X and row j of Bt are the two vectors whose dot product is Y[i][j].
// Block 32x8 threads moves a 32x32 tile through shared memory; n is a multiple of 64.

extern "C" __global__ void transpose_i8(const i8* in, i8* out, int n) {
    __shared__ i8 tile[32][33];
    const u64 base = (u64)blockIdx.z * (u64)n * (u64)n;
    int x = blockIdx.x * 32 + threadIdx.x;
    int y = blockIdx.y * 32 + threadIdx.y;
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
        tile[threadIdx.y + j][threadIdx.x] = in[base + (u64)(y + j) * n + x];
    }
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x;
    y = blockIdx.x * 32 + threadIdx.y;
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
        out[base + (u64)(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
    }
}
