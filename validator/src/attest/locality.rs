//! The locality walk as the validator runs it (PROTOCOL.md 20.10): after version 4's walk, a
//! second seed, `G` generations of `W` walkers per device, each device's signed root timed on its
//! own, then `m` segments per device drawn and each replayed on its proven lines.
//!
//! The rules are in [`LocalityJudge`], which the attestation applies as it reads and the audit
//! applies to the transcript's record, so that both reach the same reasons and figures.

use super::client::MinerConnection;
use super::decoding::own_decode_failure;
use super::exchange::walk_give_up;
use super::{AttestError, AttestEvent, now_ms, random32};
use crate::config::memory::LocalityConfig;
use crate::transcript::Recorder;
use crate::untrusted::miner_text;
use crate::verdict::memory::DeviceLocality;
use crate::verdict::reason::{Reason, ReasonCode};
use gpu_attest_proto::locality::{
    LocalityRequest, OpenLinesRequest, open_request_to_wire, opening_from_wire, request_to_wire,
};
use gpu_attest_proto::memory_v4::walk_root_from_wire;
use gpu_attest_proto::v1;
use gpu_attest_shared::Work;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::inventory::HardwareClaim;
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use gpu_attest_shared::memory::bound::model_for_device;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::locality::{
    LocalityCommitments, LocalityWalk, MAX_KEPT_ENDS, MAX_WALKERS, check_segment,
};
use gpu_attest_shared::memory::slice::CHUNK_BYTES;
use gpu_attest_shared::memory::slice_walk::DeviceCommitments;
use gpu_attest_shared::statement::Commitment;
use gpu_attest_shared::statement::locality::{
    SegmentSample, open_request_bytes, opening_bytes, request_bytes, root_bytes,
};
use gpu_attest_shared::statement::memory_v4::WalkRoot;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use tonic::Code;

/// The round trip and the miner's scheduling, allowed on top of the walk's own time.
pub const ROUND_TRIP_ALLOWANCE_US: u64 = 100_000;

/// What the validator fixed of a locality walk before asking for it: its shape and the figures
/// its deadline and bound come from. Recorded in the transcript as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalityPlan {
    pub walkers: u32,
    pub generations: u32,
    pub steps: u32,
    pub segments: u32,
    pub step_ns: u64,
    pub slack: f64,
    /// The hop the verdict's bound speaks of; 0 in plans recorded before it had one.
    #[serde(default)]
    pub hop_ns: u64,
}

/// Whether this validator asks a miner for the locality walk, from its settings and the
/// miner's claim.
#[derive(Clone, Debug, PartialEq)]
pub enum LocalityAsk {
    /// `[memory.locality]` is off.
    Off,
    Asked(LocalityPlan),
    /// The walk is on, but this miner is not asked for it: why, for the attestation's events.
    NotAsked(String),
}

/// The locality walk `config` asks of a miner claiming `claim`: on the CPU backend `config`'s
/// own walkers and `step_ns`; on GPUs one walker an SM of the claimed models' datasheets (the
/// fewest among them; design: the walkers then do not slow each other, and `miner bench`
/// measures the step so), timed by the slowest claimed model's step, where every claimed model
/// has one in `gpu_step_ns`. The SMs are the model's, not the claim's: with fewer walkers than
/// the step was measured at a walk runs faster than its deadline assumes, and with more its
/// generations are capped, shortening it. The bound holds for any number of walkers (it rests on
/// the measured time and the ordered steps of each); the deadline is what the walkers and the
/// step set.
pub fn locality_ask(config: &LocalityConfig, claim: &HardwareClaim) -> LocalityAsk {
    if !config.enabled {
        return LocalityAsk::Off;
    }
    match claim.backend.as_str() {
        "cpu" => LocalityAsk::Asked(LocalityPlan::new(config, config.walkers, config.step_ns)),
        "cuda" if !claim.devices.is_empty() => {
            let mut step_ns = 0;
            for device in &claim.devices {
                let model = model_for_device(&device.name, device.memory_bytes);
                match model.and_then(|m| config.gpu_step_ns.get(m.name)) {
                    Some(&ns) => step_ns = step_ns.max(ns),
                    None => {
                        let class = model.map_or_else(
                            || "a GPU outside the shipped model table".to_string(),
                            |m| format!("model {:?}", m.name),
                        );
                        return LocalityAsk::NotAsked(format!(
                            "no measured locality step for device {} ({}, {class}) in [memory.locality.gpu_step_ns]",
                            device.index,
                            miner_text(&device.name)
                        ));
                    }
                }
            }
            match datasheet_walkers(claim) {
                Some(walkers) => LocalityAsk::Asked(LocalityPlan::new(config, walkers, step_ns)),
                // Not reached while every shipped model has its SM count (a test holds that).
                None => LocalityAsk::NotAsked("a claimed GPU's model has no SM count in the shipped table".into()),
            }
        }
        backend => LocalityAsk::NotAsked(format!(
            "the locality walk is not asked of the {} backend",
            miner_text(backend)
        )),
    }
}

