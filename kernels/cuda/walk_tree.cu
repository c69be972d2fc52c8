// Version 4's walker trees (PROTOCOL.md 20.4) on the device, bit-identical to the kept trace and
// the walker roots of shared/src/memory/slice_walk.rs. Every state s_0 ..= s_L of a walker is a
// leaf of its Merkle tree (PROTOCOL.md 7: leaf node blake3(0x00 || s), inner node
// blake3(0x01 || left || right), an odd last node promoted unchanged). The walk kernel
// (walk.cu, with checkpoint_every = 1) writes every state of a launch; these kernels fold them,
// so that no state crosses to the host before the walk root is signed:
//
// - walk_blocks: one thread per walker and block of 64 states (s_{64b} ..= s_{64b+63}, the last
//   block holding what is left, L % 64 + 1 states): the block's first state and its node, the
//   root of its states' subtree. With the odd node promoted at every level, that is exactly the
//   walker tree's node at level 6 (`MerkleTree::over_nodes`), so the blocks are what a miner
//   keeps to open any step by walking at most three blocks again.
// - walk_roots: one thread per walker: the tree over its blocks' nodes, the walker's root.
//
// A tree is folded as a stack of the right edge: leaf k enters at level 0 and merges upward
// while bit `level` of k is set; at the end the nodes left on the edge are combined from the
// lowest level up, the higher (left) one always on the left. That is the tree of section 7: its
// left subtree at every node holds the largest power of two of leaves below the node's whole.
//
// Walks are cut into launches; the blocks of a launch are those that end inside it, so the host
// launches walk_blocks after each walk launch that starts on a multiple of 64 and takes a
// multiple of 64 steps (the last may take the rest).
//
// Needs blake3.cu (ga_b3_compress, ga_b3_iv) before it. No shared memory and no barriers: the host
// emulation (kernels/tests/cuda_kernels_on_host.rs) runs it one thread at a time.

#define TREE_THREADS 128
#define TREE_BLOCK_STATES 64
#define TREE_BLOCK_LEVELS 6   // log2(TREE_BLOCK_STATES)
#define TREE_ROOT_LEVELS 15   // a walker has at most 2^20 / 64 + 1 blocks: 15 levels above them

// blake3(prefix || a || b), b optional: a leaf node (prefix 0, a the state: 33 bytes, one block)
// or an inner node (prefix 1: 65 bytes, a block and one byte). The message's words are its
// bytes shifted by the prefix: word i is byte 4i - 1 of a || b (from the word before) and its
// bytes 4i .. 4i + 2.
__device__ __forceinline__ void ga_tree_node(u32 prefix, const u32 a[8], const u32* b, u32 out[8]) {
    u32 src[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) src[i] = a[i];
#pragma unroll
    for (int i = 0; i < 8; ++i) src[8 + i] = b ? b[i] : 0u;
    u32 words[17];
    words[0] = (src[0] << 8) | prefix;
#pragma unroll
    for (int i = 1; i < 16; ++i) words[i] = (src[i] << 8) | (src[i - 1] >> 24);
    words[16] = src[15] >> 24;
    u32 cv[8];
    ga_b3_iv(cv);
    if (!b) {
        // 33 bytes: words 0..8 (word 8 is the state's last byte alone), the rest of the block zero.
        u32 block[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) block[i] = i <= 8 ? words[i] : 0u;
        ga_b3_compress(cv, block, 0, 33, GA_B3_CHUNK_START | GA_B3_CHUNK_END | GA_B3_ROOT, out);
        return;
    }
    ga_b3_compress(cv, words, 0, 64, GA_B3_CHUNK_START, cv);
    u32 last[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) last[i] = i == 0 ? words[16] : 0u;
    ga_b3_compress(cv, last, 0, 1, GA_B3_CHUNK_END | GA_B3_ROOT, out);
}

__device__ __forceinline__ void ga_tree_copy(const u32* from, u32* to) {
#pragma unroll
    for (int i = 0; i < 8; ++i) to[i] = from[i];
}

