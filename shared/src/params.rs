//! Challenge parameters, their limits, and the key every matrix is derived from.

use crate::digest::Digest;
use thiserror::Error;

/// Version 3, the memory phase of a filled pool (PROTOCOL.md 18): what a miner of this release
/// speaks where its backend holds pools but cannot say [`NEWEST_PROTOCOL_VERSION`] (its operator
/// turned `protocol_4` off, or its GPU's version 4 walk failed its self-check). Validators of
/// this release refuse its memory phase by default.
pub const PROTOCOL_VERSION: u32 = 3;
/// The newest version this crate speaks with a peer that says it: version 4's memory proof over
/// the chains' own states (PROTOCOL.md 20). A validator attests a miner whose inventory says 4
/// under version 4; a miner of this release says 4 by default wherever its backend keeps its
/// chains' states (`protocol_4`).
pub const NEWEST_PROTOCOL_VERSION: u32 = 4;
/// The oldest version it still speaks: a version 2 miner can be challenged without a memory
/// phase, where a validator allows that (its verdicts then prove no memory).
pub const MIN_PROTOCOL_VERSION: u32 = 2;

/// Matrix dimension bounds. Every n is a multiple of 64 so that GPU tiles and the CPU kernel's
/// 8x32 register tiles never need edge handling.
pub const MIN_N: u32 = 64;
pub const MAX_N: u32 = 8192;
pub const N_MULTIPLE: u32 = 64;
/// Most chains one challenge may ask for.
pub const MAX_CHAINS: u64 = 1 << 20;
/// Most GEMM steps per chain; `mix` takes the step as u32, and a chain must stay openable.
pub const MAX_ITERATIONS: u32 = 1 << 20;
/// Most segments (K / c) per chain: an opening carries K/c + 1 checkpoint hashes.
pub const MAX_SEGMENTS: u32 = 1024;
/// Most checkpoint hashes one challenge produces (M * (K/c + 1)); the miner keeps them all until
/// the validator has asked for its openings, so this bounds its memory at 128 MiB.
pub const MAX_TOTAL_CHECKPOINTS: u64 = 1 << 22;

const KEY_CONTEXT: &str = "gpu-attest v1 matrix key";

/// The parameters of one challenge, as they travel. Use [`Work::new`] to check them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChallengeParams {
    /// 32 random bytes chosen by the validator; the challenge's id.
    pub nonce: [u8; 32],
    /// 32 random bytes chosen by the validator, independent of the nonce.
    pub seed: [u8; 32],
    /// The ed25519 public key of the miner the work is bound to.
    pub miner_key: [u8; 32],
    /// Matrix dimension n.
    pub n: u32,
    /// Number of chains M (one A_i, B_i pair each).
    pub num_chains: u64,
    /// GEMM steps per chain, K.
    pub iterations: u32,
    /// Steps between checkpoints, c; divides K.
    pub checkpoint_every: u32,
}

/// Why a set of parameters is not a valid v1 challenge.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ParamsError {
    #[error("matrix size n={0} is outside {MIN_N}..={MAX_N}")]
    SizeOutOfRange(u32),
    #[error("matrix size n={0} is not a multiple of {N_MULTIPLE}")]
    SizeNotAligned(u32),
    #[error("number of chains {0} is outside 1..={MAX_CHAINS}")]
    ChainsOutOfRange(u64),
    #[error("iterations {0} is outside 1..={MAX_ITERATIONS}")]
    IterationsOutOfRange(u32),
    #[error("checkpoint interval {every} must be in 1..=iterations ({iterations})")]
    CheckpointOutOfRange { every: u32, iterations: u32 },
    #[error("checkpoint interval {every} does not divide iterations {iterations}")]
    CheckpointNotDivisor { every: u32, iterations: u32 },
    #[error("{segments} segments per chain exceeds the limit of {MAX_SEGMENTS}; raise checkpoint_every")]
    TooManySegments { segments: u32 },
    #[error("{total} checkpoint hashes in all exceeds the limit of {MAX_TOTAL_CHECKPOINTS}")]
    TooManyCheckpoints { total: u64 },
}

impl ChallengeParams {
    /// Checks every limit of PROTOCOL.md "Parameters".
    pub fn validate(&self) -> Result<(), ParamsError> {
        if !(MIN_N..=MAX_N).contains(&self.n) {
            return Err(ParamsError::SizeOutOfRange(self.n));
        }
        if !self.n.is_multiple_of(N_MULTIPLE) {
            return Err(ParamsError::SizeNotAligned(self.n));
        }
        if !(1..=MAX_CHAINS).contains(&self.num_chains) {
            return Err(ParamsError::ChainsOutOfRange(self.num_chains));
        }
        if !(1..=MAX_ITERATIONS).contains(&self.iterations) {
            return Err(ParamsError::IterationsOutOfRange(self.iterations));
        }
        let (every, iterations) = (self.checkpoint_every, self.iterations);
        if every == 0 || every > iterations {
            return Err(ParamsError::CheckpointOutOfRange { every, iterations });
        }
        if iterations % every != 0 {
            return Err(ParamsError::CheckpointNotDivisor { every, iterations });
        }
        let segments = iterations / every;
        if segments > MAX_SEGMENTS {
            return Err(ParamsError::TooManySegments { segments });
        }
        let total = self.num_chains * (u64::from(segments) + 1);
        if total > MAX_TOTAL_CHECKPOINTS {
            return Err(ParamsError::TooManyCheckpoints { total });
        }
        Ok(())
    }

