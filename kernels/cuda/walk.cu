// The memory walk (PROTOCOL.md 18.3, and 20.4 for version 4) on the device, bit-identical to
// `step` and `walk_one` in shared/src/memory/walk.rs and to `step` in
// shared/src/memory/slice_walk.rs. Step t of a walker takes its state s (32 bytes) to
//
//   e    = le64(s[0..8]) mod P                       (the entry, or slice, the step reads)
//   v[c] = ChaCha8(key s, stream 0)[c] | 1            (256 odd int8 values)
//   y[r] = sum over c of E_e[r][c] * v[c]             (int32, exact: |y| < 2^23)
//   z[r] = mix(y[r], t, r, 0)
//   s'   = blake3("gpu-attest vV walk step" || s || z)   (311 bytes: five blocks of one chunk)
//
// with V the protocol version, 3 or 4: the only difference between the two walks' steps. A
// version 4 pool is its chains' final states side by side, so slice e is at byte e * 65536 as a
// version 3 entry is. Version 4 commits every state (checkpoint_every = 1), and walk_tree.cu
// folds them into the walkers' trees.
//
// The walk is a bandwidth test: a step reads 64 KiB and computes little, and its entry is named
// by the hash of the step before, so nothing can be fetched ahead. The memory bus is kept full by
// many walkers at once, not by prefetching within one.
//
// Layout: one block of WALK_THREADS threads per walker (blockIdx.x), WALK_MIN_BLOCKS of them per
// SM. Thread `tid` reads 16-byte vector tid + 128 i (i = 0..31) of the entry: each warp load is
// 512 contiguous bytes, and since 128 is a multiple of 16 the thread always reads the same 16
// columns (16 * (tid % 16) onwards) of row 8 i + tid / 16, so it needs only four words of v, kept
// in registers. Its partial row sums (four dp4a per vector), eight at a time, are combined across
// the 16 lanes that share the rows by a reduce-scatter of shuffles, which leaves each thread two
// whole rows of the 256 to mix.
//
// Why this shape, on an H100 (3.35 TB/s, 132 SMs): at full bandwidth each SM must finish a step
// every ~2.6 us, and by Little's law hold ~15-25 KB of loads in flight all the time. One step of
// one walker is about 4 memory latencies of loading (a sliding window of WALK_WINDOW 16-byte
// loads per thread: 16 KB per walker in flight) and then ~2.3 us of serial hashing (five BLAKE3
// compressions of ~700 instructions, and the next ChaCha8, in one lane's time), in which the
// walker reads nothing. Eight walkers per SM (64 registers a thread: 8 x 128 x 64 fills the
// register file) leave, on average, several in their loading phase (up to 128 KB in flight per
// SM) while the others hash: about four times the steps an SM must finish at full bandwidth, so
// the loads queue at the memory and the walk is bound by it. Smaller blocks would mean more
// walkers but longer loading phases; larger ones, fewer walkers to cover the hashing.
//
// ChaCha8 and BLAKE3 run once per walker and step, so they are done by four lanes of one warp
// while the rest wait at a barrier, rather than spread over the block: splitting BLAKE3's four G
// functions over lanes saves issue slots but adds shuffle latency to a chain that is already the
// walker's critical path. The four lanes all hash (one lane's issue slots: SIMT), and then each
// makes one of the four 64-byte ChaCha blocks of the next step's v from the new state (~400
// instructions more on the chain; run under the first loads instead, they would hold registers
// that the loads need). The hash is the serial part of a step: the warp that hosts it changes
// with the walker and the step, so that the hashing of the eight walkers on an SM falls on all
// four of its schedulers instead of on the one that every block's warp 0 shares (one lane's
// ~4000 instructions a step would otherwise take most of that scheduler's issue slots at full
// bandwidth).
//
// The host launches one block per walker and may run a walk in several launches: `states` holds
// each walker's current state on entry and its state after `steps` steps on return, `first_step`
// numbers the launch's first step (the `t` of the mix), and every `checkpoint_every` steps the
// walker's state goes to `checkpoints`, laid out [walker][checkpoint] (steps / checkpoint_every
// states of 32 bytes per walker), so that one copy brings a launch's checkpoints back.
// `first_step` and `steps` should be multiples of `checkpoint_every` for the checkpoints to be
// the walk's s_{w, q c_w} (PROTOCOL.md 18.3). States are the digests' bytes as eight
// little-endian words. `pool` is P entries of 65536 bytes, entry e at byte e * 65536, 16-byte
// aligned. `version` (3 or 4) names the step's domain.
//
// Needs blake3.cu (ga_b3_compress) before it in the module. Uses only __ldg, __dp4a,
// __shfl_xor_sync and __syncthreads, which the host emulation (kernels/tests/
// cuda_kernels_on_host.rs) supplies, so it runs this exact source on the CPU against walk.rs
// and slice_walk.rs.

