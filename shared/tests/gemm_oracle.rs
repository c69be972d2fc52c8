//! Every CPU kernel against the naive oracle.
//!
//! Trials are generated per kernel, so each kernel this CPU runs is checked on its own, and a
//! kernel it lacks is listed as ignored, by name (the header line says why). The sizes are the
//! tile-shape edges rather than every multiple of 64: the smallest n, sizes where the row blocks
//! per thread are uneven, one tile more or less than a power of two, and the largest n, where
//! the entries reach +-2^27.

use gpu_attest_shared::gemm::{CpuGemm, KernelKind, PackedB, naive};
use gpu_attest_shared::matrix::{Matrix, generate};
use gpu_attest_shared::params::MAX_N;
use libtest_mimic::{Arguments, Failed, Trial};

/// Checked entry by entry against the naive product, at several thread counts.
const FULL_SIZES: [usize; 7] = [64, 128, 192, 256, 320, 448, 512];
/// Checked on their first and last rows and columns and 512 scattered entries.
const SAMPLED_SIZES: [usize; 7] = [576, 960, 1024, 1088, 2048, 4096, 8192];
/// The portable kernel takes minutes beyond this; it is the fallback, not the target.
const PORTABLE_MAX_N: usize = 2048;

fn random(n: usize, stream: u64) -> Matrix {
    generate(&[0x5a; 32], stream, n)
}

fn filled(n: usize, value: i8) -> Matrix {
    Matrix::from_vec(n, vec![value; n * n]).unwrap()
}

fn engine(kernel: KernelKind, threads: usize) -> Result<CpuGemm, Failed> {
    CpuGemm::new(threads, Some(kernel)).map_err(|e| format!("{kernel}: {e}").into())
}

/// Checks every entry.
fn check_full(gemm: &CpuGemm, a: &Matrix, b: &Matrix) -> Result<(), Failed> {
    let fast = gemm.product(a, &PackedB::new(b));
    let slow = naive::product(a, b);
    let n = a.n();
    match fast.iter().zip(&slow).position(|(x, y)| x != y) {
        None => Ok(()),
        Some(pos) => Err(format!(
            "{} kernel, {} threads, n={n}: entry ({}, {}) is {} but the oracle says {}",
            gemm.kernel(),
            gemm.threads(),
            pos / n,
            pos % n,
            fast[pos],
            slow[pos]
        )
        .into()),
    }
}

/// Checks the first and last row and column completely and 512 entries scattered by a stride
/// that is coprime with n. Each entry is the oracle's plain dot product, taken against B
/// transposed once so that it reads contiguously.
fn check_sampled(gemm: &CpuGemm, a: &Matrix, b: &Matrix) -> Result<(), Failed> {
    let n = a.n();
    let fast = gemm.product(a, &PackedB::new(b));
    let mut b_t = vec![0i8; n * n];
    for (k, row) in b.as_slice().chunks_exact(n).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            b_t[j * n + k] = v;
        }
    }
    let mut positions: Vec<(usize, usize)> = Vec::new();
    for t in 0..n {
        positions.extend([(0, t), (n - 1, t), (t, 0), (t, n - 1)]);
    }
    positions.extend((0..512usize).map(|s| ((s * 7919) % n, (s * 104_729 + 13) % n)));
    for (i, j) in positions {
        let (row, col) = (&a.as_slice()[i * n..(i + 1) * n], &b_t[j * n..(j + 1) * n]);
        let want: i32 = row.iter().zip(col).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum();
        if fast[i * n + j] != want {
            return Err(format!(
                "{} kernel, n={n}: entry ({i}, {j}) is {} but the oracle says {want}",
                gemm.kernel(),
                fast[i * n + j]
            )
            .into());
        }
    }
    Ok(())
}

fn small_sizes_every_entry(kernel: KernelKind) -> Result<(), Failed> {
    for threads in [1, 2, 3] {
        let gemm = engine(kernel, threads)?;
        for n in FULL_SIZES {
            check_full(&gemm, &random(n, 1), &random(n, 2))?;
        }
    }
    Ok(())
}

fn large_sizes_sampled(kernel: KernelKind) -> Result<(), Failed> {
    let gemm = engine(kernel, 0)?;
    for n in SAMPLED_SIZES {
        if kernel == KernelKind::Portable && n > PORTABLE_MAX_N {
            continue;
        }
        check_sampled(&gemm, &random(n, 3), &random(n, 4))?;
    }
    Ok(())
}

