//! How much slower a CPU walk gets when part of the pool is not resident (PROTOCOL.md 18.8):
//! an honest walk over a whole pool against walks that hold half of it and make up the other
//! half by computing each missing entry again, or by reading it from a file (through the page
//! cache: the cheapest file there is). The engine-level figures behind the memory phase's
//! deadlines, on this machine.
//!
//! `cargo run --release -p gpu-attest-shared --example memory_cheats [POOL_MIB] [SECONDS]`

use gpu_attest_shared::CancelToken;
use gpu_attest_shared::gemm::CpuGemm;
use gpu_attest_shared::matrix::generate;
use gpu_attest_shared::memory::pool::{EntrySource, make_entry};
use gpu_attest_shared::memory::walk::{WalkSpec, walk_all};
use gpu_attest_shared::memory::{ENTRY_BYTES, MemoryParams, PoolSpec};
use gpu_attest_shared::{Digest, Work, vectors};
use std::borrow::Cow;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Instant;

/// A pool that holds its even entries and makes up the odd ones its own way.
struct Partial<'a> {
    bytes: &'a [u8],
    missing: Missing<'a>,
}

enum Missing<'a> {
    /// Every entry resident.
    None,
    /// Odd entries made again, at the cost of the work function.
    Compute { gemm: &'a CpuGemm, spec: &'a PoolSpec },
    /// Odd entries read from a file with `pread`.
    File(&'a std::fs::File),
}

impl EntrySource for Partial<'_> {
    fn entries(&self) -> u64 {
        (self.bytes.len() / ENTRY_BYTES) as u64
    }

    fn entry(&self, entry: u64) -> Cow<'_, [i8]> {
        let at = entry as usize * ENTRY_BYTES;
        let held = Cow::Borrowed(bytemuck::cast_slice(&self.bytes[at..at + ENTRY_BYTES]));
        if entry.is_multiple_of(2) {
            return held;
        }
        match &self.missing {
            Missing::None => held,
            Missing::Compute { gemm, spec } => Cow::Owned(make_entry(gemm, spec, entry).as_slice().to_vec()),
            Missing::File(file) => {
                let mut buf = vec![0u8; ENTRY_BYTES];
                file.read_exact_at(&mut buf, at as u64).expect("reading the pool file");
                Cow::Owned(bytemuck::cast_slice(&buf).to_vec())
            }
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(256, |a| a.parse().expect("POOL_MIB"));
    let seconds: f64 = args.next().map_or(1.0, |a| a.parse().expect("SECONDS"));
    let gemm = CpuGemm::new(0, None).expect("a CPU kernel");
    let entries = (mib << 20) / ENTRY_BYTES;
    let bytes: Vec<u8> = (0..entries)
        .flat_map(|e| generate(&[5; 32], e as u64, 256).as_bytes().to_vec())
        .collect();
    let dir = std::env::temp_dir().join(format!("gpu-attest-memory-cheats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pool");
    std::fs::File::create(&path).unwrap().write_all(&bytes).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let work = Work::new(vectors::vector_params()).unwrap();
    let spec = PoolSpec::with_entries(&work, 0, entries as u64);

    let walk = |source: &Partial, steps: u32| {
        let params = MemoryParams {
            pool_permille: 1000,
            walkers: (gemm.threads() * 2) as u32,
            walk_steps: steps,
            walk_checkpoint_every: 8,
        };
        let spec = WalkSpec {
            nonce: [1; 32],
            walk_seed: [2; 32],
            device: 0,
            pool_root: Digest::default(),
            entries: entries as u64,
            params,
        };
        let start = Instant::now();
        gemm.install(|| walk_all(source, &spec, &CancelToken::new())).unwrap();
        params.walk_bytes() as f64 / start.elapsed().as_secs_f64()
    };
    // Steps sized for about `seconds` of honest walk, then every walk takes that many.
    let honest = Partial {
        bytes: &bytes,
        missing: Missing::None,
    };
    let probe = walk(&honest, 64);
    let steps = ((probe * seconds / ((gemm.threads() * 2) as f64 * ENTRY_BYTES as f64)) as u32).clamp(8, 32768) / 8 * 8;
    println!(
        "pool {mib} MiB ({entries} entries), {} threads, {} walkers x {steps} steps, kernel {}",
        gemm.threads(),
        gemm.threads() * 2,
        gemm.kernel()
    );
    let honest_rate = (0..3).map(|_| walk(&honest, steps)).fold(0.0, f64::max);
    println!(
        "honest, whole pool resident:      {:>8.2} GB/s   1.00x the time",
        honest_rate / 1e9
    );
    let file_rate = walk(
        &Partial {
            bytes: &bytes,
            missing: Missing::File(&file),
        },
        steps,
    );
    println!(
        "half the pool read from a file:   {:>8.2} GB/s {:>6.2}x the time",
        file_rate / 1e9,
        honest_rate / file_rate
    );
    // Computing again is slow enough that a few steps tell: 8 per walker.
    let compute_rate = walk(
        &Partial {
            bytes: &bytes,
            missing: Missing::Compute {
                gemm: &gemm,
                spec: &spec,
            },
        },
        8,
    );
    println!(
        "half the pool computed again:     {:>8.4} GB/s {:>6.0}x the time",
        compute_rate / 1e9,
        honest_rate / compute_rate
    );
    let _ = std::fs::remove_dir_all(&dir);
}
