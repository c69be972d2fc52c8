// Version 4's locality walk (PROTOCOL.md 20.10) on the device, bit-identical to `walk_lines` in
// shared/src/memory/locality.rs. A device's walk is G generations of W walkers, each walker C
// dependent steps over the pool's 256-byte lines; generation g + 1 starts from the locality
// tree's nodes left of leaf g + 1, which hold every generation before it. Per generation the host
// queues three launches on one stream, so no state and no digest crosses to the host until the
// last generation has ended:
//
// - locality_starts: one thread per walker: its start, blake3("gpu-attest v4 locality tree
//   start" || nonce || seed || G || le32(j) || le32(g) || le32(w) || p_1 || .. || p_k), one
//   chunk (at most 141 + 32 k bytes, k <= LOC_MAX_PARENTS), where p_1 .. p_k are the tree's
//   finished subtrees, lowest first: `edge[l]` for each set bit l of g.
// - locality_walk: one warp per walker, a lane per word of the line. A step names slice
//   le64(s[0..8]) mod P and line le64(s[8..16]) mod 256, loads the line in one coalesced 256-byte
//   load (8 bytes a lane), keys word l with state word l mod 4 and l << 56 through m(x), folds the
//   eight lanes that share a state word with three butterfly shuffles, broadcasts the four folds
//   and chains them into the next state (`step` in locality.rs), in registers on every lane.
//   Lane 0 writes the walker's end.
// - locality_generation: one block: D_g = blake3("gpu-attest v4 locality leaf" || nonce || seed
//   || le32(j) || le32(g) || e_{g,0} || .. || e_{g,W-1}) (99 + 32 W bytes: each thread hashes
//   whole chunks, then the block merges the chaining values a level at a time), written to
//   `digests[g]`; then thread 0 pushes leaf node blake3(0x00 || D_g) onto the tree's right edge
//   (walk_tree.cu's fold), which the next generation's starts read.
//
// The walk is a latency test: each step waits for one load whose address the step before it
// produced, and mixes little, so that a step costs about one memory latency and a line held
// elsewhere costs a hop on top of it (docs/design/locality.md). One warp a walker is
// scripts/probes/locality_probe.cu's step.
//
// States are four 64-bit words (a state's 32 bytes as little-endian words), laid out [walker][4];
// `key` is the walk's nonce, seed and global root (24 words, their bytes in order); `pool` is P
// slices of 65536 bytes, slice e at byte e * 65536, 8-byte aligned.
//
// Needs blake3.cu (ga_b3_compress, ga_b3_iv) and walk_tree.cu (ga_tree_node, ga_tree_push)
// before it. Uses only __ldcg, __shfl_xor_sync, __shfl_sync and __syncthreads, which the host
// emulation (kernels/tests/cuda_kernels_on_host.rs) supplies, so it runs this exact source on the
// CPU against locality.rs.

#define LOC_THREADS 128
#define LOC_WARPS (LOC_THREADS / 32)
#define LOC_LINE_WORDS 32            // a line is 256 bytes: 32 words of 8, one a lane
#define LOC_SLICE_WORDS 8192         // 65536 bytes
#define LOC_LINES_PER_SLICE 256
#define LOC_START_HEAD 141           // context 33, nonce, seed, G, le32 j, le32 g, le32 w
#define LOC_MAX_PARENTS 27           // (1024 - 141) / 32: a start stays one chunk
#define LOC_LEAF_HEAD 99             // context 27, nonce, seed, le32 j, le32 g
#define LOC_MAX_WALKERS 4096         // locality.rs's MAX_WALKERS
#define LOC_MAX_CHUNKS ((LOC_LEAF_HEAD + 32 * LOC_MAX_WALKERS + 1023) / 1024)  // 129
#define LOC_EDGE_LEVELS 32           // the tree's right edge: a level per bit of g

