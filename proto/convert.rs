//! Conversions between wire messages and engine types. Each `*_from_wire` checks every length
//! and count before allocating or indexing.

pub use crate::fields::WireError;
use crate::fields::{bytes32, digests, signature, wire_err};
use crate::v1;
use gpu_attest_shared::commitment::{DeviceRoot, WorkCommitment};
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::inventory::{HardwareClaim, Inventory, MinerLimits};
use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::chain_pool::ChainPoolParams;
use gpu_attest_shared::memory::check::{OpenedEntry, WalkOpening};
use gpu_attest_shared::memory::params::{ENTRY_BYTES, MAX_WALK_CHECKPOINT_EVERY, MAX_WALK_SEGMENTS, MemoryParams};
use gpu_attest_shared::merkle::MerkleProof;
use gpu_attest_shared::opening::{ChainOpening, SampleRequest};
use gpu_attest_shared::params::{ChallengeParams, MAX_SEGMENTS};
use gpu_attest_shared::partition::{DeviceSlice, MAX_DEVICES};
use gpu_attest_shared::statement::memory_v3::{PoolCommitment, WalkSample, WalkStatement};
use gpu_attest_shared::statement::memory_v4::StepSample;
use gpu_attest_shared::statement::{Challenge, Commitment, DeviceInfo, MemoryPhase};

pub fn params_to_wire(p: &ChallengeParams) -> v1::ChallengeParams {
    v1::ChallengeParams {
        nonce: p.nonce.to_vec(),
        seed: p.seed.to_vec(),
        miner_key: p.miner_key.to_vec(),
        n: p.n,
        num_chains: p.num_chains,
        iterations: p.iterations,
        checkpoint_every: p.checkpoint_every,
    }
}

/// Lengths only; the protocol limits are checked by `Work::new`.
pub fn params_from_wire(p: &v1::ChallengeParams) -> Result<ChallengeParams, WireError> {
    Ok(ChallengeParams {
        nonce: bytes32("params.nonce", &p.nonce)?,
        seed: bytes32("params.seed", &p.seed)?,
        miner_key: bytes32("params.miner_key", &p.miner_key)?,
        n: p.n,
        num_chains: p.num_chains,
        iterations: p.iterations,
        checkpoint_every: p.checkpoint_every,
    })
}

pub fn challenge_to_wire(c: &Challenge, sig: &[u8; 64]) -> v1::Challenge {
    v1::Challenge {
        params: Some(params_to_wire(&c.params)),
        issued_at_unix_ms: c.issued_at_ms,
        deadline_unix_ms: c.deadline_ms,
        validator_key: c.validator_key.0.to_vec(),
        signature: sig.to_vec(),
        inventory_digest: c.inventory_digest.0.to_vec(),
        memory: c.memory.as_ref().and_then(MemoryPhase::v3).map(memory_to_wire),
        finish_by_unix_ms: c.finish_by_ms.unwrap_or(0),
        chain_pool: match &c.memory {
            Some(MemoryPhase::V4(pool)) => Some(v1::ChainPoolParams {
                walkers: pool.walkers,
                walk_steps: pool.walk_steps,
                pool_chains: pool.pool_chains.clone(),
            }),
            _ => None,
        },
    }
}

pub fn memory_to_wire(m: &MemoryParams) -> v1::MemoryParams {
    v1::MemoryParams {
        pool_permille: m.pool_permille,
        walkers: m.walkers,
        walk_steps: m.walk_steps,
        walk_checkpoint_every: m.walk_checkpoint_every,
    }
}

/// No checks: the limits of PROTOCOL.md 18.1 are [`MemoryParams::validate`]'s job.
pub fn memory_from_wire(m: &v1::MemoryParams) -> MemoryParams {
    MemoryParams {
        pool_permille: m.pool_permille,
        walkers: m.walkers,
        walk_steps: m.walk_steps,
        walk_checkpoint_every: m.walk_checkpoint_every,
    }
}

