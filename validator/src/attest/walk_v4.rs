//! Version 4's walk and step openings as the validator runs them (PROTOCOL.md 20.4 to 20.8):
//! the signed walk request with a seed drawn only now; each device's signed root timed on its
//! own, from sending the request to that root's arrival, against that device's own deadline;
//! the steps drawn once every root is in; and each opened step checked with 20.5, a row of its
//! slice made again from the work function for the openings this validator chose, unseen by the
//! miner, and the row itself drawn after the opening arrived.
//!
//! Failures are pushed as [`Reason`]s, so that the attestation that calls this keeps one list.

use super::client::MinerConnection;
use super::decoding::own_decode_failure;
use super::exchange::walk_give_up;
use super::{AttestError, AttestEvent, now_ms, random32};
use crate::memory::plan_v4::ChainPoolPlan;
use crate::transcript::Recorder;
use crate::untrusted::miner_text;
use crate::verdict::reason::{Reason, ReasonCode};
use gpu_attest_proto::convert::{WalkRequest, walk_request_to_wire};
use gpu_attest_proto::memory_v4::{step_opening_from_wire, walk_root_from_wire};
use gpu_attest_proto::v1;
use gpu_attest_shared::Work;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice_walk::{DeviceCommitments, SliceWalk, StepRejection, check_step};
use gpu_attest_shared::statement::Commitment;
use gpu_attest_shared::statement::memory_v4::{StepSample, WalkRoot, step_opening_bytes, walk_request_bytes};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// One device's walk as this validator received it.
#[derive(Clone, Debug)]
pub struct WalkedDevice {
    pub pool: ChainPool,
    pub committed: DeviceCommitments,
    /// From sending the walk request to this device's root, by this validator's clock.
    pub measured_us: u64,
    /// What the miner says the device timed: logged, never trusted.
    pub device_us: u64,
}

/// A walk whose every root arrived, signed: what its step openings are checked against.
#[derive(Clone, Debug)]
pub struct StatesWalk {
    pub walk: SliceWalk,
    pub devices: Vec<WalkedDevice>,
    /// The drawn steps whose slice gets a row check: drawn with the steps, never sent.
    row_checked: HashSet<StepSample>,
}

