// ChaCha8 matrix generation, bit-identical to rand_chacha's ChaCha8Rng:
// the original (djb) layout, words 12-13 a 64-bit block counter, words 14-15 the stream.
// Byte b of a matrix is byte b % 64 of block b / 64, so each thread writes one 64-byte block.
// shared/src/matrix.rs pins the same block function against rand_chacha on the CPU.

struct ChaChaKey {
    u32 w[8];
};

__device__ __forceinline__ u32 ga_rotl(u32 v, int c) {
    return (v << c) | (v >> (32 - c));
}

#define GA_QR(a, b, c, d)                 \
    a += b; d = ga_rotl(d ^ a, 16);       \
    c += d; b = ga_rotl(b ^ c, 12);       \
    a += b; d = ga_rotl(d ^ a, 8);        \
    c += d; b = ga_rotl(b ^ c, 7);

// Matrix z of the batch (blockIdx.y) uses stream first_stream + z * stream_stride: the A
// matrices of chains i..i+b are streams 2i, 2i+2, ...; their B matrices 2i+1, 2i+3, ...
extern "C" __global__ void chacha8_generate(u8* out, ChaChaKey key, u64 first_stream, u64 stream_stride,
                                            u64 blocks_per_matrix) {
    u64 block = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (block >= blocks_per_matrix) {
        return;
    }
    u64 stream = first_stream + stream_stride * (u64)blockIdx.y;
    u32 init[16];
    init[0] = 0x61707865u;
    init[1] = 0x3320646eu;
    init[2] = 0x79622d32u;
    init[3] = 0x6b206574u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        init[4 + i] = key.w[i];
    }
    init[12] = (u32)block;
    init[13] = (u32)(block >> 32);
    init[14] = (u32)stream;
    init[15] = (u32)(stream >> 32);

    u32 s0 = init[0], s1 = init[1], s2 = init[2], s3 = init[3];
    u32 s4 = init[4], s5 = init[5], s6 = init[6], s7 = init[7];
    u32 s8 = init[8], s9 = init[9], s10 = init[10], s11 = init[11];
    u32 s12 = init[12], s13 = init[13], s14 = init[14], s15 = init[15];
    // Eight rounds: four double rounds of a column round then a diagonal round.
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        GA_QR(s0, s4, s8, s12);
        GA_QR(s1, s5, s9, s13);
        GA_QR(s2, s6, s10, s14);
        GA_QR(s3, s7, s11, s15);
        GA_QR(s0, s5, s10, s15);
        GA_QR(s1, s6, s11, s12);
        GA_QR(s2, s7, s8, s13);
        GA_QR(s3, s4, s9, s14);
    }
    // Words are written little-endian, which is the GPU's byte order, as uint4 stores.
    uint4* dst = (uint4*)(out + ((u64)blockIdx.y * blocks_per_matrix + block) * 64);
    dst[0] = make_uint4(s0 + init[0], s1 + init[1], s2 + init[2], s3 + init[3]);
    dst[1] = make_uint4(s4 + init[4], s5 + init[5], s6 + init[6], s7 + init[7]);
    dst[2] = make_uint4(s8 + init[8], s9 + init[9], s10 + init[10], s11 + init[11]);
    dst[3] = make_uint4(s12 + init[12], s13 + init[13], s14 + init[14], s15 + init[15]);
}

#undef GA_QR
