//! Freed memory goes back to the operating system, whichever thread made and freed it: a pool
//! (a buffer sized from a claim) when it is dropped, any large block once a daemon's `main`
//! has set the allocator up (`gpu_attest_daemon::allocator`), and small blocks freed below
//! ones still held once the daemon releases free memory on going idle.
//!
//! The failure this guards against was seen in the hour-long soak (BENCHMARKS.md): a miner
//! freed each 15 MiB pool after its round, yet its resident size kept growing by a pool at a
//! time. Once glibc has returned one large block with `munmap`, it raises its mmap threshold to
//! that block's size, so the next block of that size comes from a per-thread arena, which keeps
//! it when it is freed. Before either fix, the pool half of this test grew the process by
//! 110 MiB, and the heap half by 37.7 MiB.
//!
//! Why one test in a binary of its own: it measures the process's resident memory, which
//! anything running beside it would disturb, and the allocator setting is process-wide, so
//! the pools are measured before it is made.

#![cfg(target_os = "linux")]

use gpu_attest_shared::aligned::AlignedBytes;

/// The process's resident bytes, from the kernel's own count.
fn resident_bytes() -> u64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("Linux has /proc/self/smaps_rollup");
    let kib: u64 = rollup
        .lines()
        .find_map(|line| line.strip_prefix("Rss:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
        .expect("smaps_rollup has an Rss line in kB");
    kib * 1024
}

/// The soak's pool size.
const POOL_BYTES: usize = 15 << 20;

/// What `make_and_free` leaves resident after six rounds on fresh threads and six on this one.
fn grown_by_rounds(make_and_free: fn()) -> u64 {
    // A first round here, so the allocator has seen (and given back) one large block.
    make_and_free();
    let before = resident_bytes();
    for round in 0..6 {
        std::thread::Builder::new()
            .name(format!("round-{round}"))
            .spawn(make_and_free)
            .unwrap()
            .join()
            .unwrap();
        make_and_free();
    }
    let after = resident_bytes();
    println!("resident before {before} bytes, after 12 rounds {after} bytes");
    after.saturating_sub(before)
}

/// A pool-sized buffer, every page of it touched, then dropped.
fn pool_round() {
    let mut pool = AlignedBytes::try_zeroed(POOL_BYTES).expect("15 MiB is available");
    pool.as_mut_slice().fill(0xA5);
    assert!(pool.as_slice().iter().step_by(4096).all(|&b| b == 0xA5));
}

/// Heap blocks as a daemon makes them in a round (a large message, a smaller one), every page
/// touched, then freed.
fn heap_round() {
    let large = vec![0x5Au8; POOL_BYTES];
    let smaller = vec![0x3Cu8; 3 << 20];
    assert_eq!(std::hint::black_box(&large)[POOL_BYTES - 1], 0x5A);
    assert_eq!(std::hint::black_box(&smaller)[0], 0x3C);
}

/// Blocks under the mmap threshold, as a round makes them (a CPU miner's matrices), every page
/// touched; all but every eighth freed. The ones kept (a kept commitment, a connection's buffer)
/// sit above the freed ones, so the arena cannot give those back from its top.
fn fragmented_round() -> Vec<Vec<u8>> {
    const BLOCK_BYTES: usize = 1 << 20;
    let blocks: Vec<Vec<u8>> = (0..24u8).map(|i| vec![i | 1; BLOCK_BYTES]).collect();
    blocks
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 8 == 7)
        .map(|(_, block)| block)
        .collect()
}

#[test]
fn freed_pools_and_large_blocks_go_back_to_the_system() {
    println!("pools, before any allocator setting:");
    let grown = grown_by_rounds(pool_round);
    assert!(
        grown < (POOL_BYTES / 2) as u64,
        "resident memory grew by {grown} bytes after pools of {POOL_BYTES} bytes were dropped: \
         freed pools are kept instead of returned"
    );

    if !gpu_attest_daemon::allocator::return_freed_memory() {
        println!("heap half skipped: this allocator is not glibc's, and decides for itself");
        return;
    }
    println!("heap blocks, after the daemons' allocator setting:");
    let grown = grown_by_rounds(heap_round);
    assert!(
        grown < (POOL_BYTES / 2) as u64,
        "resident memory grew by {grown} bytes after heap blocks of up to {POOL_BYTES} bytes were \
         freed: the allocator keeps them instead of returning them"
    );

    println!("small blocks freed below kept ones, then released as a daemon does when it goes idle:");
    let before = resident_bytes();
    let kept = fragmented_round();
    let held = resident_bytes();
    let started = std::time::Instant::now();
    let released = gpu_attest_daemon::allocator::release_free_memory();
    let took = started.elapsed();
    let after = resident_bytes();
    let kept_bytes: u64 = kept.iter().map(|block| block.len() as u64).sum();
    println!(
        "resident before {before} bytes, with 24 MiB made and 21 MiB of it freed {held} bytes, \
         after the release {after} bytes (released: {released}, in {took:?})"
    );
    assert!(
        after.saturating_sub(before) < kept_bytes + (4 << 20),
        "resident memory stayed {} bytes above where it started after 21 MiB of blocks were freed \
         and the free memory released, with {kept_bytes} bytes still held: the release leaves \
         freed memory resident",
        after.saturating_sub(before)
    );
    drop(kept);
}