#define WALK_THREADS 128
#define WALK_MIN_BLOCKS 8
#define WALK_ENTRY_VECS 4096  // 16-byte vectors in one 65536-byte entry
#define WALK_VECS_PER_THREAD (WALK_ENTRY_VECS / WALK_THREADS)
#define WALK_WINDOW 8  // 16-byte loads in flight per thread: 16 KB per walker
#define WALK_NO_SUM ((int)0x80000000u)  // a value no partial row sum can take
#define WALK_CONTEXT_LEN 23  // "gpu-attest vV walk step"
#define WALK_VERSION_AT 12   // where V is in it
#define WALK_Z_AT (WALK_CONTEXT_LEN + 32)
#define WALK_MSG_LEN (WALK_Z_AT + 256)  // 311: five BLAKE3 blocks, the last of 55 bytes

// ChaCha8 block `counter` of stream 0 under `key` (rand_chacha's layout, as in chacha8.cu, whose
// block function lives inside its generator kernel). The walk test pins it against rand_chacha,
// since v enters every step.
#define GA_WALK_QR(a, b, c, d)                 \
    a += b; d = ga_rotr(d ^ a, 32 - 16);       \
    c += d; b = ga_rotr(b ^ c, 32 - 12);       \
    a += b; d = ga_rotr(d ^ a, 32 - 8);        \
    c += d; b = ga_rotr(b ^ c, 32 - 7);

__device__ __forceinline__ void ga_walk_chacha8_block(const u32 key[8], u32 counter, u32 out[16]) {
    u32 x[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u, key[0], key[1], key[2], key[3],
                 key[4],      key[5],      key[6],      key[7],      counter, 0u,    0u,     0u};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        GA_WALK_QR(x[0], x[4], x[8], x[12]);
        GA_WALK_QR(x[1], x[5], x[9], x[13]);
        GA_WALK_QR(x[2], x[6], x[10], x[14]);
        GA_WALK_QR(x[3], x[7], x[11], x[15]);
        GA_WALK_QR(x[0], x[5], x[10], x[15]);
        GA_WALK_QR(x[1], x[6], x[11], x[12]);
        GA_WALK_QR(x[2], x[7], x[8], x[13]);
        GA_WALK_QR(x[3], x[4], x[9], x[14]);
    }
    out[0] = x[0] + 0x61707865u;
    out[1] = x[1] + 0x3320646eu;
    out[2] = x[2] + 0x79622d32u;
    out[3] = x[3] + 0x6b206574u;
#pragma unroll
    for (int i = 0; i < 8; ++i) out[4 + i] = x[4 + i] + key[i];
    out[12] = x[12] + counter;
    out[13] = x[13];
    out[14] = x[14];
    out[15] = x[15];
}

#undef GA_WALK_QR

