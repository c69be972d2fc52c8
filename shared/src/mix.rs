//! The non-linear step between GEMMs.
//!
//! Without it the chain would be `X_K = A * B^K`, which repeated squaring computes in
//! O(log K) products instead of K. `mix` maps each int32 product element to an int8 through an
//! integer hash keyed by the step number and by the element's position, so step k's output is
//! unstructured again.
//!
//! The position is what keeps a forged segment from being cheap (PROTOCOL.md "Why the mix"):
//! keyed by the step alone, a matrix whose rows are all equal stays so through `X * B` and
//! the element-wise hash, so a chain restarted from such a matrix costs one vector-matrix
//! product a step, and a sampled validator only catches the restart when it opens the one
//! segment that crosses it.

/// Multiplier that makes every step's mix distinct (the 32-bit golden ratio).
const STEP_KEY: u32 = 0x9E37_79B9;
/// Multiplier that makes every position's mix distinct (odd, so distinct positions get distinct
/// keys: MurmurHash3's first finaliser constant).
const POSITION_KEY: u32 = 0x85EB_CA6B;

/// `mix(y, k, row, col)` from PROTOCOL.md section "Chain": the top byte of a 32-bit avalanche
/// of `y ^ k*φ ^ ((row << 16) | col) * POSITION_KEY`. `row` and `col` index the element in its
/// n x n matrix (n <= 8192 < 2^16).
#[inline(always)]
pub fn mix(y: i32, k: u32, row: u32, col: u32) -> i8 {
    mix_keyed(y, k.wrapping_mul(STEP_KEY) ^ position_key(row, col))
}

/// The position's part of the key: `((row << 16) | col) * POSITION_KEY`, which is also
/// `row_key(row) + col * POSITION_KEY` (wrapping), the form a vectorised epilogue uses.
#[inline(always)]
pub fn position_key(row: u32, col: u32) -> u32 {
    ((row << 16) | col).wrapping_mul(POSITION_KEY)
}

/// `(row << 16) * POSITION_KEY`: the row's share of [`position_key`], to which a row's
/// columns add `col * POSITION_KEY`.
#[inline(always)]
pub fn row_key(row: u32) -> u32 {
    (row << 16).wrapping_mul(POSITION_KEY)
}

/// `col * POSITION_KEY`: a column's share of [`position_key`].
#[inline(always)]
pub fn col_key(col: u32) -> u32 {
    col.wrapping_mul(POSITION_KEY)
}

/// The step's part of the key, `k * φ`.
#[inline(always)]
pub fn step_key(k: u32) -> u32 {
    k.wrapping_mul(STEP_KEY)
}

/// The avalanche of `y ^ key`, top byte: `mix` with its key already combined.
#[inline(always)]
pub fn mix_keyed(y: i32, key: u32) -> i8 {
    let mut x = (y as u32) ^ key;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    (x >> 24) as u8 as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // Worked by hand from the definition; PROTOCOL.md lists these and more.
        // y=0, k=0, (0, 0): x=0 -> 0.
        assert_eq!(mix(0, 0, 0, 0), 0);
        // y=1, k=0, (0, 0): x=1; x^=0 -> 1; x*=0x7FEB352D -> 0x7FEB352D; x^=x>>15 (0xFFD6) ->
        // 0x7FEBCAFB; top byte 0x7F.
        assert_eq!(mix(1, 0, 0, 0), 0x7F);
        // y=0, k=1, (0, 0): x=0x9E3779B9; x^=0x9E37 -> 0x9E37E78E; then the multiply and shift.
        let mut x: u32 = 0x9E37_79B9 ^ 0x9E37;
        x = x.wrapping_mul(0x7FEB_352D);
        x ^= x >> 15;
        assert_eq!(mix(0, 1, 0, 0), (x >> 24) as u8 as i8);
        // y=0, k=0, (0, 1): the key is 0x85EBCA6B alone.
        let mut x: u32 = 0x85EB_CA6B ^ 0x85EB;
        x = x.wrapping_mul(0x7FEB_352D);
        x ^= x >> 15;
        assert_eq!(mix(0, 0, 0, 1), (x >> 24) as u8 as i8);
    }

    #[test]
    fn the_position_key_splits_into_row_and_column_shares() {
        for row in [0u32, 1, 63, 4095, 8191] {
            for col in [0u32, 1, 2, 31, 8191] {
                assert_eq!(position_key(row, col), row_key(row).wrapping_add(col_key(col)));
            }
        }
    }

    #[test]
    fn step_number_changes_output() {
        let differing = (0..1000).filter(|&y| mix(y, 3, 5, 6) != mix(y, 4, 5, 6)).count();
        assert!(differing > 950, "mix barely depends on k: {differing}/1000 differ");
    }

    /// The same product value in two rows (or two columns) mixes to unrelated bytes, so a matrix
    /// with equal rows does not stay one.
    #[test]
    fn position_changes_output() {
        let rows = (0..1000).filter(|&y| mix(y, 3, 0, 9) != mix(y, 3, 1, 9)).count();
        let cols = (0..1000).filter(|&y| mix(y, 3, 9, 0) != mix(y, 3, 9, 1)).count();
        assert!(
            rows > 950 && cols > 950,
            "mix barely depends on the position: {rows}, {cols}"
        );
    }
}
