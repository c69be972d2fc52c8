//! A verdict on the wire, both ways. The API's `Verdict` message and PROTOCOL.md 16.1's JSON
//! (the store's [`Verdict`], serialized) are one schema: every field of one is a field of the
//! other. So `validator verdicts --json` (from the database) and `validator miners verdicts
//! --json` (from the API, through [`verdict_from_wire`]) print the same objects, and a test holds
//! the round trip exact.

use crate::verdict::class::RateSource;
use crate::verdict::identity::{DeviceIdentity, IdentityProof, IdentityStatus};
use crate::verdict::memory::{DeviceLocality, DeviceMemory, DeviceWalk, MemoryProof};
use crate::verdict::reason::{Reason, ReasonCode};
use crate::verdict::throughput::Throughput;
use crate::verdict::{FirstRun, StoredParams, Verdict};
use gpu_attest_proto::convert::{device_from_wire, device_to_wire};
use gpu_attest_proto::v1;

fn fail_reasons_to_wire(reasons: &[crate::verdict::reason::Reason]) -> Vec<v1::FailReason> {
    reasons
        .iter()
        .map(|r| v1::FailReason {
            code: r.code.as_str().into(),
            message: r.message.clone(),
        })
        .collect()
}

/// A stored verdict as the API sends it.
pub fn verdict_to_wire(v: &Verdict) -> v1::Verdict {
    let hex32 = |s: &str| hex::decode(s).unwrap_or_default();
    v1::Verdict {
        id: v.id,
        miner_url: v.miner_url.clone(),
        miner_key: hex32(&v.miner_key),
        nonce: hex32(&v.nonce),
        passed: v.passed,
        reasons: v.reasons.iter().map(|r| r.message.clone()).collect(),
        fail_reasons: fail_reasons_to_wire(&v.reasons),
        policy: v.policy.clone(),
        samples: v.samples,
        params: Some(v1::ChallengeParams {
            nonce: hex32(&v.params.nonce),
            seed: hex32(&v.params.seed),
            miner_key: hex32(&v.params.miner_key),
            n: v.params.n,
            num_chains: v.params.num_chains,
            iterations: v.params.iterations,
            checkpoint_every: v.params.checkpoint_every,
        }),
        measured_ms: v.measured_ms,
        expected_ms: v.expected_ms,
        deadline_ms: v.deadline_ms,
        finish_by_ms: v.finish_by_ms,
        protocol_version: v.protocol_version,
        transcript_bytes: v.transcript_bytes.unwrap_or(0),
        first_run: v.first_run.as_ref().map(|f| v1::FirstRun {
            nonce: hex32(&f.nonce),
            measured_ms: f.measured_ms,
            expected_ms: f.expected_ms,
            deadline_ms: f.deadline_ms,
            finish_by_ms: f.finish_by_ms,
            proven_ops_per_sec: f.proven_ops_per_sec.unwrap_or(0.0),
            fail_reasons: fail_reasons_to_wire(&f.reasons),
        }),
        inventory: v.inventory.iter().map(device_to_wire).collect(),
        backend: v.backend.clone(),
        kernel: v.kernel.clone(),
        global_checksum: hex32(&v.global_checksum),
        created_at_unix_ms: v.created_at_ms,
        operations: v.throughput.operations,
        proven_ops_per_sec: v.throughput.proven_ops_per_sec.unwrap_or(0.0),
        proven_ops_per_sec_per_device: v.throughput.proven_ops_per_sec_per_device.unwrap_or(0.0),
        expected_ops_per_sec: v.throughput.expected_ops_per_sec,
        proven_to_expected: v.throughput.proven_to_expected.unwrap_or(0.0),
        rate_source: v
            .throughput
            .rate_source
            .map(|r| r.as_str().to_string())
            .unwrap_or_default(),
        rate_miners: v.throughput.rate_miners,
        slack: v.throughput.slack,
        claimed_peak_ops_per_sec: v.throughput.claimed_peak_ops_per_sec,
        memory: v.memory.as_ref().map(memory_to_wire),
        identity: v.identity.as_ref().map(identity_to_wire),
    }
}

fn reasons_from_wire(reasons: &[v1::FailReason]) -> Vec<Reason> {
    reasons
        .iter()
        .map(|r| Reason::new(ReasonCode::from_name(&r.code), r.message.clone()))
        .collect()
}

/// 0 on the wire is "none" for the rates a failed verdict does not prove (PROTOCOL.md 16.1).
fn positive(x: f64) -> Option<f64> {
    (x != 0.0).then_some(x)
}