/// The walkers of a GPU walk: one an SM of the claimed models' datasheets, the fewest among
/// them. None where a claimed device's model is not in the shipped table (or has no SM count).
fn datasheet_walkers(claim: &HardwareClaim) -> Option<u32> {
    let mut walkers = MAX_WALKERS;
    for device in &claim.devices {
        let sms = model_for_device(&device.name, device.memory_bytes)?.sms;
        if sms == 0 {
            return None;
        }
        walkers = walkers.min(sms);
    }
    Some(walkers.clamp(1, MAX_WALKERS))
}

impl LocalityPlan {
    /// Why this plan is outside what [`locality_ask`] may make for `claim` under settings that
    /// [`LocalityConfig::problem`] accepts; None where it is within it. The audit holds a
    /// recorded plan to it: the step, the slack, the walk's length and the hop are the
    /// validator's to set within those limits (an auditor cannot see its settings, so this
    /// checks the limits, not the settings), but a GPU walk's walkers are the claimed models'
    /// datasheet SMs, a walk is not asked of other backends, and the generations are what a walk
    /// target of 1 ms to ten minutes makes at the plan's step, within the kept-end limit.
    pub fn problem_for(&self, claim: &HardwareClaim) -> Option<String> {
        use crate::config::memory::{
            MAX_HOP_NS, MAX_LOCALITY_SLACK, MAX_STEP_NS, MAX_WALK_TARGET_MS, locality_slack_allowed, useless_hop_below,
        };
        use gpu_attest_shared::statement::locality::MAX_SEGMENT_SAMPLES_PER_DEVICE;
        // The limits a miner holds a walk's shape to (PROTOCOL.md 20.10), whatever it is seeded with.
        if let Err(e) = self.walk([0; 32], [0; 32], Digest::default()).check_shape() {
            return Some(format!("its shape is outside this release's limits: {e}"));
        }
        if !(1..=MAX_SEGMENT_SAMPLES_PER_DEVICE as u32).contains(&self.segments) {
            return Some(format!(
                "{} segments a device is outside 1..={MAX_SEGMENT_SAMPLES_PER_DEVICE}",
                self.segments
            ));
        }
        // A hop of 0 is what plans recorded before the bound had one say.
        if !(1..=MAX_STEP_NS).contains(&self.step_ns) || self.hop_ns > MAX_HOP_NS || !locality_slack_allowed(self.slack)
        {
            return Some(format!(
                "its step ({} ns, 1 to {MAX_STEP_NS}), hop ({} ns, at most {MAX_HOP_NS}) or slack ({}, 1 to {MAX_LOCALITY_SLACK}) is one no validator may set",
                self.step_ns, self.hop_ns, self.slack
            ));
        }
        // The settings refuse a hop no longer than their slowest step over the ordered share
        // (a bound that would say nothing); the plan's step is one of theirs.
        let useless_below = useless_hop_below(self.step_ns, self.segments);
        if self.hop_ns != 0 && self.hop_ns <= useless_below {
            return Some(format!(
                "its hop ({} ns) is no longer than its step over the ordered share ({useless_below} ns), which no validator's settings allow",
                self.hop_ns
            ));
        }
        // `new` takes the fewest generations that last the walk target (1 ms to ten minutes),
        // within the kept-end limit.
        let generation_ns = u64::from(self.steps) * self.step_ns;
        let most = (MAX_WALK_TARGET_MS * 1_000_000).div_ceil(generation_ns);
        let least = 1_000_000u64
            .div_ceil(generation_ns)
            .min(MAX_KEPT_ENDS / u64::from(self.walkers));
        if !(least..=most).contains(&u64::from(self.generations)) {
            return Some(format!(
                "{} generations of {generation_ns} ns are outside what a walk target of 1 ms to {MAX_WALK_TARGET_MS} ms makes ({least} to {most})",
                self.generations
            ));
        }
        match claim.backend.as_str() {
            "cpu" => None,
            "cuda" if claim.devices.is_empty() => Some("no walk is asked of a GPU miner that claims no device".into()),
            "cuda" => match datasheet_walkers(claim) {
                Some(walkers) if walkers == self.walkers => None,
                Some(walkers) => Some(format!(
                    "it walks {} walkers a GPU where the claimed models' datasheets give {walkers} (one an SM, the fewest among them)",
                    self.walkers
                )),
                None => Some(
                    "a claimed GPU's model is not in the shipped table (or has no SM count there), so no walk is asked of it"
                        .into(),
                ),
            },
            backend => Some(format!("no walk is asked of the {} backend", miner_text(backend))),
        }
    }

    /// The walk the settings ask for of `walkers` walkers at `step_ns` a step: as many
    /// generations as last `walk_target_ms`, within the limit on the ends a miner keeps.
    pub fn new(config: &LocalityConfig, walkers: u32, step_ns: u64) -> Self {
        let generation_ns = u64::from(config.steps) * step_ns;
        let wanted = (config.walk_target_ms * 1_000_000).div_ceil(generation_ns.max(1));
        let most = MAX_KEPT_ENDS / u64::from(walkers.max(1));
        LocalityPlan {
            walkers,
            generations: wanted.clamp(1, most.min(u64::from(u32::MAX))) as u32,
            steps: config.steps,
            segments: config.segments,
            step_ns,
            slack: config.slack,
            hop_ns: config.hop_ns,
        }
    }

