//! The validator's checks: the commitment's structure, sampled openings, full re-execution.
//! Every failure has its own [`Rejection`] so that a verdict says exactly what was wrong.

use crate::backend::{Backend, BackendError, CancelToken};
use crate::chain::leaf_hash;
use crate::commitment::{WorkCommitment, global_checksum};
use crate::digest::Digest;
use crate::engine::{self, DeviceProgress, EngineError};
use crate::matrix::generate_a;
use crate::merkle::{ProofError, empty_root, verify_proof};
use crate::opening::{ChainOpening, SampleRequest};
use crate::params::Work;
use crate::partition::{DeviceSlice, MAX_DEVICES, canonical_partition};
use thiserror::Error;

/// Why a miner's answer is wrong. Each variant is one distinct reason in a stored verdict.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Rejection {
    #[error("commitment echoes nonce {got}, the challenge's is {want}")]
    NonceMismatch { want: Digest, got: Digest },
    #[error("commitment names {0} devices; 1..={MAX_DEVICES} are allowed")]
    DeviceCount(usize),
    #[error(
        "partition is not the canonical one for {chains} chains on {devices} devices: device {index} claims offset {got_offset} count {got_count}, canonical is offset {want_offset} count {want_count}"
    )]
    PartitionNotCanonical {
        chains: u64,
        devices: usize,
        index: u32,
        got_offset: u64,
        got_count: u64,
        want_offset: u64,
        want_count: u64,
    },
    #[error("device {0} has no chains but its root is not the empty root")]
    EmptyDeviceRoot(u32),
    #[error("global checksum {got} does not match {want} recomputed from the device roots")]
    GlobalChecksumMismatch { want: Digest, got: Digest },
    #[error("re-execution gives global checksum {want}, the miner committed {got}")]
    ReexecutionMismatch { want: Digest, got: Digest },
    #[error(
        "opening answers chain {got_chain} segment {got_segment}, chain {want_chain} segment {want_segment} was asked"
    )]
    OpeningForWrongRequest {
        want_chain: u64,
        want_segment: u32,
        got_chain: u64,
        got_segment: u32,
    },
    #[error(
        "chain {chain} segment {segment} is not a sample of this challenge ({chains} chains of {segments} segments)"
    )]
    NoSuchSample {
        chain: u64,
        segment: u32,
        chains: u64,
        segments: u32,
    },
    #[error("chain {chain}: opening has {got} checkpoint hashes, the challenge has {want} per chain")]
    CheckpointCount { chain: u64, got: usize, want: usize },
    #[error("chain {chain}: first checkpoint is not the hash of A_{chain}")]
    StartMatrixMismatch { chain: u64 },
    #[error("chain {chain}: leaf is not in the committed device root ({reason})")]
    LeafNotCommitted { chain: u64, reason: ProofError },
    #[error("chain {chain}: opened matrix is {got}x{got}, the challenge's is {want}x{want}")]
    OpenedMatrixSize { chain: u64, got: usize, want: usize },
    #[error("chain {chain}: opened matrix does not hash to checkpoint {segment}")]
    OpenedMatrixMismatch { chain: u64, segment: u32 },
    #[error("chain {chain}: recomputing segment {segment} does not reach checkpoint {}", segment + 1)]
    SegmentMismatch { chain: u64, segment: u32 },
}

/// A check either rejects the miner or could not be done at all (a backend failure on the
/// validator's side, which must not be blamed on the miner).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VerifyError {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("validator could not recompute: {0}")]
    Backend(#[from] BackendError),
    #[error("validator could not recompute: {0}")]
    Engine(EngineError),
}

impl From<EngineError> for VerifyError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Backend(b) => VerifyError::Backend(b),
            other => VerifyError::Engine(other),
        }
    }
}

/// The cheap checks every commitment gets: nonce echo, canonical partition, empty roots, and G.
pub fn check_commitment(work: &Work, commitment: &WorkCommitment) -> Result<(), Rejection> {
    let nonce = work.params().nonce;
    if commitment.nonce != nonce {
        return Err(Rejection::NonceMismatch {
            want: Digest(nonce),
            got: Digest(commitment.nonce),
        });
    }
    let devices = commitment.devices.len();
    let canonical = u32::try_from(devices)
        .ok()
        .and_then(|d| canonical_partition(work.num_chains(), d).ok())
        .ok_or(Rejection::DeviceCount(devices))?;
    for (want, got) in canonical.iter().zip(&commitment.devices) {
        let got = got.slice;
        if got != *want {
            return Err(partition_rejection(work.num_chains(), devices, want, &got));
        }
    }
    if let Some(d) = commitment
        .devices
        .iter()
        .find(|d| d.slice.count == 0 && d.root != empty_root())
    {
        return Err(Rejection::EmptyDeviceRoot(d.slice.index));
    }
    let want = global_checksum(&commitment.nonce, &commitment.devices);
    if want != commitment.global {
        return Err(Rejection::GlobalChecksumMismatch {
            want,
            got: commitment.global,
        });
    }
    Ok(())
}

