//! Runs the CUDA kernels on the CPU: the exact `.cu` sources, compiled as C++ behind a shim,
//! against rand_chacha, the blake3 crate, `mix.rs`, the naive GEMM and the memory walk's step. Kernels without barriers
//! (ChaCha8, BLAKE3, mix) run one emulated thread at a time; the transpose and the GEMM kernels
//! run each block's threads as OS threads, with `__syncthreads` a barrier, cp.async a copy that
//! lands only when its commit group is waited for, and `ldmatrix`, `mma.sync` and `wgmma` (read
//! through the kernel's own shared-memory descriptors) emulated from the PTX ISA's layout
//! tables. That checks every kernel's indexing, tiling, swizzling, pipeline order, bounds and
//! fragment layouts bit for bit without a GPU. What it cannot check is the hardware itself (the
//! real tensor cores, a reading of the PTX ISA that both the kernel and this emulation share,
//! timing), which the GPU tests do (tests/cuda_backend.rs).
//!
//! Needs a C++ compiler (`c++`, or `CXX`); without one it says it was skipped.

mod common;

use gpu_attest_kernels::GpuKernel;
use gpu_attest_kernels::kernels::AuxModule;
use gpu_attest_kernels::tma::OperandMap;
use gpu_attest_shared::gemm::naive;
use gpu_attest_shared::matrix::{Matrix, generate};
use gpu_attest_shared::memory::ENTRY_BYTES;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::locality::{LocalityWalk, State, walk_lines};
use gpu_attest_shared::memory::slice::SLICE_BYTES;
use gpu_attest_shared::memory::slice_walk::{HeldStates, KEPT_EVERY, KeptTrace, SliceWalk, walk_device};
use gpu_attest_shared::memory::walk::{entry_index, step};
use gpu_attest_shared::merkle::MerkleTree;
use gpu_attest_shared::mix::mix;
use gpu_attest_shared::{CancelToken, Digest};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const SHIM: &str = r#"
#define GA_HOST_EMULATION 1
#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
// Shared memory is static storage in a section of its own, filled with garbage before every
// block as a GPU's is: a kernel that reads shared bytes it never wrote reads 0xa5 here.
#define __shared__ static __attribute__((section("ga_shared")))
extern "C" unsigned char __start_ga_shared[], __stop_ga_shared[];
#define __align__(x) __attribute__((aligned(x)))
struct ga_dim3 { unsigned x, y, z; };
static thread_local ga_dim3 blockIdx, threadIdx, blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct char2 { signed char x, y; };
static inline char2 make_char2(signed char a, signed char b) { return char2{a, b}; }

// A block's threads are OS threads; __syncthreads is a barrier over them. What belongs to one
// block (its barriers, its shared memory) is reached through thread-locals the launcher sets, so
// that the blocks of a cluster can run at once.
static thread_local std::barrier<>* ga_block_barrier;
static inline void __syncthreads() { ga_block_barrier->arrive_and_wait(); }

static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}

template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __ldcg(const T* p) { return *p; }

// __shfl_xor_sync over a whole warp (the walk's row reduction): every lane posts its value, then
// reads its partner's. Every lane of the warp must call it, as the full mask requires; a partial
// mask is refused outright, since this emulation cannot model one. Its two warp-wide barriers
// also order shared memory across the warp, which a real shuffle does not: a race between the
// lanes of one warp around a shuffle would not show here.
static int ga_shfl_values[2][32][32];
static thread_local std::vector<std::unique_ptr<std::barrier<>>>* ga_warp_barriers;
// Which of the blocks running at once (a cluster's) this thread's is: indexes per-warp scratch.
static thread_local unsigned ga_block_slot;
// Every lane posts `v`, then reads lane `source(lane)`'s (`what` names the shuffle for the error).
template <class Source>
static inline int ga_shuffle(const char* what, unsigned mask, int v, Source source) {
    if (mask != 0xffffffffu) {
        fprintf(stderr, "%s with a partial mask (%08x): not emulated\n", what, mask);
        abort();
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ga_shfl_values[ga_block_slot][warp][lane] = v;
    (*ga_warp_barriers)[warp]->arrive_and_wait();
    const int got = ga_shfl_values[ga_block_slot][warp][source(lane) & 31];
    (*ga_warp_barriers)[warp]->arrive_and_wait();
    return got;
}
static inline int __shfl_xor_sync(unsigned mask, int v, int lane_mask) {
    return ga_shuffle("__shfl_xor_sync", mask, v, [=](int lane) { return lane ^ lane_mask; });
}
// __shfl_sync from a source lane, over a whole warp (the same conditions).
static inline int __shfl_sync(unsigned mask, int v, int src_lane) {
    return ga_shuffle("__shfl_sync", mask, v, [=](int) { return src_lane; });
}

// __syncwarp over a whole warp.
static inline void __syncwarp() { (*ga_warp_barriers)[threadIdx.x >> 5]->arrive_and_wait(); }

// cp.async as the PTX ISA promises it, no more: a thread's copies land only when a wait_group
// retires their commit group, and until then the destination holds garbage (the hardware may
// write it at any moment after the issue). A pipeline that reads a stage before waiting for it
// (or waits for too few groups) reads garbage here, and so does one that refills a stage still
// being read (by another warp, or by a wgmma that has not been retired).
struct ga_copy { void* dst; const void* src; int bytes; };
static thread_local std::vector<ga_copy> ga_open_group;
static thread_local std::deque<std::vector<ga_copy>> ga_committed_groups;
static inline void ga_cp_async16(void* smem, const void* gmem, int src_bytes) {
    memset(smem, 0xa5, 16);
    ga_open_group.push_back(ga_copy{smem, gmem, src_bytes});
}
static inline void ga_cp_async_commit() {
    ga_committed_groups.push_back(std::move(ga_open_group));
    ga_open_group.clear();
}
template <int Pending> static inline void ga_cp_async_wait() {
    while (ga_committed_groups.size() > (size_t)Pending) {
        for (const ga_copy& c : ga_committed_groups.front()) {
            if (c.bytes) memcpy(c.dst, c.src, 16); else memset(c.dst, 0, 16);
        }
        ga_committed_groups.pop_front();
    }
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16 for one warp: lanes 8j..8j+7 post the row addresses
// of matrix j; lane 4g + t receives, from each matrix j, bytes 4t..4t+3 of its row g.
static const void* ga_ldmatrix_rows[32][32];
static inline void tc_ldmatrix_x4(int* r, const void* row_addr) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ga_ldmatrix_rows[warp][lane] = row_addr;
    (*ga_warp_barriers)[warp]->arrive_and_wait();
    for (int j = 0; j < 4; ++j) memcpy(&r[j], (const char*)ga_ldmatrix_rows[warp][8 * j + lane / 4] + 4 * (lane % 4), 4);
    (*ga_warp_barriers)[warp]->arrive_and_wait();
}

// mma.sync.m16n8k32.row.col.s32.s8.s8.s32 for one warp: every lane posts its fragments, then
// each lane computes its four outputs from the whole warp's, locating every element of A (16x32)
// and B (32x8) by the PTX ISA's fragment tables (lane = 4 * groupID + threadID_in_group):
//   A[row][k]: lane (row % 8) * 4 + (k % 16) / 4, register (row / 8) + 2 * (k / 16), byte k % 4
//   B[k][col]: lane col * 4 + (k % 16) / 4,       register k / 16,                  byte k % 4
//   C: register e of lane (g, t) is row g + 8 * (e / 2), column 2 * t + e % 2
struct ga_warp_fragments { int a[32][4]; int b[32][2]; };
static ga_warp_fragments ga_warps[32];
static inline signed char ga_byte(int reg, int byte) { return (signed char)(reg >> (8 * byte)); }
static inline void tc_mma(int* c, int a0, int a1, int a2, int a3, int b0, int b1) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ga_warp_fragments& w = ga_warps[warp];
    w.a[lane][0] = a0; w.a[lane][1] = a1; w.a[lane][2] = a2; w.a[lane][3] = a3;
    w.b[lane][0] = b0; w.b[lane][1] = b1;
    (*ga_warp_barriers)[warp]->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    int out[4];
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        int sum = c[e];
        for (int k = 0; k < 32; ++k) {
            const int a = ga_byte(w.a[(row % 8) * 4 + (k % 16) / 4][(row / 8) + 2 * (k / 16)], k % 4);
            const int b = ga_byte(w.b[col * 4 + (k % 16) / 4][k / 16], k % 4);
            sum += a * b;
        }
        out[e] = sum;
    }
    (*ga_warp_barriers)[warp]->arrive_and_wait();
    for (int e = 0; e < 4; ++e) c[e] = out[e];
}

// wgmma (gemm_wgmma.cu). Dynamic shared memory is one 1024-aligned buffer, and a shared address
// is an offset into it, so descriptors built by the kernel decode to host pointers here.
// This thread's block's dynamic shared memory; the launcher copies ga_launch_smem into it.
static thread_local unsigned char* wg_smem_raw;
static unsigned char* ga_launch_smem;
static size_t ga_dynamic_smem_bytes;
static inline unsigned ga_smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - wg_smem_raw); }
static inline void wg_fence_proxy_async() {}
static inline void wg_fence() {}
static inline void wg_fence_operand(int (&)[128]) {}

// Byte (row, k) of a K-major operand as the hardware reads it through a descriptor with the
// 128-byte swizzle: rows 128 bytes apart within groups of eight, groups `stride` bytes apart,
// then address bits 4-6 XORed with bits 7-9 (which is why groups must be 1024-byte aligned).
static inline int ga_desc_byte(unsigned long long desc, int row, int k) {
    if ((desc >> 62) != 1) { fprintf(stderr, "wgmma descriptor without the 128-byte swizzle\n"); abort(); }
    const unsigned start = (unsigned)(desc & 0x3FFF) << 4;
    const unsigned stride = (unsigned)((desc >> 32) & 0x3FFF) << 4;
    unsigned addr = start + (row / 8) * stride + (row % 8) * 128 + k;
    addr ^= ((addr >> 7) & 7) << 4;
    return (signed char)wg_smem_raw[addr];
}