    /// `G * C * step_ns`, microseconds.
    pub fn expected_us(&self) -> u64 {
        (u64::from(self.generations) * u64::from(self.steps) * self.step_ns).div_ceil(1000)
    }

    /// `ceil(expected_us * slack) + ROUND_TRIP_ALLOWANCE_US`.
    pub fn deadline_us(&self) -> u64 {
        // Saturating: a plan read from a hostile transcript may carry any slack.
        ((self.expected_us() as f64 * self.slack).ceil() as u64).saturating_add(ROUND_TRIP_ALLOWANCE_US)
    }

    pub fn walk(&self, nonce: [u8; 32], seed: [u8; 32], global: Digest) -> LocalityWalk {
        LocalityWalk {
            nonce,
            seed,
            global,
            walkers: self.walkers,
            generations: self.generations,
            steps: self.steps,
        }
    }

    /// Largest opening accepted: `C` lines, each its chunk with a path, a chain's checkpoints
    /// and proof at their largest for this challenge, and one generation's ends with their proof
    /// in the locality tree.
    pub fn max_opening_bytes(&self, work: &Work) -> usize {
        let per_line = CHUNK_BYTES + 40 * (16 + work.checkpoints_per_chain() + 20) + 64;
        self.steps as usize * per_line + 40 * (self.walkers as usize + 24) + 4096
    }

    /// `segments` segments of every device, each `(g, w)` drawn uniformly and independently
    /// (so that `m` openings all miss a share `f` of made-up segments with probability exactly
    /// `(1 - f)^m`).
    pub fn draw(&self, devices: usize, rng: &mut ChaCha20Rng) -> Vec<SegmentSample> {
        let mut samples = Vec::with_capacity(devices * self.segments as usize);
        for device in 0..devices as u32 {
            for _ in 0..self.segments {
                samples.push(SegmentSample {
                    device,
                    generation: (rng.next_u64() % u64::from(self.generations)) as u32,
                    walker: (rng.next_u64() % u64::from(self.walkers)) as u32,
                });
            }
        }
        samples
    }
}

/// The rules of a locality walk, applied to what the miner sent in the order it came.
pub struct LocalityJudge<'a> {
    pub plan: &'a LocalityPlan,
    pub walk: LocalityWalk,
    pub miner_key: PublicKey,
    pub validator_key: PublicKey,
    /// Each device's pool and commitments, from version 4's walk.
    pub devices: Vec<(ChainPool, DeviceCommitments)>,
    /// Each device's locality root and its arrival, as taken.
    roots: Vec<Option<(Digest, u64)>>,
}

fn reason(code: ReasonCode, message: impl Into<String>) -> Reason {
    Reason::new(code, message)
}

impl<'a> LocalityJudge<'a> {
    pub fn new(
        plan: &'a LocalityPlan,
        walk: LocalityWalk,
        miner_key: PublicKey,
        validator_key: PublicKey,
        devices: Vec<(ChainPool, DeviceCommitments)>,
    ) -> Self {
        let roots = vec![None; devices.len()];
        LocalityJudge {
            plan,
            walk,
            miner_key,
            validator_key,
            devices,
            roots,
        }
    }

    /// The stream failed with `status`: `Ok(())` for a miner that cannot walk lines
    /// (UNIMPLEMENTED: the verdict states no locality), else the reason.
    pub fn refused(&self, status: &tonic::Status) -> Result<(), Reason> {
        if let Some(why) = own_decode_failure(status) {
            return Err(reason(ReasonCode::MalformedLocality, format!("locality root: {why}")));
        }
        if status.code() == Code::Unimplemented {
            return Ok(());
        }
        Err(reason(
            ReasonCode::LocalityRefused,
            format!(
                "miner refused or failed the locality walk ({:?}): {}",
                status.code(),
                miner_text(status.message())
            ),
        ))
    }

    /// The stream of roots failed with `status`: as [`Self::refused`] before any root came,
    /// else a failure whatever the code (a miner that cannot walk lines says so before it
    /// sends a root, not after one).
    pub fn stream_failed(&self, status: &tonic::Status) -> Walked {
        match self.refused(status) {
            Ok(()) if self.roots.iter().any(Option::is_some) => Err(reason(
                ReasonCode::LocalityRefused,
                "the locality walk was cut off after it began",
            )),
            Ok(()) => Ok(None),
            Err(why) => Err(why),
        }
    }

    pub fn timed_out(&self, after_ms: u64) -> Reason {
        let missing: Vec<usize> = (0..self.roots.len()).filter(|&j| self.roots[j].is_none()).collect();
        reason(
            ReasonCode::LocalityTimedOut,
            format!("no locality roots from devices {missing:?} within {after_ms} ms"),
        )
    }

