// A separate mix pass over an int32 product: only the benchmark's cuBLASLt baseline uses it,
// to compare "library GEMM, then mix" against the fused kernels on equal terms.

// `y` holds whole n x n matrices one after another; each element is mixed at its place in its
// own matrix.
extern "C" __global__ void mix_i32(const int* y, i8* out, u64 count, u32 step, u32 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        const u64 at = i % ((u64)n * n);
        out[i] = ga_mix(y[i], step, (u32)(at / n), (u32)(at % n));
    }
}