// wgmma.mma_async.m64n256k32.s32.s8.s8 for one thread of a warpgroup: its 128 accumulators, by
// the PTX ISA's D layout (register i of lane 4g + t in warp w: row 16w + g + 8((i/2)%2), column
// 8(i/4) + 2t + i%2), each summed over the 32 k of A's row and B's row.
static inline void ga_wgmma_now(int* d, unsigned long long a_desc, unsigned long long b_desc) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 128; ++i) {
        const int row = 16 * warp + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
        int sum = d[i];
        for (int k = 0; k < 32; ++k) sum += ga_desc_byte(a_desc, row, k) * ga_desc_byte(b_desc, col, k);
        d[i] = sum;
    }
}

// wgmma is asynchronous: the hardware may read shared memory and write the accumulators at any
// time until the wait_group that retires its group. Like cp.async above, the emulation does it
// at the latest moment the PTX ISA allows, when the group is retired, so a kernel that refills a
// stage or reads the accumulators too early gets wrong results here.
struct ga_wgmma_op { int* d; unsigned long long a, b; };
static thread_local std::vector<ga_wgmma_op> ga_wgmma_open;
static thread_local std::deque<std::vector<ga_wgmma_op>> ga_wgmma_groups;
static inline void wg_mma_m64n256k32(int (&d)[128], unsigned long long a_desc, unsigned long long b_desc) {
    ga_wgmma_open.push_back(ga_wgmma_op{d, a_desc, b_desc});
}
static inline void wg_commit() {
    ga_wgmma_groups.push_back(std::move(ga_wgmma_open));
    ga_wgmma_open.clear();
}
// wait_group is .sync.aligned: the warp executes it together, so no lane goes on (to free a
// stage, say) before every lane's groups are retired.
template <int Pending>
static inline void wg_wait() {
    while (ga_wgmma_groups.size() > (size_t)Pending) {
        for (const ga_wgmma_op& op : ga_wgmma_groups.front()) ga_wgmma_now(op.d, op.a, op.b);
        ga_wgmma_groups.pop_front();
    }
    (*ga_warp_barriers)[threadIdx.x >> 5]->arrive_and_wait();
}
"#;

/// The TMA kernel's machinery (kernels/cuda/tma.cuh), after that file's `ga_tensor_map`: mbarriers
/// with phases, transaction counts and arrival counts, and tile loads that write garbage at issue
/// and land only when a thread waiting on their barrier would otherwise wait. A wait on a phase
/// that has completed (or on the parity of the one before the current) passes at once, as
/// try_wait.parity does, landing nothing; a wait that never completes aborts the run.
const TMA_SHIM: &str = r#"
#define __grid_constant__
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

// The tensor map as the harness builds it from the host's numbers (kernels/src/tma.rs):
// opaque[0] the base, [1..3] the dims, [4..5] the row and matrix strides, [6..8] the box.
// The map is copied: the kernel's parameter lives on the issuing thread's stack here, and a load
// may land after that thread has finished.
struct ga_load { unsigned char* dst; unsigned char* base; ga_tensor_map map; int c0, c1, c2; };
struct ga_mbarrier {
    u32 expected = 0, pending = 0, phase = 0;
    long long tx = 0;
    std::vector<ga_load> loads;
};
static std::mutex ga_mbar_mutex;
static std::condition_variable ga_mbar_changed;
static std::map<const void*, ga_mbarrier> ga_mbars;

// The cluster running now (launch_clusters): each block's shared memory and whether it has
// exited, this thread's rank, and a barrier over all the cluster's threads. A block alone is a
// cluster of one. Reaching the shared memory of a block that has exited (an arrival on its
// barrier, a multicast into it) aborts the run: on a GPU that memory may already be another
// block's.
static unsigned char* ga_cluster_smem[2];
static bool ga_cluster_exited[2];
static unsigned ga_cluster_size = 1;
static std::barrier<>* ga_cluster_barrier;
static thread_local unsigned ga_rank;

static void ga_check_live(const void* p) {
    if (ga_cluster_size < 2) return;
    for (unsigned r = 0; r < ga_cluster_size; ++r) {
        const unsigned char* at = (const unsigned char*)p;
        if (at >= ga_cluster_smem[r] && at < ga_cluster_smem[r] + ga_dynamic_smem_bytes && ga_cluster_exited[r]) {
            fprintf(stderr, "a block reached the shared memory of block %u of its cluster after it exited\n", r);
            abort();
        }
    }
}

// The shared memory of the block of rank `cta` in this thread's cluster (its own block alone).
static unsigned char* ga_block_smem(unsigned cta) {
    if (cta >= ga_cluster_size) { fprintf(stderr, "block rank %u outside a cluster of %u\n", cta, ga_cluster_size); abort(); }
    return ga_cluster_size < 2 ? wg_smem_raw : ga_cluster_smem[cta];
}

// `p` in this thread's block's shared memory, at the same offset in the block of rank `cta`
// (mapa.shared::cluster).
static unsigned char* ga_peer(const void* p, unsigned cta) {
    return ga_block_smem(cta) + ((const unsigned char*)p - wg_smem_raw);
}

static ga_mbarrier& ga_mbar(const void* bar) {
    ga_check_live(bar);
    auto it = ga_mbars.find(bar);
    if (it == ga_mbars.end()) { fprintf(stderr, "an mbarrier used before mbarrier.init\n"); abort(); }
    return it->second;
}

// The phase completes once every arrival and every transaction byte is in.
static void ga_mbar_complete_if_done(ga_mbarrier& b) {
    if (b.pending == 0 && b.tx == 0) {
        b.phase += 1;
        b.pending = b.expected;
        ga_mbar_changed.notify_all();
    }
}

static void ga_mbar_init(u64* bar, u32 arrivals) {
    std::lock_guard<std::mutex> lock(ga_mbar_mutex);
    ga_mbarrier fresh;
    fresh.expected = fresh.pending = arrivals;
    ga_mbars[bar] = fresh;
}
static void ga_mbar_init_fence() {}

static void ga_mbar_arrive_locked(ga_mbarrier& b) {
    if (b.pending == 0) { fprintf(stderr, "more arrivals on an mbarrier than its phase expects\n"); abort(); }
    b.pending -= 1;
    ga_mbar_complete_if_done(b);
}
static void ga_mbar_arrive(u64* bar) {
    std::lock_guard<std::mutex> lock(ga_mbar_mutex);
    ga_mbar_arrive_locked(ga_mbar(bar));
}
static void ga_mbar_arrive_expect_tx(u64* bar, u32 bytes) {
    std::lock_guard<std::mutex> lock(ga_mbar_mutex);
    ga_mbarrier& b = ga_mbar(bar);
    b.tx += bytes;
    ga_mbar_arrive_locked(b);
}

// The bytes one load of `map` moves and counts against its barrier: the whole box, zeros
// outside the tensor included.
static u32 ga_box_bytes(const ga_tensor_map& map) {
    return (u32)(map.opaque[6] * map.opaque[7] * map.opaque[8]);
}

// One box into shared memory, in the 128-byte swizzle (address bits 4-6 XORed with bits 7-9, as
// wgmma reads it), zeros outside the tensor.
static void ga_land(const ga_load& l) {
    const u64* m = l.map.opaque;
    const i8* base = (const i8*)m[0];
    const u64 dims[3] = {m[1], m[2], m[3]};
    const u32 box0 = (u32)m[6], box1 = (u32)m[7];
    for (u32 r = 0; r < box1; ++r)
        for (u32 k = 0; k < box0; ++k) {
            const u64 gk = (u64)l.c0 + k, gr = (u64)l.c1 + r, gz = (u64)l.c2;
            const bool in = l.c0 >= 0 && l.c1 >= 0 && l.c2 >= 0 && gk < dims[0] && gr < dims[1] && gz < dims[2];
            unsigned addr = (unsigned)(l.dst - l.base) + r * box0 + k;
            addr ^= ((addr >> 7) & 7) << 4;
            l.base[addr] = in ? (unsigned char)base[gz * m[5] + gr * m[4] + gk] : 0;
        }
}

// A load's destination in this block (or, multicast, the same place in the blocks of `cta_mask`):
// garbage from the issue, landing only when a waiter on the barrier at `bar`'s place polls it.
static void ga_tma_load_to(void* dst, const ga_tensor_map* map, u64* bar, unsigned cta_mask, int c0, int c1, int c2) {
    const u64* m = map->opaque;
    const u32 box_bytes = ga_box_bytes(*map);
    const unsigned at = (unsigned)((unsigned char*)dst - wg_smem_raw);
    if (m[6] != 128 || m[8] != 1) { fprintf(stderr, "a TMA box other than 128 bytes of k by rows of one matrix\n"); abort(); }
    if (at % 1024 != 0) { fprintf(stderr, "a 128-byte-swizzled TMA box not 1024-byte aligned\n"); abort(); }
    if (at + box_bytes > ga_dynamic_smem_bytes) { fprintf(stderr, "a TMA box past the shared memory\n"); abort(); }
    if (cta_mask == 0 || (cta_mask >> ga_cluster_size) != 0) { fprintf(stderr, "multicast to blocks outside the cluster\n"); abort(); }
    std::lock_guard<std::mutex> lock(ga_mbar_mutex);
    for (unsigned r = 0; r < ga_cluster_size; ++r) {
        if (!(cta_mask >> r & 1)) continue;
        unsigned char* to = ga_peer(dst, r);
        ga_check_live(to);
        ga_mbarrier& b = ga_mbar(ga_peer(bar, r));
        memset(to, 0xa5, box_bytes);
        b.loads.push_back(ga_load{to, ga_block_smem(r), *map, c0, c1, c2});
    }
}
static void ga_tma_load_3d(void* dst, const ga_tensor_map* map, u64* bar, int c0, int c1, int c2) {
    ga_tma_load_to(dst, map, bar, 1u << ga_rank, c0, c1, c2);
}
static void ga_tma_load_3d_multicast(void* dst, const ga_tensor_map* map, u64* bar, unsigned short cta_mask, int c0,
                                     int c1, int c2) {
    ga_tma_load_to(dst, map, bar, cta_mask, c0, c1, c2);
}
static u32 ga_cluster_rank() { return ga_rank; }
static void ga_cluster_sync() {
    if (!ga_cluster_barrier) { fprintf(stderr, "a cluster barrier outside a cluster launch\n"); abort(); }
    ga_cluster_barrier->arrive_and_wait();
}
static void ga_mbar_arrive_cluster(u64* bar, u32 cta) {
    std::lock_guard<std::mutex> lock(ga_mbar_mutex);
    ga_mbar_arrive_locked(ga_mbar(ga_peer(bar, cta)));
}
static void ga_tma_prefetch_map(const ga_tensor_map*) {}

