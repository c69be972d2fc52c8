//! What happens after the commitment arrives: its signature, bindings and structure, then the
//! work itself, by sampled openings (PROTOCOL.md section 9) or full re-execution (section 10).

use super::client::MinerConnection;
use super::decoding::own_decode_failure;
use super::outcome::Outcome;
use super::walk::WalkContext;
use super::walk_v4::{StatesWalk, StepChecks};
use super::{AttestError, AttestEvent, random32};
use crate::planner::MemoryPhasePlan;
use crate::untrusted::miner_text;
use crate::verdict::reason::ReasonCode;
use gpu_attest_proto::convert::{opening_from_wire, sample_to_wire, walk_sample_to_wire};
use gpu_attest_proto::memory_v4::step_sample_to_wire;
use gpu_attest_proto::v1;
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::opening::{SampleRequest, draw_samples};
use gpu_attest_shared::statement::memory_v3::{WalkSample, open_request_bytes_v3};
use gpu_attest_shared::statement::memory_v4::{self, StepSample};
use gpu_attest_shared::statement::{Challenge, Commitment, open_request_bytes, opening_bytes};
use gpu_attest_shared::verify::{VerifyError, check_commitment, verify_full, verify_opening};
use gpu_attest_shared::{Backend, CancelToken, Work};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Code, Status};

/// Shortest time a miner gets to answer an open request, however small the challenge.
const MIN_OPENING_BUDGET_MS: u64 = 5_000;

/// The opening budget (PROTOCOL.md 14.5): twice the deadline, at least twice 5 s, counting
/// only the time spent waiting for the miner.
pub fn opening_budget(deadline_ms: u64) -> Duration {
    Duration::from_millis(deadline_ms.max(MIN_OPENING_BUDGET_MS).saturating_mul(2))
}

/// The commitment's own checks (PROTOCOL.md 14.4, steps 2 to 6, in order). `true` when the
/// work it names is worth verifying.
pub fn check_statement(
    challenge: &Challenge,
    work: &Work,
    commitment: &Commitment,
    signature: &[u8; 64],
    outcome: &mut Outcome,
) -> bool {
    let expected_miner = PublicKey(challenge.params.miner_key);
    if commitment.miner_key != expected_miner {
        outcome.fail(
            ReasonCode::CommitmentWrongMiner,
            format!(
                "commitment is from key {}, the challenge was for {expected_miner}",
                commitment.miner_key
            ),
        );
        return false;
    }
    if commitment.verify(signature).is_err() {
        outcome.fail(
            ReasonCode::CommitmentSignature,
            "commitment signature does not verify with the miner's key",
        );
        return false;
    }
    // Only a checksum the miner signed is worth storing beside the verdict.
    outcome.record_global(commitment.work.global);
    if commitment.validator_key != challenge.validator_key {
        outcome.fail(
            ReasonCode::CommitmentWrongValidator,
            "commitment answers another validator's challenge",
        );
        return false;
    }
    if let Some(difference) = outcome.plan.claim.first_difference(&commitment.claim()) {
        outcome.fail(
            ReasonCode::HardwareMismatch,
            format!("commitment names other hardware than the challenge was sized for: {difference}"),
        );
    }
    if let Err(rejection) = check_commitment(work, &commitment.work) {
        outcome.reject(&rejection);
        return false;
    }
    let planned = outcome.plan.claim.devices.len();
    if commitment.work.devices.len() != planned {
        outcome.fail(
            ReasonCode::HardwareMismatch,
            format!(
                "work is split over {} devices; the challenge was sized for {planned}",
                commitment.work.devices.len()
            ),
        );
    }
    true
}

