//! `locality_openings`: what a locality opening round costs the miner (PROTOCOL.md 20.10): the
//! validator's default 16 segments of 256 lines, each line with its 1 KiB chunk and the chunk's
//! path to its state's hash, over a CPU pool of random states at the challenge sizes.
//!
//! The round shares one `ChunkPaths`, as the miner does, so each state's slices are hashed once
//! and a line's path costs its own slice. The validator allows the round about 4.8 s at its
//! defaults (its give-up plus 100 ms a segment); cutting every path from the whole state took
//! 18 s at n = 1024 and 70 s at n = 2048 (docs/benchmarks/2026-11-29-locality-moves.md).
//! Run with `cargo bench -p gpu-attest-shared --bench locality_openings`.

use gpu_attest_shared::CancelToken;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::matrix::generate;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::locality::{ChunkPaths, LocalityWalk, open_segment, walk_lines};
use gpu_attest_shared::memory::slice_walk::HeldStates;
use gpu_attest_shared::merkle::MerkleTree;
use std::time::Instant;

/// (n, states in the pool): the CPU default, then larger states and a pool of 2 GiB.
const CASES: [(usize, u64); 4] = [(256, 256), (1024, 64), (2048, 64), (2048, 512)];
const SEGMENTS: u32 = 16;
const STEPS: u32 = 256;

fn main() {
    println!("locality opening round: {SEGMENTS} segments of {STEPS} lines, one ChunkPaths");
    for (n, chains) in CASES {
        let states = (0..chains).map(|i| generate(&[7; 32], i, n)).collect();
        let pool = ChainPool::new(0, 0, chains, n).expect("a pool of whole slices");
        let held = HeldStates::new(pool, states).expect("one state a chain");
        let walk = LocalityWalk {
            nonce: [1; 32],
            seed: [2; 32],
            global: Digest([3; 32]),
            walkers: 1,
            generations: 4 * SEGMENTS,
            steps: STEPS,
        };
        let walked = walk_lines(&walk, &held, &CancelToken::new()).expect("the walk");
        // The chains' checkpoints and proofs are the miner's own and cost nothing here.
        let leaves: Vec<Digest> = (0..chains).map(|i| Digest([i as u8; 32])).collect();
        let tree = MerkleTree::new(&leaves);
        let chain = |i: u64| (vec![Digest([0; 32])], tree.proof(i).expect("a chain of the pool"));
        let paths = ChunkPaths::default();
        let started = Instant::now();
        for g in 0..SEGMENTS {
            open_segment(&walk, &held, &walked, (4 * g, 0), &chain, &paths)
                .expect("the segment opens")
                .expect("the segment is in the walk");
        }
        println!(
            "n = {n:>4}, {chains:>3} states ({:>4} MiB): {:.3} s",
            (chains * (n * n) as u64) >> 20,
            started.elapsed().as_secs_f64()
        );
    }
}
