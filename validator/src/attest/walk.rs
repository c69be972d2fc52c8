//! The memory phase's exchange (PROTOCOL.md 18.4 and 18.5): the commitment's pools checked
//! against the plan, the signed walk request with a seed drawn only now, the walk statement
//! timed on this validator's clock, the walk samples drawn after it, and each walk opening
//! checked with rows of its entries that this validator draws after the opening arrived.

use super::client::MinerConnection;
use super::decoding::own_decode_failure;
use super::exchange::walk_give_up;
use super::outcome::Outcome;
use super::{AttestError, AttestEvent, now_ms, random32};
use crate::memory::MemoryPlan;
use crate::untrusted::miner_text;
use crate::verdict::reason::{Reason, ReasonCode};
use gpu_attest_proto::convert::{WalkRequest, walk_opening_from_wire, walk_request_to_wire, walk_statement_from_wire};
use gpu_attest_proto::v1;
use gpu_attest_shared::Work;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::keys::KeyPair;
use gpu_attest_shared::memory::PoolSpec;
use gpu_attest_shared::memory::check::{ROWS_CHECKED_PER_ENTRY, check_segment, draw_rows};
use gpu_attest_shared::memory::params::ENTRY_N;
use gpu_attest_shared::memory::pool::entry_rows_match;
use gpu_attest_shared::memory::walk::WalkSpec;
use gpu_attest_shared::statement::Commitment;
use gpu_attest_shared::statement::memory_v3::{WalkSample, walk_opening_bytes, walk_request_bytes};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The commitment's pools (PROTOCOL.md 18.4, step 5 of 14.4): one per device, in index order,
/// each of the planned size. `false` (with the reason recorded) when they are not.
pub fn check_pools(commitment: &Commitment, plan: &MemoryPlan, outcome: &mut Outcome) -> bool {
    let Some(pools) = &commitment.pools else {
        outcome.fail(
            ReasonCode::PoolNotCanonical,
            "the commitment names no pools, but the challenge asked for the memory phase",
        );
        return false;
    };
    if pools.len() != plan.pools.len() {
        outcome.fail(
            ReasonCode::PoolNotCanonical,
            format!(
                "the commitment names {} pools; the challenge has {} devices",
                pools.len(),
                plan.pools.len()
            ),
        );
        return false;
    }
    for (j, (got, want)) in pools.iter().zip(&plan.pools).enumerate() {
        if got.device != j as u32 || got.entries != want.entries {
            outcome.fail(
                ReasonCode::PoolNotCanonical,
                format!(
                    "pool {j} is named device {} with {} entries; device {j} claims {} bytes, a pool of {} entries",
                    got.device, got.entries, want.memory_bytes, want.entries
                ),
            );
            return false;
        }
    }
    true
}

/// What checking a walk opening needs, per device: the walk it was bound to, the pool it read
/// and the walk root the statement committed.
pub struct WalkContext {
    devices: Vec<(WalkSpec, PoolSpec, Digest)>,
    /// Walk segments to open (the plan's).
    samples: u32,
}

impl WalkContext {
    /// The walk samples (PROTOCOL.md 18.4): sample `i` on device `i mod d`, walker and segment
    /// uniform, no `(j, w, q)` twice while a device has any left.
    pub fn draw_samples(&self, rng: &mut impl Rng) -> Vec<WalkSample> {
        let count = self.samples;
        let devices = self.devices.len() as u32;
        let Some((first, _, _)) = self.devices.first() else {
            return Vec::new();
        };
        let params = first.params;
        let per_device = u64::from(params.walkers) * u64::from(params.walk_segments());
        let mut taken: HashSet<WalkSample> = HashSet::new();
        let mut samples = Vec::with_capacity(count as usize);
        for i in 0..count {
            let device = i % devices;
            let drawn_here = samples.iter().filter(|s: &&WalkSample| s.device == device).count() as u64;
            if drawn_here >= per_device {
                continue; // every segment of this device is already asked for
            }
            loop {
                let sample = WalkSample {
                    device,
                    walker: (rng.next_u64() % u64::from(params.walkers)) as u32,
                    segment: (rng.next_u64() % u64::from(params.walk_segments())) as u32,
                };
                if taken.insert(sample) {
                    samples.push(sample);
                    break;
                }
            }
        }
        samples
    }

