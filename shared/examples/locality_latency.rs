//! The locality walk's figures on this CPU (docs/design/locality.md section 5): the time of one
//! step over a pool in this process's memory (`t_l`), and what a step costs more when another
//! process serves its line over a pipe (`Delta`), from walks with 1% and 10% of the steps served
//! so (a walk with every step served so also idles the core between answers, which costs more).
//!
//!   cargo run --release -p gpu-attest-shared --example locality_latency -- [POOL_MIB] [STEPS]
//!
//! (defaults 4096 and 1000000). The pool is filled deterministically, so the serving process
//! (this binary again, `serve POOL_MIB`) holds the same bytes, and the walk's final state is
//! printed for each share: the same state every time, since every line is the same line
//! wherever it comes from.

use gpu_attest_shared::memory::locality::{LINE_BYTES, Line, State, mix64, step};
use std::io::{BufReader, BufWriter, Read, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

const SLICE: usize = 65536;

fn fill(mib: usize) -> Vec<u8> {
    let mut pool = vec![0u8; mib << 20];
    for (i, word) in pool.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&mix64(i as u64 ^ 0x5eed).to_le_bytes());
    }
    pool
}

fn line_of(pool: &[u8], line: Line) -> &[u8; LINE_BYTES] {
    line.of(&pool[line.slice as usize * SLICE..][..SLICE])
}

/// Serves lines of the pool: reads a slice (8 bytes) and a line (4 bytes), answers its 256.
fn serve(mib: usize) {
    let pool = fill(mib);
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = std::io::stdout().lock();
    let mut request = [0u8; 12];
    while input.read_exact(&mut request).is_ok() {
        let line = Line {
            slice: u64::from_le_bytes(request[..8].try_into().unwrap()),
            line: u32::from_le_bytes(request[8..].try_into().unwrap()),
        };
        if output
            .write_all(line_of(&pool, line))
            .and_then(|()| output.flush())
            .is_err()
        {
            return;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        return serve(args[2].parse().expect("POOL_MIB"));
    }
    let mib: usize = args.get(1).map_or(4096, |a| a.parse().expect("POOL_MIB"));
    let steps: u64 = args.get(2).map_or(1_000_000, |a| a.parse().expect("STEPS"));
    let pool = fill(mib);
    let slices = (pool.len() / SLICE) as u64;

    let mut server = Command::new(std::env::current_exe().unwrap())
        .args(["serve", &mib.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the serving process starts");
    let mut to_server = BufWriter::new(server.stdin.take().unwrap());
    let mut from_server = server.stdout.take().unwrap();

    let mut walk = |remote_per_1024: u64, steps: u64| {
        let mut state = State::start(&[1; 32], &[2; 32], &gpu_attest_shared::Digest([3; 32]), 0, 0);
        let mut fetched = [0u8; LINE_BYTES];
        let started = Instant::now();
        for _ in 0..steps {
            let line = state.names(slices);
            let bytes = if (state.0[2] >> 54) % 1024 < remote_per_1024 {
                let mut request = [0u8; 12];
                request[..8].copy_from_slice(&line.slice.to_le_bytes());
                request[8..].copy_from_slice(&line.line.to_le_bytes());
                to_server.write_all(&request).unwrap();
                to_server.flush().unwrap();
                from_server.read_exact(&mut fetched).unwrap();
                &fetched
            } else {
                line_of(&pool, line)
            };
            state = step(&state, bytes);
        }
        let ns = started.elapsed().as_secs_f64() * 1e9 / steps as f64;
        println!(
            "remote share {:.4}: {ns:.1} ns a step over {steps} steps (final state {:016x})",
            remote_per_1024 as f64 / 1024.0,
            state.0[0]
        );
        ns
    };

    println!("pool {mib} MiB in this process; another process serves the same bytes over a pipe");
    walk(0, steps / 10); // warm: page the pool in
    let local = walk(0, steps);
    let remote = walk(1024, (steps / 20).max(1));
    let delta = remote - local;
    let shares = [10u64, 102];
    let mixed: Vec<f64> = shares.iter().map(|&s| walk(s, (steps / 5).max(1))).collect();
    // Every step remote leaves this core idle between answers, and waking it costs more than
    // the hop: the hop a cheater pays is the one measured among local steps.
    println!("every step remote: {remote:.1} ns a step ({delta:.1} ns over a local one)");
    let mut least = f64::INFINITY;
    for (&share, measured) in shares.iter().zip(&mixed) {
        let x = share as f64 / 1024.0;
        let hop = (measured - local) / x;
        least = least.min(hop);
        println!("share {x:.4}: {measured:.1} ns a step, so a hop costs {hop:.1} ns");
    }
    println!(
        "t_l {local:.1} ns; the least hop {least:.1} ns ({:.1} t_l); caught at slack 1.25 when the share served elsewhere exceeds {:.2}%",
        least / local,
        100.0 * 0.25 * local / least
    );
    drop(to_server);
    let _ = server.wait();
}
