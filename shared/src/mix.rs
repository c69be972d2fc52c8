//! The non-linear step between GEMMs.
//!
//! Without it the chain would be `X_K = A * B^K`, which repeated squaring computes in
//! O(log K) products instead of K. `mix` maps each int32 product element to an int8 through an
//! integer hash keyed by the step number, so step k's output is unstructured again.

/// Multiplier that makes every step's mix distinct (the 32-bit golden ratio).
const STEP_KEY: u32 = 0x9E37_79B9;

/// `mix(y, k)` from PROTOCOL.md section "Chain": the top byte of a 32-bit avalanche of `y ^ k*φ`.
#[inline(always)]
pub fn mix(y: i32, k: u32) -> i8 {
    let mut x = (y as u32) ^ k.wrapping_mul(STEP_KEY);
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
        // Worked by hand from the definition; PROTOCOL.md lists the same values.
        // y=0,k=0: x=0 -> 0.
        assert_eq!(mix(0, 0), 0);
        // y=1,k=0: x=1; x^=0 -> 1; x*=0x7FEB352D -> 0x7FEB352D; x^=x>>15 (0xFFD6) -> 0x7FEBCAFB; top byte 0x7F.
        assert_eq!(mix(1, 0), 0x7F);
        // y=0,k=1: x=0x9E3779B9; x^=0x9E37 -> 0x9E37E78E; then the multiply and shift below.
        let mut x: u32 = 0x9E37_79B9 ^ 0x9E37;
        x = x.wrapping_mul(0x7FEB_352D);
        x ^= x >> 15;
        assert_eq!(mix(0, 1), (x >> 24) as u8 as i8);
    }

    #[test]
    fn step_number_changes_output() {
        let differing = (0..1000).filter(|&y| mix(y, 3) != mix(y, 4)).count();
        assert!(differing > 950, "mix barely depends on k: {differing}/1000 differ");
    }
}