/// The API's verdict as the store's, for PROTOCOL.md 16.1's JSON: the inverse of
/// [`verdict_to_wire`] for every verdict a validator sends.
pub fn verdict_from_wire(v: &v1::Verdict) -> Verdict {
    let params = v.params.clone().unwrap_or_default();
    Verdict {
        id: v.id,
        miner_url: v.miner_url.clone(),
        miner_key: hex::encode(&v.miner_key),
        nonce: hex::encode(&v.nonce),
        passed: v.passed,
        reasons: reasons_from_wire(&v.fail_reasons),
        policy: v.policy.clone(),
        samples: v.samples,
        params: StoredParams {
            nonce: hex::encode(&params.nonce),
            seed: hex::encode(&params.seed),
            miner_key: hex::encode(&params.miner_key),
            n: params.n,
            num_chains: params.num_chains,
            iterations: params.iterations,
            checkpoint_every: params.checkpoint_every,
        },
        measured_ms: v.measured_ms,
        expected_ms: v.expected_ms,
        deadline_ms: v.deadline_ms,
        finish_by_ms: v.finish_by_ms,
        inventory: v.inventory.iter().map(device_from_wire).collect(),
        backend: v.backend.clone(),
        kernel: v.kernel.clone(),
        global_checksum: hex::encode(&v.global_checksum),
        created_at_ms: v.created_at_unix_ms,
        throughput: Throughput {
            operations: v.operations,
            proven_ops_per_sec: positive(v.proven_ops_per_sec),
            proven_ops_per_sec_per_device: positive(v.proven_ops_per_sec_per_device),
            expected_ops_per_sec: v.expected_ops_per_sec,
            proven_to_expected: positive(v.proven_to_expected),
            rate_source: RateSource::parse(&v.rate_source),
            rate_miners: v.rate_miners,
            slack: v.slack,
            claimed_peak_ops_per_sec: v.claimed_peak_ops_per_sec,
            proven_share_of_peak: crate::verdict::throughput::share_of_peak(
                positive(v.proven_ops_per_sec),
                v.claimed_peak_ops_per_sec,
            ),
        },
        memory: v.memory.as_ref().map(memory_from_wire),
        identity: v.identity.as_ref().map(identity_from_wire),
        first_run: v.first_run.as_ref().map(|f| FirstRun {
            nonce: hex::encode(&f.nonce),
            measured_ms: f.measured_ms,
            expected_ms: f.expected_ms,
            deadline_ms: f.deadline_ms,
            finish_by_ms: f.finish_by_ms,
            proven_ops_per_sec: positive(f.proven_ops_per_sec),
            reasons: reasons_from_wire(&f.fail_reasons),
        }),
        protocol_version: v.protocol_version,
        transcript_bytes: (v.transcript_bytes > 0).then_some(v.transcript_bytes),
    }
}

/// A verdict's memory phase as the API sends it (PROTOCOL.md 16.1 `memory`).
fn memory_to_wire(m: &MemoryProof) -> v1::MemoryVerdict {
    v1::MemoryVerdict {
        pool_permille: m.pool_permille,
        walkers: m.walkers,
        walk_steps: m.walk_steps,
        walk_checkpoint_every: m.walk_checkpoint_every,
        walk_samples: m.walk_samples,
        devices: m
            .devices
            .iter()
            .map(|d| v1::DeviceMemoryVerdict {
                claimed_bytes: d.claimed_bytes,
                pool_entries: d.pool_entries,
                proven_bytes: d.proven_bytes,
                walk: d.walk.as_ref().map(|w| v1::DeviceWalkVerdict {
                    measured_ms: w.measured_ms,
                    expected_ms: w.expected_ms,
                    deadline_ms: w.deadline_ms,
                    expected_bytes_per_sec: w.expected_bytes_per_sec,
                    proven_bytes_per_sec: w.proven_bytes_per_sec.unwrap_or(0.0),
                    bandwidth_source: w.bandwidth_source.clone(),
                    steps_opened: w.steps_opened,
                    rows_checked: w.rows_checked,
                    sized_as: w.sized_as.clone(),
                    bound_as: w.bound_as.clone(),
                    held_at_least: w.held_at_least,
                }),
                locality: d.locality.as_ref().map(|l| v1::DeviceLocalityVerdict {
                    walkers: l.walkers,
                    generations: l.generations,
                    steps: l.steps,
                    segments_opened: l.segments_opened,
                    measured_us: l.measured_us,
                    expected_us: l.expected_us,
                    deadline_us: l.deadline_us,
                    step_ns: l.step_ns,
                    hop_ns: l.hop_ns,
                    sequential_at_least: l.sequential_at_least,
                    hop_share_at_most: l.hop_share_at_most,
                }),
            })
            .collect(),
        walk_bytes: m.walk_bytes,
        walk_measured_ms: m.walk_measured_ms,
        walk_expected_ms: m.walk_expected_ms,
        walk_deadline_ms: m.walk_deadline_ms,
        expected_walk_bytes_per_sec: m.expected_walk_bytes_per_sec,
        proven_walk_bytes_per_sec: m.proven_walk_bytes_per_sec.unwrap_or(0.0),
        bandwidth_source: m.bandwidth_source.clone(),
        bandwidth_miners: m.bandwidth_miners,
        slack: m.slack,
        fill_weight: m.fill_weight,
        host_held_at_least: m.host_held_at_least,
        proves: m.proves.clone(),
    }
}

