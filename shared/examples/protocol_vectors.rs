//! Prints the known-answer test vectors of PROTOCOL.md, computed with the naive oracle only
//! (no fast GEMM), so the vectors stand on the definition itself.
//!
//! `cargo run -p gpu-attest-shared --example protocol_vectors`

use gpu_attest_shared::Work;
use gpu_attest_shared::chain::{ChainResult, leaf_hash};
use gpu_attest_shared::commitment::{DeviceRoot, global_checksum};
use gpu_attest_shared::matrix::{generate_a, generate_b};
use gpu_attest_shared::merkle::{MerkleTree, empty_root, root_of};
use gpu_attest_shared::mix::mix;
use gpu_attest_shared::partition::canonical_partition;
use gpu_attest_shared::reference;
use gpu_attest_shared::vectors::vector_params;

fn main() {
    let params = vector_params();
    let work = Work::new(params).expect("valid");
    let n = work.n();
    println!("key            {}", hex::encode(work.key()));
    let (a0, b0, a4) = (
        generate_a(work.key(), 0, n),
        generate_b(work.key(), 0, n),
        generate_a(work.key(), 4, n),
    );
    println!("A_0[0..16]     {}", hex::encode(&a0.as_bytes()[..16]));
    println!("B_0[0..16]     {}", hex::encode(&b0.as_bytes()[..16]));
    println!("A_4[0..16]     {}", hex::encode(&a4.as_bytes()[..16]));
    for (y, k, row, col) in [
        (0i32, 0u32, 0u32, 0u32),
        (1, 0, 0, 0),
        (-1, 7, 0, 0),
        (-1, 7, 0, 1),
        (-1, 7, 1, 0),
        (123_456_789, 3, 5, 9),
        (i32::MIN, u32::MAX, 8191, 8191),
    ] {
        println!("mix({y}, {k}, {row}, {col}) = {}", mix(y, k, row, col));
    }
    let chains: Vec<ChainResult> = (0..work.num_chains()).map(|i| reference::chain(&work, i)).collect();
    for (j, h) in chains[0].checkpoints.iter().enumerate() {
        println!("h_0,{j}          {h}");
    }
    let leaves: Vec<_> = chains.iter().map(|c| leaf_hash(c.index, &c.checkpoints)).collect();
    for (i, leaf) in leaves.iter().enumerate() {
        println!("leaf_{i}         {leaf}");
    }
    for (j, h) in chains[1].checkpoints.iter().enumerate() {
        println!("h_1,{j}          {h}");
    }
    let tree = MerkleTree::new(&leaves);
    for chain in [1, 4] {
        let siblings = tree.proof(chain).expect("a leaf of the tree").siblings;
        let siblings: Vec<String> = siblings.iter().map(|s| s.to_hex()).collect();
        println!("d=1 proof of chain {chain}: {}", siblings.join(", "));
    }
    println!("empty root     {}", empty_root());
    for d in [1u32, 2, 3, 8] {
        let devices: Vec<DeviceRoot> = canonical_partition(work.num_chains(), d)
            .unwrap()
            .into_iter()
            .map(|slice| DeviceRoot {
                slice,
                root: root_of(&leaves[slice.offset as usize..(slice.offset + slice.count) as usize]),
            })
            .collect();
        for dev in &devices {
            println!(
                "d={d} device {} offset {} count {} root {}",
                dev.slice.index, dev.slice.offset, dev.slice.count, dev.root
            );
        }
        println!("d={d} G        {}", global_checksum(&params.nonce, &devices));
    }
    memory_vectors(&work);
}

/// PROTOCOL.md 18.7: the memory phase on section 12's challenge, naively.
fn memory_vectors(work: &Work) {
    use gpu_attest_shared::memory::pool::entry_leaf;
    use gpu_attest_shared::memory::walk::WalkSpec;
    use gpu_attest_shared::memory::{MemoryParams, PoolSpec};
    let pool = PoolSpec::new(work, 0, 4 * 65536, 1000).expect("a pool of 4 entries");
    println!("pool_key_0     {}", hex::encode(pool.key()));
    let entries = reference::pool(&pool);
    println!("E_0,0[0..16]   {}", hex::encode(&entries[0].as_bytes()[..16]));
    let leaves: Vec<_> = entries.iter().map(|e| entry_leaf(e.as_bytes())).collect();
    for (e, leaf) in leaves.iter().enumerate() {
        println!("pool leaf {e}    {leaf}");
    }
    let spec = WalkSpec {
        nonce: work.params().nonce,
        walk_seed: core::array::from_fn(|i| 0x60 + i as u8),
        device: 0,
        pool_root: root_of(&leaves),
        entries: pool.entries(),
        params: MemoryParams {
            pool_permille: 1000,
            walkers: 3,
            walk_steps: 16,
            walk_checkpoint_every: 4,
        },
    };
    println!("pool_root_0    {}", spec.pool_root);
    let start = spec.start_state(0);
    let e = u64::from_le_bytes(start.0[..8].try_into().expect("8 bytes")) % pool.entries();
    println!("s_0,0          {start}");
    println!("step 0 reads   entry {e}");
    println!(
        "s_0,1          {}",
        reference::walk_step(&entries[e as usize], &start, 0)
    );
    let traces: Vec<_> = (0..spec.params.walkers)
        .map(|w| reference::walk(&spec, &entries, w))
        .collect();
    for (q, s) in traces[0].checkpoints.iter().enumerate() {
        println!("s_0,{:<2}         {s}", 4 * q);
    }
    let walk_leaves: Vec<_> = traces.iter().map(|t| t.leaf()).collect();
    for (w, leaf) in walk_leaves.iter().enumerate() {
        println!("walk leaf {w}    {leaf}");
    }
    println!("walk_root_0    {}", root_of(&walk_leaves));
}