// Eight partial sums p[0..8) in each of the 16 lanes of a half warp -> the sum over the 16 lanes
// of p[l % 8], in lanes l and l ^ 8. Each of the first three rounds halves the values a lane
// holds: it keeps the half its lane bit selects and sends the other half to the partner that
// keeps it; the last adds the two halves of the group. 4 + 2 + 1 + 1 = 8 shuffles do what eight
// separate four-shuffle reductions would. Integer sums: any order is exact.
__device__ __forceinline__ int ga_walk_reduce8(int (&p)[8], u32 lane) {
#pragma unroll
    for (int half = 4; half >= 1; half /= 2) {
        const bool upper = (lane & half) != 0;
#pragma unroll
        for (int j = 0; j < half; ++j) {
            const int send = upper ? p[j] : p[j + half];
            const int keep = upper ? p[j + half] : p[j];
            p[j] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, half);
        }
    }
    return p[0] + __shfl_xor_sync(0xFFFFFFFFu, p[0], 8);
}

// Makes `s` the walker's state, and names the entry of its next step: le64(s[0..8]) mod P.
__device__ __forceinline__ void ga_walk_set_state(const u32 s[8], u32* state, u64 entries, u64* entry) {
#pragma unroll
    for (int i = 0; i < 8; ++i) state[i] = s[i];
    *entry = (((u64)s[1] << 32) | s[0]) % entries;
}

// Lane `lane` (0..3) of the hashing warp: block `lane` of the ChaCha8 keystream keyed by the
// state, as words 16 lane .. 16 lane + 15 of v, every byte | 1 (every v[c] odd, so every byte of
// the entry moves y).
__device__ __forceinline__ void ga_walk_vector(const u32 s[8], u32 lane, u32* v) {
    u32 block[16];
    ga_walk_chacha8_block(s, lane, block);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[16 * lane + i] = block[i] | 0x01010101u;
}

