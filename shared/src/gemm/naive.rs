//! The textbook triple loop: slow, obviously right, and the oracle for every faster path.

use crate::matrix::Matrix;
use crate::mix::mix;

/// `a * b` as int32, computed one dot product at a time.
pub fn product(a: &Matrix, b: &Matrix) -> Vec<i32> {
    let n = a.n();
    assert_eq!(b.n(), n);
    let (a, b) = (a.as_slice(), b.as_slice());
    let mut out = vec![0i32; n * n];
    for i in 0..n {
        for j in 0..n {
            out[i * n + j] = entry(a, b, n, i, j);
        }
    }
    out
}

/// One entry of `a * b`, for spot checks of products too large to compute naively in full.
pub fn entry(a: &[i8], b: &[i8], n: usize, i: usize, j: usize) -> i32 {
    (0..n).map(|k| i32::from(a[i * n + k]) * i32::from(b[k * n + j])).sum()
}

/// One chain step, naively: `mix(x * b, step)`, each element keyed by its row and column.
pub fn step(x: &Matrix, b: &Matrix, step: u32) -> Matrix {
    let n = x.n();
    let data = product(x, b)
        .into_iter()
        .enumerate()
        .map(|(at, y)| mix(y, step, (at / n) as u32, (at % n) as u32))
        .collect();
    Matrix::from_vec(n, data).expect("product has n*n entries")
}