/// A verdict's device identity as the API sends it (PROTOCOL.md 16.1 `identity`).
fn identity_to_wire(i: &IdentityProof) -> v1::IdentityVerdict {
    v1::IdentityVerdict {
        policy: i.policy.clone(),
        devices: i
            .devices
            .iter()
            .map(|d| v1::DeviceIdentityVerdict {
                index: d.index,
                status: d.status.as_str().into(),
                line: d.line.clone(),
                reason: d.reason.clone().unwrap_or_default(),
                part: d
                    .part
                    .as_ref()
                    .map(|(chip, id)| vec![chip.clone(), id.clone()])
                    .unwrap_or_default(),
            })
            .collect(),
    }
}

/// [`memory_to_wire`]'s inverse.
fn memory_from_wire(m: &v1::MemoryVerdict) -> MemoryProof {
    MemoryProof {
        pool_permille: m.pool_permille,
        walkers: m.walkers,
        walk_steps: m.walk_steps,
        walk_checkpoint_every: m.walk_checkpoint_every,
        walk_samples: m.walk_samples,
        devices: m
            .devices
            .iter()
            .map(|d| DeviceMemory {
                claimed_bytes: d.claimed_bytes,
                pool_entries: d.pool_entries,
                proven_bytes: d.proven_bytes,
                walk: d.walk.as_ref().map(|w| DeviceWalk {
                    measured_ms: w.measured_ms,
                    expected_ms: w.expected_ms,
                    deadline_ms: w.deadline_ms,
                    expected_bytes_per_sec: w.expected_bytes_per_sec,
                    proven_bytes_per_sec: positive(w.proven_bytes_per_sec),
                    bandwidth_source: w.bandwidth_source.clone(),
                    steps_opened: w.steps_opened,
                    rows_checked: w.rows_checked,
                    sized_as: w.sized_as.clone(),
                    bound_as: w.bound_as.clone(),
                    held_at_least: w.held_at_least,
                }),
                locality: d.locality.as_ref().map(|l| DeviceLocality {
                    walkers: l.walkers,
                    generations: l.generations,
                    steps: l.steps,
                    segments_opened: l.segments_opened,
                    measured_us: l.measured_us,
                    expected_us: l.expected_us,
                    deadline_us: l.deadline_us,
                    step_ns: l.step_ns,
                    hop_ns: l.hop_ns,
                    sequential_at_least: l.sequential_at_least,
                    hop_share_at_most: l.hop_share_at_most,
                }),
            })
            .collect(),
        walk_bytes: m.walk_bytes,
        walk_measured_ms: m.walk_measured_ms,
        walk_expected_ms: m.walk_expected_ms,
        walk_deadline_ms: m.walk_deadline_ms,
        expected_walk_bytes_per_sec: m.expected_walk_bytes_per_sec,
        proven_walk_bytes_per_sec: positive(m.proven_walk_bytes_per_sec),
        bandwidth_source: m.bandwidth_source.clone(),
        bandwidth_miners: m.bandwidth_miners,
        slack: m.slack,
        fill_weight: m.fill_weight,
        host_held_at_least: m.host_held_at_least,
        proves: m.proves.clone(),
    }
}

