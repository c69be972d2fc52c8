//! Runs the CUDA kernels that use no shared memory and no barriers (ChaCha8 generation, BLAKE3
//! hashing, the mix pass) on the CPU: the exact `.cu` sources, compiled as C++ behind a small
//! shim, one emulated thread at a time, against rand_chacha, the blake3 crate and `mix.rs`.
//! That checks those kernels' logic bit for bit without a GPU. The GEMM kernels use shared
//! memory, barriers and PTX, so only a GPU checks them (tests/cuda_backend.rs).
//!
//! Needs a C++ compiler (`c++`, or `CXX`); without one it says it was skipped.

use gpu_attest_shared::matrix::generate;
use gpu_attest_shared::mix::mix;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const SHIM: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#define __device__
#define __global__
#define __forceinline__ inline
struct ga_dim3 { unsigned x, y, z; };
static ga_dim3 blockIdx, threadIdx, blockDim;
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
"#;

const HARNESS: &str = r#"
// Every thread of a grid (gx, gy) of blocks of bx threads, one after another.
template <class F> static void launch(unsigned gx, unsigned gy, unsigned bx, F f) {
    blockDim = {bx, 1, 1};
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x)
            for (unsigned t = 0; t < bx; ++t) {
                blockIdx = {x, y, 0};
                threadIdx = {t, 0, 0};
                f();
            }
}

static std::vector<unsigned char> read_stdin() {
    std::vector<unsigned char> in;
    unsigned char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, stdin)) > 0) in.insert(in.end(), buf, buf + got);
    return in;
}

int main(int argc, char** argv) {
    std::vector<unsigned char> in = read_stdin();
    std::string mode = argv[1];
    if (mode == "chacha") {  // chacha N FIRST_STREAM COUNT < key
        u64 n = strtoull(argv[2], 0, 10), first = strtoull(argv[3], 0, 10), count = strtoull(argv[4], 0, 10);
        ChaChaKey key;
        memcpy(key.w, in.data(), 32);
        u64 bpm = n * n / 64;
        std::vector<unsigned char> out(count * n * n);
        launch((unsigned)((bpm + 255) / 256), (unsigned)count, 256,
               [&] { chacha8_generate(out.data(), key, first, 2, bpm); });
        fwrite(out.data(), 1, out.size(), stdout);
    } else if (mode == "blake3") {  // blake3 MATRIX_BYTES < matrices
        u64 bytes = strtoull(argv[2], 0, 10), count = in.size() / bytes, chunks = bytes / 1024;
        std::vector<u32> a(count * chunks * 8), b(count * chunks * 8);
        launch((unsigned)((chunks + 127) / 128), (unsigned)count, 128, [&] { blake3_chunks(in.data(), bytes, a.data()); });
        u64 nodes = chunks;
        while (nodes > 1) {
            u64 next = (nodes + 1) / 2;
            launch((unsigned)((next + 127) / 128), (unsigned)count, 128,
                   [&] { blake3_parents(a.data(), b.data(), nodes, nodes == 2 ? 1u : 0u); });
            a.swap(b);
            nodes = next;
        }
        fwrite(a.data(), 4, count * 8, stdout);
    } else if (mode == "mix") {  // mix STEP < int32 values
        u32 step = (u32)strtoul(argv[2], 0, 10);
        u64 count = in.size() / 4;
        std::vector<unsigned char> out(count);
        launch((unsigned)((count + 255) / 256), 1, 256,
               [&] { mix_i32((const int*)in.data(), (i8*)out.data(), count, step); });
        fwrite(out.data(), 1, out.size(), stdout);
    }
    return 0;
}
"#;

/// The harness binary, built once per test process; `None` without a C++ compiler.
fn harness() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
            let read = |name: &str| std::fs::read_to_string(kernels.join(name)).unwrap();
            let source = [
                SHIM.to_string(),
                read("common.cuh"),
                read("chacha8.cu"),
                read("blake3.cu"),
                read("mix.cu"),
                HARNESS.to_string(),
            ]
            .join("\n");
            let dir = std::env::temp_dir().join(format!("gpu-attest-host-kernels-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("harness.cpp"), source).unwrap();
            let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
            let built = Command::new(&cxx)
                .args(["-O2", "-std=c++17", "-o"])
                .arg(dir.join("harness"))
                .arg(dir.join("harness.cpp"))
                .output();
            match built {
                Ok(out) if out.status.success() => Some(dir.join("harness")),
                Ok(out) => panic!(
                    "the kernels do not compile as C++ for the host run:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ),
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "SKIPPED: no C++ compiler ({cxx}: {e})");
                    None
                }
            }
        })
        .as_deref()
}

fn run(args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(harness().unwrap())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "harness {args:?} failed");
    out.stdout
}

#[test]
fn device_chacha8_generation_matches_rand_chacha() {
    if harness().is_none() {
        return;
    }
    let key: [u8; 32] = core::array::from_fn(|i| (i * 29 + 7) as u8);
    for (n, first, count) in [(64usize, 0u64, 1usize), (128, 5, 3), (192, 0x1_0000_0001, 2)] {
        let got = run(
            &["chacha", &n.to_string(), &first.to_string(), &count.to_string()],
            &key,
        );
        for z in 0..count {
            let want = generate(&key, first + 2 * z as u64, n);
            assert_eq!(
                &got[z * n * n..(z + 1) * n * n],
                want.as_bytes(),
                "n={n} stream {}",
                first + 2 * z as u64
            );
        }
    }
}

#[test]
fn device_blake3_matches_the_blake3_crate() {
    if harness().is_none() {
        return;
    }
    let mut rng = ChaCha8Rng::from_seed([9; 32]);
    // 4 chunks (the least), 36 (not a power of two: a 32 | 4 tree), 64, and 1024.
    for n in [64usize, 192, 256, 1024] {
        let count = 3;
        let mut data = vec![0u8; count * n * n];
        rng.fill_bytes(&mut data);
        let got = run(&["blake3", &(n * n).to_string()], &data);
        for z in 0..count {
            let want = blake3::hash(&data[z * n * n..(z + 1) * n * n]);
            assert_eq!(&got[32 * z..32 * z + 32], want.as_bytes(), "n={n} matrix {z}");
        }
    }
}

#[test]
fn device_mix_pass_matches_mix_rs() {
    if harness().is_none() {
        return;
    }
    let mut rng = ChaCha8Rng::from_seed([4; 32]);
    let mut values: Vec<i32> = vec![0, 1, -1, i32::MIN, i32::MAX, 1 << 27, -(1 << 27)];
    values.extend((0..5000).map(|_| rng.next_u32() as i32));
    for step in [0u32, 1, 7, u32::MAX] {
        let got = run(&["mix", &step.to_string()], bytemuck::cast_slice(&values));
        let want: Vec<u8> = values.iter().map(|&y| mix(y, step) as u8).collect();
        assert_eq!(got, want, "step {step}");
    }
}