// Pushes node `node` (already a node: hashed as a leaf, or a subtree's root), the k-th of its
// level's run, onto `edge`, merging upward while bit `level` of k is set. Returns nothing: the
// edge holds at level l the root of the last complete run of 2^l nodes.
__device__ __forceinline__ void ga_tree_push(u32 (*edge)[8], u32 k, u32 node[8]) {
    int level = 0;
    while (k & 1u) {
        ga_tree_node(1u, edge[level], node, node);
        k >>= 1;
        ++level;
    }
    ga_tree_copy(node, edge[level]);
}

// The root of `count` (>= 1) nodes pushed onto `edge`: the nodes left on it, combined from the
// lowest level up.
__device__ __forceinline__ void ga_tree_finish(u32 (*edge)[8], u32 count, int levels, u32 root[8]) {
    bool any = false;
    for (int level = 0; level < levels; ++level) {
        if (!((count >> level) & 1u)) {
            continue;
        }
        if (any) {
            ga_tree_node(1u, edge[level], root, root);
        } else {
            ga_tree_copy(edge[level], root);
            any = true;
        }
    }
}

// The blocks that end in one walk launch. `firsts` holds each walker's state s_{first_step}
// (8 words), `states` the launch's states laid out [walker][steps]: s_{first_step + 1} ..=
// s_{first_step + steps}. `first_step` is a multiple of 64, and so is `steps` unless the launch
// ends the walk (first_step + steps == walk_steps, L). Block b of walker w goes to
// block_starts and block_nodes at [w][b], `blocks` (floor(L / 64) + 1) per walker.
extern "C" __global__ void __launch_bounds__(TREE_THREADS)
walk_blocks(const u32* firsts, const u32* states, u32 first_step, u32 steps, u32 walk_steps, u32 walkers,
            u32 blocks, u32* block_starts, u32* block_nodes) {
    const bool last_launch = first_step + steps == walk_steps;
    // Blocks whose states all lie in this launch: those starting before its last state, and,
    // in the walk's last launch, the one that holds s_L alone when 64 divides L.
    const u32 first_block = first_step / TREE_BLOCK_STATES;
    const u32 launch_blocks = last_launch ? walk_steps / TREE_BLOCK_STATES + 1 - first_block : steps / TREE_BLOCK_STATES;
    const u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (thread >= (u64)walkers * launch_blocks) {
        return;
    }
    const u32 walker = (u32)(thread / launch_blocks);
    const u32 b = first_block + (u32)(thread % launch_blocks);
    const u32 from = b * TREE_BLOCK_STATES;
    const u32 left = walk_steps + 1 - from;
    const u32 count = left < TREE_BLOCK_STATES ? left : TREE_BLOCK_STATES;
    u32 edge[TREE_BLOCK_LEVELS + 1][8];
    for (u32 k = 0; k < count; ++k) {
        const u32 t = from + k;
        const u32* s = t == first_step ? firsts + (u64)walker * 8 : states + ((u64)walker * steps + (t - first_step - 1)) * 8;
        u32 state[8], node[8];
        ga_tree_copy(s, state);
        if (k == 0) {
            ga_tree_copy(state, block_starts + ((u64)walker * blocks + b) * 8);
        }
        ga_tree_node(0u, state, 0, node);
        ga_tree_push(edge, k, node);
    }
    u32 root[8];
    ga_tree_finish(edge, count, TREE_BLOCK_LEVELS + 1, root);
    ga_tree_copy(root, block_nodes + ((u64)walker * blocks + b) * 8);
}

// Each walker's root: the tree over its `blocks` nodes ([walker][block] in block_nodes), into
// roots[walker].
extern "C" __global__ void __launch_bounds__(TREE_THREADS)
walk_roots(const u32* block_nodes, u32 blocks, u32 walkers, u32* roots) {
    const u32 walker = blockIdx.x * blockDim.x + threadIdx.x;
    if (walker >= walkers) {
        return;
    }
    u32 edge[TREE_ROOT_LEVELS + 1][8];
    for (u32 k = 0; k < blocks; ++k) {
        u32 node[8];
        ga_tree_copy(block_nodes + ((u64)walker * blocks + k) * 8, node);
        ga_tree_push(edge, k, node);
    }
    u32 root[8];
    ga_tree_finish(edge, blocks, TREE_ROOT_LEVELS + 1, root);
    ga_tree_copy(root, roots + (u64)walker * 8);
}
