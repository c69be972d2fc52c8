//! Sampled openings: the validator picks (chain, segment) pairs after the commitment, the miner
//! reveals the chain's checkpoints, its Merkle path and the matrix at the segment's start.

use crate::backend::{Backend, BackendError, CancelToken};
use crate::commitment::DeviceTree;
use crate::digest::Digest;
use crate::matrix::generate_a;
use crate::params::Work;
use rand_core::Rng;
use thiserror::Error;

pub use crate::statement::{ChainOpening, SampleRequest};

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum OpenError {
    #[error("chain {chain} does not exist; the challenge has {chains}")]
    NoSuchChain { chain: u64, chains: u64 },
    #[error("segment {segment} does not exist; chains have {segments}")]
    NoSuchSegment { segment: u32, segments: u32 },
    #[error("no checkpoints were kept for chain {0}")]
    NotComputed(u64),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Draws `count` requests from the validator's CSPRNG: distinct chains while there are enough,
/// each with a uniformly chosen segment; past that, no (chain, segment) pair twice while any
/// is left undrawn, since a repeated pair costs the validator a re-execution and tells it
/// nothing new. Only when `count` exceeds every pair do pairs repeat.
pub fn draw_samples(rng: &mut impl Rng, work: &Work, count: u32) -> Vec<SampleRequest> {
    let chains = work.num_chains();
    let segments = work.segments();
    let pairs = chains.saturating_mul(u64::from(segments));
    let mut picked: Vec<SampleRequest> = Vec::with_capacity(count as usize);
    let mut seen = std::collections::HashSet::new();
    while picked.len() < count as usize {
        let drawn = picked.len() as u64;
        let chain = uniform(rng, chains);
        if drawn < chains && picked.iter().any(|s| s.chain == chain) {
            continue;
        }
        let segment = uniform(rng, u64::from(segments)) as u32;
        let request = SampleRequest { chain, segment };
        // Every pair drawn once already: from here on, repeats are all there is.
        if drawn < pairs && !seen.insert(request) {
            continue;
        }
        picked.push(request);
    }
    picked
}

/// Unbiased draw from 0..bound (rejection sampling on the top of the u64 range).
fn uniform(rng: &mut impl Rng, bound: u64) -> u64 {
    assert!(bound > 0);
    let zone = u64::MAX - (u64::MAX % bound);
    loop {
        let v = rng.next_u64();
        if v < zone {
            return v % bound;
        }
    }
}

/// Whether `request` names a chain and segment that exist in `work`.
pub fn check_sample(work: &Work, request: SampleRequest) -> Result<(), OpenError> {
    let SampleRequest { chain, segment } = request;
    if chain >= work.num_chains() {
        return Err(OpenError::NoSuchChain {
            chain,
            chains: work.num_chains(),
        });
    }
    if segment >= work.segments() {
        return Err(OpenError::NoSuchSegment {
            segment,
            segments: work.segments(),
        });
    }
    Ok(())
}

/// Builds the opening for `request` from what the miner kept after executing.
pub fn open_chain(
    backend: &dyn Backend,
    work: &Work,
    checkpoints: &[Digest],
    trees: &[DeviceTree],
    request: SampleRequest,
    cancel: &CancelToken,
) -> Result<ChainOpening, OpenError> {
    check_sample(work, request)?;
    let SampleRequest { chain, segment } = request;
    let tree = trees
        .iter()
        .find(|t| t.slice.contains(chain))
        .ok_or(OpenError::NotComputed(chain))?;
    let proof = tree
        .tree
        .proof(chain - tree.slice.offset)
        .ok_or(OpenError::NotComputed(chain))?;
    let steps = segment * work.checkpoint_every();
    let a = generate_a(work.key(), chain, work.n());
    let start = if steps == 0 {
        a
    } else {
        backend.advance(work, chain, a, 0, steps, cancel)?
    };
    Ok(ChainOpening {
        chain,
        segment,
        checkpoints: checkpoints.to_vec(),
        proof,
        start,
    })
}