// How long one wait may go unanswered before the run is called a deadlock.
static std::chrono::milliseconds ga_deadlock_after() {
    const char* v = getenv("GA_EMULATION_DEADLOCK_MS");
    return std::chrono::milliseconds(v ? atol(v) : 60000);
}

static bool ga_mbar_try_wait(u64* bar, u32 parity) {
    using clock = std::chrono::steady_clock;
    static thread_local bool waiting = false;
    static thread_local clock::time_point since;
    std::unique_lock<std::mutex> lock(ga_mbar_mutex);
    ga_mbarrier& b = ga_mbar(bar);
    // The phase of this parity has completed: the current one has the other parity.
    auto passed = [&] { return (b.phase & 1) != (parity & 1); };
    if (!passed()) {
        // Only now, with a thread about to wait, do the loads land.
        for (const ga_load& l : b.loads) { ga_land(l); b.tx -= ga_box_bytes(l.map); }
        b.loads.clear();
        ga_mbar_complete_if_done(b);
    }
    if (!passed()) ga_mbar_changed.wait_for(lock, std::chrono::milliseconds(1));
    if (passed()) { waiting = false; return true; }
    if (!waiting) { waiting = true; since = clock::now(); }
    if (clock::now() - since > ga_deadlock_after()) {
        fprintf(stderr, "deadlock: an mbarrier phase never completed (thread %u)\n", threadIdx.x);
        abort();
    }
    return false;
}

// How long the threads of one block of a cluster (GA_EMULATION_SKEW_RANK, default the second)
// sleep before each barrier wait (GA_EMULATION_SKEW_MS, default none): the blocks of a cluster
// then run at different speeds, as they may on a GPU, and an ordering between them that only
// lockstep kept shows up.
static std::chrono::milliseconds ga_skew() {
    static const long ms = [] { const char* v = getenv("GA_EMULATION_SKEW_MS"); return v ? atol(v) : 0L; }();
    return std::chrono::milliseconds(ms);
}
static unsigned ga_skewed_rank() {
    static const unsigned rank = [] { const char* v = getenv("GA_EMULATION_SKEW_RANK"); return v ? (unsigned)atoi(v) : 1u; }();
    return rank;
}

// Threads lo..hi-1 of each block (GA_EMULATION_HOLD_THREADS=lo-hi, default none) are held at
// their first barrier wait until every other thread of their block has reached one (or
// returned). A GPU may run that schedule (a warpgroup late to start); the host's scheduler runs
// it only by chance, so a test that needs it (a wait that passes too early, seen only if it is
// reached before the phase it should have waited for) forces it here, every run.
static std::atomic<unsigned> ga_hold_others_left[2];
static thread_local bool ga_hold_counted, ga_hold_released;
static bool ga_held_index(unsigned x) {
    static const std::pair<unsigned, unsigned> range = [] {
        const char* v = getenv("GA_EMULATION_HOLD_THREADS");
        unsigned lo = 0, hi = 0;
        if (v && sscanf(v, "%u-%u", &lo, &hi) != 2) { fprintf(stderr, "GA_EMULATION_HOLD_THREADS is lo-hi\n"); abort(); }
        return std::pair<unsigned, unsigned>{lo, hi};
    }();
    return x >= range.first && x < range.second;
}
static bool ga_held_thread() { return ga_held_index(threadIdx.x); }
// This thread, outside the held ones, has reached a barrier wait or returned.
static void ga_hold_count_arrival() {
    if (ga_hold_counted || ga_held_thread()) return;
    ga_hold_counted = true;
    --ga_hold_others_left[ga_block_slot];
}
static void ga_hold_if_held() {
    using clock = std::chrono::steady_clock;
    if (ga_hold_released || !ga_held_thread()) return;
    const clock::time_point since = clock::now();
    while (ga_hold_others_left[ga_block_slot].load() > 0) {
        if (clock::now() - since > ga_deadlock_after()) {
            fprintf(stderr, "deadlock: held thread %u waited for the others of its block to reach a barrier wait\n", threadIdx.x);
            abort();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ga_hold_released = true;
}

// No timer here: the emulated try_wait aborts a wait that never completes. Scopes are not
// modelled: every emulated barrier operation is sequentially consistent.
template <bool ClusterScope = false>
static void ga_mbar_wait(u64* bar, u32 parity) {
    ga_hold_count_arrival();
    ga_hold_if_held();
    if (ga_rank == ga_skewed_rank() && ga_skew().count() > 0) std::this_thread::sleep_for(ga_skew());
    while (!ga_mbar_try_wait(bar, parity)) {
    }
}

template <u32 Registers> static inline void ga_setmaxnreg_dec() {}
template <u32 Registers> static inline void ga_setmaxnreg_inc() {}
"#;

const HARNESS: &str = r#"
// Runs the blocks `ids` at once, each of bx * by threads as OS threads, block r with the shared
// memory `smem[r]` and rank r (in a cluster, ga_cluster_size > 1), each thread reaching its
// block's barriers, shared memory and scratch through the thread-locals above. A block is marked
// exited when its last thread returns (the cluster checks read the marks).
template <class F>
static void run_blocks(const std::vector<ga_dim3>& ids, const std::vector<unsigned char*>& smem, ga_dim3 grid,
                       unsigned bx, unsigned by, F& f) {
    const unsigned threads = bx * by, count = (unsigned)ids.size();
    std::vector<std::unique_ptr<std::barrier<>>> blocks;
    std::vector<std::vector<std::unique_ptr<std::barrier<>>>> warps(count);
    std::vector<std::atomic<unsigned>> running(count);
    for (unsigned r = 0; r < count; ++r) {
        blocks.push_back(std::make_unique<std::barrier<>>(threads));
        for (unsigned w = 0; w < (threads + 31) / 32; ++w) warps[r].push_back(std::make_unique<std::barrier<>>(32));
        running[r] = threads;
        ga_cluster_exited[r] = false;
        unsigned held = 0;
        for (unsigned t = 0; t < threads; ++t) held += ga_held_index(t % bx) ? 1u : 0u;
        ga_hold_others_left[r] = threads - held;
    }
    std::vector<std::thread> pool;
    for (unsigned r = 0; r < count; ++r)
        for (unsigned t = 0; t < threads; ++t)
            pool.emplace_back([=, &f, &ids, &smem, &blocks, &warps, &running] {
                blockDim = {bx, by, 1};
                gridDim = grid;
                blockIdx = ids[r];
                threadIdx = {t % bx, t / bx, 0};
                ga_block_barrier = blocks[r].get();
                ga_warp_barriers = &warps[r];
                wg_smem_raw = smem[r];
                ga_block_slot = r;
                ga_rank = r;
                f();
                ga_hold_count_arrival();
                if (--running[r] == 0) {
                    std::lock_guard<std::mutex> lock(ga_mbar_mutex);
                    ga_cluster_exited[r] = true;
                }
            });
    for (auto& th : pool) th.join();
}

// Every block of a grid in turn, its bx * by threads running together as OS threads, all on the
// dynamic shared memory ga_launch_smem.
template <class F>
static void launch_threads(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, F f) {
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                memset(__start_ga_shared, 0xa5, (size_t)(__stop_ga_shared - __start_ga_shared));
                run_blocks({ga_dim3{x, y, z}}, {ga_launch_smem}, ga_dim3{gx, gy, gz}, bx, by, f);
            }
}

// A one-dimensional grid of gx blocks of bx threads in clusters of two consecutive blocks
// (kernels with __cluster_dims__(2, 1, 1)): a cluster's blocks run at once, each with dynamic
// shared memory of its own (ga_dynamic_smem_bytes of garbage), under a cluster barrier. Static
// __shared__ arrays are one copy here, so such kernels keep their barriers in dynamic shared
// memory (as they must anyway, to reach each other's).
template <class F>
static void launch_clusters(unsigned gx, unsigned bx, F f) {
    const unsigned cluster = 2;
    if (gx % cluster != 0) { fprintf(stderr, "clusters of 2 over an even grid only\n"); abort(); }
    for (unsigned c = 0; c < gx / cluster; ++c) {
        std::barrier<> whole(cluster * bx);
        std::vector<ga_dim3> ids;
        for (unsigned r = 0; r < cluster; ++r) {
            ids.push_back(ga_dim3{c * cluster + r, 0, 0});
            ga_cluster_smem[r] = (unsigned char*)aligned_alloc(1024, ga_dynamic_smem_bytes);
            memset(ga_cluster_smem[r], 0xa5, ga_dynamic_smem_bytes);
        }
        ga_cluster_size = cluster;
        ga_cluster_barrier = &whole;
        run_blocks(ids, {ga_cluster_smem[0], ga_cluster_smem[1]}, ga_dim3{gx, 1, 1}, bx, 1, f);
        ga_cluster_size = 1;
        ga_cluster_barrier = nullptr;
        for (unsigned r = 0; r < cluster; ++r) free(ga_cluster_smem[r]);
    }
}

// Every thread of a grid (gx, gy) of blocks of bx threads, one after another (kernels without
// barriers).
template <class F> static void launch(unsigned gx, unsigned gy, unsigned bx, F f) {
    blockDim = {bx, 1, 1};
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x)
            for (unsigned t = 0; t < bx; ++t) {
                blockIdx = {x, y, 0};
                threadIdx = {t, 0, 0};
                f();
            }
}

// A tensor map from the host's numbers (`OperandMap::to_arg`: d0,d1,d2,s1,s2,b0,b1,b2).
static ga_tensor_map ga_parse_map(const char* arg, const void* base) {
    ga_tensor_map map{};
    map.opaque[0] = (u64)base;
    const char* p = arg;
    for (int i = 1; i <= 8; ++i) {
        char* end;
        map.opaque[i] = strtoull(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
    }
    return map;
}

static std::vector<unsigned char> read_stdin() {
    std::vector<unsigned char> in;
    unsigned char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, stdin)) > 0) in.insert(in.end(), buf, buf + got);
    return in;
}