    /// One root, decoded, for a device of the challenge, signed by the miner over this walk,
    /// the first for its device, and within its deadline.
    pub fn take_root(&mut self, message: &v1::DeviceWalkRoot, measured_us: u64) -> Result<(), Reason> {
        let devices = self.roots.len();
        let (device, root, device_us, signature) = walk_root_from_wire(message)
            .map_err(|e| reason(ReasonCode::MalformedLocality, format!("malformed locality root: {e}")))?;
        let Some(slot) = self.roots.get_mut(device as usize) else {
            return Err(reason(
                ReasonCode::MalformedLocality,
                format!("a locality root for device {device}; the challenge has {devices} devices"),
            ));
        };
        let statement = WalkRoot {
            nonce: self.walk.nonce,
            miner_key: self.miner_key,
            validator_key: self.validator_key,
            walk_seed: self.walk.seed,
            device,
            root,
            device_us,
        };
        if self.miner_key.verify(&root_bytes(&statement), &signature).is_err() {
            return Err(reason(
                ReasonCode::LocalityRootSignature,
                format!("device {device}'s locality root is not signed by the miner over this locality walk"),
            ));
        }
        if slot.replace((root, measured_us)).is_some() {
            return Err(reason(
                ReasonCode::MalformedLocality,
                format!("two locality roots for device {device}"),
            ));
        }
        let deadline_us = self.plan.deadline_us();
        if measured_us > deadline_us {
            return Err(reason(
                ReasonCode::LocalityTimedOut,
                format!(
                    "device {device}'s locality root arrived after {:.1} ms; its deadline was {:.1} ms (expected {:.1} ms: {} generations of {} steps at {} ns)",
                    measured_us as f64 / 1e3,
                    deadline_us as f64 / 1e3,
                    self.plan.expected_us() as f64 / 1e3,
                    self.plan.generations,
                    self.plan.steps,
                    self.plan.step_ns
                ),
            ));
        }
        Ok(())
    }

    /// Once the stream ended: every device's root came.
    pub fn all_roots(&self) -> Result<(), Reason> {
        let missing: Vec<usize> = (0..self.roots.len()).filter(|&j| self.roots[j].is_none()).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(reason(
                ReasonCode::MalformedLocality,
                format!("the locality walk ended without the roots of devices {missing:?}"),
            ))
        }
    }

    /// One opening read in the place of `sample`: decoded, that sample's, signed by the miner,
    /// and replayed on its proven lines to its committed end.
    pub fn check_opening(
        &self,
        work: &Work,
        sample: SegmentSample,
        message: &v1::LocalityOpening,
    ) -> Result<(), Reason> {
        let (device, opening, signature) = opening_from_wire(message).map_err(|e| {
            reason(
                ReasonCode::MalformedLocality,
                format!("malformed locality opening: {e}"),
            )
        })?;
        if (device, opening.generation, opening.walker) != (sample.device, sample.generation, sample.walker) {
            return Err(reason(
                ReasonCode::LocalityOpeningForWrongRequest,
                format!(
                    "an opening of device {device}, generation {}, walker {} in the place of {sample:?}",
                    opening.generation, opening.walker
                ),
            ));
        }
        if self
            .miner_key
            .verify(&opening_bytes(&self.walk.nonce, device, &opening), &signature)
            .is_err()
        {
            return Err(reason(
                ReasonCode::LocalityOpeningSignature,
                format!("the opening of {sample:?} is not signed by the miner"),
            ));
        }
        let (Some((pool, committed)), Some(Some((root, _)))) =
            (self.devices.get(device as usize), self.roots.get(device as usize))
        else {
            return Err(reason(
                ReasonCode::LocalityOpeningForWrongRequest,
                format!("an opening of device {device}, which has no locality root"),
            ));
        };
        let commitments = LocalityCommitments {
            device_root: committed.device_root,
            device_chains: committed.device_chains,
            locality_root: *root,
        };
        check_segment(work, &self.walk, pool, &commitments, &opening).map_err(|rejection| {
            reason(
                ReasonCode::from_name(rejection.code()),
                format!(
                    "device {device}, generation {}, walker {}: {rejection}",
                    sample.generation, sample.walker
                ),
            )
        })
    }

    /// What each device's walk states, once every root is in (settled by the proof).
    pub fn verdicts(&self) -> Vec<DeviceLocality> {
        self.roots
            .iter()
            .map(|root| DeviceLocality {
                walkers: self.plan.walkers,
                generations: self.plan.generations,
                steps: self.plan.steps,
                segments_opened: self.plan.segments,
                measured_us: root.map_or(0, |(_, us)| us.max(1)),
                expected_us: self.plan.expected_us(),
                deadline_us: self.plan.deadline_us(),
                step_ns: 0.0,
                hop_ns: self.plan.hop_ns,
                sequential_at_least: 0.0,
                hop_share_at_most: None,
            })
            .collect()
    }
}

/// How a locality walk ended, for the outcome: its figures per device where every root came
/// and every opening checked; `None` where the miner cannot walk lines; the reason otherwise.
pub type Walked = Result<Option<Vec<DeviceLocality>>, Reason>;

