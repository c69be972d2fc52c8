// Asynchronous global -> shared copies (cp.async, sm_80 and later) and the shared-address
// conversion the tensor-core kernels share. NVRTC compiles it into the modules of the kernels
// that use it only (see kernels/src/kernels.rs): older GPUs have no cp.async.
//
// A host build (kernels/tests/cuda_kernels_on_host.rs) defines GA_HOST_EMULATION and supplies
// equivalents: copies that land only when the wait_group retiring their group runs.
#ifndef GA_HOST_EMULATION
__device__ __forceinline__ u32 ga_smem_addr(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

// 16 bytes global -> shared, bypassing L1; src_bytes = 0 writes zeros (rows past n).
__device__ __forceinline__ void ga_cp_async16(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ga_smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes));
}

__device__ __forceinline__ void ga_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most `Pending` committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void ga_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}
#endif  // GA_HOST_EMULATION