extern "C" __global__ void __launch_bounds__(WALK_THREADS, WALK_MIN_BLOCKS)
walk_steps(const i8* pool, u64 entries, u32* states, u32 first_step, u32 steps, u32 checkpoint_every,
           u32* checkpoints, u32 walkers, u32 version) {
    // The step hash's message, context || s || z, zero-padded to five whole blocks; written as
    // bytes (z[r] by the thread that owns row r), read as words by the hashing lanes.
    __shared__ __align__(16) u32 msg[80];
    __shared__ u32 state[8];
    __shared__ u32 v[64];
    __shared__ u64 entry;

    const u32 walker = blockIdx.x;
    if (walker >= walkers) {
        return;
    }
    const u32 tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    u8* const msg_bytes = (u8*)msg;
    if (tid < 4) {
        u32 s[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i] = states[(u64)walker * 8 + i];
        ga_walk_vector(s, tid, v);
        if (tid == 0) {
            const char context[WALK_CONTEXT_LEN + 1] = "gpu-attest v3 walk step";
            for (int i = 0; i < WALK_CONTEXT_LEN; ++i) msg_bytes[i] = (u8)context[i];
            msg_bytes[WALK_VERSION_AT] = (u8)('0' + version);
            for (int i = WALK_MSG_LEN; i < 320; ++i) msg_bytes[i] = 0;
            ga_walk_set_state(s, state, entries, &entry);
        }
    }
    __syncthreads();

    // Fibonacci hashing of the walker spreads the hashing warp over the SM's four schedulers even
    // when an SM's walkers are an arithmetic progression (blocks w, w + #SMs, ...).
    const u32 spread = (walker * 0x9E3779B9u) >> 30;
    const u32 column = tid % 16;  // this thread's 16 bytes of every row it reads: 16 * column..
    const u32 row_group = tid / 16;
    const uint4* const base = (const uint4*)pool + tid;

    for (u32 k = 0; k < steps; ++k) {
        const u32 t = first_step + k;
        const uint4* const src = base + entry * WALK_ENTRY_VECS;
        // A window of WALK_WINDOW loads: vector i + WALK_WINDOW is requested as vector i is
        // consumed. In the SASS (sm_90) the refills of a window issue after its dp4a have read
        // it, so the loads go out in batches of WALK_WINDOW: about four memory latencies a step
        // (the estimate in the header), not a window that never drains.
        uint4 window[WALK_WINDOW];
#pragma unroll
        for (int j = 0; j < WALK_WINDOW; ++j) window[j] = __ldg(src + j * WALK_THREADS);
        const int v0 = (int)v[4 * column], v1 = (int)v[4 * column + 1];
        const int v2 = (int)v[4 * column + 2], v3 = (int)v[4 * column + 3];
        // s into the message here, not by the lane that hashed it: the other hashing lanes may
        // still be reading the first block then.
        if (tid < 32) {
            msg_bytes[WALK_CONTEXT_LEN + tid] = (u8)(state[tid / 4] >> (8 * (tid % 4)));
        }
        // Four quarters of eight vectors (rows 64 q..64 q + 63). Eight partial sums at a time,
        // not sixteen or all 32, leave the registers to the loads in flight.
#pragma unroll
        for (u32 q = 0; q < WALK_VECS_PER_THREAD / 8; ++q) {
            int part[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const u32 i = 8 * q + j;
                const uint4 d = window[i % WALK_WINDOW];
                part[j] = __dp4a((int)d.w, v3, __dp4a((int)d.z, v2, __dp4a((int)d.y, v1, __dp4a((int)d.x, v0, 0))));
                // The refill waits for the vector it replaces: |part| <= 16 * 128 * 128 = 2^18,
                // so the test always passes, but it makes the load depend on the sum, and ptxas
                // can no longer hoist the step's later loads above it. Left free, ptxas hoists
                // as many loads as registers allow and then spills around them.
                if (i + WALK_WINDOW < WALK_VECS_PER_THREAD && part[j] != WALK_NO_SUM) {
                    window[i % WALK_WINDOW] = __ldg(src + (i + WALK_WINDOW) * WALK_THREADS);
                }
            }
            // Vector 8 q + j of this thread is row 8 (8 q + j) + row_group; after the reduction
            // lanes `column` and `column ^ 8` of the half warp both hold j = column % 8, and
            // they take turns to write it.
            const int y = ga_walk_reduce8(part, column);
            const u32 row = 64 * q + 8 * (column % 8) + row_group;
            if (column / 8 == q % 2) {
                msg_bytes[WALK_Z_AT + row] = (u8)ga_mix(y, t, row, 0);
            }
        }
        __syncthreads();

        // Lanes 0..3 of one warp all hash (the same instructions, so no more issue slots than
        // one lane), then each makes its quarter of the next step's v from the new state: no
        // further barrier, and nothing of either held in registers while loads are in flight.
        if (warp == ((spread + k) & 3) && lane < 4) {
            u32 cv[8];
            ga_b3_iv(cv);
            // One chunk (311 < 1024 bytes) of five blocks, chunk counter 0; the last block is
            // the root.
#pragma unroll 1
            for (int b = 0; b < 5; ++b) {
                u32 block[16];
#pragma unroll
                for (int i = 0; i < 16; ++i) block[i] = msg[16 * b + i];
                const u32 flags = (b == 0 ? GA_B3_CHUNK_START : 0u) | (b == 4 ? GA_B3_CHUNK_END | GA_B3_ROOT : 0u);
                ga_b3_compress(cv, block, 0, b == 4 ? WALK_MSG_LEN - 256 : 64, flags, cv);
            }
            ga_walk_vector(cv, lane, v);
            if (lane == 0) {
                ga_walk_set_state(cv, state, entries, &entry);
                // Worked out here, in one lane, rather than carried through the loop in
                // registers that the loads need.
                if (checkpoint_every != 0 && (k + 1) % checkpoint_every == 0) {
                    const u64 at = (u64)walker * (steps / checkpoint_every) + (k + 1) / checkpoint_every - 1;
#pragma unroll
                    for (int i = 0; i < 8; ++i) checkpoints[at * 8 + i] = cv[i];
                }
            }
        }
        __syncthreads();
    }
    if (tid < 8) {
        states[(u64)walker * 8 + tid] = state[tid];
    }
}
