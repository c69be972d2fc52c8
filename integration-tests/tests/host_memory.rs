//! A buffer sized from a claim (a host memory pool) goes back to the operating system when it
//! is dropped, whichever thread made and dropped it.
//!
//! Why this is its own test binary: it measures the process's resident memory, which other
//! tests running beside it in the same process would disturb.
//!
//! The failure it guards against was seen in the hour-long soak (BENCHMARKS.md): a miner freed
//! each 15 MiB pool after its round, yet glibc kept the memory. After the first large block is
//! returned with `munmap`, glibc raises its mmap threshold to that block's size, so the next
//! pool of the same size comes from a per-thread arena, and an arena keeps freed memory below
//! its (equally raised) trim threshold. The miner's resident size then grew by one pool each
//! time a new rayon or tokio thread first filled one.

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

const POOL_BYTES: usize = 15 << 20;

/// Makes a pool-sized buffer, touches every page of it, and drops it.
fn fill_and_drop() {
    let mut pool = AlignedBytes::try_zeroed(POOL_BYTES).expect("15 MiB is available");
    pool.as_mut_slice().fill(0xA5);
    assert!(pool.as_slice().iter().step_by(4096).all(|&b| b == 0xA5));
    drop(pool);
}

#[test]
fn a_dropped_pool_returns_its_memory_from_any_thread() {
    // A first round on this thread, so the allocator has seen (and given back) one large block.
    fill_and_drop();
    let before = resident_bytes();
    for round in 0..6 {
        std::thread::Builder::new()
            .name(format!("pool-{round}"))
            .spawn(fill_and_drop)
            .unwrap()
            .join()
            .unwrap();
        fill_and_drop();
    }
    let after = resident_bytes();
    let grown = after.saturating_sub(before);
    println!("resident before {before} bytes, after 12 pools made and dropped {after} bytes");
    assert!(
        grown < (POOL_BYTES / 2) as u64,
        "resident memory grew by {grown} bytes after pools of {POOL_BYTES} bytes were dropped: \
         freed pools are being kept by the allocator instead of returned"
    );
}
