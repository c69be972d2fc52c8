//! The memory proof: in version 3 (PROTOCOL.md 18) each device fills a pool with the work
//! function's own output, in version 4 (PROTOCOL.md 20) its pool is its pool chains' final
//! states; then it walks the pool, step by step, in an order that each step's result chooses.
//!
//! - [`params`]: the challenge's memory parameters and the size of each device's pool.
//! - [`bench`](mod@bench): the memory phase's bandwidths and fill rate on the CPU, for `miner bench`.
//! - [`pool`]: pool entries (a short chain each), the pool's Merkle root, a pool held in host
//!   memory.
//! - [`step`]: the walk step both versions take, under each version's domain.
//! - [`walk`]: version 3's walk: its start states, walker traces and the walk root.
//! - [`check`]: the validator's check of one opened walk segment.
//! - [`chain_pool`], [`slice`], [`slice_walk`], [`bound`]: version 4's engine (PROTOCOL.md 20,
//!   what a miner of this release speaks by default): the pool as the pool chains' final states, a 64 KiB
//!   slice of one proven against the state's BLAKE3 hash, the walk over slices with every state
//!   committed and the check of one opened step, and the clock and opening bounds against the
//!   best cheater, from which a planner sizes its openings.
//! - [`locality`]: the locality walk (docs/design/locality.md): its step, its generations, a
//!   segment's opening and the validator's check of one.
//!
//! The memory phase's signed statements are `crate::statement::memory_v3` and `memory_v4`.
//!
//! Why it proves memory: an entry costs `2 * 256 * 64 = 32768` int8 operations per byte to make
//! and one read to use. A walk step reads one whole entry that the step before it chose, so a
//! device missing part of its pool must, at that step, make the entry again, fetch it from
//! somewhere slower than its own memory, or fake the step. The walk is timed on its own, which
//! catches the first two where they are slow enough (SECURITY.md "The memory proof" says where
//! they are not); the openings catch faked steps and fake entries.

pub mod bench;
pub mod bound;
pub mod chain_pool;
pub mod check;
pub mod locality;
pub mod params;
pub mod pool;
pub mod slice;
pub mod slice_walk;
pub mod step;
pub mod walk;

pub use params::{ENTRY_BYTES, ENTRY_N, ENTRY_OPS, ENTRY_STEPS, MemoryError, MemoryParams, PoolSpec};