/// Symmetric re-execution on this validator's backend.
pub async fn full(
    backend: Arc<dyn Backend>,
    work: &Work,
    commitment: &Commitment,
    outcome: &mut Outcome,
    on_event: &(dyn Fn(AttestEvent) + Send + Sync),
) -> Result<(), AttestError> {
    let (work, committed) = (work.clone(), commitment.work.clone());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = tokio::task::spawn_blocking(move || {
        verify_full(
            backend.as_ref(),
            &work,
            &committed,
            &|p| {
                let _ = tx.send(p);
            },
            &CancelToken::new(),
        )
    });
    let mut job = std::pin::pin!(job);
    let result = loop {
        tokio::select! {
            biased;
            Some(p) = rx.recv() => on_event(AttestEvent::Progress(p)),
            joined = &mut job => break joined,
        }
    };
    // A re-execution that ends within one poll has sent its progress all the same: passed on,
    // not dropped with the channel (a fast verifier otherwise reported none).
    while let Ok(p) = rx.try_recv() {
        on_event(AttestEvent::Progress(p));
    }
    match result.map_err(|e| AttestError::Verify(e.to_string()))? {
        Ok(()) => Ok(()),
        Err(VerifyError::Rejected(r)) => {
            outcome.reject(&r);
            Ok(())
        }
        Err(e) => Err(AttestError::Verify(e.to_string())),
    }
}

/// The walk segments to open beside the chains (version 3), and what checks them.
pub struct WalkOpenings<'a> {
    pub context: &'a WalkContext,
    pub samples: Vec<WalkSample>,
}

/// The walk steps to open beside the chains (version 4), and the walk that checks them.
pub struct StepOpenings<'a> {
    pub walked: &'a StatesWalk,
    pub steps: Vec<StepSample>,
}

