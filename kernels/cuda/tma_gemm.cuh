// What the persistent TMA GEMM kernels share (gemm_tma.cu, the cooperative schedule, and
// gemm_pingpong.cu): a k-tile's wgmma, the order of the output tiles, and the producers that load
// them (a block's own, and that of a block in a cluster of two sharing Bt). Both read
// X and Bt through 3-d tensor maps (k, rows, matrices; kernels/src/tma.rs) in boxes of TMA_BK
// bytes of k, and both keep a stage as A (the tile's X rows) then B (its Bt rows), each box in
// the 128-byte swizzle wgmma's descriptors read.

// Bytes of k a box and a stage cover: the most the 128-byte swizzle allows (tma.rs's BOX_K).
#define TMA_BK 128

// One k-tile of a stage, on the tensor cores: the warpgroup's four wgmma.m64n256k32 over its
// TMA_BK bytes of k, from the stage's descriptors (the first stage's, plus the stage's offset /
// 16), committed as one group. The accumulators are fenced first, so that the compiler neither
// moves them nor reads them while the group may still write them.
__device__ __forceinline__ void tma_mma_ktile(int (&acc)[128], u64 a_desc, u64 b_desc) {
    wg_fence_operand(acc);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < TMA_BK / 32; ++kk) {
        wg_mma_m64n256k32(acc, a_desc + kk * 2, b_desc + kk * 2);
    }
    wg_commit();
}

// The output tile `tile` of a batch: matrix, first row, first column. Row tiles vary fastest,
// so the blocks running at one time share their B columns (the larger operand) in L2.
struct tma_tile {
    int matrix, row0, col0;
};

template <int BM, int BN>
__device__ __forceinline__ tma_tile tma_tile_at(u32 tile, int n) {
    const u32 rows = (u32)(n + BM - 1) / BM;
    const u32 cols = (u32)(n + BN - 1) / BN;
    const u32 in_matrix = tile % (rows * cols);
    tma_tile t;
    t.matrix = (int)(tile / (rows * cols));
    t.row0 = (int)(in_matrix % rows) * BM;
    t.col0 = (int)(in_matrix / rows) * BN;
    return t;
}

// The producer's one thread: every k-tile of every tile of this block (blockIdx.x, then a grid's
// width further on each time), in order, into the STAGES stages of (BM + BN) x TMA_BK bytes as
// the consumers free them. Each stage's `full` barrier gets one arrival announcing the stage's
// bytes, then both boxes count against it; `empty` is waited on with the parity opposite the
// consumers' `full` waits, so the first pass over the stages does not wait.
template <int BM, int BN, int STAGES>
__device__ __forceinline__ void tma_produce(const ga_tensor_map* x_map, const ga_tensor_map* bt_map, u8* smem,
                                            u64* full, u64* empty, int n, u32 tiles) {
    const int stage_bytes = (BM + BN) * TMA_BK;
    const int ktiles = (n + TMA_BK - 1) / TMA_BK;
    int stage = 0;
    u32 phase = 0;
    for (u32 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const tma_tile t = tma_tile_at<BM, BN>(tile, n);
        for (int kt = 0; kt < ktiles; ++kt) {
            ga_mbar_wait(&empty[stage], phase ^ 1);
            u8* a = smem + stage * stage_bytes;
            ga_mbar_arrive_expect_tx(&full[stage], stage_bytes);
            ga_tma_load_3d(a, x_map, &full[stage], kt * TMA_BK, t.row0, t.matrix);
            ga_tma_load_3d(a + BM * TMA_BK, bt_map, &full[stage], kt * TMA_BK, t.col0, t.matrix);
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}

// The producer of one block of a cluster of two that share their Bt rows (gemm_pingpong.cu's
// multicast kernel): the cluster takes output tiles of 2 BM x BN (cluster c of the grid's
// gridDim.x / 2: tiles c, c + gridDim.x / 2, ...), the block of rank r their rows r * BM..; a
// stage holds the block's BM rows of X and all BN rows of Bt. Each block loads its own X box and
// half of the Bt rows (BN / 2 from col0 + r * BN / 2), multicast into the same place in both
// blocks' stages and counted against both blocks' `full` barriers: each stage's Bt is read from
// L2 once for the two blocks. Both blocks load the same tiles' k-tiles in the same order, so a
// stage holds the same k-tile in both, and a block refills it only once the consumers of both
// have freed it (each block's `empty` counts the arrivals of both blocks' consumer warps, and is
// waited on at cluster scope, pairing with the other block's releases).
// Afterwards the producer waits until every stage has been freed once more: the other block's
// consumers arrive on this block's barriers, and must have done so before this block exits.
template <int BM, int BN, int STAGES>
__device__ __forceinline__ void tma_produce_pair(const ga_tensor_map* x_map, const ga_tensor_map* bt_map,
                                                 u8* smem, u64* full, u64* empty, int n, u32 tiles, u32 rank) {
    const int stage_bytes = (BM + BN) * TMA_BK;
    const int half_bytes = (BN / 2) * TMA_BK;
    const int ktiles = (n + TMA_BK - 1) / TMA_BK;
    int stage = 0;
    u32 phase = 0;
    for (u32 tile = blockIdx.x / 2; tile < tiles; tile += gridDim.x / 2) {
        const tma_tile t = tma_tile_at<2 * BM, BN>(tile, n);
        for (int kt = 0; kt < ktiles; ++kt) {
            ga_mbar_wait<true>(&empty[stage], phase ^ 1);
            u8* a = smem + stage * stage_bytes;
            ga_mbar_arrive_expect_tx(&full[stage], stage_bytes);
            ga_tma_load_3d(a, x_map, &full[stage], kt * TMA_BK, t.row0 + (int)rank * BM, t.matrix);
            ga_tma_load_3d_multicast(a + BM * TMA_BK + (int)rank * half_bytes, bt_map, &full[stage], 0x3,
                                     kt * TMA_BK, t.col0 + (int)rank * (BN / 2), t.matrix);
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
    for (int s = 0; s < STAGES; ++s) {
        ga_mbar_wait<true>(&empty[stage], phase ^ 1);
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
}
