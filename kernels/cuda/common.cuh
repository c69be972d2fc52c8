// Definitions every gpu-attest kernel shares. NVRTC compiles each module from this header
// followed by the kernel file (see kernels/src/kernels.rs), so nothing here may rely on
// system headers: NVRTC has none.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef unsigned char u8;

// mix(y, k, row, col) from PROTOCOL.md "Chain": the top byte of a 32-bit avalanche of
// y ^ k*phi ^ ((row << 16) | col) * 0x85EBCA6B, where (row, col) is the element's place in its
// n x n matrix. Must stay bit-identical to shared/src/mix.rs.
__device__ __forceinline__ i8 ga_mix(int y, u32 k, u32 row, u32 col) {
    u32 x = ((u32)y) ^ (k * 0x9E3779B9u) ^ (((row << 16) | col) * 0x85EBCA6Bu);
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    return (i8)(x >> 24);
}