    /// Whether `samples` could have been drawn by [`Self::draw_samples`]: as many, each device
    /// in the draw's turn, each walker and segment within the walk, none twice. An audit reads
    /// the samples from the recorded open request; the draw's randomness is the validator's.
    pub fn drawable(&self, samples: &[WalkSample]) -> bool {
        let Some((first, _, _)) = self.devices.first() else {
            return samples.is_empty();
        };
        let params = first.params;
        let devices = self.devices.len() as u32;
        let per_device = u64::from(params.walkers) * u64::from(params.walk_segments());
        let mut drawn = vec![0u64; devices as usize];
        let turns: Vec<u32> = (0..self.samples)
            .map(|i| i % devices)
            .filter(|&device| {
                let here = &mut drawn[device as usize];
                *here += 1;
                *here <= per_device
            })
            .collect();
        let mut taken = HashSet::new();
        turns.len() == samples.len()
            && turns.iter().zip(samples).all(|(&device, s)| {
                s.device == device
                    && s.walker < params.walkers
                    && s.segment < params.walk_segments()
                    && taken.insert(*s)
            })
    }
}

/// Sends the walk request of the outcome's planned memory phase and waits for the statement,
/// timing it on this validator's clock (into the outcome's memory proof, once the statement
/// passed its checks) and checking it. `None` when there is no memory phase, or the walk has
/// failed (the outcome says why) and nothing is left to open.
pub async fn request_walk(
    miner: &mut MinerConnection,
    identity: &KeyPair,
    work: &Work,
    commitment: &Commitment,
    outcome: &mut Outcome,
    on_event: &(dyn Fn(AttestEvent) + Send + Sync),
) -> Result<Option<WalkContext>, AttestError> {
    let Some(plan) = outcome.plan.memory.v3().cloned() else {
        return Ok(None);
    };
    let walked = walk_and_check(miner, identity, work, commitment, &plan, outcome, on_event).await?;
    Ok(walked.map(|(context, measured_ms)| {
        let proof = outcome.memory.get_or_insert_with(|| plan.planned_proof());
        proof.walk_measured_ms = measured_ms;
        context
    }))
}

/// The walk and its statement's checks: the context and the walk time, when it passed them.
async fn walk_and_check(
    miner: &mut MinerConnection,
    identity: &KeyPair,
    work: &Work,
    commitment: &Commitment,
    plan: &MemoryPlan,
    outcome: &mut Outcome,
    on_event: &(dyn Fn(AttestEvent) + Send + Sync),
) -> Result<Option<(WalkContext, u64)>, AttestError> {
    let nonce = work.params().nonce;
    let walk_seed = random32()?;
    let deadline = Duration::from_millis(plan.walk_deadline_ms);
    let deadline_ms = now_ms().saturating_add(plan.walk_deadline_ms);
    let request = WalkRequest {
        nonce,
        walk_seed,
        deadline_ms,
        validator_key: identity.public_key().0,
        signature: identity.sign(&walk_request_bytes(&nonce, &walk_seed, deadline_ms)),
    };
    on_event(AttestEvent::Phase {
        name: "walking",
        detail: walk_planned(plan),
    });
    let sent_wire = walk_request_to_wire(&request);
    outcome.transcript.walk_request(sent_wire.clone());
    let sent = Instant::now();
    let answered = tokio::time::timeout(walk_give_up(deadline), miner.walk_pool(sent_wire)).await;
    let measured_ms = sent.elapsed().as_millis() as u64;
    let answer = match answered {
        Ok(Ok(wire)) => {
            outcome.transcript.walk_statement(&wire, measured_ms);
            WalkAnswer::Statement(wire, measured_ms)
        }
        Err(_) => {
            outcome.transcript.walk_timed_out(measured_ms);
            WalkAnswer::TimedOut(measured_ms)
        }
        Ok(Err(status)) => {
            outcome.transcript.walk_failed(&status);
            WalkAnswer::Failed(status)
        }
    };
    let judged = judge_walk(work, &request, commitment, plan, answer, outcome);
    if let Some((_, measured_ms)) = &judged {
        on_event(AttestEvent::Phase {
            name: "walk-received",
            detail: format!("after {measured_ms} ms"),
        });
    }
    Ok(judged)
}

/// How a version 3 walk request was answered, as the validator read it.
pub enum WalkAnswer {
    /// The statement, `measured_ms` after the request.
    Statement(v1::WalkStatement, u64),
    /// Nothing within the walk's time and its grace: read then, from sending the request.
    TimedOut(u64),
    /// The miner's status, or one this validator made of what it could not decode.
    Failed(tonic::Status),
}