/// Sends the walk request and collects every device's root. `None` when the walk failed before
/// there was anything to open (the reasons say why); a late device is a reason, but its root is
/// kept and its steps are opened like the others'.
#[allow(clippy::too_many_arguments)]
pub async fn walk_states(
    miner: &mut MinerConnection,
    identity: &KeyPair,
    work: &Work,
    commitment: &Commitment,
    plan: &ChainPoolPlan,
    reasons: &mut Vec<Reason>,
    recorder: &mut Recorder,
    on_event: &(dyn Fn(AttestEvent) + Send + Sync),
) -> Result<Option<StatesWalk>, AttestError> {
    let nonce = work.params().nonce;
    let walk_seed = random32()?;
    let longest = plan.devices.iter().map(|d| d.deadline_ms).max().unwrap_or(0);
    let deadline_ms = now_ms().saturating_add(longest);
    // Version 3's message, signed over version 4's bytes (PROTOCOL.md 20.7).
    let request = walk_request_to_wire(&WalkRequest {
        nonce,
        walk_seed,
        deadline_ms,
        validator_key: identity.public_key().0,
        signature: identity.sign(&walk_request_bytes(&nonce, &walk_seed, deadline_ms)),
    });
    recorder.walk_request(request.clone());
    on_event(AttestEvent::Phase {
        name: "walking",
        detail: format!(
            "{} walkers x {} steps over the states of {} pool chains on {} device(s); deadlines {} ms",
            plan.params.walkers,
            plan.params.walk_steps,
            plan.params.pool_chains.iter().sum::<u64>(),
            plan.devices.len(),
            plan.devices
                .iter()
                .map(|d| d.deadline_ms.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    let walk = SliceWalk {
        nonce,
        walk_seed,
        global: commitment.work.global,
        walkers: plan.params.walkers,
        steps: plan.params.walk_steps,
    };
    let give_up = walk_give_up(Duration::from_millis(longest));
    let sent = Instant::now();
    let roots = collect_roots(
        miner,
        identity.public_key(),
        request,
        &walk,
        commitment,
        plan,
        sent,
        give_up,
        reasons,
        recorder,
    )
    .await;
    let Some(devices) = roots.and_then(|roots| walked_devices(roots, work, commitment, plan, reasons)) else {
        return Ok(None);
    };
    on_event(AttestEvent::Phase {
        name: "walk-received",
        detail: devices
            .iter()
            .enumerate()
            .map(|(j, d)| format!("device {j} after {} ms", d.measured_us.div_ceil(1000)))
            .collect::<Vec<_>>()
            .join(", "),
    });
    Ok(Some(StatesWalk {
        walk,
        row_checked: HashSet::new(),
        devices,
    }))
}

/// Each device's received root with its pool and commitments, every device timed against its
/// own deadline: a late one is a reason, and its root is kept. `None` (with the reason) when a
/// device has no pool of the planned size.
pub fn walked_devices(
    roots: Vec<(Digest, u64, u64)>,
    work: &Work,
    commitment: &Commitment,
    plan: &ChainPoolPlan,
    reasons: &mut Vec<Reason>,
) -> Option<Vec<WalkedDevice>> {
    let mut devices = Vec::with_capacity(roots.len());
    for (j, (root, measured_us, device_us)) in roots.into_iter().enumerate() {
        let planned = &plan.devices[j];
        // In microseconds, so that a root is late by any time past its deadline.
        if measured_us > planned.deadline_ms.saturating_mul(1000) {
            let measured_ms = measured_us.div_ceil(1000);
            reasons.push(Reason::new(
                ReasonCode::LateWalk,
                format!(
                    "device {j}'s walk root arrived after {measured_ms} ms; its deadline was {} ms (expected {} ms at {:.3e} bytes/s)",
                    planned.deadline_ms, planned.expected_ms, planned.bytes_per_sec
                ),
            ));
        }
        let Some(pool) = device_pool(work, commitment, plan, j) else {
            reasons.push(Reason::new(
                ReasonCode::WalkNotCanonical,
                format!("device {j} has no pool of the planned size in the commitment's partition"),
            ));
            return None;
        };
        let root_j = &commitment.work.devices[j];
        devices.push(WalkedDevice {
            pool,
            committed: DeviceCommitments {
                device_root: root_j.root,
                device_chains: root_j.slice.count,
                walk_root: root,
            },
            measured_us,
            device_us,
        });
    }
    Some(devices)
}

/// Device `j`'s pool: its first `N_j` chains, from the commitment's partition.
fn device_pool(work: &Work, commitment: &Commitment, plan: &ChainPoolPlan, j: usize) -> Option<ChainPool> {
    let slice = commitment.work.devices.get(j)?.slice;
    let chains = *plan.params.pool_chains.get(j)?;
    if chains > slice.count {
        return None;
    }
    ChainPool::new(j as u32, slice.offset, chains, work.n()).ok()
}

/// Reads the stream of roots: one per device, each signed, none twice. Returns each device's
/// `(walk_root_j, measured_us, device_us)` in device order, or `None` (with the reason) when
/// the walk cannot be checked.
#[allow(clippy::too_many_arguments)]
async fn collect_roots(
    miner: &mut MinerConnection,
    validator_key: PublicKey,
    request: v1::WalkRequest,
    walk: &SliceWalk,
    commitment: &Commitment,
    plan: &ChainPoolPlan,
    sent: Instant,
    give_up: Duration,
    reasons: &mut Vec<Reason>,
    recorder: &mut Recorder,
) -> Option<Vec<(Digest, u64, u64)>> {
    let mut roots = Roots::new(plan.devices.len());
    let until = tokio::time::Instant::from_std(sent) + give_up;
    let mut stream = match tokio::time::timeout_at(until, miner.walk_states(request)).await {
        Err(_) => return roots.timed_out(sent.elapsed().as_millis() as u64, reasons, recorder),
        Ok(Err(status)) => return roots.refused(&status, reasons, recorder),
        Ok(Ok(stream)) => stream,
    };
    loop {
        let message = match tokio::time::timeout_at(until, stream.message()).await {
            Err(_) => return roots.timed_out(sent.elapsed().as_millis() as u64, reasons, recorder),
            Ok(Err(status)) => return roots.refused(&status, reasons, recorder),
            Ok(Ok(None)) => break,
            Ok(Ok(Some(message))) => message,
        };
        let measured_us = sent.elapsed().as_micros() as u64;
        recorder.walk_root(&message, measured_us);
        if let Err((code, message)) = roots.take(&message, measured_us, walk, commitment, validator_key) {
            reasons.push(Reason::new(code, message));
            return None;
        }
    }
    roots.all(reasons)
}

/// The roots of a walk as they arrive, one slot per device: how a stream of them is judged,
/// live or from a transcript.
pub struct Roots(Vec<Option<(Digest, u64, u64)>>);

impl Roots {
    pub fn new(devices: usize) -> Self {
        Roots(vec![None; devices])
    }

    /// The stream failed with `status` (recorded): the miner's refusal or failure, or a
    /// message this validator could not decode.
    pub fn refused(
        &self,
        status: &tonic::Status,
        reasons: &mut Vec<Reason>,
        recorder: &mut Recorder,
    ) -> Option<Vec<(Digest, u64, u64)>> {
        recorder.walk_failed(status);
        reasons.push(match own_decode_failure(status) {
            Some(why) => Reason::new(ReasonCode::MalformedWalk, format!("walk root: {why}")),
            None => Reason::new(
                ReasonCode::WalkRefused,
                format!(
                    "miner refused or failed the walk ({:?}): {}",
                    status.code(),
                    miner_text(status.message())
                ),
            ),
        });
        None
    }

    /// Nothing more came within the walk's time, `after_ms` after the request (recorded).
    pub fn timed_out(
        &self,
        after_ms: u64,
        reasons: &mut Vec<Reason>,
        recorder: &mut Recorder,
    ) -> Option<Vec<(Digest, u64, u64)>> {
        recorder.walk_timed_out(after_ms);
        reasons.push(Reason::new(
            ReasonCode::WalkTimedOut,
            format!("no walk roots from devices {:?} within {after_ms} ms", self.missing()),
        ));
        None
    }

    fn missing(&self) -> Vec<usize> {
        (0..self.0.len()).filter(|&j| self.0[j].is_none()).collect()
    }

    /// Every device's root, in device order, once the stream has ended; `None` (with the
    /// reason) when one is missing.
    pub fn all(self, reasons: &mut Vec<Reason>) -> Option<Vec<(Digest, u64, u64)>> {
        let missing = self.missing();
        if !missing.is_empty() {
            reasons.push(Reason::new(
                ReasonCode::WalkNotCanonical,
                format!("the walk ended without the roots of devices {missing:?}"),
            ));
            return None;
        }
        Some(self.0.into_iter().flatten().collect())
    }

    /// One root from the stream, decoded, for a device of the challenge, signed by the miner
    /// over this walk, and the first for its device: kept with the time it arrived, or the
    /// reason it cannot be.
    pub fn take(
        &mut self,
        message: &v1::DeviceWalkRoot,
        measured_us: u64,
        walk: &SliceWalk,
        commitment: &Commitment,
        validator_key: PublicKey,
    ) -> Result<(), (ReasonCode, String)> {
        let devices = self.0.len();
        let (device, root, device_us, signature) = walk_root_from_wire(message)
            .map_err(|e| (ReasonCode::MalformedWalk, format!("malformed walk root: {e}")))?;
        let Some(slot) = self.0.get_mut(device as usize) else {
            return Err((
                ReasonCode::WalkNotCanonical,
                format!("a walk root for device {device}; the challenge has {devices} devices"),
            ));
        };
        let statement = WalkRoot {
            nonce: walk.nonce,
            miner_key: commitment.miner_key,
            validator_key,
            walk_seed: walk.walk_seed,
            device,
            root,
            device_us,
        };
        if commitment
            .miner_key
            .verify(&statement.signing_bytes(), &signature)
            .is_err()
        {
            return Err((
                ReasonCode::WalkSignature,
                format!("device {device}'s walk root is not signed by the miner over this walk"),
            ));
        }
        if slot.replace((root, measured_us, device_us)).is_some() {
            return Err((
                ReasonCode::WalkNotCanonical,
                format!("two walk roots for device {device}"),
            ));
        }
        Ok(())
    }
}

impl StatesWalk {
    /// The steps to open (PROTOCOL.md 20.8): on each device its planned count, walker and step
    /// uniform, none twice, drawn now that every root is in. Of each device's steps, its planned
    /// count of row checks is chosen here too, and kept.
    pub fn draw_steps(&mut self, plan: &ChainPoolPlan, rng: &mut impl Rng) -> Vec<StepSample> {
        let per_device = u64::from(self.walk.walkers) * u64::from(self.walk.steps);
        let mut steps = Vec::new();
        for (j, planned) in plan.devices.iter().enumerate().take(self.devices.len()) {
            let count = u64::from(planned.steps_opened).min(per_device) as usize;
            let first = steps.len();
            let mut taken = HashSet::with_capacity(count);
            while taken.len() < count {
                let step = StepSample {
                    device: j as u32,
                    walker: (rng.next_u64() % u64::from(self.walk.walkers)) as u32,
                    step: (rng.next_u64() % u64::from(self.walk.steps)) as u32,
                };
                if taken.insert(step) {
                    steps.push(step);
                }
            }
            let rows = (planned.rows_checked as usize).min(count);
            let mut checked = 0;
            while checked < rows {
                let chosen = steps[first + (rng.next_u64() % count as u64) as usize];
                checked += usize::from(self.row_checked.insert(chosen));
            }
        }
        steps
    }

    /// A walk from a transcript: its roots as received, and the steps the validator chose to
    /// row-check (which a live walk draws with the steps).
    pub fn replayed(walk: SliceWalk, devices: Vec<WalkedDevice>, row_checked: HashSet<StepSample>) -> Self {
        StatesWalk {
            walk,
            devices,
            row_checked,
        }
    }

    /// The steps whose slice gets a row check, in a fixed order (for the transcript).
    pub fn row_checked_steps(&self) -> Vec<StepSample> {
        let mut steps: Vec<StepSample> = self.row_checked.iter().copied().collect();
        steps.sort_by_key(|s| (s.device, s.walker, s.step));
        steps
    }

    /// Whether `sample` is one of the steps whose slice gets a row check.
    pub fn row_checked(&self, sample: &StepSample) -> bool {
        self.row_checked.contains(sample)
    }

    /// The row for `sample`'s row check, drawn now (after its opening arrived) where it gets
    /// one, and recorded for the transcript.
    pub fn draw_row(&self, sample: StepSample, recorder: &mut Recorder) -> Result<Option<u32>, AttestError> {
        if !self.row_checked(&sample) {
            return Ok(None);
        }
        // Reduced to one of the opened slice's rows in `check_step` (PROTOCOL.md 20.5).
        let row = ChaCha20Rng::from_seed(random32()?).next_u32();
        recorder.row_check(sample, row);
        Ok(Some(row))
    }

    /// Checks one opened step as it arrived (PROTOCOL.md 20.5): its decoding, echo and signature
    /// now, recording what is wrong in `reasons`; the rest, with its row check on `row` where
    /// it has one (the costly part: `K` vector-matrix products and the chain's `B`), as a job on
    /// a blocking thread that the caller waits for with others ([`StepChecks`]).
    pub fn begin_check(
        &self,
        work: &Work,
        miner_key: &PublicKey,
        sample: StepSample,
        wire: &v1::ChainOpening,
        row: Option<u32>,
        reasons: &mut Vec<Reason>,
    ) -> Option<StepCheck> {
        let shown = format!(
            "step {} of walker {} on device {}",
            sample.step, sample.walker, sample.device
        );
        let Some(step) = &wire.step else {
            reasons.push(Reason::new(
                ReasonCode::MalformedWalkOpening,
                format!("the miner sent another opening where {shown} was due"),
            ));
            return None;
        };
        let (device, opening, signature) = match step_opening_from_wire(step) {
            Ok(decoded) => decoded,
            Err(e) => {
                reasons.push(Reason::new(
                    ReasonCode::MalformedWalkOpening,
                    format!("malformed opening of {shown}: {e}"),
                ));
                return None;
            }
        };
        if (device, opening.walker, opening.step) != (sample.device, sample.walker, sample.step) {
            reasons.push(Reason::new(
                ReasonCode::WalkOpeningForWrongRequest,
                format!(
                    "the miner opened step {} of walker {} on device {device} where {shown} was due",
                    opening.step, opening.walker
                ),
            ));
            return None;
        }
        let nonce = self.walk.nonce;
        if miner_key
            .verify(&step_opening_bytes(&nonce, device, &opening), &signature)
            .is_err()
        {
            reasons.push(Reason::new(
                ReasonCode::WalkOpeningSignature,
                format!("the opening of {shown} is not signed by the miner"),
            ));
            return None;
        }
        let Some(walked) = self.devices.get(device as usize).cloned() else {
            reasons.push(Reason::new(
                ReasonCode::WalkOpeningForWrongRequest,
                format!("{shown} names no device of this walk"),
            ));
            return None;
        };
        let rows: Vec<u32> = row.into_iter().collect();
        let (work, walk) = (work.clone(), self.walk.clone());
        Some(StepCheck(tokio::task::spawn_blocking(move || {
            check_step(&work, &walk, &walked.pool, &walked.committed, &opening, &rows)
        })))
    }
}

/// One opened step's check, running on a blocking thread.
pub struct StepCheck(tokio::task::JoinHandle<Result<(), StepRejection>>);

/// The step checks of one open round, run on every core this validator has: up to
/// `available_parallelism` at once, each waited for in the order the openings came, so that
/// the openings keep arriving while earlier ones are checked (PROTOCOL.md 20.9 step 6's row
/// checks cost about 10 ms of one core each at n = 2048).
pub struct StepChecks {
    running: std::collections::VecDeque<StepCheck>,
    at_once: usize,
}

impl Default for StepChecks {
    fn default() -> Self {
        StepChecks::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl StepChecks {
    pub fn new(at_once: usize) -> Self {
        StepChecks {
            running: Default::default(),
            at_once: at_once.max(1),
        }
    }

    /// Adds `check`, first waiting for the oldest while `at_once` are running.
    pub async fn push(&mut self, check: StepCheck, reasons: &mut Vec<Reason>) -> Result<(), AttestError> {
        while self.running.len() >= self.at_once {
            self.wait_oldest(reasons).await?;
        }
        self.running.push_back(check);
        Ok(())
    }

    /// Waits for every check still running, recording each rejection.
    pub async fn finish(&mut self, reasons: &mut Vec<Reason>) -> Result<(), AttestError> {
        while !self.running.is_empty() {
            self.wait_oldest(reasons).await?;
        }
        Ok(())
    }

    async fn wait_oldest(&mut self, reasons: &mut Vec<Reason>) -> Result<(), AttestError> {
        let Some(StepCheck(job)) = self.running.pop_front() else {
            return Ok(());
        };
        let checked = job.await.map_err(|e| AttestError::Verify(e.to_string()))?;
        if let Err(rejection) = checked {
            reasons.push(Reason::new(
                ReasonCode::from_name(rejection.code()),
                rejection.to_string(),
            ));
        }
        Ok(())
    }
}