    /// The canonical byte string the matrix key is derived from (PROTOCOL.md "Key").
    pub fn key_material(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + 32);
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.seed);
        out.extend_from_slice(&self.miner_key);
        out.extend_from_slice(&u64::from(self.n).to_le_bytes());
        out.extend_from_slice(&self.num_chains.to_le_bytes());
        out.extend_from_slice(&u64::from(self.iterations).to_le_bytes());
        out.extend_from_slice(&u64::from(self.checkpoint_every).to_le_bytes());
        out
    }
}

/// Validated parameters with everything derived from them: the only way into the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Work {
    params: ChallengeParams,
    key: [u8; 32],
}

impl Work {
    pub fn new(params: ChallengeParams) -> Result<Self, ParamsError> {
        params.validate()?;
        let key = blake3::derive_key(KEY_CONTEXT, &params.key_material());
        Ok(Work { params, key })
    }

    pub fn params(&self) -> &ChallengeParams {
        &self.params
    }

    /// The ChaCha8 key all of this challenge's matrices come from.
    pub fn key(&self) -> &[u8; 32] {
        &self.key
    }

    pub fn n(&self) -> usize {
        self.params.n as usize
    }

    pub fn num_chains(&self) -> u64 {
        self.params.num_chains
    }

    pub fn iterations(&self) -> u32 {
        self.params.iterations
    }

    pub fn checkpoint_every(&self) -> u32 {
        self.params.checkpoint_every
    }

    /// K / c: the number of segments a chain is cut into.
    pub fn segments(&self) -> u32 {
        self.params.iterations / self.params.checkpoint_every
    }

    /// Checkpoint hashes per chain: K/c + 1 (the first hashes A_i itself).
    pub fn checkpoints_per_chain(&self) -> usize {
        self.segments() as usize + 1
    }

    /// Integer operations in the whole challenge (2 n^3 per GEMM step).
    pub fn total_ops(&self) -> u128 {
        let n = u128::from(self.params.n);
        2 * n * n * n * u128::from(self.params.iterations) * u128::from(self.params.num_chains)
    }

    pub fn nonce_digest(&self) -> Digest {
        Digest(self.params.nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> ChallengeParams {
        ChallengeParams {
            nonce: [1; 32],
            seed: [2; 32],
            miner_key: [3; 32],
            n: 64,
            num_chains: 4,
            iterations: 8,
            checkpoint_every: 2,
        }
    }

    #[test]
    fn accepts_valid() {
        assert!(Work::new(ok()).is_ok());
    }

    #[test]
    fn rejects_each_limit_with_its_own_error() {
        let cases: Vec<(ChallengeParams, ParamsError)> = vec![
            (ChallengeParams { n: 0, ..ok() }, ParamsError::SizeOutOfRange(0)),
            (ChallengeParams { n: 8256, ..ok() }, ParamsError::SizeOutOfRange(8256)),
            (ChallengeParams { n: 100, ..ok() }, ParamsError::SizeNotAligned(100)),
            (
                ChallengeParams { num_chains: 0, ..ok() },
                ParamsError::ChainsOutOfRange(0),
            ),
            (
                ChallengeParams {
                    num_chains: MAX_CHAINS + 1,
                    ..ok()
                },
                ParamsError::ChainsOutOfRange(MAX_CHAINS + 1),
            ),
            (
                ChallengeParams {
                    iterations: 0,
                    checkpoint_every: 1,
                    ..ok()
                },
                ParamsError::IterationsOutOfRange(0),
            ),
            (
                ChallengeParams {
                    checkpoint_every: 0,
                    ..ok()
                },
                ParamsError::CheckpointOutOfRange {
                    every: 0,
                    iterations: 8,
                },
            ),
            (
                ChallengeParams {
                    checkpoint_every: 9,
                    ..ok()
                },
                ParamsError::CheckpointOutOfRange {
                    every: 9,
                    iterations: 8,
                },
            ),
            (
                ChallengeParams {
                    checkpoint_every: 3,
                    ..ok()
                },
                ParamsError::CheckpointNotDivisor {
                    every: 3,
                    iterations: 8,
                },
            ),
            (
                ChallengeParams {
                    iterations: 2048,
                    checkpoint_every: 1,
                    ..ok()
                },
                ParamsError::TooManySegments { segments: 2048 },
            ),
            (
                ChallengeParams {
                    num_chains: 1 << 20,
                    iterations: 8,
                    checkpoint_every: 1,
                    ..ok()
                },
                ParamsError::TooManyCheckpoints { total: 9 << 20 },
            ),
        ];
        for (params, expected) in cases {
            assert_eq!(Work::new(params).unwrap_err(), expected, "{params:?}");
        }
    }

    #[test]
    fn key_binds_every_parameter() {
        let base = Work::new(ok()).unwrap();
        let variants = [
            ChallengeParams { nonce: [9; 32], ..ok() },
            ChallengeParams { seed: [9; 32], ..ok() },
            ChallengeParams {
                miner_key: [9; 32],
                ..ok()
            },
            ChallengeParams { n: 128, ..ok() },
            ChallengeParams { num_chains: 5, ..ok() },
            ChallengeParams { iterations: 16, ..ok() },
            ChallengeParams {
                checkpoint_every: 4,
                ..ok()
            },
        ];
        for params in variants {
            assert_ne!(Work::new(params).unwrap().key(), base.key(), "{params:?}");
        }
    }
}