/// What of the memory phase an open request asks for after the chains.
pub enum MemoryOpenings<'a> {
    Segments(WalkOpenings<'a>),
    Steps(StepOpenings<'a>),
}

/// Sampled verification: draw `chains` chain samples now, after the commitment, ask for them
/// (and for `walks`) over the same connection, and check each opening as it arrives.
#[allow(clippy::too_many_arguments)]
pub async fn sampled(
    miner: &mut MinerConnection,
    identity: &KeyPair,
    backend: Arc<dyn Backend>,
    work: &Work,
    commitment: &Commitment,
    chains: u32,
    memory: Option<MemoryOpenings<'_>>,
    outcome: &mut Outcome,
) -> Result<(), AttestError> {
    let mut rng = ChaCha20Rng::from_seed(random32()?);
    let samples = draw_samples(&mut rng, work, chains);
    let nonce = work.params().nonce;
    let request = open_request(identity, nonce, &outcome.plan.memory, &samples, memory.as_ref());
    outcome.transcript.open_request(&request);
    // A miner that stalls must not hold this validator: all openings must arrive within the
    // budget, counting only the time spent waiting for the miner, not this validator's own
    // recomputation.
    let budget = opening_budget(outcome.plan.deadline_ms);
    let started = Instant::now();
    let opened = tokio::time::timeout(budget, open_with_retries(miner, request, work.n())).await;
    let mut waited = started.elapsed();
    let mut stream = match opened {
        Ok(Ok(stream)) => stream,
        Ok(Err(s)) => {
            outcome.transcript.open_refused(&s);
            refused(&s, outcome);
            return Ok(());
        }
        Err(_) => {
            outcome.transcript.open_timed_out();
            openings_timed_out(outcome);
            return Ok(());
        }
    };
    let due = owed(&samples, memory.as_ref());
    // Step checks run on every core while the openings keep coming; each is waited for before
    // this returns, whatever ended the stream.
    let mut steps = StepChecks::default();
    for sample in due {
        let started = Instant::now();
        let next = tokio::time::timeout(budget.saturating_sub(waited), stream.message()).await;
        waited += started.elapsed();
        let wire = match next {
            Ok(received) => {
                outcome.transcript.opening(&received);
                match received_opening(received, sample, outcome) {
                    Some(wire) => wire,
                    None => break,
                }
            }
            Err(_) => {
                outcome.transcript.opening_timed_out();
                openings_timed_out(outcome);
                break;
            }
        };
        match sample {
            Due::Chain(chain) => check_opening(backend.clone(), work, commitment, chain, &wire, outcome).await?,
            Due::Walk(walk, context) => {
                super::walk::check_opening(
                    context,
                    nonce,
                    commitment,
                    walk,
                    &wire,
                    super::walk::WalkRows::Draw,
                    outcome,
                )
                .await?;
            }
            Due::Step(step, walked) => {
                let row = walked.draw_row(step, &mut outcome.transcript)?;
                if let Some(check) =
                    walked.begin_check(work, &commitment.miner_key, step, &wire, row, &mut outcome.reasons)
                {
                    steps.push(check, &mut outcome.reasons).await?;
                }
            }
        }
    }
    steps.finish(&mut outcome.reasons).await?;
    Ok(())
}

/// The signed open request for `samples` and what the walk left to open, of the challenge's
/// version (PROTOCOL.md 13.3, 18.5, 20.5): a version 3 one with walk samples or none, a version
/// 4 one with steps or none.
fn open_request(
    identity: &KeyPair,
    nonce: [u8; 32],
    phase: &MemoryPhasePlan,
    samples: &[SampleRequest],
    memory: Option<&MemoryOpenings<'_>>,
) -> v1::OpenChainsRequest {
    let (walk_samples, step_samples) = match memory {
        Some(MemoryOpenings::Segments(w)) => (w.samples.clone(), Vec::new()),
        Some(MemoryOpenings::Steps(s)) => (Vec::new(), s.steps.clone()),
        None => (Vec::new(), Vec::new()),
    };
    // The version the planner chose: the walk refused a commitment whose pools did not fit it.
    let signed = match phase {
        MemoryPhasePlan::V4(_) => memory_v4::open_request_bytes(&nonce, samples, &step_samples),
        MemoryPhasePlan::V3(_) => open_request_bytes_v3(&nonce, samples, &walk_samples),
        MemoryPhasePlan::Off => open_request_bytes(&nonce, samples),
    };
    v1::OpenChainsRequest {
        nonce: nonce.to_vec(),
        samples: samples.iter().map(sample_to_wire).collect(),
        validator_key: identity.public_key().0.to_vec(),
        signature: identity.sign(&signed).to_vec(),
        walk_samples: walk_samples.iter().map(walk_sample_to_wire).collect(),
        step_samples: step_samples.iter().map(step_sample_to_wire).collect(),
    }
}

/// Not every opening came within the opening budget.
pub fn openings_timed_out(outcome: &mut Outcome) {
    let budget = opening_budget(outcome.plan.deadline_ms);
    outcome.fail(
        ReasonCode::OpeningsTimedOut,
        format!("miner did not send all openings within {} ms", budget.as_millis()),
    )
}

/// The openings the stream owes, in request order: the chains, then the walk segments or steps.
pub fn owed<'a>(samples: &[SampleRequest], memory: Option<&MemoryOpenings<'a>>) -> Vec<Due<'a>> {
    let mut due: Vec<Due> = samples.iter().map(|&s| Due::Chain(s)).collect();
    match memory {
        Some(MemoryOpenings::Segments(w)) => due.extend(w.samples.iter().map(|&sample| Due::Walk(sample, w.context))),
        Some(MemoryOpenings::Steps(s)) => due.extend(s.steps.iter().map(|&step| Due::Step(step, s.walked))),
        None => {}
    }
    due
}

/// The miner refused the open request.
pub fn refused(status: &Status, outcome: &mut Outcome) {
    outcome.fail(
        ReasonCode::OpenRefused,
        format!(
            "miner refused to open chains ({:?}): {}",
            status.code(),
            miner_text(status.message())
        ),
    );
}

/// The opening the stream sent for `sample`, or `None` once the outcome says why there is none
/// (the stream ended, or the miner sent an error: malformed by this validator's decoding, or the
/// miner's own).
pub fn received_opening(
    received: Result<Option<v1::ChainOpening>, Status>,
    sample: Due<'_>,
    outcome: &mut Outcome,
) -> Option<v1::ChainOpening> {
    match received {
        Ok(Some(wire)) => Some(wire),
        Ok(None) => {
            outcome.fail(
                ReasonCode::OpeningMissing,
                format!("miner sent no opening for {sample}"),
            );
            None
        }
        Err(s) => {
            match own_decode_failure(&s) {
                Some(why) => outcome.fail(sample.malformed(), format!("opening {sample}: {why}")),
                None => outcome.fail(
                    ReasonCode::OpeningFailed,
                    format!("opening {sample} failed ({:?}): {}", s.code(), miner_text(s.message())),
                ),
            }
            None
        }
    }
}