__device__ __forceinline__ u64 ga_mix64(u64 x) {
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

// 64-bit shuffles as two 32-bit ones, written out so that the host emulation runs exactly these.
__device__ __forceinline__ u64 ga_loc_shfl_xor(u64 v, int lane_mask) {
    const u32 lo = (u32)__shfl_xor_sync(0xFFFFFFFFu, (int)(u32)v, lane_mask);
    const u32 hi = (u32)__shfl_xor_sync(0xFFFFFFFFu, (int)(u32)(v >> 32), lane_mask);
    return ((u64)hi << 32) | lo;
}

__device__ __forceinline__ u64 ga_loc_shfl(u64 v, int src_lane) {
    const u32 lo = (u32)__shfl_sync(0xFFFFFFFFu, (int)(u32)v, src_lane);
    const u32 hi = (u32)__shfl_sync(0xFFFFFFFFu, (int)(u32)(v >> 32), src_lane);
    return ((u64)hi << 32) | lo;
}

__device__ __forceinline__ void ga_loc_put32(u8* at, u32 v) {
    at[0] = (u8)v;
    at[1] = (u8)(v >> 8);
    at[2] = (u8)(v >> 16);
    at[3] = (u8)(v >> 24);
}

// The 16-word message block `b` of `msg` (bytes past `len` zero), little-endian words.
__device__ __forceinline__ void ga_loc_block(const u8* msg, u32 len, u32 b, u32 block[16]) {
    for (int w = 0; w < 16; ++w) {
        u32 word = 0;
        for (int i = 0; i < 4; ++i) {
            const u32 at = b * 64 + 4 * w + i;
            word |= (at < len ? (u32)msg[at] : 0u) << (8 * i);
        }
        block[w] = word;
    }
}

// blake3 of `len` (1 ..= 1024) bytes: one chunk, its last block the root.
__device__ __forceinline__ void ga_loc_hash_chunk(const u8* msg, u32 len, u32 out[8]) {
    const u32 blocks = (len + 63) / 64;
    u32 cv[8];
    ga_b3_iv(cv);
    for (u32 b = 0; b < blocks; ++b) {
        u32 block[16];
        ga_loc_block(msg, len, b, block);
        const u32 last = b + 1 == blocks;
        const u32 flags = (b == 0 ? GA_B3_CHUNK_START : 0u) | (last ? GA_B3_CHUNK_END | GA_B3_ROOT : 0u);
        ga_b3_compress(cv, block, 0, last ? len - 64 * b : 64, flags, cv);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = cv[i];
}

// Every walker's start of generation `generation` of device `device`, into `starts`.
extern "C" __global__ void __launch_bounds__(LOC_THREADS)
    locality_starts(const u32* key, u32 device, u32 generation, u32 walkers, const u32* edge, u64* starts) {
    const u32 walker = blockIdx.x * LOC_THREADS + threadIdx.x;
    if (walker >= walkers) {
        return;
    }
    u8 msg[LOC_START_HEAD + 32 * LOC_MAX_PARENTS];
    const char context[] = "gpu-attest v4 locality tree start";
    for (int i = 0; i < 33; ++i) msg[i] = (u8)context[i];
    for (int w = 0; w < 24; ++w) ga_loc_put32(msg + 33 + 4 * w, key[w]);
    ga_loc_put32(msg + 129, device);
    ga_loc_put32(msg + 133, generation);
    ga_loc_put32(msg + 137, walker);
    u32 len = LOC_START_HEAD;
    for (int level = 0; level < LOC_EDGE_LEVELS && len + 32 <= sizeof msg; ++level) {
        if ((generation >> level) & 1u) {
            for (int w = 0; w < 8; ++w) ga_loc_put32(msg + len + 4 * w, edge[level * 8 + w]);
            len += 32;
        }
    }
    u32 digest[8];
    ga_loc_hash_chunk(msg, len, digest);
#pragma unroll
    for (int i = 0; i < 4; ++i) starts[4 * (u64)walker + i] = ((u64)digest[2 * i + 1] << 32) | digest[2 * i];
}

// `steps` steps of every walker from `starts`, each walker's end into `ends` (one generation's).
extern "C" __global__ void __launch_bounds__(LOC_THREADS)
    locality_walk(const u64* pool, u64 pool_slices, const u64* starts, u32 walkers, u32 steps, u64* ends) {
    const u32 lane = threadIdx.x & 31;
    const u32 walker = blockIdx.x * LOC_WARPS + (threadIdx.x >> 5);
    if (walker >= walkers) {
        return;  // the whole warp: its shuffles below involve no lane of another walker
    }
    u64 s0 = starts[4 * (u64)walker], s1 = starts[4 * (u64)walker + 1];
    u64 s2 = starts[4 * (u64)walker + 2], s3 = starts[4 * (u64)walker + 3];
    const u64 lane_key = (u64)lane << 56;
    for (u32 t = 0; t < steps; ++t) {
        const u64 slice = s0 % pool_slices;
        const u64 line = s1 % LOC_LINES_PER_SLICE;
        // Past L1: a walk's lines are not read again, and the address hangs on the last step.
        const u64 v = __ldcg(pool + slice * LOC_SLICE_WORDS + line * LOC_LINE_WORDS + lane);
        const u64 word = (lane & 3) == 0 ? s0 : (lane & 3) == 1 ? s1 : (lane & 3) == 2 ? s2 : s3;
        u64 x = ga_mix64(v ^ word ^ lane_key);
        // n_r, the XOR over the lanes l with l mod 4 = r: lanes that differ in bits 2..4 only.
        x ^= ga_loc_shfl_xor(x, 4);
        x ^= ga_loc_shfl_xor(x, 8);
        x ^= ga_loc_shfl_xor(x, 16);
        const u64 n0 = ga_loc_shfl(x, 0), n1 = ga_loc_shfl(x, 1), n2 = ga_loc_shfl(x, 2), n3 = ga_loc_shfl(x, 3);
        const u64 next0 = ga_mix64(n0 ^ n1 ^ n2 ^ n3 ^ s1);
        const u64 next1 = n1 + s2 + next0;
        const u64 next2 = n2 ^ s3 ^ next0;
        const u64 next3 = n3 + s0 + next0;
        s0 = next0;
        s1 = next1;
        s2 = next2;
        s3 = next3;
    }
    if (lane == 0) {
        ends[4 * (u64)walker] = s0;
        ends[4 * (u64)walker + 1] = s1;
        ends[4 * (u64)walker + 2] = s2;
        ends[4 * (u64)walker + 3] = s3;
    }
}

// Byte `at` of generation `generation`'s leaf message: `head` (LOC_LEAF_HEAD bytes), then the
// ends' bytes.
__device__ __forceinline__ u8 ga_loc_leaf_byte(const u8* head, const u64* ends, u32 at) {
    if (at < LOC_LEAF_HEAD) {
        return head[at];
    }
    const u32 e = at - LOC_LEAF_HEAD;
    return (u8)(ends[e / 8] >> (8 * (e % 8)));
}

// Generation `generation`'s digest from its ends, into `digests[generation]` (8 words), and its
// leaf node pushed onto the tree's right edge `edge` (LOC_EDGE_LEVELS nodes of 8 words). One
// block of LOC_THREADS threads.
extern "C" __global__ void __launch_bounds__(LOC_THREADS)
    locality_generation(const u32* key, u32 device, u32 generation, u32 walkers, const u64* ends, u32* digests,
                        u32* edge) {
    __shared__ u32 cvs[LOC_MAX_CHUNKS][8];
    u8 head[LOC_LEAF_HEAD];
    const char context[] = "gpu-attest v4 locality leaf";
    for (int i = 0; i < 27; ++i) head[i] = (u8)context[i];
    for (int w = 0; w < 16; ++w) ga_loc_put32(head + 27 + 4 * w, key[w]);
    ga_loc_put32(head + 91, device);
    ga_loc_put32(head + 95, generation);
    const u32 len = LOC_LEAF_HEAD + 32 * walkers;
    const u32 chunks = (len + 1023) / 1024;
    for (u32 c = threadIdx.x; c < chunks; c += LOC_THREADS) {
        const u32 chunk_len = len - 1024 * c < 1024 ? len - 1024 * c : 1024;
        const u32 blocks = (chunk_len + 63) / 64;
        u32 cv[8];
        ga_b3_iv(cv);
        for (u32 b = 0; b < blocks; ++b) {
            u32 block[16];
            for (int w = 0; w < 16; ++w) {
                u32 word = 0;
                for (int i = 0; i < 4; ++i) {
                    const u32 at = 64 * b + 4 * w + i;
                    word |= (at < chunk_len ? (u32)ga_loc_leaf_byte(head, ends, 1024 * c + at) : 0u) << (8 * i);
                }
                block[w] = word;
            }
            const u32 last = b + 1 == blocks;
            const u32 flags = (b == 0 ? GA_B3_CHUNK_START : 0u) | (last ? GA_B3_CHUNK_END : 0u) |
                              (last && chunks == 1 ? GA_B3_ROOT : 0u);
            ga_b3_compress(cv, block, c, last ? chunk_len - 64 * b : 64, flags, cv);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) cvs[c][i] = cv[i];
    }
    __syncthreads();
    // BLAKE3's tree, a level at a time: node i of the next level is the parent of nodes 2i and
    // 2i + 1, or node 2i itself when it has no right sibling (as blake3.cu's blake3_parents);
    // the level of two nodes makes the root. Each parent is computed before any is written.
    for (u32 nodes = chunks; nodes > 1; nodes = (nodes + 1) / 2) {
        const u32 next = (nodes + 1) / 2;
        u32 parent[8];
        const u32 i = threadIdx.x;
        if (i < next) {
            if (2 * i + 1 < nodes) {
                u32 block[16];
#pragma unroll
                for (int w = 0; w < 8; ++w) {
                    block[w] = cvs[2 * i][w];
                    block[8 + w] = cvs[2 * i + 1][w];
                }
                u32 iv[8];
                ga_b3_iv(iv);
                ga_b3_compress(iv, block, 0, 64, GA_B3_PARENT | (nodes == 2 ? GA_B3_ROOT : 0u), parent);
            } else {
#pragma unroll
                for (int w = 0; w < 8; ++w) parent[w] = cvs[2 * i][w];
            }
        }
        __syncthreads();
        if (i < next) {
#pragma unroll
            for (int w = 0; w < 8; ++w) cvs[i][w] = parent[w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        u32 digest[8], node[8];
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            digest[w] = cvs[0][w];
            digests[8 * (u64)generation + w] = digest[w];
        }
        ga_tree_node(0u, digest, 0, node);
        ga_tree_push((u32 (*)[8])edge, generation, node);
    }
}
