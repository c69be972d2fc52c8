// A separate mix pass over an int32 product: only the benchmark's cuBLASLt baseline uses it,
// to compare "library GEMM, then mix" against the fused kernels on equal terms.

extern "C" __global__ void mix_i32(const int* y, i8* out, u64 count, u32 step) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        out[i] = ga_mix(y[i], step);
    }
}
