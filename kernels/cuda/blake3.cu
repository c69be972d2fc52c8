// BLAKE3 of every n x n matrix of a batch, on the device, bit-identical to the blake3 crate's
// `blake3::hash` (PROTOCOL.md: checkpoints are blake3 of X's row-major bytes).
//
// A matrix is n^2 bytes, a multiple of 4096 (n is a multiple of 64), so it has at least four
// 1024-byte chunks and its root is always a parent node. `blake3_chunks` gives each chunk its
// own thread; `blake3_parents` then merges one tree level per launch, pairing nodes left to
// right and promoting an odd last node unchanged. That yields BLAKE3's tree, whose left subtree
// always holds the largest power-of-two number of chunks. The level with two nodes is the root.
//
// Kept free of shared memory and barriers so that kernels/tests/cuda_kernels_on_host.rs can run
// this exact source on the CPU, one emulated thread at a time, against the blake3 crate.

#define GA_B3_CHUNK_START 1u
#define GA_B3_CHUNK_END 2u
#define GA_B3_PARENT 4u
#define GA_B3_ROOT 8u

__device__ __forceinline__ u32 ga_rotr(u32 v, int c) {
    return (v >> c) | (v << (32 - c));
}

#define GA_B3_G(a, b, c, d, mx, my)  \
    a = a + b + (mx); d = ga_rotr(d ^ a, 16); \
    c = c + d; b = ga_rotr(b ^ c, 12);        \
    a = a + b + (my); d = ga_rotr(d ^ a, 8);  \
    c = c + d; b = ga_rotr(b ^ c, 7);

// The compression function; writes the 8-word chaining value (the first half of the output).
__device__ __forceinline__ void ga_b3_compress(const u32 cv[8], const u32 block[16], u64 counter, u32 block_len,
                                               u32 flags, u32 out[8]) {
    const u32 iv[4] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au};
    u32 s[16] = {cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
                 iv[0], iv[1], iv[2], iv[3], (u32)counter, (u32)(counter >> 32), block_len, flags};
    u32 m[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) m[i] = block[i];
    // Seven rounds, the message permuted between them.
    const int perm[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};
    for (int round = 0; round < 7; ++round) {
        GA_B3_G(s[0], s[4], s[8], s[12], m[0], m[1]);
        GA_B3_G(s[1], s[5], s[9], s[13], m[2], m[3]);
        GA_B3_G(s[2], s[6], s[10], s[14], m[4], m[5]);
        GA_B3_G(s[3], s[7], s[11], s[15], m[6], m[7]);
        GA_B3_G(s[0], s[5], s[10], s[15], m[8], m[9]);
        GA_B3_G(s[1], s[6], s[11], s[12], m[10], m[11]);
        GA_B3_G(s[2], s[7], s[8], s[13], m[12], m[13]);
        GA_B3_G(s[3], s[4], s[9], s[14], m[14], m[15]);
        u32 t[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) t[i] = m[perm[i]];
#pragma unroll
        for (int i = 0; i < 16; ++i) m[i] = t[i];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = s[i] ^ s[i + 8];
}

#undef GA_B3_G

__device__ __forceinline__ void ga_b3_iv(u32 cv[8]) {
    cv[0] = 0x6A09E667u; cv[1] = 0xBB67AE85u; cv[2] = 0x3C6EF372u; cv[3] = 0xA54FF53Au;
    cv[4] = 0x510E527Fu; cv[5] = 0x9B05688Cu; cv[6] = 0x1F83D9ABu; cv[7] = 0x5BE0CD19u;
}

// One thread per 1024-byte chunk of matrix blockIdx.y: its chaining value, 8 words, into cvs.
extern "C" __global__ void blake3_chunks(const u8* data, u64 matrix_bytes, u32* cvs) {
    const u64 chunks = matrix_bytes / 1024;
    const u64 chunk = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (chunk >= chunks) {
        return;
    }
    // Matrices and chunks start on 1024-byte boundaries: 16-byte loads are aligned.
    const uint4* src = (const uint4*)(data + (u64)blockIdx.y * matrix_bytes + chunk * 1024);
    u32 cv[8];
    ga_b3_iv(cv);
    for (int b = 0; b < 16; ++b) {
        u32 block[16];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint4 v = src[b * 4 + q];
            block[4 * q] = v.x;
            block[4 * q + 1] = v.y;
            block[4 * q + 2] = v.z;
            block[4 * q + 3] = v.w;
        }
        const u32 flags = (b == 0 ? GA_B3_CHUNK_START : 0u) | (b == 15 ? GA_B3_CHUNK_END : 0u);
        ga_b3_compress(cv, block, chunk, 64, flags, cv);
    }
    u32* dst = cvs + ((u64)blockIdx.y * chunks + chunk) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[i] = cv[i];
}

// One tree level of matrix blockIdx.y: node i of the next level is the parent of nodes 2i and
// 2i+1 of this one, or node 2i itself when it has no right sibling. With `root` set (this level
// has exactly two nodes) the parent is the root and its chaining value is the hash.
extern "C" __global__ void blake3_parents(const u32* in, u32* out, u64 in_count, u32 root) {
    const u64 out_count = (in_count + 1) / 2;
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= out_count) {
        return;
    }
    const u32* src = in + ((u64)blockIdx.y * in_count + 2 * i) * 8;
    u32* dst = out + ((u64)blockIdx.y * out_count + i) * 8;
    if (2 * i + 1 < in_count) {
        u32 block[16];
#pragma unroll
        for (int w = 0; w < 16; ++w) block[w] = src[w];
        u32 key[8];
        ga_b3_iv(key);
        u32 cv[8];
        ga_b3_compress(key, block, 0, 64, GA_B3_PARENT | (root ? GA_B3_ROOT : 0u), cv);
#pragma unroll
        for (int w = 0; w < 8; ++w) dst[w] = cv[w];
    } else {
#pragma unroll
        for (int w = 0; w < 8; ++w) dst[w] = src[w];
    }
}