/// The walk's answer judged (PROTOCOL.md 18.4): the context to check openings against and the
/// walk time, when the statement passed its checks; the outcome says what failed otherwise.
/// An attestation judges what it just read, an audit what the transcript recorded.
pub fn judge_walk(
    work: &Work,
    request: &WalkRequest,
    commitment: &Commitment,
    plan: &MemoryPlan,
    answer: WalkAnswer,
    outcome: &mut Outcome,
) -> Option<(WalkContext, u64)> {
    let (wire, measured_ms) = match answer {
        WalkAnswer::Statement(wire, measured_ms) => (wire, measured_ms),
        WalkAnswer::TimedOut(measured_ms) => {
            outcome.fail(
                ReasonCode::WalkTimedOut,
                format!(
                    "no walk statement within {measured_ms} ms (walk deadline {} ms)",
                    plan.walk_deadline_ms
                ),
            );
            return None;
        }
        WalkAnswer::Failed(status) => {
            walk_not_answered(&status, outcome);
            return None;
        }
    };
    let context = check_statement(work, &wire, request, commitment, plan, outcome)?;
    if measured_ms > plan.walk_deadline_ms {
        outcome.fail(
            ReasonCode::LateWalk,
            format!(
                "walk statement arrived after {measured_ms} ms; the walk deadline was {} ms (expected {} ms at {:.3e} bytes/s per device)",
                plan.walk_deadline_ms,
                plan.walk_expected_ms,
                plan.slowest_bytes_per_sec()
            ),
        );
    }
    Some((context, measured_ms))
}

/// What the walk asks of the miner, for the attestation's event.
fn walk_planned(plan: &MemoryPlan) -> String {
    let pools: Vec<String> = plan
        .pools
        .iter()
        .map(|p| format!("{} MiB", (p.entries * 65536) >> 20))
        .collect();
    format!(
        "{} walkers x {} steps over pools of {} on {} device(s); expected {} ms, deadline {} ms",
        plan.params.walkers,
        plan.params.walk_steps,
        pools.join(", "),
        plan.pools.len(),
        plan.walk_expected_ms,
        plan.walk_deadline_ms
    )
}

/// The miner answered the walk request with an error: one this validator made of a statement
/// it could not decode, or the miner's own refusal.
fn walk_not_answered(status: &tonic::Status, outcome: &mut Outcome) {
    match own_decode_failure(status) {
        Some(why) => outcome.fail(ReasonCode::MalformedWalk, format!("walk statement: {why}")),
        None => outcome.fail(
            ReasonCode::WalkRefused,
            format!(
                "miner refused or failed the walk ({:?}): {}",
                status.code(),
                miner_text(status.message())
            ),
        ),
    }
}

/// The walk statement's checks (PROTOCOL.md 18.4), in order; the context to check openings
/// against when it passes them.
fn check_statement(
    work: &Work,
    wire: &v1::WalkStatement,
    request: &WalkRequest,
    commitment: &Commitment,
    plan: &MemoryPlan,
    outcome: &mut Outcome,
) -> Option<WalkContext> {
    let (statement, signature) = match walk_statement_from_wire(wire) {
        Ok(decoded) => decoded,
        Err(e) => {
            outcome.fail(ReasonCode::MalformedWalk, format!("malformed walk statement: {e}"));
            return None;
        }
    };
    if statement.nonce != request.nonce
        || statement.walk_seed != request.walk_seed
        || statement.miner_key != commitment.miner_key
        || statement.validator_key.0 != request.validator_key
    {
        outcome.fail(
            ReasonCode::WalkWrongChallenge,
            "the walk statement names another nonce, walk seed, miner or validator than the walk request",
        );
        return None;
    }
    if commitment
        .miner_key
        .verify(&statement.signing_bytes(), &signature)
        .is_err()
    {
        outcome.fail(
            ReasonCode::WalkSignature,
            "walk statement signature does not verify with the miner's key",
        );
        return None;
    }
    let pools = commitment.pools.as_deref().unwrap_or_default();
    let canonical = statement.roots.len() == pools.len()
        && statement
            .roots
            .iter()
            .enumerate()
            .all(|(j, (index, _))| *index == j as u32);
    if !canonical {
        outcome.fail(
            ReasonCode::WalkNotCanonical,
            format!(
                "the walk statement names {} walk roots (devices {:?}); the commitment has {} pools",
                statement.roots.len(),
                statement.roots.iter().map(|(j, _)| *j).collect::<Vec<_>>(),
                pools.len()
            ),
        );
        return None;
    }
    let devices = pools
        .iter()
        .zip(&statement.roots)
        .map(|(pool, (_, walk_root))| {
            let walk = WalkSpec {
                nonce: request.nonce,
                walk_seed: request.walk_seed,
                device: pool.device,
                pool_root: pool.root,
                entries: pool.entries,
                params: plan.params,
            };
            (
                walk,
                PoolSpec::with_entries(work, pool.device, pool.entries),
                *walk_root,
            )
        })
        .collect();
    Some(WalkContext {
        devices,
        samples: plan.samples,
    })
}

/// Where a walk opening's checked rows come from (PROTOCOL.md 18.5 check 7).
pub enum WalkRows {
    /// Drawn now, after the opening arrived, from this validator's own randomness, and
    /// recorded in the transcript.
    Draw,
    /// As a transcript recorded them, [`ROWS_CHECKED_PER_ENTRY`] an entry in the order checked:
    /// an audit's.
    Recorded(Vec<u32>),
}