pub fn challenge_from_wire(c: &v1::Challenge) -> Result<(Challenge, [u8; 64]), WireError> {
    let params = c.params.as_ref().ok_or_else(|| wire_err("params", "missing"))?;
    let challenge = Challenge {
        params: params_from_wire(params)?,
        issued_at_ms: c.issued_at_unix_ms,
        deadline_ms: c.deadline_unix_ms,
        validator_key: PublicKey(bytes32("validator_key", &c.validator_key)?),
        inventory_digest: Digest(bytes32("inventory_digest", &c.inventory_digest)?),
        memory: memory_phase_from_wire(c)?,
        finish_by_ms: (c.finish_by_unix_ms != 0).then_some(c.finish_by_unix_ms),
    };
    Ok((challenge, signature("signature", &c.signature)?))
}

/// The challenge's memory phase: version 3's, version 4's or none; never both. No limits
/// beyond the list's length: the rest of PROTOCOL.md 20's are [`ChainPoolParams::pools`]'s job.
fn memory_phase_from_wire(c: &v1::Challenge) -> Result<Option<MemoryPhase>, WireError> {
    match (&c.memory, &c.chain_pool) {
        (None, None) => Ok(None),
        (Some(m), None) => Ok(Some(MemoryPhase::V3(memory_from_wire(m)))),
        (None, Some(pool)) => {
            if pool.pool_chains.len() > MAX_DEVICES as usize {
                return Err(wire_err(
                    "chain_pool.pool_chains",
                    format!("more than {MAX_DEVICES} devices"),
                ));
            }
            Ok(Some(MemoryPhase::V4(ChainPoolParams {
                walkers: pool.walkers,
                walk_steps: pool.walk_steps,
                pool_chains: pool.pool_chains.clone(),
            })))
        }
        (Some(_), Some(_)) => Err(wire_err(
            "chain_pool",
            "present beside memory: a challenge is version 3 or version 4, not both",
        )),
    }
}

pub fn device_to_wire(d: &DeviceInfo) -> v1::DeviceInfo {
    v1::DeviceInfo {
        index: d.index,
        name: d.name.clone(),
        uuid: d.uuid.clone(),
        memory_bytes: d.memory_bytes,
        sm_count: d.sm_count,
        compute_capability_major: d.compute_capability.0,
        compute_capability_minor: d.compute_capability.1,
        pci_bus_id: d.pci_bus_id.clone(),
        driver_version: d.driver_version.clone(),
    }
}

pub fn device_from_wire(d: &v1::DeviceInfo) -> DeviceInfo {
    DeviceInfo {
        index: d.index,
        name: d.name.clone(),
        uuid: d.uuid.clone(),
        memory_bytes: d.memory_bytes,
        sm_count: d.sm_count,
        compute_capability: (d.compute_capability_major, d.compute_capability_minor),
        pci_bus_id: d.pci_bus_id.clone(),
        driver_version: d.driver_version.clone(),
    }
}

pub fn limits_to_wire(l: &MinerLimits) -> v1::MinerLimits {
    v1::MinerLimits {
        max_n: l.max_n,
        max_chains: l.max_chains,
        max_iterations: l.max_iterations,
        max_duration_ms: l.max_duration_ms,
        max_samples: l.max_samples,
    }
}

pub fn limits_from_wire(l: &v1::MinerLimits) -> MinerLimits {
    MinerLimits {
        max_n: l.max_n,
        max_chains: l.max_chains,
        max_iterations: l.max_iterations,
        max_duration_ms: l.max_duration_ms,
        max_samples: l.max_samples,
    }
}

