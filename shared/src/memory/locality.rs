//! The locality walk's arithmetic (docs/design/locality.md): a latency-bound walk over a
//! device's version 4 pool, one 256-byte line a step, with every `C`-th state kept as a
//! checkpoint and a segment between two checkpoints replayed from the lines it read.
//!
//! Not on the wire yet: no message carries it and no verdict states it. It is here, with its
//! tests, so that the miner's walk (CPU and CUDA), the validator's replay and the protocol's
//! vectors are built on one definition, and so that `examples/locality_latency.rs` measures the
//! very step the design sizes.
//!
//! Why a cheap mix and not a hash: the step must cost one memory latency, so that a line served
//! from elsewhere (a peer device, host memory, another process) costs a hop the clock sees. Every
//! word of the line goes through the bijection [`mix64`] keyed by the state, so the next line is
//! known only once the whole line has been read; the walk's states are committed by hashing the
//! checkpoints, not by the step.

use crate::digest::Digest;
use thiserror::Error;

/// The bytes a step reads: one line.
pub const LINE_BYTES: usize = 256;
/// Lines in a 64 KiB slice of the pool (PROTOCOL.md 20.1).
pub const LINES_PER_SLICE: u64 = 65536 / LINE_BYTES as u64;

const START_CONTEXT: &[u8] = b"gpu-attest v4 locality start";

/// A walker's state: four 64-bit words (32 bytes, little-endian words when written as bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State(pub [u64; 4]);

impl State {
    /// `blake3("gpu-attest v4 locality start" || nonce || seed || G || le32(j) || le32(w))`,
    /// read as four little-endian words.
    pub fn start(nonce: &[u8; 32], seed: &[u8; 32], global: &Digest, device: u32, walker: u32) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(START_CONTEXT);
        h.update(nonce);
        h.update(seed);
        h.update(global.as_bytes());
        h.update(&device.to_le_bytes());
        h.update(&walker.to_le_bytes());
        State::from_bytes(h.finalize().as_bytes())
    }

    pub fn from_bytes(bytes: &[u8; 32]) -> Self {
        let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        State([word(0), word(1), word(2), word(3)])
    }

    pub fn to_bytes(self) -> [u8; 32] {
        let mut out = [0; 32];
        for (chunk, word) in out.chunks_exact_mut(8).zip(self.0) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The line this state names in a pool of `pool_slices` slices: slice `s_0 mod P`, line
    /// `s_1 mod 256` within it.
    pub fn names(&self, pool_slices: u64) -> Line {
        Line {
            slice: self.0[0] % pool_slices.max(1),
            line: (self.0[1] % LINES_PER_SLICE) as u32,
        }
    }
}

/// A line of the pool: bytes `256 line .. 256 line + 256` of slice `slice`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    pub slice: u64,
    pub line: u32,
}

impl Line {
    /// The line's bytes within its slice's 65536.
    pub fn of<'a>(&self, slice: &'a [u8]) -> &'a [u8; LINE_BYTES] {
        slice[self.line as usize * LINE_BYTES..][..LINE_BYTES]
            .try_into()
            .expect("a slice is 65536 bytes")
    }
}

/// `m(x)`: a bijection of 64-bit words (xorshift, odd multiply, xorshift), wrapping.
pub fn mix64(x: u64) -> u64 {
    let x = (x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

/// One step: the line's 32 words `v_l`, each keyed by state word `l mod 4` and its lane, mixed
/// and folded into four (`n_r`), then chained into the next state so that its first word, and
/// through it every word (the next line's address included), takes in the whole line.
pub fn step(state: &State, line: &[u8; LINE_BYTES]) -> State {
    let s = state.0;
    let mut n = [0u64; 4];
    for (l, word) in line.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        n[l % 4] ^= mix64(v ^ s[l % 4] ^ ((l as u64) << 56));
    }
    let s0 = mix64(n[0] ^ n[1] ^ n[2] ^ n[3] ^ s[1]);
    let s1 = n[1].wrapping_add(s[2]).wrapping_add(s0);
    let s2 = n[2] ^ s[3] ^ s0;
    let s3 = n[3].wrapping_add(s[0]).wrapping_add(s0);
    State([s0, s1, s2, s3])
}

/// A walker's walk of `steps` steps from `start` over a pool of `pool_slices` slices, reading
/// each line from `slices` (slice `e`'s 65536 bytes): its checkpoints, the start and every
/// `every`-th state after it, the last state included however `steps` divides.
pub fn walk<'a>(
    start: State,
    steps: u64,
    every: u64,
    pool_slices: u64,
    slices: impl Fn(u64) -> &'a [u8],
) -> Vec<State> {
    let every = every.max(1);
    let mut checkpoints = Vec::with_capacity((steps / every) as usize + 2);
    checkpoints.push(start);
    let mut state = start;
    for t in 1..=steps {
        let line = state.names(pool_slices);
        state = step(&state, line.of(slices(line.slice)));
        if t % every == 0 || t == steps {
            checkpoints.push(state);
        }
    }
    checkpoints
}

/// Why a segment does not replay to its end.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SegmentError {
    #[error("step {step} of the segment read line {got:?}, but its state names {named:?}")]
    WrongLine { step: usize, named: Line, got: Line },
    #[error("the segment's {steps} lines replay to another state than its end checkpoint")]
    WrongEnd { steps: usize },
}