/// Runs the locality walk over `devices` (from version 4's walk) and its openings.
#[allow(clippy::too_many_arguments)]
pub async fn walk_lines(
    miner: &mut MinerConnection,
    identity: &KeyPair,
    work: &Work,
    commitment: &Commitment,
    plan: &LocalityPlan,
    devices: Vec<(ChainPool, DeviceCommitments)>,
    recorder: &mut Recorder,
    on_event: &(dyn Fn(AttestEvent) + Send + Sync),
) -> Result<Walked, AttestError> {
    let nonce = work.params().nonce;
    let walk = plan.walk(nonce, random32()?, commitment.work.global);
    let deadline_us = plan.deadline_us();
    let deadline_ms = now_ms().saturating_add(deadline_us.div_ceil(1000));
    let request = request_to_wire(&LocalityRequest {
        signature: identity.sign(&request_bytes(&walk, deadline_ms)),
        walk: walk.clone(),
        deadline_ms,
        validator_key: identity.public_key().0,
    });
    recorder.locality_request(
        request.clone(),
        serde_json::to_string(plan).expect("a plan of numbers serialises"),
    );
    on_event(AttestEvent::Phase {
        name: "locality",
        detail: format!(
            "{} generations of {} walker(s) x {} steps on {} device(s); deadline {:.1} ms",
            plan.generations,
            plan.walkers,
            plan.steps,
            devices.len(),
            deadline_us as f64 / 1e3
        ),
    });
    let mut judge = LocalityJudge::new(plan, walk, commitment.miner_key, identity.public_key(), devices);
    let give_up = walk_give_up(Duration::from_micros(deadline_us));
    let sent = Instant::now();
    let until = tokio::time::Instant::from_std(sent) + give_up;
    let mut stream = match tokio::time::timeout_at(until, miner.walk_lines(request)).await {
        Err(_) => return Ok(roots_timed_out(&judge, recorder, sent)),
        Ok(Err(status)) => {
            recorder.locality_failed(&status);
            return Ok(judge.stream_failed(&status));
        }
        Ok(Ok(stream)) => stream,
    };
    loop {
        let message = match tokio::time::timeout_at(until, stream.message()).await {
            Err(_) => return Ok(roots_timed_out(&judge, recorder, sent)),
            Ok(Err(status)) => {
                recorder.locality_failed(&status);
                return Ok(judge.stream_failed(&status));
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(message))) => message,
        };
        // Rounded up, so that neither the hop bound (which grows with it) nor the deadline (missed
        // by any part of a microsecond) is read in the miner's favour.
        let measured_us = u64::try_from(sent.elapsed().as_nanos().div_ceil(1000)).unwrap_or(u64::MAX);
        recorder.locality_root(&message, measured_us);
        if let Err(why) = judge.take_root(&message, measured_us) {
            return Ok(Err(why));
        }
    }
    if let Err(why) = judge.all_roots() {
        return Ok(Err(why));
    }
    let samples = plan.draw(judge.devices.len(), &mut ChaCha20Rng::from_seed(random32()?));
    let open = OpenLinesRequest {
        nonce,
        signature: identity.sign(&open_request_bytes(&nonce, &samples)),
        samples: samples.clone(),
        validator_key: identity.public_key().0,
    };
    let open = open_request_to_wire(&open);
    recorder.locality_open_request(&open);
    on_event(AttestEvent::Phase {
        name: "locality-opening",
        detail: format!("{} segment(s) of {} steps", samples.len(), plan.steps),
    });
    // The openings' budget: the walk's again, each opening walking one walker's generation.
    let until = tokio::time::Instant::now() + give_up + Duration::from_millis(100 * samples.len() as u64);
    let mut openings = match tokio::time::timeout_at(until, miner.open_lines(open, plan.max_opening_bytes(work))).await
    {
        Err(_) => return Ok(opening_not_read(recorder, None)),
        Ok(Err(status)) => return Ok(opening_not_read(recorder, Some(&status))),
        Ok(Ok(stream)) => stream,
    };
    for sample in samples {
        let message = match tokio::time::timeout_at(until, openings.message()).await {
            Err(_) => return Ok(opening_not_read(recorder, None)),
            Ok(Err(status)) => return Ok(opening_not_read(recorder, Some(&status))),
            Ok(Ok(None)) => {
                recorder.locality_opening(v1::recorded_locality_opening::Received::Ended(true));
                return Ok(Err(ended_early()));
            }
            Ok(Ok(Some(message))) => message,
        };
        recorder.locality_opening(v1::recorded_locality_opening::Received::Opening(message.clone()));
        if let Err(why) = judge.check_opening(work, sample, &message) {
            return Ok(Err(why));
        }
    }
    let verdicts = judge.verdicts();
    on_event(AttestEvent::Phase {
        name: "locality-checked",
        detail: verdicts
            .iter()
            .enumerate()
            .map(|(j, d)| format!("device {j} after {:.1} ms", d.measured_us as f64 / 1e3))
            .collect::<Vec<_>>()
            .join(", "),
    });
    Ok(Ok(Some(verdicts)))
}