pub fn inventory_to_wire(i: &Inventory) -> v1::Inventory {
    v1::Inventory {
        miner_key: i.miner_key.0.to_vec(),
        backend: i.claim.backend.clone(),
        kernel: i.claim.kernel.clone(),
        devices: i.claim.devices.iter().map(device_to_wire).collect(),
        protocol_version: i.protocol_version,
        software_version: i.software_version.clone(),
        limits: Some(limits_to_wire(&i.limits)),
        // Filled by the miner service from its self-check; never part of the inventory's claim.
        self_checks: Vec::new(),
        takes_finish_by: i.takes_finish_by,
        // Answered by the miner service to the validator key its request names; never part of
        // the inventory's claim either.
        validator_standing: v1::ValidatorStanding::Unstated as i32,
    }
}

/// Shape only (key length, a bounded device list); what the protocol allows is
/// [`Inventory::check`]'s job. Missing limits read as "not stated" (zeros).
pub fn inventory_from_wire(i: &v1::Inventory) -> Result<Inventory, WireError> {
    // The check names the count; a list far past the limit is not worth converting first.
    if i.devices.len() > 4 * MAX_DEVICES as usize {
        return Err(wire_err("devices", format!("{} devices", i.devices.len())));
    }
    Ok(Inventory {
        miner_key: PublicKey(bytes32("miner_key", &i.miner_key)?),
        claim: HardwareClaim {
            backend: i.backend.clone(),
            kernel: i.kernel.clone(),
            devices: i.devices.iter().map(device_from_wire).collect(),
        },
        protocol_version: i.protocol_version,
        software_version: i.software_version.clone(),
        limits: limits_from_wire(&i.limits.unwrap_or_default()),
        takes_finish_by: i.takes_finish_by,
    })
}

pub fn commitment_to_wire(c: &Commitment, sig: &[u8; 64]) -> v1::Commitment {
    v1::Commitment {
        nonce: c.work.nonce.to_vec(),
        miner_key: c.miner_key.0.to_vec(),
        validator_key: c.validator_key.0.to_vec(),
        devices: c
            .work
            .devices
            .iter()
            .map(|d| v1::DeviceRoot {
                index: d.slice.index,
                offset: d.slice.offset,
                count: d.slice.count,
                root: d.root.0.to_vec(),
            })
            .collect(),
        global_checksum: c.work.global.0.to_vec(),
        inventory: c.inventory.iter().map(device_to_wire).collect(),
        backend: c.backend.clone(),
        kernel: c.kernel.clone(),
        compute_ms: c.compute_ms,
        signature: sig.to_vec(),
        pools: c
            .pools
            .iter()
            .flatten()
            .map(|p| v1::PoolRoot {
                index: p.device,
                entries: p.entries,
                root: p.root.0.to_vec(),
            })
            .collect(),
        // Device evidence is signed apart (PROTOCOL.md 19.3): `crate::evidence` fills it.
        evidence: Vec::new(),
        evidence_signature: Vec::new(),
    }
}

pub fn commitment_from_wire(c: &v1::Commitment) -> Result<(Commitment, [u8; 64]), WireError> {
    // Each list is named by its own field: a commitment with 65 pools has too many pools, not
    // too many devices.
    for (field, len, what) in [
        ("devices", c.devices.len(), "device roots"),
        ("inventory", c.inventory.len(), "devices in its inventory"),
        ("pools", c.pools.len(), "pools"),
    ] {
        if len > MAX_DEVICES as usize {
            return Err(wire_err(
                field,
                format!("{len} {what}, more than the {MAX_DEVICES} a claim may hold"),
            ));
        }
    }
    let devices = c
        .devices
        .iter()
        .map(|d| {
            Ok(DeviceRoot {
                slice: DeviceSlice {
                    index: d.index,
                    offset: d.offset,
                    count: d.count,
                },
                root: Digest(bytes32("devices.root", &d.root)?),
            })
        })
        .collect::<Result<Vec<_>, WireError>>()?;
    let pools = c
        .pools
        .iter()
        .map(|p| {
            Ok(PoolCommitment {
                device: p.index,
                entries: p.entries,
                root: Digest(bytes32("pools.root", &p.root)?),
            })
        })
        .collect::<Result<Vec<_>, WireError>>()?;
    let commitment = Commitment {
        work: WorkCommitment {
            nonce: bytes32("nonce", &c.nonce)?,
            devices,
            global: Digest(bytes32("global_checksum", &c.global_checksum)?),
        },
        miner_key: PublicKey(bytes32("miner_key", &c.miner_key)?),
        validator_key: PublicKey(bytes32("validator_key", &c.validator_key)?),
        inventory: c.inventory.iter().map(device_from_wire).collect(),
        backend: c.backend.clone(),
        kernel: c.kernel.clone(),
        compute_ms: c.compute_ms,
        // A version 3 commitment names a pool for each of its (at least one) devices.
        pools: (!pools.is_empty()).then_some(pools),
    };
    Ok((commitment, signature("signature", &c.signature)?))
}