/// How a walk opening's rows were used: every row checked, in order, and whether an entry's
/// recorded rows were not a draw's (too few left, a row twice, or a row past the entry): the
/// check then failed for want of rows, not for the miner.
pub struct RowsUsed {
    pub rows: Vec<u32>,
    pub not_a_draw: bool,
}

/// Checks one walk opening as it arrived, recording what is wrong with it (PROTOCOL.md 18.5).
/// The rows of its entries are drawn here, after it arrived, or come from a transcript.
pub async fn check_opening(
    context: &WalkContext,
    nonce: [u8; 32],
    commitment: &Commitment,
    sample: WalkSample,
    wire: &v1::ChainOpening,
    rows: WalkRows,
    outcome: &mut Outcome,
) -> Result<RowsUsed, AttestError> {
    let used = RowsUsed {
        rows: Vec::new(),
        not_a_draw: false,
    };
    let shown = format!(
        "walk segment {} of walker {} on device {}",
        sample.segment, sample.walker, sample.device
    );
    let Some(walk) = &wire.walk else {
        outcome.fail(
            ReasonCode::MalformedWalkOpening,
            format!("the miner sent a chain opening where {shown} was due"),
        );
        return Ok(used);
    };
    let (opened_nonce, opening, signature) = match walk_opening_from_wire(walk) {
        Ok(decoded) => decoded,
        Err(e) => {
            outcome.fail(
                ReasonCode::MalformedWalkOpening,
                format!("malformed opening of {shown}: {e}"),
            );
            return Ok(used);
        }
    };
    if opened_nonce != nonce {
        outcome.fail(
            ReasonCode::WalkOpeningForWrongRequest,
            format!("the opening of {shown} is for another challenge"),
        );
        return Ok(used);
    }
    if commitment
        .miner_key
        .verify(&walk_opening_bytes(&nonce, &opening), &signature)
        .is_err()
    {
        outcome.fail(
            ReasonCode::WalkOpeningSignature,
            format!("the opening of {shown} is not signed by the miner"),
        );
        return Ok(used);
    }
    let Some((spec, pool, root)) = context.devices.get(sample.device as usize).cloned() else {
        outcome.fail(
            ReasonCode::WalkOpeningForWrongRequest,
            format!("{shown} names no device of this walk"),
        );
        return Ok(used);
    };
    let source = match rows {
        WalkRows::Draw => RowSource::Drawn(Box::new(ChaCha20Rng::from_seed(random32()?))),
        WalkRows::Recorded(rows) => RowSource::Recorded(rows.into_iter()),
    };
    let (checked, used) = tokio::task::spawn_blocking(move || {
        // `check_segment` takes a shared closure: the rows' source and their record behind one lock.
        let rows = Mutex::new((source, used));
        let is_made = |entry: u64, bytes: &[u8]| {
            let mut rows = rows.lock().unwrap_or_else(|p| p.into_inner());
            let (source, used) = &mut *rows;
            let Some(drawn) = source.next_entry() else {
                used.not_a_draw = true;
                return false;
            };
            used.rows.extend_from_slice(&drawn);
            entry_rows_match(&pool, entry, bytes, &drawn)
        };
        let checked = check_segment(&spec, &pool, &root, (sample.walker, sample.segment), &opening, &is_made);
        (checked, rows.into_inner().unwrap_or_else(|p| p.into_inner()).1)
    })
    .await
    .map_err(|e| AttestError::Verify(e.to_string()))?;
    outcome.transcript.walk_rows(&used.rows);
    if let Err(e) = checked {
        outcome.reasons.push(Reason::from(&e));
    }
    Ok(used)
}

/// The rows of one entry's check at a time, drawn or as recorded.
enum RowSource {
    Drawn(Box<ChaCha20Rng>),
    Recorded(std::vec::IntoIter<u32>),
}

impl RowSource {
    /// The next entry's rows; `None` where recorded ones are not what [`draw_rows`] makes
    /// ([`ROWS_CHECKED_PER_ENTRY`] distinct rows of an entry), so that a transcript cannot have
    /// an entry checked on fewer rows than the protocol's.
    fn next_entry(&mut self) -> Option<Vec<u32>> {
        match self {
            RowSource::Drawn(rng) => Some(draw_rows(rng.as_mut())),
            RowSource::Recorded(rows) => {
                let entry: Vec<u32> = rows.by_ref().take(ROWS_CHECKED_PER_ENTRY).collect();
                let distinct: HashSet<u32> = entry.iter().copied().collect();
                let a_draw = entry.len() == ROWS_CHECKED_PER_ENTRY
                    && distinct.len() == entry.len()
                    && entry.iter().all(|&row| (row as usize) < ENTRY_N);
                a_draw.then_some(entry)
            }
        }
    }
}
