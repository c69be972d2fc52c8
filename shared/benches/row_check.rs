//! `row_check`: what one version 4 row check costs the validator (PROTOCOL.md 20.3, 20.9 step 6),
//! and what a round of them costs on one core and on every core.
//!
//! A row check makes the opened chain's `B` (`n^2` bytes of ChaCha8) and runs `K` vector-matrix
//! products from the row of `A`: at the planner's `K = 2^16 / n` that is `2^17 n` operations
//! whatever `n` is, beside the `B`. criterion measures one check; a summary then times the
//! round an H100's calibrated verdict checks (238 rows, each of its own chain) one after
//! another and spread over every core, as the validator now runs them. Run with
//! `cargo bench -p gpu-attest-shared --bench row_check`.

use criterion::{BenchmarkId, Criterion};
use gpu_attest_shared::memory::chain_pool::StateRows;
use gpu_attest_shared::params::{ChallengeParams, Work};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// (n, K): the planner's fewest steps at each size, `2^16 / n`.
const CASES: [(u32, u32); 3] = [(256, 256), (1024, 64), (2048, 32)];
/// Rows a calibrated H100 SXM verdict checks (PROTOCOL.md 20.9 step 6).
const ROUND: u64 = 238;

fn work(n: u32, iterations: u32) -> Work {
    Work::new(ChallengeParams {
        nonce: [1; 32],
        seed: [2; 32],
        miner_key: [3; 32],
        n,
        num_chains: ROUND,
        iterations,
        checkpoint_every: 1,
    })
    .expect("valid parameters")
}

/// One check: the chain's `B`, then one row.
fn check(work: &Work, chain: u64) -> Vec<i8> {
    StateRows::new(work, chain).row((chain % 64) as u32)
}

fn criterion_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("row_check");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    for (n, k) in CASES {
        let work = work(n, k);
        group.bench_with_input(BenchmarkId::new("one", format!("n{n}_k{k}")), &n, |bench, _| {
            bench.iter(|| check(black_box(&work), 0))
        });
    }
    group.finish();
}

fn round(work: &Work, threads: usize) -> Duration {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads as u64 {
            scope.spawn(move || {
                for chain in (t..ROUND).step_by(threads) {
                    black_box(check(work, chain));
                }
            });
        }
    });
    started.elapsed()
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("\n{ROUND} row checks, each of its own chain, best of 3:");
    println!("| n | K | one core, s | {cores} cores, s | speed-up |");
    println!("|---|---|---|---|---|");
    for (n, k) in CASES {
        let work = work(n, k);
        let best = |threads| (0..3).map(|_| round(&work, threads)).min().expect("three runs");
        let (one, all) = (best(1), best(cores));
        println!(
            "| {n} | {k} | {:.3} | {:.3} | {:.2}x |",
            one.as_secs_f64(),
            all.as_secs_f64(),
            one.as_secs_f64() / all.as_secs_f64()
        );
    }
}
