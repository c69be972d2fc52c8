// Hopper's asynchronous machinery for the TMA kernels (gemm_tma.cu, gemm_pingpong.cu; sm_90a):
// transaction barriers (mbarrier), tensor-map tile loads (TMA, cp.async.bulk.tensor), their
// multicast to the blocks of a cluster, and register rebalancing between warpgroups
// (setmaxnreg). Written from the PTX ISA 8.x sections on each instruction; CUTLASS's
// cluster_barrier.h and copy_sm90_tma.hpp issue the same instructions.
//
// A host build (kernels/tests/cuda_kernels_on_host.rs) defines GA_HOST_EMULATION and supplies
// equivalents that are as late and as strict as the PTX ISA allows: a tile load writes garbage
// at issue and lands only when a thread polls its barrier, and a barrier's phase completes only
// when both its arrivals and its transaction bytes are in.

// A tensor map (CUtensorMap): 128 opaque bytes the host encodes (cuTensorMapEncodeTiled; see
// kernels/src/tma.rs), passed to the kernel by value as a __grid_constant__ parameter so
// that TMA can read it from the parameter space.
struct __align__(64) ga_tensor_map {
    u64 opaque[16];
};

#ifndef GA_HOST_EMULATION
// Arms a barrier: each phase completes after `arrivals` arrivals (and the transaction bytes
// announced during the phase). One thread initialises; ga_mbar_init_fence, then a block barrier,
// publishes it to every thread and to the async proxy before anyone uses it.
__device__ __forceinline__ void ga_mbar_init(u64* bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ga_smem_addr(bar)), "r"(arrivals) : "memory");
}

// (CUTLASS fences the initialisation this way; the CUDA Programming Guide's TMA example fences
// it into the async proxy. Both, once a block.)
__device__ __forceinline__ void ga_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One arrival, announcing `bytes` of transactions the phase must also wait for (the tile loads
// this thread is about to issue against the barrier).
__device__ __forceinline__ void ga_mbar_arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(ga_smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// One arrival (release semantics: this thread's earlier memory operations happen before the
// phase completes).
__device__ __forceinline__ void ga_mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(ga_smem_addr(bar)) : "memory");
}

// Whether the phase of parity `parity` has completed: true once the barrier's current phase is
// the next one. A phase is named by its parity, so a waiter must track which phase it expects:
// waiting on the parity of the phase before would pass at once (the mutant the host test
// builds). try_wait may suspend the thread for a while before it answers false. It acquires at
// the block's scope; ClusterScope acquires at the cluster's, pairing with arrivals that another
// block of the cluster released at that scope (ga_mbar_arrive_cluster).
template <bool ClusterScope = false>
__device__ __forceinline__ bool ga_mbar_try_wait(u64* bar, u32 parity) {
    u32 done;
    if (ClusterScope) {
        asm volatile(
            "{\n"
            ".reg .pred complete;\n"
            "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 complete, [%1], %2;\n"
            "selp.u32 %0, 1, 0, complete;\n"
            "}\n"
            : "=r"(done)
            : "r"(ga_smem_addr(bar)), "r"(parity)
            : "memory");
    } else {
        asm volatile(
            "{\n"
            ".reg .pred complete;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
            "selp.u32 %0, 1, 0, complete;\n"
            "}\n"
            : "=r"(done)
            : "r"(ga_smem_addr(bar)), "r"(parity)
            : "memory");
    }
    return done != 0;
}

// The global nanosecond timer.
__device__ __forceinline__ u64 ga_globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// A wait on one barrier phase longer than this is a broken pipeline (transaction bytes that never
// arrive, a lost arrival): the kernel traps, a fault the backend reports and recovers from,
// rather than hanging the GPU. A healthy wait is a k-tile's multiply, microseconds.
#define GA_MBAR_TIMEOUT_NS 4000000000ull

// Waits for the phase of parity `parity` to complete (see ga_mbar_try_wait).
template <bool ClusterScope = false>
__device__ __forceinline__ void ga_mbar_wait(u64* bar, u32 parity) {
    if (ga_mbar_try_wait<ClusterScope>(bar, parity)) return;
    const u64 start = ga_globaltimer();
    while (!ga_mbar_try_wait<ClusterScope>(bar, parity)) {
        if (ga_globaltimer() - start > GA_MBAR_TIMEOUT_NS) __trap();
    }
}

// Loads the box of `map` at coordinates (c0, c1, c2), innermost first, into shared memory at
// `dst` (128-byte aligned; 1024 for the 128-byte swizzle to match wgmma's), and counts its bytes
// against `bar`'s current phase. Elements outside the tensor are written as zeros.
__device__ __forceinline__ void ga_tma_load_3d(void* dst, const ga_tensor_map* map, u64* bar, int c0, int c1,
                                               int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(ga_smem_addr(dst)),
        "l"((u64)map), "r"(ga_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// The same load written to the same shared-memory offset in every block of the cluster named in
// `cta_mask` (bit r: the block of rank r), and counted against the barrier at `bar`'s offset in
// each of them: one read of global memory (and of L2) for several blocks.
__device__ __forceinline__ void ga_tma_load_3d_multicast(void* dst, const ga_tensor_map* map, u64* bar,
                                                         unsigned short cta_mask, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%4, %5, %6}], [%2], %3;\n" ::"r"(ga_smem_addr(dst)),
        "l"((u64)map), "r"(ga_smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// This block's rank in its cluster.
__device__ __forceinline__ u32 ga_cluster_rank() {
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// Every thread of every block of the cluster arrives, then waits for all the others (release,
// then acquire): what one block initialised is then visible to the others, and no block goes on
// before all have reached this point.
__device__ __forceinline__ void ga_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// One arrival on the barrier at `bar`'s shared-memory offset in the block of rank `cta` of this
// cluster (this block's own for its own rank), with release semantics at cluster scope.
__device__ __forceinline__ void ga_mbar_arrive_cluster(u64* bar, u32 cta) {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
        "}\n" ::"r"(ga_smem_addr(bar)),
        "r"(cta)
        : "memory");
}

// Fetches a tensor map into the TMA unit's cache ahead of its first use.
__device__ __forceinline__ void ga_tma_prefetch_map(const ga_tensor_map* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)map) : "memory");
}

// Gives registers back to the SM (a warpgroup that only issues loads) or takes them (the
// warpgroups that hold accumulators). Every thread of the warpgroup executes it.
template <u32 Registers>
__device__ __forceinline__ void ga_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}

template <u32 Registers>
__device__ __forceinline__ void ga_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
#endif  // GA_HOST_EMULATION