fn partition_rejection(chains: u64, devices: usize, want: &DeviceSlice, got: &DeviceSlice) -> Rejection {
    Rejection::PartitionNotCanonical {
        chains,
        devices,
        index: got.index,
        got_offset: got.offset,
        got_count: got.count,
        want_offset: want.offset,
        want_count: want.count,
    }
}

/// Checks one opening against a commitment that passed [`check_commitment`]; recomputes c steps.
pub fn verify_opening(
    backend: &dyn Backend,
    work: &Work,
    commitment: &WorkCommitment,
    request: SampleRequest,
    opening: &ChainOpening,
    cancel: &CancelToken,
) -> Result<(), VerifyError> {
    let SampleRequest { chain, segment } = request;
    if opening.chain != chain || opening.segment != segment {
        return Err(Rejection::OpeningForWrongRequest {
            want_chain: chain,
            want_segment: segment,
            got_chain: opening.chain,
            got_segment: opening.segment,
        }
        .into());
    }
    // The validator draws its requests within the challenge, but this check must not trust its
    // caller for the indexing below.
    if chain >= work.num_chains() || segment >= work.segments() {
        return Err(Rejection::NoSuchSample {
            chain,
            segment,
            chains: work.num_chains(),
            segments: work.segments(),
        }
        .into());
    }
    let want = work.checkpoints_per_chain();
    if opening.checkpoints.len() != want {
        return Err(Rejection::CheckpointCount {
            chain,
            got: opening.checkpoints.len(),
            want,
        }
        .into());
    }
    let device = commitment.device_of(chain).ok_or(Rejection::LeafNotCommitted {
        chain,
        reason: ProofError::IndexOutOfRange {
            index: chain,
            count: work.num_chains(),
        },
    })?;
    let leaf = leaf_hash(chain, &opening.checkpoints);
    verify_proof(
        &device.root,
        &leaf,
        chain - device.slice.offset,
        device.slice.count,
        &opening.proof,
    )
    .map_err(|reason| Rejection::LeafNotCommitted { chain, reason })?;
    // A chain must start from the challenge's own A_i: O(n^2) to check, and without it a miner
    // could run a consistent chain from a cheaper start.
    if generate_a(work.key(), chain, work.n()).digest() != opening.checkpoints[0] {
        return Err(Rejection::StartMatrixMismatch { chain }.into());
    }
    if opening.start.n() != work.n() {
        return Err(Rejection::OpenedMatrixSize {
            chain,
            got: opening.start.n(),
            want: work.n(),
        }
        .into());
    }
    if opening.start.digest() != opening.checkpoints[segment as usize] {
        return Err(Rejection::OpenedMatrixMismatch { chain, segment }.into());
    }
    let c = work.checkpoint_every();
    let end = backend.advance(work, chain, opening.start.clone(), segment * c, c, cancel)?;
    if end.digest() != opening.checkpoints[segment as usize + 1] {
        return Err(Rejection::SegmentMismatch { chain, segment }.into());
    }
    Ok(())
}

/// Symmetric re-execution: recompute every chain on the validator's backend, rebuild the
/// commitment with the miner's (already checked) device count, and compare G.
pub fn verify_full(
    backend: &dyn Backend,
    work: &Work,
    commitment: &WorkCommitment,
    progress: &(dyn Fn(DeviceProgress) + Sync),
    cancel: &CancelToken,
) -> Result<(), VerifyError> {
    check_commitment(work, commitment)?;
    let chains = engine::run_all_chains(backend, work, progress, cancel)?;
    let devices =
        u32::try_from(commitment.devices.len()).map_err(|_| Rejection::DeviceCount(commitment.devices.len()))?;
    let ours = engine::commit(work, devices, chains)?.commitment;
    if ours.global != commitment.global {
        return Err(Rejection::ReexecutionMismatch {
            want: ours.global,
            got: commitment.global,
        }
        .into());
    }
    Ok(())
}