pub fn sample_to_wire(s: &SampleRequest) -> v1::SampleRequest {
    v1::SampleRequest {
        chain: s.chain,
        segment: s.segment,
    }
}

pub fn sample_from_wire(s: &v1::SampleRequest) -> SampleRequest {
    SampleRequest {
        chain: s.chain,
        segment: s.segment,
    }
}

/// An open request's fields, their lengths checked: what the miner verifies the request's
/// signature over (PROTOCOL.md 13.3), and who it says sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRequest {
    pub nonce: [u8; 32],
    pub validator_key: [u8; 32],
    pub samples: Vec<SampleRequest>,
    /// Walk segments to open (version 3; empty in version 2).
    pub walks: Vec<WalkSample>,
    /// Walk steps to open (version 4; empty otherwise).
    pub steps: Vec<StepSample>,
    pub signature: [u8; 64],
}

/// Decodes an `OpenChainsRequest`: a nonce or key that is not 32 bytes, or a signature that is
/// not 64, is malformed (as in a challenge), not a stranger's key or a bad signature.
pub fn open_request_from_wire(r: &v1::OpenChainsRequest) -> Result<OpenRequest, WireError> {
    if !r.walk_samples.is_empty() && !r.step_samples.is_empty() {
        return Err(wire_err(
            "step_samples",
            "beside walk_samples: a commitment is opened as version 3 or version 4, not both",
        ));
    }
    Ok(OpenRequest {
        nonce: bytes32("nonce", &r.nonce)?,
        validator_key: bytes32("validator_key", &r.validator_key)?,
        samples: r.samples.iter().map(sample_from_wire).collect(),
        walks: r.walk_samples.iter().map(walk_sample_from_wire).collect(),
        steps: r
            .step_samples
            .iter()
            .map(crate::memory_v4::step_sample_from_wire)
            .collect(),
        signature: signature("signature", &r.signature)?,
    })
}

pub fn walk_sample_to_wire(s: &WalkSample) -> v1::WalkSampleRequest {
    v1::WalkSampleRequest {
        device: s.device,
        walker: s.walker,
        segment: s.segment,
    }
}

pub fn walk_sample_from_wire(s: &v1::WalkSampleRequest) -> WalkSample {
    WalkSample {
        device: s.device,
        walker: s.walker,
        segment: s.segment,
    }
}

/// A walk request's fields, their lengths checked (PROTOCOL.md 18.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkRequest {
    pub nonce: [u8; 32],
    pub walk_seed: [u8; 32],
    pub deadline_ms: u64,
    pub validator_key: [u8; 32],
    pub signature: [u8; 64],
}

pub fn walk_request_to_wire(r: &WalkRequest) -> v1::WalkRequest {
    v1::WalkRequest {
        nonce: r.nonce.to_vec(),
        walk_seed: r.walk_seed.to_vec(),
        deadline_unix_ms: r.deadline_ms,
        validator_key: r.validator_key.to_vec(),
        signature: r.signature.to_vec(),
    }
}