/// An opening the stream owes, in request order: the chains, then the walk segments or steps.
#[derive(Clone, Copy)]
pub enum Due<'a> {
    Chain(SampleRequest),
    Walk(WalkSample, &'a WalkContext),
    /// A version 4 step.
    Step(StepSample, &'a StatesWalk),
}

impl Due<'_> {
    /// The reason an opening of this kind that does not decode fails with.
    fn malformed(&self) -> ReasonCode {
        match self {
            Due::Chain(_) => ReasonCode::MalformedOpening,
            Due::Walk(..) | Due::Step(..) => ReasonCode::MalformedWalkOpening,
        }
    }
}

impl std::fmt::Display for Due<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Due::Chain(s) => write!(f, "chain {} segment {}", s.chain, s.segment),
            Due::Walk(w, _) => write!(
                f,
                "walk segment {} of walker {} on device {}",
                w.segment, w.walker, w.device
            ),
            Due::Step(s, _) => write!(f, "walk step {} of walker {} on device {}", s.step, s.walker, s.device),
        }
    }
}

/// Refusals a later attempt may get past: a rate limit in front of the miner (which a peer
/// sharing this validator's address can use up), or a miner briefly unavailable. A request
/// refused there never reached the single-use check, so asking again is safe.
const RETRYABLE: [Code; 2] = [Code::ResourceExhausted, Code::Unavailable];
const OPEN_ATTEMPTS: u32 = 3;

/// Sends the open request, again after a pause when it is refused for a reason that may pass
/// (PROTOCOL.md 14.5). The caller bounds the whole with the opening budget.
async fn open_with_retries(
    miner: &mut MinerConnection,
    request: v1::OpenChainsRequest,
    n: usize,
) -> Result<tonic::Streaming<v1::ChainOpening>, Status> {
    let mut attempt = 1;
    loop {
        match miner.open_chains(request.clone(), n).await {
            Err(s) if RETRYABLE.contains(&s.code()) && attempt < OPEN_ATTEMPTS => {
                tracing::warn!(code = ?s.code(), message = miner_text(s.message()), attempt, "open request refused; asking again");
                tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// Checks one opening, recording what is wrong with it; `Err` only when this validator cannot
/// check at all (its own backend failed), which must not be blamed on the miner.
pub async fn check_opening(
    backend: Arc<dyn Backend>,
    work: &Work,
    commitment: &Commitment,
    sample: SampleRequest,
    wire: &v1::ChainOpening,
    outcome: &mut Outcome,
) -> Result<(), AttestError> {
    let (nonce, opening, signature) = match opening_from_wire(wire, work.n()) {
        Ok(t) => t,
        Err(e) => {
            outcome.fail(
                ReasonCode::MalformedOpening,
                format!("malformed opening of chain {}: {e}", sample.chain),
            );
            return Ok(());
        }
    };
    if nonce != work.params().nonce {
        outcome.fail(
            ReasonCode::OpeningWrongChallenge,
            format!("opening of chain {} is for another challenge", sample.chain),
        );
        return Ok(());
    }
    if commitment
        .miner_key
        .verify(&opening_bytes(&nonce, &opening), &signature)
        .is_err()
    {
        outcome.fail(
            ReasonCode::OpeningSignature,
            format!("opening of chain {} is not signed by the miner", sample.chain),
        );
        return Ok(());
    }
    let (work, committed) = (work.clone(), commitment.work.clone());
    let checked = tokio::task::spawn_blocking(move || {
        verify_opening(
            backend.as_ref(),
            &work,
            &committed,
            sample,
            &opening,
            &CancelToken::new(),
        )
    })
    .await
    .map_err(|e| AttestError::Verify(e.to_string()))?;
    match checked {
        Ok(()) => Ok(()),
        Err(VerifyError::Rejected(r)) => {
            outcome.reject(&r);
            Ok(())
        }
        Err(e) => Err(AttestError::Verify(e.to_string())),
    }
}