/// Nothing more within the walk's time, recorded.
fn roots_timed_out(judge: &LocalityJudge, recorder: &mut Recorder, sent: Instant) -> Walked {
    let after_ms = sent.elapsed().as_millis() as u64;
    recorder.locality_timed_out(after_ms);
    Err(judge.timed_out(after_ms))
}

/// The miner's status (`Some`) or nothing in time (`None`) in place of an opening, recorded.
fn opening_not_read(recorder: &mut Recorder, status: Option<&tonic::Status>) -> Walked {
    use v1::recorded_locality_opening::Received;
    match status {
        Some(status) => {
            recorder.locality_opening(Received::Failure(crate::transcript::record::recorded_status(status)));
            Err(opening_failed(status))
        }
        None => {
            recorder.locality_opening(Received::TimedOut(true));
            Err(openings_timed_out())
        }
    }
}

/// The miner's status in place of an opening.
pub fn opening_failed(status: &tonic::Status) -> Reason {
    match own_decode_failure(status) {
        Some(why) => reason(ReasonCode::MalformedLocality, format!("locality opening: {why}")),
        None => reason(
            ReasonCode::LocalityRefused,
            format!(
                "miner refused or failed the locality openings ({:?}): {}",
                status.code(),
                miner_text(status.message())
            ),
        ),
    }
}

/// Nothing more within the openings' budget.
pub fn openings_timed_out() -> Reason {
    reason(
        ReasonCode::LocalityTimedOut,
        "the locality openings did not all come in time",
    )
}