int main(int argc, char** argv) {
    std::vector<unsigned char> in = read_stdin();
    std::string mode = argv[1];
    if (mode == "chacha") {  // chacha N FIRST_STREAM COUNT < key
        u64 n = strtoull(argv[2], 0, 10), first = strtoull(argv[3], 0, 10), count = strtoull(argv[4], 0, 10);
        ChaChaKey key;
        memcpy(key.w, in.data(), 32);
        u64 bpm = n * n / 64;
        std::vector<unsigned char> out(count * n * n);
        launch((unsigned)((bpm + 255) / 256), (unsigned)count, 256,
               [&] { chacha8_generate(out.data(), key, first, 2, bpm); });
        fwrite(out.data(), 1, out.size(), stdout);
    } else if (mode == "blake3") {  // blake3 MATRIX_BYTES < matrices
        u64 bytes = strtoull(argv[2], 0, 10), count = in.size() / bytes, chunks = bytes / 1024;
        std::vector<u32> a(count * chunks * 8), b(count * chunks * 8);
        launch((unsigned)((chunks + 127) / 128), (unsigned)count, 128, [&] { blake3_chunks(in.data(), bytes, a.data()); });
        u64 nodes = chunks;
        while (nodes > 1) {
            u64 next = (nodes + 1) / 2;
            launch((unsigned)((next + 127) / 128), (unsigned)count, 128,
                   [&] { blake3_parents(a.data(), b.data(), nodes, nodes == 2 ? 1u : 0u); });
            a.swap(b);
            nodes = next;
        }
        fwrite(a.data(), 4, count * 8, stdout);
    } else if (mode == "gemm") {  // gemm tiled|tensor|wgmma|tma|pingpong|multicast N COUNT STEP [...] < X matrices, then B matrices
        std::string kind = argv[2];
        unsigned n = (unsigned)strtoul(argv[3], 0, 10), count = (unsigned)strtoul(argv[4], 0, 10);
        u32 step = (u32)strtoul(argv[5], 0, 10);
        const size_t nn = (size_t)n * n;
        const i8* x = (const i8*)in.data();
        const i8* b = x + count * nn;
        std::vector<i8> bt(count * nn), out(count * nn);
        launch_threads(n / 32, n / 32, count, 32, 8, [&] { transpose_i8(b, bt.data(), (int)n); });
        if (kind == "tiled") {
            launch_threads(n / TILED_BN, n / TILED_BM, count, TILED_THREADS, 1,
                           [&] { gemm_mix_tiled(x, bt.data(), out.data(), (int)n, step); });
        } else if (kind == "tensor") {
            const unsigned tiles = (n + 127) / 128;
            launch_threads(tiles, tiles, count, TC_THREADS, 1,
                           [&] { gemm_mix_tensor(x, bt.data(), out.data(), (int)n, step); });
        } else if (kind == "wgmma") {
            ga_launch_smem = (unsigned char*)aligned_alloc(1024, WG_SMEM_BYTES);
            launch_threads((n + WG_BN - 1) / WG_BN, (n + WG_BM - 1) / WG_BM, count, WG_THREADS, 1,
                           [&] { gemm_mix_wgmma(x, bt.data(), out.data(), (int)n, step); });
            free(ga_launch_smem);
        } else if (kind == "multicast") {  // gemm multicast N COUNT STEP BLOCKS X_MAP BT_MAP: clusters of two
            const unsigned blocks = (unsigned)strtoul(argv[6], 0, 10);
            ga_tensor_map x_map = ga_parse_map(argv[7], x), bt_map = ga_parse_map(argv[8], bt.data());
            ga_dynamic_smem_bytes = PP_SMEM_BYTES;
            launch_clusters(blocks, PP_THREADS,
                            [&] { gemm_mix_multicast(x_map, bt_map, out.data(), (int)n, (int)count, step); });
        } else {  // gemm tma|pingpong N COUNT STEP BLOCKS X_MAP BT_MAP: the persistent grid, the host's maps
            const unsigned blocks = (unsigned)strtoul(argv[6], 0, 10);
            ga_tensor_map x_map = ga_parse_map(argv[7], x), bt_map = ga_parse_map(argv[8], bt.data());
            const bool pingpong = kind == "pingpong";
            ga_dynamic_smem_bytes = pingpong ? PP_SMEM_BYTES : TMA_SMEM_BYTES;
            ga_launch_smem = (unsigned char*)aligned_alloc(1024, ga_dynamic_smem_bytes);
            memset(ga_launch_smem, 0xa5, ga_dynamic_smem_bytes);  // garbage, as a GPU's shared memory holds
            launch_threads(blocks, 1, 1, pingpong ? PP_THREADS : TMA_THREADS, 1, [&] {
                if (pingpong) gemm_mix_pingpong(x_map, bt_map, out.data(), (int)n, (int)count, step);
                else gemm_mix_tma(x_map, bt_map, out.data(), (int)n, (int)count, step);
            });
            free(ga_launch_smem);
        }
        fwrite(out.data(), 1, out.size(), stdout);
    } else if (mode == "shapes") {  // each GEMM kernel's block: rows, columns, threads, dynamic smem
        printf("tiled %d %d %d 0\n", TILED_BM, TILED_BN, TILED_THREADS);
        printf("tensor %d %d %d 0\n", TC_BM, TC_BN, TC_THREADS);
        printf("wgmma %d %d %d %d\n", WG_BM, WG_BN, WG_THREADS, WG_SMEM_BYTES);
        printf("tma %d %d %d %d\n", TMA_BM, TMA_BN, TMA_THREADS, TMA_SMEM_BYTES);
        printf("pingpong %d %d %d %d\n", PP_BM, PP_BN, PP_THREADS, PP_SMEM_BYTES);
        printf("multicast %d %d %d %d\n", PP_BM, PP_BN, PP_THREADS, PP_SMEM_BYTES);
        printf("walk %d\n", WALK_THREADS);
        printf("tree %d\n", TREE_THREADS);
        printf("locality %d\n", LOC_THREADS);
    } else if (mode == "walk") {  // walk P WALKERS FIRST_STEP STEPS EVERY VERSION < pool, then WALKERS + 1 states
        // One block past the walkers, and a state slot past theirs that it must not touch.
        u64 entries = strtoull(argv[2], 0, 10);
        u32 walkers = (u32)strtoul(argv[3], 0, 10), first = (u32)strtoul(argv[4], 0, 10);
        u32 steps = (u32)strtoul(argv[5], 0, 10), every = (u32)strtoul(argv[6], 0, 10);
        u32 version = (u32)strtoul(argv[7], 0, 10);
        const size_t pool_bytes = entries * 65536;
        // 16-byte aligned, as cuMemAlloc's pointers are, for the kernel's uint4 loads.
        unsigned char* pool = (unsigned char*)aligned_alloc(256, pool_bytes);
        memcpy(pool, in.data(), pool_bytes);
        std::vector<u32> states((walkers + 1) * 8);
        memcpy(states.data(), in.data() + pool_bytes, states.size() * 4);
        std::vector<u32> checkpoints(((size_t)walkers * (steps / every) + 1) * 8, 0xA5A5A5A5u);
        launch_threads(walkers + 1, 1, 1, WALK_THREADS, 1, [&] {
            walk_steps((const i8*)pool, entries, states.data(), first, steps, every, checkpoints.data(), walkers, version);
        });
        free(pool);
        fwrite(checkpoints.data(), 4, checkpoints.size(), stdout);
        fwrite(states.data(), 4, states.size(), stdout);
    } else if (mode == "walk4") {  // walk4 P WALKERS L LAUNCH < pool, then WALKERS start states
        // A version 4 walk as the host drives it (kernels/src/pool_states.rs): launches of LAUNCH
        // steps (the last takes the rest), every state written, each launch's blocks folded
        // after it, then the walker roots. Writes the block starts, block nodes and roots.
        u64 entries = strtoull(argv[2], 0, 10);
        u32 walkers = (u32)strtoul(argv[3], 0, 10), walk_steps_total = (u32)strtoul(argv[4], 0, 10);
        u32 launch_steps = (u32)strtoul(argv[5], 0, 10);
        const size_t pool_bytes = entries * 65536;
        unsigned char* pool = (unsigned char*)aligned_alloc(256, pool_bytes);
        memcpy(pool, in.data(), pool_bytes);
        std::vector<u32> states(walkers * 8), firsts(walkers * 8);
        memcpy(states.data(), in.data() + pool_bytes, states.size() * 4);
        const u32 blocks = walk_steps_total / TREE_BLOCK_STATES + 1;
        // One slot past the walkers' blocks that no thread may touch.
        std::vector<u32> block_starts(((size_t)walkers * blocks + 1) * 8, 0xA5A5A5A5u);
        std::vector<u32> block_nodes(block_starts.size(), 0xA5A5A5A5u), roots((walkers + 1) * 8, 0xA5A5A5A5u);
        for (u32 first = 0; first < walk_steps_total; first += launch_steps) {
            const u32 steps = launch_steps < walk_steps_total - first ? launch_steps : walk_steps_total - first;
            firsts = states;
            std::vector<u32> launch_states((size_t)walkers * steps * 8);
            launch_threads(walkers, 1, 1, WALK_THREADS, 1, [&] {
                walk_steps((const i8*)pool, entries, states.data(), first, steps, 1, launch_states.data(), walkers, 4);
            });
            const u32 launch_blocks = first + steps == walk_steps_total
                ? walk_steps_total / TREE_BLOCK_STATES + 1 - first / TREE_BLOCK_STATES
                : steps / TREE_BLOCK_STATES;
            launch((unsigned)(((u64)walkers * launch_blocks + TREE_THREADS - 1) / TREE_THREADS), 1, TREE_THREADS, [&] {
                walk_blocks(firsts.data(), launch_states.data(), first, steps, walk_steps_total, walkers, blocks,
                            block_starts.data(), block_nodes.data());
            });
        }
        launch((walkers + TREE_THREADS - 1) / TREE_THREADS, 1, TREE_THREADS,
               [&] { walk_roots(block_nodes.data(), blocks, walkers, roots.data()); });
        free(pool);
        fwrite(block_starts.data(), 4, block_starts.size(), stdout);
        fwrite(block_nodes.data(), 4, block_nodes.size(), stdout);
        fwrite(roots.data(), 4, roots.size(), stdout);
    } else if (mode == "locality") {  // locality P W G C DEVICE < pool, then the key (nonce, seed, G: 96 bytes)
        // A device's locality walk as the host drives it: per generation the starts, the walk and
        // the generation's digest with its push onto the tree's edge. Writes every end state
        // (G x W), then every digest, then the edge, each with a slot past it no thread may touch.
        u64 slices = strtoull(argv[2], 0, 10);
        u32 walkers = (u32)strtoul(argv[3], 0, 10), generations = (u32)strtoul(argv[4], 0, 10);
        u32 steps = (u32)strtoul(argv[5], 0, 10), device = (u32)strtoul(argv[6], 0, 10);
        const size_t pool_bytes = slices * 65536;
        u64* pool = (u64*)aligned_alloc(256, pool_bytes);
        memcpy(pool, in.data(), pool_bytes);
        std::vector<u32> key(24);
        memcpy(key.data(), in.data() + pool_bytes, 96);
        std::vector<u64> starts(((size_t)walkers + 1) * 4, 0xA5A5A5A5A5A5A5A5ull);
        std::vector<u64> ends(((size_t)generations * walkers + 1) * 4, 0xA5A5A5A5A5A5A5A5ull);
        std::vector<u32> digests(((size_t)generations + 1) * 8, 0xA5A5A5A5u);
        std::vector<u32> edge((LOC_EDGE_LEVELS + 1) * 8, 0xA5A5A5A5u);
        for (u32 g = 0; g < generations; ++g) {
            u64* ends_g = ends.data() + (size_t)g * walkers * 4;
            launch((walkers + LOC_THREADS - 1) / LOC_THREADS, 1, LOC_THREADS,
                   [&] { locality_starts(key.data(), device, g, walkers, edge.data(), starts.data()); });
            launch_threads((walkers + LOC_WARPS - 1) / LOC_WARPS, 1, 1, LOC_THREADS, 1,
                           [&] { locality_walk(pool, slices, starts.data(), walkers, steps, ends_g); });
            launch_threads(1, 1, 1, LOC_THREADS, 1, [&] {
                locality_generation(key.data(), device, g, walkers, ends_g, digests.data(), edge.data());
            });
        }
        free(pool);
        fwrite(ends.data(), 8, ends.size(), stdout);
        fwrite(digests.data(), 4, digests.size(), stdout);
        fwrite(starts.data() + (size_t)walkers * 4, 8, 4, stdout);
        fwrite(edge.data() + LOC_EDGE_LEVELS * 8, 4, 8, stdout);
    } else if (mode == "mix") {  // mix STEP N < int32 values, whole n x n matrices
        u32 step = (u32)strtoul(argv[2], 0, 10);
        u32 n = (u32)strtoul(argv[3], 0, 10);
        u64 count = in.size() / 4;
        std::vector<unsigned char> out(count);
        launch((unsigned)((count + 255) / 256), 1, 256,
               [&] { mix_i32((const int*)in.data(), (i8*)out.data(), count, step, n); });
        fwrite(out.data(), 1, out.size(), stdout);
    }
    return 0;
}
"#;