pub fn walk_request_from_wire(r: &v1::WalkRequest) -> Result<WalkRequest, WireError> {
    Ok(WalkRequest {
        nonce: bytes32("nonce", &r.nonce)?,
        walk_seed: bytes32("walk_seed", &r.walk_seed)?,
        deadline_ms: r.deadline_unix_ms,
        validator_key: bytes32("validator_key", &r.validator_key)?,
        signature: signature("signature", &r.signature)?,
    })
}

pub fn walk_statement_to_wire(w: &WalkStatement, sig: &[u8; 64]) -> v1::WalkStatement {
    v1::WalkStatement {
        nonce: w.nonce.to_vec(),
        miner_key: w.miner_key.0.to_vec(),
        validator_key: w.validator_key.0.to_vec(),
        walk_seed: w.walk_seed.to_vec(),
        roots: w
            .roots
            .iter()
            .map(|(index, root)| v1::WalkRoot {
                index: *index,
                root: root.0.to_vec(),
            })
            .collect(),
        walk_ms: w.walk_ms,
        signature: sig.to_vec(),
    }
}

pub fn walk_statement_from_wire(w: &v1::WalkStatement) -> Result<(WalkStatement, [u8; 64]), WireError> {
    if w.roots.len() > MAX_DEVICES as usize {
        return Err(wire_err("roots", format!("more than {MAX_DEVICES} walk roots")));
    }
    let statement = WalkStatement {
        nonce: bytes32("nonce", &w.nonce)?,
        miner_key: PublicKey(bytes32("miner_key", &w.miner_key)?),
        validator_key: PublicKey(bytes32("validator_key", &w.validator_key)?),
        walk_seed: bytes32("walk_seed", &w.walk_seed)?,
        roots: w
            .roots
            .iter()
            .map(|r| Ok((r.index, Digest(bytes32("roots.root", &r.root)?))))
            .collect::<Result<_, WireError>>()?,
        walk_ms: w.walk_ms,
    };
    Ok((statement, signature("signature", &w.signature)?))
}

pub fn walk_opening_to_wire(nonce: &[u8; 32], o: &WalkOpening, sig: &[u8; 64]) -> v1::WalkOpening {
    v1::WalkOpening {
        nonce: nonce.to_vec(),
        device: o.device,
        walker: o.walker,
        segment: o.segment,
        checkpoints: o.checkpoints.iter().map(|d| d.0.to_vec()).collect(),
        proof: o.proof.siblings.iter().map(|d| d.0.to_vec()).collect(),
        entries: o
            .entries
            .iter()
            .map(|e| v1::PoolEntryOpening {
                entry: e.bytes.clone(),
                proof: e.proof.siblings.iter().map(|d| d.0.to_vec()).collect(),
            })
            .collect(),
        signature: sig.to_vec(),
    }
}

/// Shape only: at most `MAX_WALK_SEGMENTS + 1` checkpoints and `MAX_WALK_CHECKPOINT_EVERY`
/// entries of exactly 65536 bytes; whether they fit the challenge is the walk check's job.
pub fn walk_opening_from_wire(o: &v1::WalkOpening) -> Result<([u8; 32], WalkOpening, [u8; 64]), WireError> {
    if o.entries.len() > MAX_WALK_CHECKPOINT_EVERY as usize {
        return Err(wire_err(
            "walk.entries",
            format!(
                "{} entries, at most {MAX_WALK_CHECKPOINT_EVERY} allowed",
                o.entries.len()
            ),
        ));
    }
    let entries = o
        .entries
        .iter()
        .map(|e| {
            if e.entry.len() != ENTRY_BYTES {
                return Err(wire_err(
                    "walk.entries.entry",
                    format!("must be {ENTRY_BYTES} bytes, got {}", e.entry.len()),
                ));
            }
            Ok(OpenedEntry {
                bytes: e.entry.clone(),
                // A pool of at most 2^24 entries has a proof of at most 24 siblings.
                proof: MerkleProof {
                    siblings: digests("walk.entries.proof", &e.proof, 64)?,
                },
            })
        })
        .collect::<Result<Vec<_>, WireError>>()?;
    let opening = WalkOpening {
        device: o.device,
        walker: o.walker,
        segment: o.segment,
        checkpoints: digests("walk.checkpoints", &o.checkpoints, MAX_WALK_SEGMENTS as usize + 1)?,
        proof: MerkleProof {
            siblings: digests("walk.proof", &o.proof, 64)?,
        },
        entries,
    };
    Ok((
        bytes32("walk.nonce", &o.nonce)?,
        opening,
        signature("walk.signature", &o.signature)?,
    ))
}