/// The openings' stream ended before every sample was answered.
pub fn ended_early() -> Reason {
    reason(
        ReasonCode::MalformedLocality,
        "the locality openings ended before every segment asked for",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_attest_shared::device::DeviceInfo;

    fn gpu(index: u32, name: &str, memory_gib: u64, sm_count: u32) -> DeviceInfo {
        DeviceInfo {
            index,
            name: name.into(),
            uuid: format!("GPU-{index:08}"),
            memory_bytes: memory_gib << 30,
            sm_count,
            compute_capability: (9, 0),
            pci_bus_id: format!("00000000:{:02X}:00.0", index + 0x18),
            driver_version: "570.86.15".into(),
        }
    }

    fn claim(backend: &str, devices: Vec<DeviceInfo>) -> HardwareClaim {
        HardwareClaim {
            backend: backend.into(),
            kernel: "tiled".into(),
            devices,
        }
    }

    fn on(gpu_step_ns: &[(&str, u64)]) -> LocalityConfig {
        LocalityConfig {
            enabled: true,
            gpu_step_ns: gpu_step_ns.iter().map(|&(m, ns)| (m.to_string(), ns)).collect(),
            ..LocalityConfig::default()
        }
    }

    fn asked(ask: LocalityAsk) -> LocalityPlan {
        match ask {
            LocalityAsk::Asked(plan) => plan,
            other => panic!("not asked: {other:?}"),
        }
    }

    fn not_asked(ask: LocalityAsk) -> String {
        match ask {
            LocalityAsk::NotAsked(why) => why,
            other => panic!("expected NotAsked, got {other:?}"),
        }
    }

    #[test]
    fn a_walk_that_is_off_is_asked_of_no_one() {
        let off = LocalityConfig {
            gpu_step_ns: on(&[("H100 SXM", 700)]).gpu_step_ns,
            ..LocalityConfig::default()
        };
        let cpu = claim("cpu", vec![gpu(0, "cpu: AMD EPYC", 1, 2)]);
        let h100 = claim("cuda", vec![gpu(0, "NVIDIA H100 80GB HBM3", 80, 132)]);
        assert_eq!(locality_ask(&off, &cpu), LocalityAsk::Off);
        assert_eq!(locality_ask(&off, &h100), LocalityAsk::Off);
    }

    /// A CPU miner walks the settings' walkers at the CPU's step: 500 ms at 256 steps of 600 ns
    /// a generation is 3,256 generations (rounded up).
    #[test]
    fn a_cpu_miner_is_asked_at_the_settings_walkers_and_step() {
        let plan = asked(locality_ask(
            &on(&[]),
            &claim("cpu", vec![gpu(0, "cpu: AMD EPYC", 1, 2)]),
        ));
        assert_eq!((plan.walkers, plan.step_ns, plan.steps), (1, 600, 256));
        assert_eq!(plan.generations, 500_000_000u64.div_ceil(256 * 600) as u32);
        assert_eq!(plan.generations, 3256);
    }

    /// A GPU miner whose every model has a measured step walks one walker an SM of its models'
    /// datasheets (the fewest among them), timed by the slowest model's step. The SM count the
    /// miner claims plays no part.
    #[test]
    fn a_gpu_miner_is_asked_only_where_every_class_has_a_measured_step() {
        let settings = on(&[("H100 SXM", 700), ("H200", 650), ("H100 PCIe", 720)]);
        for claimed_sms in [132, 0, 1, 50_000] {
            let h100 = asked(locality_ask(
                &settings,
                &claim("cuda", vec![gpu(0, "NVIDIA H100 80GB HBM3", 80, claimed_sms)]),
            ));
            assert_eq!((h100.walkers, h100.step_ns), (132, 700), "claiming {claimed_sms} SMs");
        }
        let h100 = asked(locality_ask(
            &settings,
            &claim("cuda", vec![gpu(0, "NVIDIA H100 80GB HBM3", 80, 132)]),
        ));
        assert_eq!(h100.generations, 2791, "500 ms at 256 x 700 ns a generation");
        assert_eq!(h100.expected_us(), 2791 * 256 * 700 / 1000 + 1);

        let mixed = asked(locality_ask(
            &settings,
            &claim(
                "cuda",
                vec![gpu(0, "NVIDIA H200", 141, 132), gpu(1, "NVIDIA H100 PCIe", 80, 132)],
            ),
        ));
        assert_eq!(
            (mixed.walkers, mixed.step_ns),
            (114, 720),
            "the PCIe part's 114 SMs and step"
        );

        let missing = not_asked(locality_ask(
            &on(&[("H200", 650)]),
            &claim(
                "cuda",
                vec![
                    gpu(0, "NVIDIA H200", 141, 132),
                    gpu(1, "NVIDIA H100 80GB HBM3", 80, 132),
                ],
            ),
        ));
        assert!(
            missing.contains("device 1") && missing.contains("\"H100 SXM\"") && missing.contains("gpu_step_ns"),
            "{missing}"
        );
        let unknown = not_asked(locality_ask(
            &settings,
            &claim("cuda", vec![gpu(0, "NVIDIA B200", 180, 148)]),
        ));
        assert!(unknown.contains("outside the shipped model table"), "{unknown}");
        let no_devices = not_asked(locality_ask(&settings, &claim("cuda", Vec::new())));
        assert!(no_devices.contains("cuda"), "{no_devices}");
        let other = not_asked(locality_ask(
            &settings,
            &claim("rocm", vec![gpu(0, "AMD MI300X", 192, 304)]),
        ));
        assert!(other.contains("rocm"), "{other}");
    }

    /// Every model of the shipped table has its datasheet SM count, so that a step set for any of
    /// them can be asked; and a long walk stays within the ends a miner keeps.
    #[test]
    fn every_shipped_model_has_an_sm_count_and_walks_stay_within_the_kept_ends() {
        for model in gpu_attest_shared::memory::bound::models() {
            assert!((1..=MAX_WALKERS).contains(&model.sms), "{}", model.name);
        }
        let settings = LocalityConfig {
            walk_target_ms: 600_000,
            ..on(&[("RTX 6000 Ada", 1)])
        };
        let ada = claim("cuda", vec![gpu(0, "NVIDIA RTX 6000 Ada Generation", 48, 142)]);
        let plan = asked(locality_ask(&settings, &ada));
        assert_eq!(plan.walkers, 142);
        assert_eq!(u64::from(plan.generations), MAX_KEPT_ENDS / 142);
        plan.walk([0; 32], [0; 32], Digest::default())
            .check_shape()
            .expect("a walk a miner takes");
    }
    /// Every plan the ask makes, at the settings' extremes, is one the audit accepts for the
    /// claim it was made for.
    #[test]
    fn every_plan_the_ask_makes_is_one_the_audit_accepts() {
        let cpu = claim("cpu", vec![gpu(0, "cpu: AMD EPYC", 1, 2)]);
        let h100 = claim("cuda", vec![gpu(0, "NVIDIA H100 80GB HBM3", 80, 132)]);
        let mixed = claim(
            "cuda",
            vec![
                gpu(0, "NVIDIA H100 80GB HBM3", 80, 132),
                gpu(1, "NVIDIA GeForce RTX 4090", 24, 128),
            ],
        );
        let steps = [("H100 SXM", 700), ("RTX 4090", 900)];
        let configs = [
            on(&steps),
            LocalityConfig {
                walkers: MAX_WALKERS,
                walk_target_ms: crate::config::memory::MAX_WALK_TARGET_MS,
                step_ns: 1,
                ..on(&[("H100 SXM", 1), ("RTX 4090", 1)])
            },
            LocalityConfig {
                walk_target_ms: 1,
                step_ns: crate::config::memory::MAX_STEP_NS,
                hop_ns: crate::config::memory::MAX_HOP_NS,
                slack: 1.0,
                ..on(&[("H100 SXM", 1_000_000), ("RTX 4090", 1_000_000)])
            },
            // The longest segments at the slowest step for ten minutes: G at the limit (586).
            LocalityConfig {
                steps: 1024,
                step_ns: crate::config::memory::MAX_STEP_NS,
                walk_target_ms: crate::config::memory::MAX_WALK_TARGET_MS,
                hop_ns: crate::config::memory::MAX_HOP_NS,
                segments: 256,
                slack: crate::config::memory::MAX_LOCALITY_SLACK,
                ..on(&[("H100 SXM", 1_000_000), ("RTX 4090", 1_000_000)])
            },
            // One-step segments at 1 ns for ten minutes: G at the kept-end limit, one segment.
            LocalityConfig {
                steps: 1,
                step_ns: 1,
                walk_target_ms: crate::config::memory::MAX_WALK_TARGET_MS,
                hop_ns: 100_000,
                segments: 1,
                ..on(&[("H100 SXM", 1), ("RTX 4090", 1)])
            },
        ];
        for config in &configs {
            assert_eq!(config.problem(), None);
            for claim in [&cpu, &h100, &mixed] {
                let plan = asked(locality_ask(config, claim));
                assert_eq!(plan.problem_for(claim), None, "{plan:?} for {}", claim.backend);
            }
        }
    }

    /// A recorded plan no validator of this software makes for the claim is refused, each
    /// with its reason: a GPU walk of other walkers than the datasheets give, a shape or a
    /// setting outside the limits, and a walk asked of a backend that is never asked.
    #[test]
    fn the_audit_refuses_plans_no_validator_makes() {
        let h100 = claim("cuda", vec![gpu(0, "NVIDIA H100 80GB HBM3", 80, 132)]);
        let plan = asked(locality_ask(&on(&[("H100 SXM", 700)]), &h100));
        let refused = |change: &dyn Fn(&mut LocalityPlan), claim: &HardwareClaim| {
            let mut changed = plan.clone();
            change(&mut changed);
            changed
                .problem_for(claim)
                .unwrap_or_else(|| panic!("{changed:?} accepted"))
        };
        let why = refused(&|p| p.walkers = 1, &h100);
        assert!(why.contains("1 walkers a GPU") && why.contains("give 132"), "{why}");
        assert!(refused(&|p| p.walkers = 133, &h100).contains("give 132"));
        assert!(refused(&|p| p.generations = 0, &h100).contains("limits"));
        assert!(refused(&|p| p.generations = u32::MAX, &h100).contains("limits"));
        assert!(refused(&|p| p.steps = 0, &h100).contains("limits"));
        assert!(refused(&|p| p.segments = 0, &h100).contains("segments"));
        assert!(refused(&|p| p.step_ns = 0, &h100).contains("no validator may set"));
        assert!(refused(&|p| p.slack = 0.5, &h100).contains("no validator may set"));
        assert!(refused(&|p| p.slack = f64::NAN, &h100).contains("no validator may set"));
        assert!(refused(&|p| p.hop_ns = u64::MAX, &h100).contains("no validator may set"));
        // Within the kept-end limit, but longer than any walk target allows at its step (at
        // 1 ms a step a generation of 256 steps takes 256 ms: 2,344 of them last ten minutes).
        let why = refused(
            &|p| {
                (p.step_ns, p.hop_ns, p.generations) = (1_000_000, 2_000_000, 2_345);
            },
            &h100,
        );
        assert!(
            why.contains("outside what a walk target") && why.contains("to 2344"),
            "{why}"
        );
        // Shorter than a walk target of 1 ms at its step: 6 generations of 179.2 us at least.
        let why = refused(&|p| p.generations = 5, &h100);
        assert!(why.contains("(6 to "), "{why}");
        // A hop no longer than the step over the ordered share (700 / 0.75 = 933 ns).
        let why = refused(&|p| p.hop_ns = 933, &h100);
        assert!(why.contains("no longer than its step"), "{why}");
        assert_eq!(
            LocalityPlan {
                hop_ns: 934,
                ..plan.clone()
            }
            .problem_for(&h100),
            None
        );
        // A slack past the settings' limit (which keeps the deadline's arithmetic in range).
        assert!(refused(&|p| p.slack = 1e300, &h100).contains("no validator may set"));
        let loose = LocalityConfig {
            slack: 1000.5,
            ..on(&[])
        };
        assert!(loose.problem().is_some_and(|why| why.contains("at most 1000")));
        assert_eq!(
            LocalityPlan {
                slack: 1e300,
                ..plan.clone()
            }
            .deadline_us(),
            u64::MAX
        );
        // The same plan for claims it is never made for.
        let unknown = claim("cuda", vec![gpu(0, "NVIDIA L20", 48, 92)]);
        assert!(refused(&|_| {}, &unknown).contains("not in the shipped table"));
        assert!(refused(&|_| {}, &claim("rocm", vec![])).contains("rocm"));
        assert!(refused(&|_| {}, &claim("cuda", vec![])).contains("claims no device"));
        // A plan recorded before the bound had a hop says 0, and is still accepted.
        let mut old = plan.clone();
        old.hop_ns = 0;
        assert_eq!(old.problem_for(&h100), None);
        // The CPU's walkers are the settings', which the audit cannot see: any in range.
        let cpu = claim("cpu", vec![gpu(0, "cpu: AMD EPYC", 1, 2)]);
        let mut cpu_plan = asked(locality_ask(&on(&[]), &cpu));
        cpu_plan.walkers = 7;
        assert_eq!(cpu_plan.problem_for(&cpu), None);
    }
}
