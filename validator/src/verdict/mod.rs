//! What a verdict is: the record every subsystem fills in (the throughput it proves, what it
//! states of memory and of device identity, why it failed, the class its rate teaches) and the
//! store keeps. These modules are the validator's bottom floor: they import nothing of the
//! validator above them, so that the planner, the attestation, the store and the API all speak
//! of one verdict without importing each other.

pub mod class;
pub mod identity;
pub mod memory;
pub mod reason;
pub mod throughput;

use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::params::ChallengeParams;
use gpu_attest_shared::statement::DeviceInfo;
use identity::IdentityProof;
use memory::MemoryProof;
use reason::Reason;
use serde::{Deserialize, Serialize};
use throughput::Throughput;

/// Challenge parameters as stored (JSON with hex bytes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredParams {
    pub nonce: String,
    pub seed: String,
    pub miner_key: String,
    pub n: u32,
    pub num_chains: u64,
    pub iterations: u32,
    pub checkpoint_every: u32,
}

impl From<&ChallengeParams> for StoredParams {
    fn from(p: &ChallengeParams) -> Self {
        StoredParams {
            nonce: hex::encode(p.nonce),
            seed: hex::encode(p.seed),
            miner_key: hex::encode(p.miner_key),
            n: p.n,
            num_chains: p.num_chains,
            iterations: p.iterations,
            checkpoint_every: p.checkpoint_every,
        }
    }
}

/// One attestation's outcome, as stored and served.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Assigned by the store; 0 before it is stored.
    pub id: u64,
    pub miner_url: String,
    pub miner_key: String,
    pub nonce: String,
    pub passed: bool,
    pub reasons: Vec<Reason>,
    pub policy: String,
    pub samples: u32,
    pub params: StoredParams,
    pub measured_ms: u64,
    pub expected_ms: u64,
    pub deadline_ms: u64,
    /// Time from sending the challenge by which a late commitment still proves its rate
    /// (PROTOCOL.md 14.3; from sending, like `deadline_ms`, not from the deadline); 0 when the
    /// challenge had no finish-by time.
    pub finish_by_ms: u64,
    /// Stored as JSON with `DeviceInfo`'s own field names.
    pub inventory: Vec<DeviceInfo>,
    pub backend: String,
    pub kernel: String,
    pub global_checksum: String,
    pub created_at_ms: u64,
    /// What the verdict proves about throughput; derived from the fields above and the
    /// expected rate, which is stored.
    pub throughput: Throughput,
    /// What it proves about memory (protocol version 3); `None` for a challenge without the
    /// memory phase. Stored as JSON.
    pub memory: Option<MemoryProof>,
    /// What it states of device identity (PROTOCOL.md 19.5); `None` under the `off` policy or
    /// before the evidence was read. Stored as JSON.
    pub identity: Option<IdentityProof>,
    /// The run this verdict's retest replaced (PROTOCOL.md 14.7); `None` for a first run.
    /// Stored as JSON.
    pub first_run: Option<FirstRun>,
    /// The protocol version whose rules judged it (PROTOCOL.md 16.1): 4 or 3 by the memory
    /// phase the challenge carried, 2 when it carried none. Decided once, by the planner
    /// (`MemoryPhasePlan`), carried through the attestation and stored as it was decided.
    pub protocol_version: u32,
    /// The size of the transcript kept beside it (PROTOCOL.md 21), in bytes; `None` when none
    /// is kept (not asked for, dropped for the budget, or stored before transcripts). Read from
    /// the store: never part of the verdict a transcript states.
    #[serde(default)]
    pub transcript_bytes: Option<u64>,
}

/// The protocol version a verdict stored before its version was (store schema 8 and earlier)
/// was judged under, told from its memory phase: version 4's proof has no fill, version 3's
/// has, and a verdict without one was judged under 2.
pub fn judged_under(memory: Option<&MemoryProof>) -> u32 {
    memory.map_or(2, MemoryProof::protocol_version)
}

/// The run a retest replaced, as the retest's verdict records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FirstRun {
    /// Hex, as the verdict's own.
    pub nonce: String,
    pub measured_ms: u64,
    pub expected_ms: u64,
    pub deadline_ms: u64,
    pub finish_by_ms: u64,
    /// What the late work proved (a first run is always a graded miss).
    pub proven_ops_per_sec: Option<f64>,
    pub reasons: Vec<Reason>,
}

impl Verdict {
    /// The hardware the challenge was sized for, as the verdict names it.
    pub fn claim(&self) -> HardwareClaim {
        HardwareClaim {
            backend: self.backend.clone(),
            kernel: self.kernel.clone(),
            devices: self.inventory.clone(),
        }
    }
}

impl From<&Verdict> for FirstRun {
    fn from(v: &Verdict) -> Self {
        FirstRun {
            nonce: v.nonce.clone(),
            measured_ms: v.measured_ms,
            expected_ms: v.expected_ms,
            deadline_ms: v.deadline_ms,
            finish_by_ms: v.finish_by_ms,
            proven_ops_per_sec: v.throughput.proven_ops_per_sec,
            reasons: v.reasons.clone(),
        }
    }
}