/// -128 and 127 are where a biased or saturating inner product would go wrong (`vpmaddubsw`
/// saturates exactly here); at n = 8192 the entries reach +-2^27, the largest any challenge
/// produces.
fn extreme_values(kernel: KernelKind) -> Result<(), Failed> {
    let gemm = engine(kernel, 0)?;
    for n in [64usize, 256] {
        for (x, y) in [(-128i8, -128i8), (-128, 127), (127, 127), (127, -128)] {
            check_full(&gemm, &filled(n, x), &filled(n, y))?;
        }
        // Alternating extremes within a row, so the bias correction sees both signs.
        let alternating: Vec<i8> = (0..n * n)
            .map(|i| if (i / n + i) % 2 == 0 { -128 } else { 127 })
            .collect();
        let alt = Matrix::from_vec(n, alternating).unwrap();
        check_full(&gemm, &alt, &filled(n, -128))?;
        check_full(&gemm, &filled(n, 127), &alt)?;
    }
    let n = if kernel == KernelKind::Portable {
        PORTABLE_MAX_N
    } else {
        MAX_N as usize
    };
    for (x, y) in [(-128i8, -128i8), (-128, 127)] {
        let product = gemm.product(&filled(n, x), &PackedB::new(&filled(n, y)));
        let want = i32::from(x) * i32::from(y) * n as i32;
        if let Some(pos) = product.iter().position(|&v| v != want) {
            return Err(format!(
                "{kernel} kernel, n={n}, {x} x {y}: entry {pos} is {} not {want}",
                product[pos]
            )
            .into());
        }
    }
    Ok(())
}

fn fused_step(kernel: KernelKind) -> Result<(), Failed> {
    let gemm = engine(kernel, 2)?;
    for n in [64, 192, 512] {
        let (x, b) = (random(n, 7), random(n, 8));
        let mut out = Matrix::zeros(n);
        for step in [0u32, 1, 77] {
            gemm.step(&x, &PackedB::new(&b), step, &mut out);
            if out != naive::step(&x, &b, step) {
                return Err(format!("{kernel} kernel, n={n}, step {step}: the fused step differs").into());
            }
        }
    }
    Ok(())
}

/// For the kernels that take k in blocks: k walked in small blocks, so that many blocks carry
/// their sums into the next, including a last block shorter than the others (192 into 320,
/// 640 into 1088 and 2048) and blocks of one k-step. On 8 threads some tasks are one strip of
/// rows, which take k in one pass while the others block it.
fn blocked_k(kernel: KernelKind) -> Result<(), Failed> {
    for k_block in [64, 192] {
        for threads in [1, 3, 8] {
            let gemm = engine(kernel, threads)?.with_k_block(Some(k_block));
            for n in [64, 128, 320, 512] {
                check_full(&gemm, &random(n, 11), &random(n, 12))?;
            }
        }
    }
    let gemm = engine(kernel, 0)?.with_k_block(Some(640));
    for n in [1088, 2048] {
        check_sampled(&gemm, &random(n, 13), &random(n, 14))?;
    }
    let gemm = engine(kernel, 2)?.with_k_block(Some(128));
    let (n, x, b) = (320, random(320, 15), random(320, 16));
    let mut out = Matrix::zeros(n);
    gemm.step(&x, &PackedB::new(&b), 5, &mut out);
    if out != naive::step(&x, &b, 5) {
        return Err(format!("{kernel} kernel, n={n}, k in blocks of 128: the fused step differs").into());
    }
    Ok(())
}

type Check = fn(KernelKind) -> Result<(), Failed>;

const CHECKS: [(&str, Check); 4] = [
    ("small_sizes_every_entry", small_sizes_every_entry),
    ("large_sizes_sampled", large_sizes_sampled),
    ("extreme_values", extreme_values),
    ("fused_step", fused_step),
];

fn main() {
    let args = Arguments::from_args();
    for kernel in KernelKind::ALL {
        match kernel.unavailable_reason() {
            None => println!("kernel {kernel}: runs on this CPU"),
            Some(why) => println!("kernel {kernel}: SKIPPED, not available on this CPU (it {why})"),
        }
    }
    let trials = KernelKind::ALL
        .into_iter()
        .flat_map(|kernel| {
            CHECKS.map(|(name, check)| {
                Trial::test(format!("{kernel}::{name}"), move || check(kernel))
                    .with_ignored_flag(!kernel.is_available())
            })
        })
        .chain(
            KernelKind::ALL
                .into_iter()
                .filter(|k| k.takes_k_blocks())
                .map(|kernel| {
                    Trial::test(format!("{kernel}::blocked_k"), move || blocked_k(kernel))
                        .with_ignored_flag(!kernel.is_available())
                }),
        )
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