pub fn opening_to_wire(nonce: &[u8; 32], o: &ChainOpening, sig: &[u8; 64]) -> v1::ChainOpening {
    v1::ChainOpening {
        nonce: nonce.to_vec(),
        chain: o.chain,
        segment: o.segment,
        checkpoints: o.checkpoints.iter().map(|d| d.0.to_vec()).collect(),
        proof: o.proof.siblings.iter().map(|d| d.0.to_vec()).collect(),
        start_matrix: o.start.as_bytes().to_vec(),
        signature: sig.to_vec(),
        walk: None,
        step: None,
    }
}

/// `n` is the challenge's matrix size: the opened matrix must be exactly n*n bytes.
pub fn opening_from_wire(o: &v1::ChainOpening, n: usize) -> Result<([u8; 32], ChainOpening, [u8; 64]), WireError> {
    let start = Matrix::from_bytes(n, &o.start_matrix).ok_or_else(|| {
        wire_err(
            "start_matrix",
            format!("must be {n}x{n} = {} bytes, got {}", n * n, o.start_matrix.len()),
        )
    })?;
    let opening = ChainOpening {
        chain: o.chain,
        segment: o.segment,
        checkpoints: digests("checkpoints", &o.checkpoints, MAX_SEGMENTS as usize + 1)?,
        // A tree over at most 2^20 chains has at most 20 levels.
        proof: MerkleProof {
            siblings: digests("proof", &o.proof, 64)?,
        },
        start,
    };
    Ok((
        bytes32("nonce", &o.nonce)?,
        opening,
        signature("signature", &o.signature)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_fields_are_named_errors() {
        let mut wire = v1::Challenge {
            params: Some(v1::ChallengeParams::default()),
            ..Default::default()
        };
        assert_eq!(challenge_from_wire(&wire).unwrap_err().field, "params.nonce");
        wire.params = None;
        assert_eq!(challenge_from_wire(&wire).unwrap_err().field, "params");
        let opening = v1::ChainOpening {
            start_matrix: vec![0; 10],
            ..Default::default()
        };
        assert_eq!(opening_from_wire(&opening, 64).unwrap_err().field, "start_matrix");
    }

    /// A version 4 challenge crosses the wire whole; one that carries both versions' memory
    /// phases, or pool sizes for more devices than any inventory lists, is refused by name.
    #[test]
    fn a_version_4_challenge_round_trips_and_is_never_also_version_3() {
        let challenge = Challenge {
            params: gpu_attest_shared::vectors::vector_params(),
            issued_at_ms: 1,
            deadline_ms: 2,
            validator_key: PublicKey([3; 32]),
            inventory_digest: Digest([4; 32]),
            memory: Some(MemoryPhase::V4(ChainPoolParams {
                walkers: 5,
                walk_steps: 6,
                pool_chains: vec![7, 8],
            })),
            finish_by_ms: None,
        };
        let wire = challenge_to_wire(&challenge, &[9; 64]);
        assert!(wire.memory.is_none());
        assert_eq!(challenge_from_wire(&wire).unwrap(), (challenge, [9; 64]));

        let mut both = wire.clone();
        both.memory = Some(v1::MemoryParams::default());
        assert_eq!(challenge_from_wire(&both).unwrap_err().field, "chain_pool");
        let mut too_many = wire;
        too_many.chain_pool.as_mut().unwrap().pool_chains = vec![1; MAX_DEVICES as usize + 1];
        assert_eq!(
            challenge_from_wire(&too_many).unwrap_err().field,
            "chain_pool.pool_chains"
        );
    }

    #[test]
    fn an_open_request_names_its_wrong_length_field() {
        let good = v1::OpenChainsRequest {
            nonce: vec![1; 32],
            validator_key: vec![2; 32],
            samples: vec![v1::SampleRequest { chain: 3, segment: 1 }],
            signature: vec![4; 64],
            walk_samples: Vec::new(),
            step_samples: Vec::new(),
        };
        let decoded = open_request_from_wire(&good).unwrap();
        assert_eq!((decoded.nonce, decoded.validator_key), ([1; 32], [2; 32]));
        assert_eq!(decoded.samples, vec![SampleRequest { chain: 3, segment: 1 }]);
        assert_eq!(decoded.signature, [4; 64]);
        type Breaks = fn(&mut v1::OpenChainsRequest);
        let broken: [(&str, Breaks); 4] = [
            ("nonce", |r| r.nonce.truncate(31)),
            ("validator_key", |r| r.validator_key = vec![2]),
            ("signature", |r| r.signature.clear()),
            ("signature", |r| r.signature.push(0)),
        ];
        for (field, breaks) in broken {
            let mut request = good.clone();
            breaks(&mut request);
            assert_eq!(open_request_from_wire(&request).unwrap_err().field, field);
        }
        // Version 3's walk samples and version 4's steps never travel together.
        let mut both = good.clone();
        both.walk_samples = vec![v1::WalkSampleRequest::default()];
        both.step_samples = vec![v1::StepSampleRequest::default()];
        assert_eq!(open_request_from_wire(&both).unwrap_err().field, "step_samples");
        let mut steps = good;
        steps.step_samples = vec![v1::StepSampleRequest {
            device: 1,
            walker: 2,
            step: 3,
        }];
        let decoded = open_request_from_wire(&steps).unwrap();
        assert_eq!((decoded.steps[0].walker, decoded.steps[0].step), (2, 3));
    }

    #[test]
    fn commitment_round_trips() {
        let c = Commitment {
            work: WorkCommitment {
                nonce: [1; 32],
                devices: vec![DeviceRoot {
                    slice: DeviceSlice {
                        index: 0,
                        offset: 0,
                        count: 3,
                    },
                    root: Digest([2; 32]),
                }],
                global: Digest([3; 32]),
            },
            miner_key: PublicKey([4; 32]),
            validator_key: PublicKey([5; 32]),
            inventory: vec![DeviceInfo {
                name: "cpu".into(),
                ..Default::default()
            }],
            backend: "cpu".into(),
            kernel: "portable".into(),
            compute_ms: 12,
            pools: None,
        };
        let (back, sig) = commitment_from_wire(&commitment_to_wire(&c, &[6; 64])).unwrap();
        assert_eq!(back, c);
        assert_eq!(sig, [6; 64]);
        let v3 = Commitment {
            pools: Some(vec![PoolCommitment {
                device: 0,
                entries: 7,
                root: Digest([8; 32]),
            }]),
            ..c
        };
        let (back, _) = commitment_from_wire(&commitment_to_wire(&v3, &[6; 64])).unwrap();
        assert_eq!(back, v3);

        // Each list over the limit is named by its own field.
        let mut wire = commitment_to_wire(&v3, &[6; 64]);
        wire.pools = vec![wire.pools[0].clone(); MAX_DEVICES as usize + 1];
        let error = commitment_from_wire(&wire).unwrap_err();
        assert_eq!(error.field, "pools", "{error}");
        assert!(error.to_string().contains("65 pools"), "{error}");
        let mut wire = commitment_to_wire(&v3, &[6; 64]);
        wire.inventory = vec![wire.inventory[0].clone(); MAX_DEVICES as usize + 1];
        assert_eq!(commitment_from_wire(&wire).unwrap_err().field, "inventory");
    }
}
