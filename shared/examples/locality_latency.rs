//! The locality walk's figures on this CPU (docs/design/locality.md section 5): the time of one
//! step over a pool in this process's memory (`t_l`), and what a step costs more when another
//! process serves its line over a pipe (`Delta`), from walks with 1% and 10% of the steps served
//! so (a walk with every step served so also idles the core between answers, which costs more).
//!
//! Then the cheaper crossing a cheater would choose: the walker moves. The pool is split by
//! slice between this process and another; a walker whose next line lies across the split sends
//! its state (32 bytes and the steps left) one way, and the other process walks on until the
//! walk crosses back. Over a pipe, a Unix socket and TCP on loopback (the last two with both ends
//! polling), at 10% and 50% of the slices held across; a move's cost is the two shares' time
//! difference over their crossings' difference.
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
use std::os::unix::net::{UnixListener, UnixStream};
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

/// Serves lines of the pool: reads a slice (8 bytes) and a line (4 bytes), answers its 256 on
/// standard error, which Rust leaves unbuffered: standard output is line-buffered, and would
/// split every answer holding a newline byte into two writes, waking the reader twice.
fn serve(mib: usize) {
    let pool = fill(mib);
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = std::io::stderr().lock();
    // Ready: no walk's clock may include this process filling its pool.
    if output.write_all(&[1]).and_then(|()| output.flush()).is_err() {
        return;
    }
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
    // Ready: no walk's clock may include this process filling its pool.
    if write_polling(&mut to, &[1]).is_err() {
        return;
    }
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

/// One side of a split, started: how to send it walkers, how to read them back, its process.
struct OtherSide {
    to: Box<dyn Write>,
    from: Box<dyn Read>,
    process: std::process::Child,
}

/// The ways across measured: a pipe with blocking reads, and a Unix socket and TCP on loopback
/// with both ends polling (the cheaper way to wait, a cheater's choice).
const TRANSPORTS: [&str; 3] = ["pipe", "unix", "tcp"];

/// Starts the other side of a split at `across_per_1024` over `transport`, once it has filled
/// its pool.
fn other_side(transport: &str, mib: usize, across_per_1024: u64) -> OtherSide {
    let exe = std::env::current_exe().expect("this binary's path");
    let args = |extra: &str| {
        let mut command = Command::new(&exe);
        command.args([
            &format!("migrate-{transport}"),
            &mib.to_string(),
            &across_per_1024.to_string(),
            extra,
        ]);
        command
    };
    let mut side = match transport {
        "pipe" => {
            // The other side answers on standard error (see `serve`).
            let mut process = args("-")
                .stdin(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("it starts");
            let to = Box::new(BufWriter::new(process.stdin.take().expect("piped")));
            let from = Box::new(process.stderr.take().expect("piped"));
            OtherSide { to, from, process }
        }
        "unix" => {
            let path = std::env::temp_dir().join(format!("locality-latency-{}.sock", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let listener = UnixListener::bind(&path).expect("a Unix socket");
            let process = args(path.to_str().expect("a UTF-8 path")).spawn().expect("it starts");
            let (stream, _) = listener.accept().expect("the other side connects");
            let _ = std::fs::remove_file(&path);
            stream.set_nonblocking(true).expect("non-blocking");
            socket_side(stream, UnixStream::try_clone, process)
        }
        _ => {
            let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
            let port = listener.local_addr().expect("bound").port();
            let process = args(&port.to_string()).spawn().expect("it starts");
            let (stream, _) = listener.accept().expect("the other side connects");
            stream.set_nodelay(true).expect("nodelay");
            stream.set_nonblocking(true).expect("non-blocking");
            socket_side(stream, TcpStream::try_clone, process)
        }
    };
    read_polling(&mut side.from, &mut [0]).expect("the other side fills its pool");
    side
}

/// A connected socket as the other side: one handle to send on, one to read from.
fn socket_side<S: Read + Write + 'static>(
    stream: S,
    clone: fn(&S) -> std::io::Result<S>,
    process: std::process::Child,
) -> OtherSide {
    let to = Box::new(clone(&stream).expect("a second handle"));
    OtherSide {
        to,
        from: Box::new(stream),
        process,
    }
}

/// The other side's `main`: connects back over `transport` and serves walkers.
fn serve_other_side(transport: &str, args: &[String]) {
    let (mib, across) = (args[0].parse().expect("POOL_MIB"), args[1].parse().expect("SHARE"));
    match transport {
        "pipe" => serve_migrations(mib, across, std::io::stdin().lock(), std::io::stderr().lock()),
        "unix" => {
            let stream = UnixStream::connect(&args[2]).expect("the walking side listens");
            stream.set_nonblocking(true).expect("non-blocking");
            let to = stream.try_clone().expect("a second handle");
            serve_migrations(mib, across, stream, to)
        }
        _ => {
            let port: u16 = args[2].parse().expect("PORT");
            let stream = TcpStream::connect(("127.0.0.1", port)).expect("the walking side listens");
            stream.set_nodelay(true).expect("nodelay");
            stream.set_nonblocking(true).expect("non-blocking");
            let to = stream.try_clone().expect("a second handle");
            serve_migrations(mib, across, stream, to)
        }
    }
}

/// The migrating walks, per transport: at 10% and 50% of the slices across, the best of three
/// walks each (two spinning processes on few cores are sometimes preempted, which only adds).
/// A move's cost is the difference of the two shares' times over the difference of their
/// crossings, so that no figure for the local steps enters it; each share's own figure, over
/// the local walk's `t_l`, is printed beside it.
fn migrations(mib: usize, pool: &[u8], local: f64, steps: u64) {
    let steps = (steps / 5).max(1);
    let mut least = f64::INFINITY;
    for transport in TRANSPORTS {
        println!("the walker moves across the split, over {transport}:");
        let mut walks = Vec::new();
        for across in [102u64, 512] {
            let mut side = other_side(transport, mib, across);
            let best = (0..3)
                .map(|_| migrating_walk(pool, across, steps, &mut side.to, &mut side.from))
                .min_by(|x, y| x.0.total_cmp(&y.0))
                .expect("three walks");
            println!(
                "  {:.2} across, best: a move costs {:.1} ns over t_l",
                across as f64 / 1024.0,
                (best.0 - local) * steps as f64 / best.1.max(1) as f64
            );
            walks.push(best);
            // Both handles closed, so that the other side reads its end (a socket's two
            // handles are one connection).
            let OtherSide { to, from, mut process } = side;
            drop((to, from));
            let _ = process.wait();
        }
        let ((ns10, x10), (ns50, x50)) = (walks[0], walks[1]);
        let each = (ns50 - ns10) * steps as f64 / (x50 as f64 - x10 as f64);
        println!("  from both shares: a move costs {each:.1} ns");
        least = least.min(each);
    }
    println!(
        "the least one-way move {least:.1} ns ({:.1} t_l): a `hop_ns` above it does not count a split whose walkers move this way",
        least / local
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => return serve(args[2].parse().expect("POOL_MIB")),
        Some(mode) if mode.starts_with("migrate-") => return serve_other_side(&mode["migrate-".len()..], &args[2..]),
        _ => {}
    }
    let mib: usize = args.get(1).map_or(4096, |a| a.parse().expect("POOL_MIB"));
    let steps: u64 = args.get(2).map_or(1_000_000, |a| a.parse().expect("STEPS"));
    let pool = fill(mib);
    let slices = (pool.len() / SLICE) as u64;

    let mut server = Command::new(std::env::current_exe().unwrap())
        .args(["serve", &mib.to_string()])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the serving process starts");
    let mut to_server = BufWriter::new(server.stdin.take().unwrap());
    let mut from_server = server.stderr.take().unwrap();
    from_server
        .read_exact(&mut [0])
        .expect("the serving process fills its pool");

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