/// Replays a segment: from checkpoint `from`, each `(line, bytes)` read in order, each the line
/// the state before it names, must end at `to`. The validator's check of an opened segment,
/// once each line's bytes are proven against the pool (20.2's path, a level down).
pub fn replay_segment(
    from: State,
    to: State,
    lines: &[(Line, [u8; LINE_BYTES])],
    pool_slices: u64,
) -> Result<(), SegmentError> {
    let mut state = from;
    for (i, (line, bytes)) in lines.iter().enumerate() {
        let named = state.names(pool_slices);
        if named != *line {
            return Err(SegmentError::WrongLine {
                step: i,
                named,
                got: *line,
            });
        }
        state = step(&state, bytes);
    }
    if state != to {
        return Err(SegmentError::WrongEnd { steps: lines.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `slices` slices of bytes from a counter, 64 KiB each.
    fn pool(slices: u64) -> Vec<Vec<u8>> {
        (0..slices)
            .map(|e| {
                (0..65536u32)
                    .map(|i| (mix64(e << 20 | u64::from(i)) >> 13) as u8)
                    .collect()
            })
            .collect()
    }

    fn start() -> State {
        State::start(&[1; 32], &[2; 32], &Digest([3; 32]), 0, 1)
    }

    /// Every segment between two checkpoints replays, from the lines its states named, to the
    /// next checkpoint; the walk's last state is a checkpoint however the steps divide.
    #[test]
    fn every_segment_of_a_walk_replays_from_its_lines() {
        let pool = pool(8);
        let (steps, every) = (1000, 64);
        let checkpoints = walk(start(), steps, every, 8, |e| &pool[e as usize]);
        assert_eq!(checkpoints.len(), 1 + (steps / every) as usize + 1);
        let mut state = start();
        for (c, pair) in checkpoints.windows(2).enumerate() {
            let count = if c as u64 == steps / every {
                steps % every
            } else {
                every
            };
            let mut lines = Vec::new();
            for _ in 0..count {
                let line = state.names(8);
                let bytes = *line.of(&pool[line.slice as usize]);
                lines.push((line, bytes));
                state = step(&state, &bytes);
            }
            assert_eq!(replay_segment(pair[0], pair[1], &lines, 8), Ok(()), "segment {c}");
        }
        assert_eq!(state, *checkpoints.last().unwrap());
    }

    /// A changed bit anywhere in any line of a segment, or a line other than the one named,
    /// fails the replay: no byte of a line can be skipped or made up.
    #[test]
    fn a_changed_bit_or_another_line_fails_the_segment() {
        let pool = pool(4);
        let mut state = start();
        let mut lines = Vec::new();
        for _ in 0..16 {
            let line = state.names(4);
            let bytes = *line.of(&pool[line.slice as usize]);
            lines.push((line, bytes));
            state = step(&state, &bytes);
        }
        let end = state;
        for i in [0, 7, 15] {
            for bit in [0, 63, 511, 2047] {
                let mut changed = lines.clone();
                changed[i].1[bit / 8] ^= 1 << (bit % 8);
                let replayed = replay_segment(start(), end, &changed, 4);
                assert!(replayed.is_err(), "line {i} bit {bit}: {replayed:?}");
            }
            let mut moved = lines.clone();
            moved[i].0.line ^= 1;
            assert!(matches!(
                replay_segment(start(), end, &moved, 4),
                Err(SegmentError::WrongLine { step, .. }) if step == i
            ));
        }
    }

    /// Each of the 32 words of a line reaches every word of the next state (so that a cheater
    /// holding part of a line cannot compute the next address), and so does each state word.
    #[test]
    fn every_word_of_the_line_and_the_state_reaches_every_word_of_the_next_state() {
        let line: [u8; LINE_BYTES] = std::array::from_fn(|i| (i * 7 + 3) as u8);
        let base = step(&start(), &line);
        for lane in 0..LINE_BYTES / 8 {
            let mut changed = line;
            changed[lane * 8] ^= 1;
            let next = step(&start(), &changed);
            for word in 0..4 {
                assert_ne!(next.0[word], base.0[word], "lane {lane} reaches word {word}");
            }
        }
        for changed_word in 0..4 {
            let mut s = start();
            s.0[changed_word] ^= 1 << 40;
            let next = step(&s, &line);
            for word in 0..4 {
                assert_ne!(next.0[word], base.0[word], "state word {changed_word} reaches {word}");
            }
        }
    }

    /// The step as design section 2 writes it, spelled out again: a mutant of either (another
    /// fold, another lane key) would have to change both.
    #[test]
    fn the_step_is_the_designs() {
        let s = State([1, 2, 3, 4]);
        let line: [u8; LINE_BYTES] = std::array::from_fn(|i| i as u8);
        let v = |l: usize| u64::from_le_bytes(line[8 * l..8 * l + 8].try_into().unwrap());
        let n = |r: usize| {
            (0..32)
                .filter(|l| l % 4 == r)
                .fold(0u64, |acc, l| acc ^ mix64(v(l) ^ s.0[r] ^ ((l as u64) << 56)))
        };
        let s0 = mix64(n(0) ^ n(1) ^ n(2) ^ n(3) ^ 2);
        let want = State([
            s0,
            n(1).wrapping_add(3).wrapping_add(s0),
            n(2) ^ 4 ^ s0,
            n(3).wrapping_add(1).wrapping_add(s0),
        ]);
        assert_eq!(step(&s, &line), want);
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x9E37_79B9_7F4A_7C15 ^ (0x9E37_79B9_7F4A_7C15 >> 29));
    }

    #[test]
    fn a_state_reads_back_from_its_bytes_and_names_a_line_in_the_pool() {
        let s = start();
        assert_eq!(State::from_bytes(&s.to_bytes()), s);
        for pool_slices in [1, 7, 1 << 20] {
            let line = s.names(pool_slices);
            assert!(line.slice < pool_slices && u64::from(line.line) < LINES_PER_SLICE);
        }
    }
}