/// The harness binary, built once per test process; `None` without a C++ compiler.
fn harness() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT.get_or_init(|| build_harness("harness", &[])).as_deref()
}

/// A kernel source edit for a mutant: in `file`, the one occurrence of `from` becomes `to`.
struct Mutation {
    file: &'static str,
    from: &'static str,
    to: &'static str,
}

/// Builds the harness from the kernels as they are, or with `mutations` applied (each must
/// match exactly once, so a mutant cannot silently stop being one when the kernel changes).
fn build_harness(name: &str, mutations: &[Mutation]) -> Option<PathBuf> {
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
    let read = |file: &str| {
        let mut text = std::fs::read_to_string(kernels.join(file)).unwrap();
        for m in mutations.iter().filter(|m| m.file == file) {
            assert_eq!(
                text.matches(m.from).count(),
                1,
                "mutant {name}: {:?} must occur once in {file}",
                m.from
            );
            text = text.replace(m.from, m.to);
        }
        text
    };
    let source = [
        SHIM.to_string(),
        read("common.cuh"),
        read("chacha8.cu"),
        read("transpose.cu"),
        read("blake3.cu"),
        read("mix.cu"),
        read("gemm_tiled.cu"),
        read("cp_async.cuh"),
        read("gemm_tensor.cu"),
        read("wgmma.cuh"),
        read("gemm_wgmma.cu"),
        read("tma.cuh"),
        TMA_SHIM.to_string(),
        read("tma_gemm.cuh"),
        read("gemm_tma.cu"),
        read("gemm_pingpong.cu"),
        read("walk.cu"),
        read("walk_tree.cu"),
        read("locality.cu"),
        HARNESS.to_string(),
    ]
    .join("\n");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    // Built into the target directory under a name drawn from its source and compiler command, so
    // that a rerun with the same sources reuses it and nothing is left outside `cargo clean`'s reach.
    const FLAGS: [&str; 3] = ["-O2", "-std=c++20", "-pthread"];
    let key = {
        let mut hasher = std::hash::DefaultHasher::new();
        (&source, &cxx, FLAGS).hash(&mut hasher);
        hasher.finish()
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("host-kernels");
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join(format!("{name}-{key:016x}"));
    if binary.exists() {
        return Some(binary);
    }
    // Built under a name of this process's own, then renamed: a concurrent run never sees half
    // a binary.
    let partial = dir.join(format!("{name}-{key:016x}.{}", std::process::id()));
    let cpp = dir.join(format!("{name}-{key:016x}.{}.cpp", std::process::id()));
    std::fs::write(&cpp, source).unwrap();
    let built = Command::new(&cxx)
        .args(FLAGS)
        .arg("-o")
        .arg(&partial)
        .arg(&cpp)
        .output();
    std::fs::remove_file(&cpp).ok();
    match built {
        Ok(out) if out.status.success() => {
            std::fs::rename(&partial, &binary).unwrap();
            Some(binary)
        }
        Ok(out) => panic!(
            "the kernels ({name}) do not compile as C++ for the host run:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            common::skipped(&format!("no C++ compiler ({cxx}: {e})"));
            None
        }
    }
}

/// Runs `binary` with `args` on `input`: its exit status, standard output and standard error.
fn run_binary(binary: &Path, args: &[&str], input: &[u8], envs: &[(&str, &str)]) -> std::process::Output {
    let mut child = Command::new(binary)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // A harness that aborts early closes its input: that write error is the run's, not ours.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn run(args: &[&str], input: &[u8]) -> Vec<u8> {
    let out = run_binary(harness().unwrap(), args, input, &[]);
    assert!(
        out.status.success(),
        "harness {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn device_chacha8_generation_matches_rand_chacha() {
    if harness().is_none() {
        return;
    }
    let key: [u8; 32] = core::array::from_fn(|i| (i * 29 + 7) as u8);
    for (n, first, count) in [(64usize, 0u64, 1usize), (128, 5, 3), (192, 0x1_0000_0001, 2)] {
        let got = run(
            &["chacha", &n.to_string(), &first.to_string(), &count.to_string()],
            &key,
        );
        for z in 0..count {
            let want = generate(&key, first + 2 * z as u64, n);
            assert_eq!(
                &got[z * n * n..(z + 1) * n * n],
                want.as_bytes(),
                "n={n} stream {}",
                first + 2 * z as u64
            );
        }
    }
}

/// The launch shapes the Rust side hard-codes (`GpuKernel`) are the ones the kernels' macros
/// define: a mismatch launches too few threads or too little shared memory.
#[test]
fn launch_shapes_match_the_kernels_own_definitions() {
    if harness().is_none() {
        return;
    }
    let shapes = String::from_utf8(run(&["shapes"], &[])).unwrap();
    for kernel in GpuKernel::ALL {
        let line = shapes
            .lines()
            .find(|l| l.split(' ').next() == Some(&kernel.to_string()))
            .unwrap_or_else(|| panic!("the harness prints no shape for {kernel}"));
        let (rows, columns) = kernel.block_tile();
        let want = format!(
            "{kernel} {rows} {columns} {} {}",
            kernel.block_threads(),
            kernel.dynamic_shared_bytes()
        );
        assert_eq!(line, want, "{kernel}: kernel macros vs GpuKernel");
    }
}

#[test]
fn device_blake3_matches_the_blake3_crate() {
    if harness().is_none() {
        return;
    }
    let mut rng = ChaCha8Rng::from_seed([9; 32]);
    // 4 chunks (the least), 36 (not a power of two: a 32 | 4 tree), 64, and 1024.
    for n in [64usize, 192, 256, 1024] {
        let count = 3;
        let mut data = vec![0u8; count * n * n];
        rng.fill_bytes(&mut data);
        let got = run(&["blake3", &(n * n).to_string()], &data);
        for z in 0..count {
            let want = blake3::hash(&data[z * n * n..(z + 1) * n * n]);
            assert_eq!(&got[32 * z..32 * z + 32], want.as_bytes(), "n={n} matrix {z}");
        }
    }
}

#[test]
fn device_mix_pass_matches_mix_rs() {
    if harness().is_none() {
        return;
    }
    let mut rng = ChaCha8Rng::from_seed([4; 32]);
    // Two 64 x 64 matrices: each element is keyed by its place in its own matrix.
    let n = 64;
    let mut values: Vec<i32> = vec![0, 1, -1, i32::MIN, i32::MAX, 1 << 27, -(1 << 27)];
    values.extend((values.len()..2 * n * n).map(|_| rng.next_u32() as i32));
    for step in [0u32, 1, 7, u32::MAX] {
        let got = run(
            &["mix", &step.to_string(), &n.to_string()],
            bytemuck::cast_slice(&values),
        );
        let want: Vec<u8> = (values.iter().enumerate())
            .map(|(i, &y)| {
                let at = i % (n * n);
                mix(y, step, (at / n) as u32, (at % n) as u32) as u8
            })
            .collect();
        assert_eq!(got, want, "step {step}");
    }
}

/// `count` X matrices then `count` B matrices of n x n random bytes, the first pair all -128
/// (all -128 against all -128 reaches the largest sums).
fn gemm_input(rng: &mut ChaCha8Rng, n: usize, count: usize) -> Vec<u8> {
    let mut input = vec![0u8; 2 * count * n * n];
    rng.fill_bytes(&mut input);
    input[..n * n].fill(0x80);
    input[count * n * n..count * n * n + n * n].fill(0x80);
    input
}

/// The chain step of every pair of `input` (as [`gemm_input`] lays it out), by the naive GEMM.
fn naive_steps(input: &[u8], n: usize, count: usize, step: u32) -> Vec<Vec<u8>> {
    (0..count)
        .map(|z| {
            let x = Matrix::from_bytes(n, &input[z * n * n..(z + 1) * n * n]).unwrap();
            let b_at = (count + z) * n * n;
            let b = Matrix::from_bytes(n, &input[b_at..b_at + n * n]).unwrap();
            naive::step(&x, &b, step).as_bytes().to_vec()
        })
        .collect()
}

#[test]
fn device_gemm_kernels_match_the_naive_step() {
    if harness().is_none() {
        return;
    }
    let mut rng = ChaCha8Rng::from_seed([21; 32]);
    // 64: one tile of each, and fewer k tiles than pipeline stages; 192: the tensor kernel's
    // partial 128-tiles; 256: a full pipeline; 320: partial tiles and the pipeline wrapping round.
    // 576 for wgmma alone: five 128-byte k-tiles (the last one half) through four stages, so
    // stages are refilled while the previous tile's wgmma may still run.
    let all = ["tiled", "tensor", "wgmma"];
    for (n, kinds) in [
        (64usize, &all[..]),
        (128, &all),
        (192, &all),
        (256, &all),
        (320, &all),
        (576, &["wgmma"]),
    ] {
        let count = if n > 320 { 1 } else { 2 };
        let input = gemm_input(&mut rng, n, count);
        let step = 5u32;
        let want = naive_steps(&input, n, count, step);
        for &kind in kinds {
            let got = run(
                &["gemm", kind, &n.to_string(), &count.to_string(), &step.to_string()],
                &input,
            );
            for (z, want) in want.iter().enumerate() {
                assert_eq!(
                    &got[z * n * n..(z + 1) * n * n],
                    &want[..],
                    "{kind} kernel, n={n}, matrix {z}"
                );
            }
        }
    }
}

/// A persistent kernel's arguments (`tma` or `pingpong`): its grid of `blocks`, and the tensor
/// maps the host encodes (`OperandMap`, the same numbers the CUDA backend hands
/// cuTensorMapEncodeTiled, with the kernel's own box rows).
fn persistent_args(kernel: GpuKernel, n: usize, count: usize, step: u32, blocks: u32) -> Vec<String> {
    assert!(kernel.is_persistent());
    let (rows, columns) = kernel.box_rows();
    let x_map = OperandMap::new(n, count, rows).unwrap();
    let bt_map = OperandMap::new(n, count, columns).unwrap();
    [
        "gemm",
        &kernel.to_string(),
        &n.to_string(),
        &count.to_string(),
        &step.to_string(),
        &blocks.to_string(),
    ]
    .into_iter()
    .map(String::from)
    .chain([x_map.to_arg(), bt_map.to_arg()])
    .collect()
}

/// A persistent kernel on `count` random n x n pairs over a grid of `blocks`, with `env`'s
/// emulation settings, against the naive step, every matrix bit for bit.
fn assert_persistent_matches_naive(
    kernel: GpuKernel,
    rng: &mut ChaCha8Rng,
    (n, count, blocks): (usize, usize, u32),
    step: u32,
    env: &[(&str, &str)],
) {
    let input = gemm_input(rng, n, count);
    let args = persistent_args(kernel, n, count, step, blocks);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_binary(harness().unwrap(), &args, &input, env);
    assert!(
        out.status.success(),
        "{kernel}, n={n}, {blocks} blocks, {env:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (z, want) in naive_steps(&input, n, count, step).iter().enumerate() {
        assert_eq!(
            &out.stdout[z * n * n..(z + 1) * n * n],
            &want[..],
            "{kernel} kernel, n={n}, {blocks} blocks, matrix {z}, {env:?}"
        );
    }
}

/// Each mutant of a persistent kernel, built and run on (n, count, blocks), must be caught: a
/// wrong product, or an abort (a barrier check, a deadlock within 5 s).
fn assert_mutants_caught(
    kernel: GpuKernel,
    seed: u8,
    (n, count, blocks): (usize, usize, u32),
    mutants: Vec<(&str, Mutation)>,
    env: &[(&str, &str)],
) {
    let mut rng = ChaCha8Rng::from_seed([seed; 32]);
    let step = 9u32;
    let input = gemm_input(&mut rng, n, count);
    let want: Vec<u8> = naive_steps(&input, n, count, step).concat();
    let args = persistent_args(kernel, n, count, step, blocks);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = [("GA_EMULATION_DEADLOCK_MS", "5000")]
        .into_iter()
        .chain(env.iter().copied())
        .collect();
    for (name, mutation) in mutants {
        let mutant = build_harness(name, &[mutation]).unwrap();
        let out = run_binary(&mutant, &args, &input, &env);
        let caught = !out.status.success() || out.stdout != want;
        assert!(
            caught,
            "mutant {name} computed the right product: the emulation let it pass"
        );
        println!(
            "mutant {name} caught: {}",
            if out.status.success() {
                "wrong product".to_string()
            } else {
                format!("aborted: {}", String::from_utf8_lossy(&out.stderr).trim())
            }
        );
    }
}

/// The TMA kernel against the naive step, on persistent grids that give a block several tiles
/// (its stages and phases running on from one tile into the next), an uneven share of them, or
/// none at all, with k-tiles fewer than the stages and more, the last one half past n.
#[test]
fn device_tma_kernel_matches_the_naive_step() {
    if harness().is_none() {
        return;
    }
    let mut rng = ChaCha8Rng::from_seed([23; 32]);
    // (n, matrices, blocks): 64, two one-k-tile tiles in one block; 64 on two blocks, one idle;
    // 192, four tiles (partial rows and columns) over three blocks; 320, twelve tiles of three
    // k-tiles on two blocks, so each block's phases wrap round four stages several times; 576,
    // fifteen tiles of five k-tiles (the last half outside the tensor) over four blocks.
    for (n, count, blocks) in [
        (64usize, 2usize, 1u32),
        (64, 1, 2),
        (192, 2, 3),
        (320, 2, 2),
        (576, 1, 4),
    ] {
        assert_persistent_matches_naive(GpuKernel::Tma, &mut rng, (n, count, blocks), 9, &[]);
    }
}

/// The emulation is strict enough to catch a pipeline bug: a consumer that waits on the parity of
/// the phase before the one it needs passes at once, before the tile has landed, and must
/// compute something else (or trip the emulation's barrier checks).
#[test]
fn a_tma_consumer_that_waits_one_phase_too_early_fails_in_the_emulation() {
    if harness().is_none() {
        return;
    }
    let mutant = Mutation {
        file: "gemm_tma.cu",
        from: "ga_mbar_wait(&full[stage], phase)",
        to: "ga_mbar_wait(&full[stage], phase ^ 1)",
    };
    assert_mutants_caught(
        GpuKernel::Tma,
        24,
        (192, 2, 2),
        vec![("tma-wait-one-phase-early", mutant)],
        &[],
    );
}

/// The ping-pong kernel against the naive step. Its consumers take alternate tiles of their
/// block, so the grids give a consumer no tile, one, or one more than the other; and k-tiles
/// fewer than its five stages (the ring holding several tiles at once) and more, so that
/// consumer 1's first k-tile lies in the ring's second pass (704: six k-tiles, the last half
/// outside the tensor, and a last column tile of 192).
#[test]
fn device_pingpong_kernel_matches_the_naive_step() {
    if harness().is_none() {
        return;
    }
    let mut rng = ChaCha8Rng::from_seed([25; 32]);
    // (n, matrices, blocks): 64, two tiles in one block, one a consumer; 64 on two blocks, one
    // idle and the other's consumer 1 idle; 192, three tiles in one block (consumer 0 takes
    // two); 320, twenty tiles of three k-tiles over three blocks (7, 7, 6); 704, thirty-three
    // tiles of six k-tiles over two blocks; 640, k-tiles exactly the stages (a tile's skip
    // flips the phase and leaves the stage), thirty tiles over three blocks.
    for (n, count, blocks) in [
        (64usize, 2usize, 1u32),
        (64, 1, 2),
        (192, 1, 1),
        (320, 2, 3),
        (704, 1, 2),
        (640, 1, 3),
    ] {
        assert_persistent_matches_naive(GpuKernel::Pingpong, &mut rng, (n, count, blocks), 11, &[]);
    }
    // The schedule the mutant test below forces (the producer started last) is one the kernel
    // itself must get right, or that test would catch its mutants for the wrong reason.
    let held = [("GA_EMULATION_HOLD_THREADS", "0-128")];
    assert_persistent_matches_naive(GpuKernel::Pingpong, &mut rng, (704, 1, 2), 11, &held);
}

/// The ping-pong schedule's two rules, each broken in a mutant that the emulation must catch
/// (a wrong product, a barrier check or a deadlock):
/// - a consumer that does not wait for its turn: consumer 1's first k-tile lies in the ring's
///   second pass (n = 704, six k-tiles, five stages), so its parity wait passes on a stage the
///   ring has not come round to;
/// - a consumer that does not skip the other's tile in the ring after its own.
#[test]
fn pingpong_mutants_that_break_the_turns_or_the_ring_fail_in_the_emulation() {
    if harness().is_none() {
        return;
    }
    let mutants = vec![
        (
            "pingpong-no-turns",
            Mutation {
                file: "gemm_pingpong.cu",
                from: "ga_mbar_wait(&turn[consumer], (turns & 1u) ^ (consumer == 0 ? 1u : 0u));",
                to: "",
            },
        ),
        (
            "pingpong-no-skip",
            Mutation {
                file: "gemm_pingpong.cu",
                from: "at = pp_advance(at, ktiles);",
                to: "",
            },
        ),
    ];
    // The producer's warpgroup held until both consumers have reached a wait, so that consumer
    // 1 reaches its first k-tile's wait before the ring's first pass has filled that stage: left
    // to the scheduler, a consumer 1 started late (a loaded machine) waits at the right phase by
    // luck and the mutant without turns passes.
    assert_mutants_caught(
        GpuKernel::Pingpong,
        26,
        (704, 1, 2),
        mutants,
        &[("GA_EMULATION_HOLD_THREADS", "0-128")],
    );
}

/// The ping-pong kernel in clusters of two (`gemm_mix_multicast`) against the naive step: the
/// two blocks of a cluster run at once, each with shared memory of its own, and each block's
/// producer multicasts half of the Bt rows into both. Grids of one cluster and of several; a
/// cluster's second row tile past n (n = 192: three 64-row tiles, so the second cluster tile's
/// lower half is all outside the matrix), k-tiles fewer than the stages and more.
#[test]
fn device_multicast_kernel_matches_the_naive_step() {
    if harness().is_none() {
        return;
    }
    let mut rng = ChaCha8Rng::from_seed([27; 32]);
    // (n, matrices, blocks): 64, two cluster tiles (the lower halves outside the matrices) in
    // one cluster; 192, one matrix's two cluster tiles on one cluster; 320, twelve cluster tiles
    // of three k-tiles over two clusters; 704, eighteen of six k-tiles over two clusters.
    for (n, count, blocks) in [(64usize, 2usize, 2u32), (192, 1, 2), (320, 2, 4), (704, 1, 4)] {
        // In lockstep, and (but for the largest case, which adds time, not coverage) with
        // either block of each cluster running behind the other: (milliseconds, lagging rank).
        let skews: &[(&str, &str)] = if n > 320 {
            &[("0", "1")]
        } else {
            &[("0", "1"), ("5", "1"), ("5", "0")]
        };
        for &(skew, rank) in skews {
            let env = [("GA_EMULATION_SKEW_MS", skew), ("GA_EMULATION_SKEW_RANK", rank)];
            assert_persistent_matches_naive(GpuKernel::Multicast, &mut rng, (n, count, blocks), 13, &env);
        }
    }
}

/// What the clusters' sharing needs, each broken in a mutant the emulation must catch, with the
/// cluster's second block running slower (GA_EMULATION_SKEW_MS) so that the first runs ahead as
/// far as the barriers let it:
/// - a block that frees a stage in its own block only: the other block's producer then
///   multicasts into it while it is still read;
/// - a producer that multicasts its half of Bt into its own block only, so the other block's
///   stage never receives it;
/// - a producer that does not wait, at the end, for the other block's consumers to have freed
///   every stage: its block exits while they still arrive on its barriers.
#[test]
fn multicast_mutants_that_break_the_sharing_fail_in_the_emulation() {
    if harness().is_none() {
        return;
    }
    let mutants = vec![
        (
            "multicast-release-own-block-only",
            Mutation {
                file: "gemm_pingpong.cu",
                from: "for (u32 cta = 0; cta < CLUSTER; ++cta) ga_mbar_arrive_cluster(empty, cta);",
                to: "ga_mbar_arrive_cluster(empty, ga_cluster_rank()); ga_mbar_arrive_cluster(empty, ga_cluster_rank());",
            },
        ),
        (
            "multicast-to-own-block-only",
            Mutation {
                file: "tma_gemm.cuh",
                from: "bt_map, &full[stage], 0x3,",
                to: "bt_map, &full[stage], (unsigned short)(1u << rank),",
            },
        ),
        (
            "multicast-no-producer-tail",
            Mutation {
                file: "tma_gemm.cuh",
                from: "    for (int s = 0; s < STAGES; ++s) {\n        ga_mbar_wait<true>(&empty[stage], phase ^ 1);",
                to: "    for (int s = 0; s < 0; ++s) {\n        ga_mbar_wait<true>(&empty[stage], phase ^ 1);",
            },
        ),
    ];
    assert_mutants_caught(
        GpuKernel::Multicast,
        28,
        (320, 1, 2),
        mutants,
        &[("GA_EMULATION_SKEW_MS", "20")],
    );
}

/// The walk kernel's launches, `first..first + steps` from `starts`: (each walker's checkpoints,
/// each walker's state after the launch).
fn device_walk(pool: &[u8], starts: &[Digest], first: u32, steps: u32, every: u32) -> (Vec<Vec<Digest>>, Vec<Digest>) {
    let entries = pool.len() / ENTRY_BYTES;
    let walkers = starts.len();
    let mut input = pool.to_vec();
    for start in starts {
        input.extend_from_slice(start.as_bytes());
    }
    // The slot of the block past the walkers, which must return without touching it.
    input.extend_from_slice(&[0x5A; 32]);
    let out = run(
        &[
            "walk",
            &entries.to_string(),
            &walkers.to_string(),
            &first.to_string(),
            &steps.to_string(),
            &every.to_string(),
            "3",
        ],
        &input,
    );
    let digests: Vec<Digest> = out.chunks_exact(32).map(|c| Digest::from_slice(c).unwrap()).collect();
    let per_walker = (steps / every) as usize;
    let (checkpoints, states) = digests.split_at(walkers * per_walker + 1);
    assert_eq!(
        checkpoints[walkers * per_walker],
        Digest([0xA5; 32]),
        "a checkpoint past the last"
    );
    assert_eq!(states.len(), walkers + 1);
    assert_eq!(
        states[walkers],
        Digest([0x5A; 32]),
        "the block past the walkers wrote a state"
    );
    (
        checkpoints[..walkers * per_walker]
            .chunks(per_walker.max(1))
            .map(<[Digest]>::to_vec)
            .collect(),
        states[..walkers].to_vec(),
    )
}

/// The walk on the CPU (`memory::walk::step`, PROTOCOL.md 18.3): each walker's states after
/// steps `first..first + steps`, and which entries the steps read.
fn host_walk(pool: &[u8], start: Digest, first: u32, steps: u32, visited: &mut [bool]) -> Vec<Digest> {
    let entries = (pool.len() / ENTRY_BYTES) as u64;
    let mut state = start;
    let mut states = Vec::new();
    for t in first..first + steps {
        let e = entry_index(&state, entries) as usize;
        visited[e] = true;
        let entry: &[i8] = bytemuck::cast_slice(&pool[e * ENTRY_BYTES..(e + 1) * ENTRY_BYTES]);
        state = step(entry, &state, t);
        states.push(state);
    }
    states
}

/// The walk kernel against `walk::step`, every checkpoint bit for bit: a pool of five entries
/// (two of them the int8 extremes, whose products reach |y| = 256 * 128 * 127), six walkers,
/// one of them starting at a state whose le64 is u64::MAX, sixteen steps in two launches of
/// eight (the second carrying on from the states the first returned, at its own step numbers),
/// checkpoints every 4; then every step checkpointed, from an odd first step.
#[test]
fn device_walk_matches_the_walk_step() {
    if harness().is_none() {
        return;
    }
    let shapes = String::from_utf8(run(&["shapes"], &[])).unwrap();
    assert!(
        shapes
            .lines()
            .any(|l| l == format!("walk {}", AuxModule::Walk.block_threads())),
        "WALK_THREADS in walk.cu is not AuxModule::Walk.block_threads():\n{shapes}"
    );
    assert!(
        shapes
            .lines()
            .any(|l| l == format!("tree {}", AuxModule::Walk.block_threads())),
        "TREE_THREADS in walk_tree.cu is not AuxModule::Walk.block_threads():\n{shapes}"
    );
    let entries = 5;
    let mut pool = vec![0u8; entries * ENTRY_BYTES];
    ChaCha8Rng::from_seed([33; 32]).fill_bytes(&mut pool);
    pool[..ENTRY_BYTES].fill(0x80);
    pool[ENTRY_BYTES..2 * ENTRY_BYTES].fill(0x7F);
    let mut starts: Vec<Digest> = (0..6u32).map(|w| Digest::hash(&w.to_le_bytes())).collect();
    starts[0] = Digest([0xFF; 32]);

    let mut visited = vec![false; entries];
    let want: Vec<Vec<Digest>> = starts
        .iter()
        .map(|&s| host_walk(&pool, s, 0, 16, &mut visited))
        .collect();
    assert!(visited.iter().all(|&v| v), "the walk left an entry unread: {visited:?}");
    let (first_half, middle) = device_walk(&pool, &starts, 0, 8, 4);
    let (second_half, end) = device_walk(&pool, &middle, 8, 8, 4);
    for (w, want) in want.iter().enumerate() {
        let got: Vec<Digest> = first_half[w].iter().chain(&second_half[w]).copied().collect();
        let checkpoints: Vec<Digest> = want.iter().skip(3).step_by(4).copied().collect();
        assert_eq!(got, checkpoints, "walker {w}: s_4, s_8, s_12, s_16");
        assert_eq!(middle[w], want[7], "walker {w}: state after the first launch");
        assert_eq!(end[w], want[15], "walker {w}: state after the second launch");
    }

    let (every_step, end) = device_walk(&pool, &starts[..2], 7, 3, 1);
    for (w, &start) in starts[..2].iter().enumerate() {
        let want = host_walk(&pool, start, 7, 3, &mut visited);
        assert_eq!(every_step[w], want, "walker {w}, steps 7..10");
        assert_eq!(end[w], want[2], "walker {w}: state after steps 7..10");
    }
}

/// A version 4 walk through the harness's `walk4`, as the host drives it on a GPU: (each
/// walker's kept trace, each walker's root).
fn device_walk_v4(
    harness: &Path,
    pool: &[u8],
    starts: &[Digest],
    steps: u32,
    launch: u32,
) -> Option<(Vec<KeptTrace>, Vec<Digest>)> {
    let slices = pool.len() / SLICE_BYTES;
    let walkers = starts.len();
    let mut input = pool.to_vec();
    for start in starts {
        input.extend_from_slice(start.as_bytes());
    }
    let args = [
        "walk4".to_string(),
        slices.to_string(),
        walkers.to_string(),
        steps.to_string(),
        launch.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_binary(harness, &args, &input, &[]);
    if !out.status.success() {
        println!("walk4 failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        return None;
    }
    let digests: Vec<Digest> = out
        .stdout
        .chunks_exact(32)
        .map(|c| Digest::from_slice(c).unwrap())
        .collect();
    let blocks = (steps / KEPT_EVERY + 1) as usize;
    let per_kind = walkers * blocks + 1;
    assert_eq!(digests.len(), 2 * per_kind + walkers + 1);
    let (starts_out, rest) = digests.split_at(per_kind);
    let (nodes, roots) = rest.split_at(per_kind);
    let untouched = Digest([0xA5; 32]);
    assert_eq!(
        starts_out[per_kind - 1],
        untouched,
        "a block start past the last walker's"
    );
    assert_eq!(nodes[per_kind - 1], untouched, "a block node past the last walker's");
    assert_eq!(roots[walkers], untouched, "a root past the last walker's");
    let kept = (0..walkers)
        .map(|w| KeptTrace {
            block_starts: starts_out[w * blocks..(w + 1) * blocks].to_vec(),
            block_nodes: nodes[w * blocks..(w + 1) * blocks].to_vec(),
        })
        .collect();
    Some((kept, roots[..walkers].to_vec()))
}

/// A pool of `slices` 64 KiB states at n = 256 (one slice a state), the first two the int8
/// extremes, the rest random.
fn v4_pool(slices: usize) -> (Vec<u8>, HeldStates) {
    let mut pool = vec![0u8; slices * SLICE_BYTES];
    ChaCha8Rng::from_seed([44; 32]).fill_bytes(&mut pool);
    pool[..SLICE_BYTES].fill(0x80);
    pool[SLICE_BYTES..2 * SLICE_BYTES].fill(0x7F);
    let states = pool
        .chunks(SLICE_BYTES)
        .map(|s| Matrix::from_vec(256, bytemuck::cast_slice::<u8, i8>(s).to_vec()).unwrap())
        .collect();
    let chains = ChainPool::new(0, 0, slices as u64, 256).unwrap();
    (pool, HeldStates::new(chains, states).unwrap())
}

/// The version 4 walk on the device (walk.cu under version 4's domain, every state written,
/// walk_tree.cu folding them) against `slice_walk::walk_device`, for walks whose last block is
/// partial (L = 150, launches of 64, 64 and 22), a lone s_L (L = 128), and one block (L = 63):
/// every block's start and node, and every walker's root, bit for bit.
#[test]
fn device_v4_walk_and_its_trees_match_slice_walk() {
    let Some(harness) = harness() else {
        return;
    };
    let (pool, held) = v4_pool(5);
    for (walkers, steps, launch) in [(3u32, 150u32, 64u32), (2, 128, 128), (2, 63, 64)] {
        let walk = SliceWalk {
            nonce: [5; 32],
            walk_seed: [6; 32],
            global: Digest::hash(b"G"),
            walkers,
            steps,
        };
        let starts: Vec<Digest> = (0..walkers).map(|w| walk.start_state(0, w)).collect();
        let want = walk_device(&walk, &held);
        let (kept, roots) = device_walk_v4(harness, &pool, &starts, steps, launch).expect("the walk ran");
        for (w, (got, want)) in kept.iter().zip(&want.kept).enumerate() {
            assert_eq!(got, want, "L = {steps}, walker {w}: its kept trace");
        }
        assert_eq!(kept.len(), want.kept.len());
        assert_eq!(roots, want.walker_roots, "L = {steps}: the walker roots");
    }
}

/// Mutants the test above must catch: the version 3 domain in a version 4 walk, a tree that
/// combines its right edge the wrong way round, and a last launch that folds no partial block.
#[test]
fn mutants_of_the_v4_walk_and_its_trees_fail_in_the_emulation() {
    if harness().is_none() {
        return;
    }
    let (pool, held) = v4_pool(5);
    let walk = SliceWalk {
        nonce: [5; 32],
        walk_seed: [6; 32],
        global: Digest::hash(b"G"),
        walkers: 2,
        steps: 150,
    };
    let starts: Vec<Digest> = (0..2).map(|w| walk.start_state(0, w)).collect();
    let want = walk_device(&walk, &held);
    let mutants = [
        (
            "walk-v4-under-the-v3-domain",
            Mutation {
                file: "walk.cu",
                from: "(u8)('0' + version)",
                to: "(u8)'3'",
            },
        ),
        (
            "tree-edge-combined-backwards",
            Mutation {
                file: "walk_tree.cu",
                from: "ga_tree_node(1u, edge[level], root, root);",
                to: "ga_tree_node(1u, root, edge[level], root);",
            },
        ),
        (
            "tree-without-the-last-block",
            Mutation {
                file: "walk_tree.cu",
                from: "walk_steps / TREE_BLOCK_STATES + 1 - first_block",
                to: "walk_steps / TREE_BLOCK_STATES - first_block",
            },
        ),
    ];
    for (name, mutation) in mutants {
        let binary = build_harness(name, &[mutation]).unwrap();
        let got = device_walk_v4(&binary, &pool, &starts, walk.steps, 64);
        let (kept, roots) = got.unwrap_or_else(|| panic!("mutant {name} aborted: it should compute, wrongly"));
        assert!(
            kept != want.kept || roots != want.walker_roots,
            "mutant {name} gave the CPU's trees"
        );
    }
}

/// One device's locality walk as the emulated kernels make it (locality.cu, driven as the
/// harness's `locality` mode drives it): every end state, generation by generation, and every
/// generation digest. `None` when the harness aborted.
fn device_locality(harness: &Path, pool: &[u8], walk: &LocalityWalk, device: u32) -> Option<(Vec<State>, Vec<Digest>)> {
    let slices = pool.len() / SLICE_BYTES;
    let mut input = pool.to_vec();
    input.extend_from_slice(&walk.nonce);
    input.extend_from_slice(&walk.seed);
    input.extend_from_slice(walk.global.as_bytes());
    let args = [
        "locality".to_string(),
        slices.to_string(),
        walk.walkers.to_string(),
        walk.generations.to_string(),
        walk.steps.to_string(),
        device.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_binary(harness, &args, &input, &[]);
    if !out.status.success() {
        println!("locality failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        return None;
    }
    let ends_count = (walk.walkers * walk.generations) as usize;
    let digests_count = walk.generations as usize;
    assert_eq!(out.stdout.len(), 32 * (ends_count + 1 + digests_count + 1 + 2));
    let (ends, rest) = out.stdout.split_at(32 * (ends_count + 1));
    let (digests, rest) = rest.split_at(32 * (digests_count + 1));
    let untouched = [0xA5; 32];
    assert_eq!(ends[32 * ends_count..], untouched, "an end past the last walker's");
    assert_eq!(
        digests[32 * digests_count..],
        untouched,
        "a digest past the last generation's"
    );
    assert_eq!(rest[..32], untouched, "a start past the last walker's");
    assert_eq!(rest[32..], untouched, "a node past the tree's edge");
    let ends = ends[..32 * ends_count]
        .chunks_exact(32)
        .map(|c| State::from_bytes(c.try_into().unwrap()))
        .collect();
    let digests = digests[..32 * digests_count]
        .chunks_exact(32)
        .map(|c| Digest::from_slice(c).unwrap())
        .collect();
    Some((ends, digests))
}

fn locality_walk_of(walkers: u32, generations: u32, steps: u32) -> LocalityWalk {
    LocalityWalk {
        nonce: [7; 32],
        seed: [8; 32],
        global: Digest::hash(b"the locality walk's global root"),
        walkers,
        generations,
        steps,
    }
}

/// The locality walk on the device against `locality::walk_lines`, every end and every
/// generation digest bit for bit, and the root over the digests: one walker (a leaf message of
/// one chunk), and 70 (three chunks, the third promoted a level), over 11 generations, whose
/// starts take one to three of the tree's nodes, on device 3.
#[test]
fn device_locality_walk_matches_walk_lines() {
    let Some(harness) = harness() else {
        return;
    };
    let shapes = String::from_utf8(run(&["shapes"], &[])).unwrap();
    assert!(
        shapes
            .lines()
            .any(|l| l == format!("locality {}", AuxModule::Walk.block_threads())),
        "LOC_THREADS in locality.cu is not AuxModule::Walk.block_threads():\n{shapes}"
    );
    let (pool, _) = v4_pool(5);
    let held = locality_pool(&pool, 3);
    for (walkers, generations, steps) in [(1u32, 11u32, 9u32), (70, 3, 4)] {
        let walk = locality_walk_of(walkers, generations, steps);
        let want = walk_lines(&walk, &held, &CancelToken::new()).unwrap();
        let (ends, digests) = device_locality(harness, &pool, &walk, 3).expect("the walk ran");
        assert_eq!(digests, want.digests, "W = {walkers}: the generation digests");
        assert_eq!(ends, want.ends, "W = {walkers}: the end states");
        assert_eq!(MerkleTree::new(&digests).root(), want.root, "W = {walkers}: the root");
    }
}

/// The pool of v4_pool's bytes as device `device`'s states.
fn locality_pool(pool: &[u8], device: u32) -> HeldStates {
    let states = pool
        .chunks(SLICE_BYTES)
        .map(|s| Matrix::from_vec(256, bytemuck::cast_slice::<u8, i8>(s).to_vec()).unwrap())
        .collect();
    let chains = ChainPool::new(device, 0, (pool.len() / SLICE_BYTES) as u64, 256).unwrap();
    HeldStates::new(chains, states).unwrap()
}

/// Mutants the test above must catch, one a kernel: a walk whose fold leaves out the lanes 16
/// apart, starts that take none of the tree's nodes, and a digest whose chunks are all hashed at
/// counter 0.
#[test]
fn mutants_of_the_locality_walk_fail_in_the_emulation() {
    if harness().is_none() {
        return;
    }
    let (pool, _) = v4_pool(5);
    let held = locality_pool(&pool, 0);
    let walk = locality_walk_of(70, 3, 4);
    let want = walk_lines(&walk, &held, &CancelToken::new()).unwrap();
    let mutants = [
        (
            "locality-fold-without-lanes-16-apart",
            Mutation {
                file: "locality.cu",
                from: "x ^= ga_loc_shfl_xor(x, 16);",
                to: "",
            },
        ),
        (
            "locality-starts-without-parents",
            Mutation {
                file: "locality.cu",
                from: "(generation >> level) & 1u",
                to: "(generation >> level) & 0u",
            },
        ),
        (
            "locality-chunks-at-counter-0",
            Mutation {
                file: "locality.cu",
                from: "ga_b3_compress(cv, block, c,",
                to: "ga_b3_compress(cv, block, 0,",
            },
        ),
    ];
    for (name, mutation) in mutants {
        let binary = build_harness(name, &[mutation]).unwrap();
        let (ends, digests) = device_locality(&binary, &pool, &walk, 0)
            .unwrap_or_else(|| panic!("mutant {name} aborted: it should compute, wrongly"));
        assert!(
            ends != want.ends || digests != want.digests,
            "mutant {name} gave the CPU's walk"
        );
    }
}
