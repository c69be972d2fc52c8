//! The locality walk's figures on this CPU (docs/design/locality.md section 5): the time of one
//! step over a pool in this process's memory (`t_l`), and what a step costs more when another
//! process serves its line over a pipe (`Delta`), from walks with 1% and 10% of the steps served
//! so (a walk with every step served so also idles the core between answers, which costs more).
//!
//! Then the cheaper crossing a cheater would choose: the walker moves. The pool is split by
//! slice between this process and another; a walker whose next line lies across the split sends
//! its state (32 bytes and the steps left) one way, and the other process walks on until the
//! walk crosses back. Over a pipe, and over TCP on loopback with both ends polling (the kernel's
//! network path, the least a host-to-host crossing without RDMA pays), at 10% and 50% of the
//! slices held across: each crossing's cost is the walk's time over the local steps', per
//! crossing.
//!
//!   cargo run --release -p gpu-attest-shared --example locality_latency -- [POOL_MIB] [STEPS]
//!
//! (defaults 4096 and 1000000). The pool is filled deterministically, so the serving process
//! (this binary again, `serve POOL_MIB`) holds the same bytes, and the walk's final state is
//! printed for each share: the same state every time, since every line is the same line
//! wherever it comes from.

use gpu_attest_shared::memory::locality::{LINE_BYTES, Line, State, mix64, step};
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Instant;

const SLICE: usize = 65536;
/// A migrating walker on the wire: its state's four words and the steps it has left.
const WALKER_BYTES: usize = 40;

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

/// Whether `slice` is held by the process across the split, for a share of `across_per_1024`.
fn held_across(slice: u64, across_per_1024: u64) -> bool {
    (mix64(slice ^ 0x5711) >> 54) < across_per_1024
}

