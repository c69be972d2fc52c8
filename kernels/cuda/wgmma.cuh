// Hopper's warpgroup MMA (wgmma), shared by the kernels that use it (gemm_wgmma.cu, fed by
// cp.async; gemm_tma.cu, fed by TMA): the PTX wrappers, the shared-memory matrix descriptor,
// and the dynamic shared memory both kernels' stages live in. sm_90a only.
//
// A host build (kernels/tests/cuda_kernels_on_host.rs) defines GA_HOST_EMULATION and supplies
// equivalents (wgmma computed from the descriptors the kernel builds, by the PTX ISA's layout
// tables, when its group is retired), and the dynamic shared memory.
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

// Stores one warpgroup's 64 x 256 accumulators, mixed (the epilogue every GEMM kernel fuses),
// at rows row0.. and columns col0.. of the n x n matrix `om`, skipping rows and columns past n.
// The layout is the PTX ISA's wgmma D fragment: register i of lane 4g + t in warp w of the
// warpgroup holds row 16w + g + 8 * ((i / 2) % 2), column 8 * (i / 4) + 2t + (i % 2), so each
// even/odd pair is two adjacent bytes, stored together.
__device__ __forceinline__ void wg_store_mixed(const int (&acc)[128], i8* om, int n, int row0, int col0, u32 step) {
    const int lane = threadIdx.x & 31;
    const int warp = (threadIdx.x >> 5) & 3;
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
        const int row = row0 + 16 * warp + g + 8 * ((i / 2) % 2);
        const int col = col0 + 8 * (i / 4) + 2 * t;
        if (row < n && col < n) {
            *(char2*)(om + (u64)row * n + col) =
                make_char2(ga_mix(acc[i], step, row, col), ga_mix(acc[i + 1], step, row, col + 1));
        }
    }
}
