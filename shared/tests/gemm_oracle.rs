//! The fast CPU GEMM against the naive oracle, for every kernel this CPU runs.

use gpu_attest_shared::gemm::{CpuGemm, KernelKind, PackedB, naive};
use gpu_attest_shared::matrix::{Matrix, generate};
use gpu_attest_shared::params::{MAX_N, MIN_N, N_MULTIPLE};

fn kernels() -> Vec<KernelKind> {
    let available: Vec<_> = KernelKind::ALL.into_iter().filter(|k| k.is_available()).collect();
    for k in KernelKind::ALL {
        if !k.is_available() {
            println!("SKIPPED: the {k} kernel is not available on this CPU");
        }
    }
    available
}

fn random(n: usize, stream: u64) -> Matrix {
    generate(&[0x5a; 32], stream, n)
}

fn filled(n: usize, value: i8) -> Matrix {
    Matrix::from_vec(n, vec![value; n * n]).unwrap()
}

/// Checks every entry.
fn assert_full(gemm: &CpuGemm, a: &Matrix, b: &Matrix) {
    let fast = gemm.product(a, &PackedB::new(b));
    let slow = naive::product(a, b);
    let n = a.n();
    if let Some(pos) = fast.iter().zip(&slow).position(|(x, y)| x != y) {
        panic!(
            "{} kernel, {} threads, n={n}: entry ({}, {}) is {} but the oracle says {}",
            gemm.kernel(),
            gemm.threads(),
            pos / n,
            pos % n,
            fast[pos],
            slow[pos]
        );
    }
}

/// Checks the first and last row and column completely and 512 entries scattered by a stride
/// that is coprime with n, for sizes where the full oracle would take minutes. Each entry is the
/// oracle's plain dot product, taken against B transposed once so that it reads contiguously
/// (walking a column of an 8192-wide B misses the cache at every step).
fn assert_sampled(gemm: &CpuGemm, a: &Matrix, b: &Matrix) {
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
        assert_eq!(
            fast[i * n + j],
            want,
            "{} kernel, n={n}: entry ({i}, {j})",
            gemm.kernel()
        );
    }
}

#[test]
fn every_entry_matches_oracle_for_small_sizes_and_thread_counts() {
    for kernel in kernels() {
        for threads in [1, 2, 3] {
            let gemm = CpuGemm::new(threads, Some(kernel)).unwrap();
            for n in [64, 128, 192, 256, 320] {
                assert_full(&gemm, &random(n, 1), &random(n, 2));
            }
        }
    }
}

#[test]
fn every_supported_size_matches_oracle() {
    let gemm = CpuGemm::new(0, None).unwrap();
    for n in (MIN_N..=MAX_N).step_by(N_MULTIPLE as usize) {
        let n = n as usize;
        if n <= 512 {
            assert_full(&gemm, &random(n, 3), &random(n, 4));
        } else {
            assert_sampled(&gemm, &random(n, 3), &random(n, 4));
        }
    }
}

#[test]
fn portable_kernel_matches_oracle_on_larger_sizes() {
    let gemm = CpuGemm::new(0, Some(KernelKind::Portable)).unwrap();
    for n in [512, 1024] {
        assert_sampled(&gemm, &random(n, 5), &random(n, 6));
    }
}

/// -128 and 127 are where a biased or saturating inner product would go wrong; at n = 8192 the
/// entries reach +-2^27, the largest any challenge produces.
#[test]
fn extreme_values_are_exact() {
    for kernel in kernels() {
        let gemm = CpuGemm::new(0, Some(kernel)).unwrap();
        for n in [64usize, 256] {
            for (x, y) in [(-128i8, -128i8), (-128, 127), (127, 127), (127, -128)] {
                assert_full(&gemm, &filled(n, x), &filled(n, y));
            }
            // Alternating extremes within a row, so the bias correction sees both signs.
            let alternating: Vec<i8> = (0..n * n)
                .map(|i| if (i / n + i) % 2 == 0 { -128 } else { 127 })
                .collect();
            let alt = Matrix::from_vec(n, alternating).unwrap();
            assert_full(&gemm, &alt, &filled(n, -128));
            assert_full(&gemm, &filled(n, 127), &alt);
        }
    }
    let gemm = CpuGemm::new(0, None).unwrap();
    let n = MAX_N as usize;
    let product = gemm.product(&filled(n, -128), &PackedB::new(&filled(n, -128)));
    assert!(product.iter().all(|&v| v == 128 * 128 * n as i32), "n=8192, all -128");
    let product = gemm.product(&filled(n, -128), &PackedB::new(&filled(n, 127)));
    assert!(
        product.iter().all(|&v| v == -128 * 127 * n as i32),
        "n=8192, -128 x 127"
    );
}

#[test]
fn fused_step_matches_naive_step() {
    for kernel in kernels() {
        let gemm = CpuGemm::new(2, Some(kernel)).unwrap();
        for n in [64, 192] {
            let (x, b) = (random(n, 7), random(n, 8));
            let mut out = Matrix::zeros(n);
            for step in [0u32, 1, 77] {
                gemm.step(&x, &PackedB::new(&b), step, &mut out);
                assert_eq!(out, naive::step(&x, &b, step), "{kernel}, n={n}, step {step}");
            }
        }
    }
}
