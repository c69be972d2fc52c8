//! The challenge of PROTOCOL.md section 12, whose published checkpoints pin the work function:
//! the known answer that self-checks, benches and tests start from.

use crate::params::ChallengeParams;

/// PROTOCOL.md section 12: `nonce = 00..1f`, `seed = 20..3f`, `miner_key = 40..5f`, n = 64,
/// M = 5, K = 4, c = 2.
pub fn vector_params() -> ChallengeParams {
    ChallengeParams {
        nonce: core::array::from_fn(|i| i as u8),
        seed: core::array::from_fn(|i| 0x20 + i as u8),
        miner_key: core::array::from_fn(|i| 0x40 + i as u8),
        n: 64,
        num_chains: 5,
        iterations: 4,
        checkpoint_every: 2,
    }
}

/// Chain 0's checkpoints of the vector challenge, as PROTOCOL.md publishes them.
pub const VECTOR_CHAIN0_CHECKPOINTS: [&str; 3] = [
    "394add245fd191a8bd07581fdeded2d8a0c5e17a278aba05d6dad807e47b69a6",
    "ed31891588d3459c78d5b014f063e8d3e1a46c261822839c9a348c62d8d63660",
    "41b4a1ef86ea66a2e647023f63e91ffbd6c7b18f039a8c4cc68479b968af3720",
];

/// PROTOCOL.md 20.6: section 12's nonce, seed and miner key with n = 512, M = 3, K = 2, c = 1,
/// on one device, version 4's vector challenge.
pub fn v4_vector_params() -> ChallengeParams {
    ChallengeParams {
        n: 512,
        num_chains: 3,
        iterations: 2,
        checkpoint_every: 1,
        ..vector_params()
    }
}

/// PROTOCOL.md 20.6's walk seed: `60 61 .. 7f`.
pub fn v4_walk_seed() -> [u8; 32] {
    core::array::from_fn(|i| 0x60 + i as u8)
}