/// Reads exactly `buf`; on a non-blocking stream, polls until it has (the cheater's choice: a
/// core spent waiting wakes sooner than one the kernel must wake).
fn read_polling(from: &mut impl Read, buf: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match from.read(&mut buf[got..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(read) => got += read,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `bytes`, polling while a non-blocking stream's buffer is full.
fn write_polling(to: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        match to.write(&bytes[sent..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(wrote) => sent += wrote,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    to.flush()
}

/// Walks a walker on while its lines are on this side (`mine(slice)`), at most its steps left;
/// returns its state and the steps still left.
fn walk_side(pool: &[u8], slices: u64, mut state: State, mut left: u64, mine: impl Fn(u64) -> bool) -> (State, u64) {
    while left > 0 {
        let line = state.names(slices);
        if !mine(line.slice) {
            break;
        }
        state = step(&state, line_of(pool, line));
        left -= 1;
    }
    (state, left)
}

fn encode(state: &State, left: u64) -> [u8; WALKER_BYTES] {
    let mut out = [0u8; WALKER_BYTES];
    for (word, bytes) in state.0.iter().zip(out.chunks_exact_mut(8)) {
        bytes.copy_from_slice(&word.to_le_bytes());
    }
    out[32..].copy_from_slice(&left.to_le_bytes());
    out
}

fn decode(bytes: &[u8; WALKER_BYTES]) -> (State, u64) {
    let word = |i: usize| u64::from_le_bytes(bytes[i * 8..][..8].try_into().expect("8 bytes"));
    (State([word(0), word(1), word(2), word(3)]), word(4))
}

/// The other side of a split: takes walkers that crossed, walks them over its slices, sends
/// them back when their next line is across or their steps are done.
fn serve_migrations(mib: usize, across_per_1024: u64, mut from: impl Read, mut to: impl Write) {
    let pool = fill(mib);
    let slices = (pool.len() / SLICE) as u64;
    let mut walker = [0u8; WALKER_BYTES];
    while read_polling(&mut from, &mut walker).is_ok() {
        let (state, left) = decode(&walker);
        let (state, left) = walk_side(&pool, slices, state, left, |s| held_across(s, across_per_1024));
        if write_polling(&mut to, &encode(&state, left)).is_err() {
            return;
        }
    }
}

/// One migrating walk of `steps` steps from this side; returns its time a step and its
/// crossings (each way counted).
fn migrating_walk(
    pool: &[u8],
    across_per_1024: u64,
    steps: u64,
    to: &mut impl Write,
    from: &mut impl Read,
) -> (f64, u64) {
    let slices = (pool.len() / SLICE) as u64;
    let mut state = State::start(&[1; 32], &[2; 32], &gpu_attest_shared::Digest([3; 32]), 0, 0);
    let mut left = steps;
    let mut crossings = 0;
    let mut walker = [0u8; WALKER_BYTES];
    let started = Instant::now();
    loop {
        (state, left) = walk_side(pool, slices, state, left, |s| !held_across(s, across_per_1024));
        if left == 0 {
            break;
        }
        write_polling(to, &encode(&state, left)).expect("the walker crosses");
        read_polling(from, &mut walker).expect("the walker comes back");
        (state, left) = decode(&walker);
        crossings += if left == 0 { 1 } else { 2 };
    }
    let ns = started.elapsed().as_secs_f64() * 1e9 / steps as f64;
    println!(
        "  {:.2} of the slices across: {ns:.1} ns a step, {crossings} crossings (final state {:016x})",
        across_per_1024 as f64 / 1024.0,
        state.0[0]
    );
    (ns, crossings)
}

/// The migrating walks: the other process holds the same bytes and serves the slices across.
fn migrations(mib: usize, pool: &[u8], local: f64, steps: u64) {
    let exe = std::env::current_exe().expect("this binary's path");
    let steps = (steps / 5).max(1);
    let mut least = f64::INFINITY;
    for across in [102u64, 512] {
        // A process per share: each holds its side of that split.
        let mut other = Command::new(&exe)
            .args(["migrate-pipe", &mib.to_string(), &across.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the other side starts");
        let mut to = BufWriter::new(other.stdin.take().expect("piped"));
        let mut from = other.stdout.take().expect("piped");
        let (ns, crossings) = {
            println!("the walker moves across the split, over a pipe:");
            migrating_walk(pool, across, steps, &mut to, &mut from)
        };
        let each = (ns - local) * steps as f64 / crossings.max(1) as f64;
        println!("  so a crossing costs {each:.1} ns");
        least = least.min(each);
        drop(to);
        let _ = other.wait();

        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        let mut other = Command::new(&exe)
            .args(["migrate-tcp", &mib.to_string(), &across.to_string(), &port.to_string()])
            .spawn()
            .expect("the other side starts");
        let (stream, _) = listener.accept().expect("the other side connects");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_nonblocking(true).expect("non-blocking");
        let (mut to, mut from) = (stream.try_clone().expect("a second handle"), stream);
        let (ns, crossings) = {
            println!("the walker moves across the split, over TCP on loopback, both ends polling:");
            migrating_walk(pool, across, steps, &mut to, &mut from)
        };
        let each = (ns - local) * steps as f64 / crossings.max(1) as f64;
        println!("  so a crossing costs {each:.1} ns");
        least = least.min(each);
        drop((to, from));
        let _ = other.wait();
    }
    println!(
        "the least one-way crossing {least:.1} ns ({:.1} t_l): `hop_ns` above it does not bound a split whose walkers move",
        least / local
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => return serve(args[2].parse().expect("POOL_MIB")),
        Some("migrate-pipe") => {
            let (stdin, stdout) = (std::io::stdin().lock(), std::io::stdout().lock());
            return serve_migrations(
                args[2].parse().expect("POOL_MIB"),
                args[3].parse().expect("SHARE"),
                stdin,
                stdout,
            );
        }
        Some("migrate-tcp") => {
            let port: u16 = args[4].parse().expect("PORT");
            let stream = TcpStream::connect(("127.0.0.1", port)).expect("the walking side listens");
            stream.set_nodelay(true).expect("nodelay");
            stream.set_nonblocking(true).expect("non-blocking");
            let to = stream.try_clone().expect("a second handle");
            return serve_migrations(
                args[2].parse().expect("POOL_MIB"),
                args[3].parse().expect("SHARE"),
                stream,
                to,
            );
        }
        _ => {}
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
    migrations(mib, &pool, local, steps);
}