/// [`identity_to_wire`]'s inverse.
fn identity_from_wire(i: &v1::IdentityVerdict) -> IdentityProof {
    IdentityProof {
        policy: i.policy.clone(),
        devices: i
            .devices
            .iter()
            .map(|d| DeviceIdentity {
                index: d.index,
                status: IdentityStatus::from_name(&d.status),
                line: d.line.clone(),
                reason: (!d.reason.is_empty()).then(|| d.reason.clone()),
                part: match d.part.as_slice() {
                    [chip, id] => Some((chip.clone(), id.clone())),
                    _ => None,
                },
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_support::passing_verdict;

    /// Every field set, every optional part present: the round trip through the API's message
    /// gives the stored verdict back exactly, so the CLI's JSON from either source is one.
    #[test]
    fn a_verdict_survives_the_wire_exactly() {
        let mut v = passing_verdict([4; 32]);
        v.id = 17;
        v.finish_by_ms = 9000;
        v.protocol_version = 3;
        v.memory = Some(MemoryProof {
            pool_permille: 950,
            walkers: 8192,
            walk_steps: 4096,
            walk_checkpoint_every: 8,
            walk_samples: 64,
            // A version 3 device, then version 4's (its own walk, with and without a bound).
            devices: vec![
                DeviceMemory {
                    locality: None,
                    claimed_bytes: 1 << 30,
                    pool_entries: 15564,
                    proven_bytes: 15564 * 65536,
                    walk: None,
                },
                DeviceMemory {
                    locality: None,
                    claimed_bytes: 80 << 30,
                    pool_entries: 1_171_840,
                    proven_bytes: 1_171_840 * 65536,
                    walk: Some(DeviceWalk {
                        measured_ms: 1900,
                        expected_ms: 2000,
                        deadline_ms: 4000,
                        expected_bytes_per_sec: 2.5e12,
                        proven_bytes_per_sec: Some(2.6e12),
                        bandwidth_source: "shipped".into(),
                        steps_opened: 468,
                        rows_checked: 174,
                        sized_as: "H100 SXM".into(),
                        bound_as: "H100 SXM".into(),
                        held_at_least: Some(0.8563),
                    }),
                },
                DeviceMemory {
                    locality: None,
                    claimed_bytes: 1 << 20,
                    pool_entries: 16,
                    proven_bytes: 16 * 65536,
                    walk: Some(DeviceWalk {
                        measured_ms: 30,
                        expected_ms: 40,
                        deadline_ms: 80,
                        expected_bytes_per_sec: 2.0e9,
                        proven_bytes_per_sec: Some(2.2e9),
                        bandwidth_source: "calibrated".into(),
                        steps_opened: 1512,
                        rows_checked: 434,
                        sized_as: String::new(),
                        bound_as: "an unlisted GPU".into(),
                        held_at_least: None,
                    }),
                },
            ],
            walk_bytes: 1 << 40,
            walk_measured_ms: 2100,
            walk_expected_ms: 2000,
            walk_deadline_ms: 3000,
            expected_walk_bytes_per_sec: 4.3e12,
            proven_walk_bytes_per_sec: Some(4.1e12),
            bandwidth_source: "calibrated".into(),
            bandwidth_miners: 3,
            slack: 1.5,
            fill_weight: 2.0,
            host_held_at_least: Some(0.8712),
            proves: "version 4: the host held at least 87.1% of its claim".into(),
        });
        v.identity = Some(IdentityProof {
            policy: "when-offered".into(),
            devices: vec![
                DeviceIdentity {
                    index: 0,
                    status: IdentityStatus::Genuine,
                    line: "genuine".into(),
                    reason: None,
                    part: Some(("GH100".into(), "48B02D92494BADF4".into())),
                },
                DeviceIdentity {
                    index: 1,
                    status: IdentityStatus::Refused,
                    line: "refused".into(),
                    reason: Some("identity-chain".into()),
                    part: None,
                },
            ],
        });
        v.first_run = Some(FirstRun {
            nonce: hex::encode([5; 32]),
            measured_ms: 5000,
            expected_ms: 3000,
            deadline_ms: 4500,
            finish_by_ms: 9000,
            proven_ops_per_sec: Some(3.0e11),
            reasons: vec![Reason::new(ReasonCode::LateCommitment, "late")],
        });
        assert_eq!(verdict_from_wire(&verdict_to_wire(&v)), v);
        // A failed verdict: the rates it does not prove stay "none", its reasons keep their codes.
        let mut failed = passing_verdict([6; 32]);
        failed.passed = false;
        failed.throughput.proven_ops_per_sec = None;
        failed.throughput.proven_ops_per_sec_per_device = None;
        failed.throughput.proven_to_expected = None;
        failed.throughput.proven_share_of_peak = None;
        failed.throughput.rate_source = None;
        failed.reasons = vec![Reason::new(ReasonCode::ReexecutionMismatch, "chain 3 differs")];
        assert_eq!(verdict_from_wire(&verdict_to_wire(&failed)), failed);
    }
}
