//! Plays the grinding cheater of docs/design/protocol-v4.md 6.2 on an abstract walk and sets the
//! share of steps it had to fake beside `memory::bound::least_faked_share` at the same budget of
//! device reads. The bound must come out at or below the simulated share (in the cheater's
//! favour); if a change of the strategy here ever beats it, the openings are sized too small.
//!
//! The walk: each step's slice is missing with probability `x`, independently (indices are hash
//! outputs). A miss is served from another source while the served share stays under `x*`, or
//! faked. After a fake the cheater chooses the next state: it grinds candidates, each of whose
//! first index it sees free, reading held slices to see the indices after it, until a candidate
//! gives `run + 1` held steps in a row; the reads of discarded candidates are wasted.

use gpu_attest_shared::memory::bound::least_faked_share;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

struct Outcome {
    faked_share: f64,
    device_reads_per_step: f64,
}

fn play(x: f64, x_star: f64, run: u32, steps_wanted: u64, seed: u64) -> Outcome {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut missing = move || (rng.next_u64() as f64 / u64::MAX as f64) < x;
    let (mut steps, mut fakes, mut served, mut reads) = (0u64, 0u64, 0u64, 0u64);
    while steps < steps_wanted {
        if !missing() {
            reads += 1;
            steps += 1;
        } else if (served as f64) < x_star * steps as f64 + 1.0 {
            served += 1; // from another source, not the device's bandwidth
            steps += 1;
        } else {
            fakes += 1;
            steps += 1;
            loop {
                let mut held = 0;
                while held < run + 1 && !missing() {
                    held += 1;
                    if held <= run {
                        reads += 1;
                    }
                }
                if held == run + 1 {
                    break;
                }
            }
            steps += u64::from(run) + 1;
            reads += 1;
        }
    }
    Outcome {
        faked_share: fakes as f64 / steps as f64,
        device_reads_per_step: reads as f64 / steps as f64,
    }
}

fn main() {
    let steps = 4_000_000;
    println!("| x | x* | run | device reads per step | faked share, played | bound at that budget | bound <= played |");
    println!("|---|---|---|---|---|---|---|");
    for (x, x_star) in [(0.0625, 0.0525), (0.0625, 0.0324), (0.0625, 0.0226), (0.10, 0.0504)] {
        for run in [10, 20, 30, 40] {
            let outcome = play(x, x_star, run, steps, u64::from(run));
            let Some(bound) = least_faked_share(x, x_star, outcome.device_reads_per_step.max(1.0)) else {
                continue;
            };
            println!(
                "| {:.2}% | {:.2}% | {run} | {:.3} | {:.4}% | {:.4}% | {} |",
                x * 100.0,
                x_star * 100.0,
                outcome.device_reads_per_step,
                outcome.faked_share * 100.0,
                bound * 100.0,
                if bound <= outcome.faked_share { "yes" } else { "NO" },
            );
        }
    }
}
