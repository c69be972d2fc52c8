//! Dishonest miners: the real `MinerCore` with one step of the honest flow changed. The tests
//! serve them on loopback and the `cheating-miner` binary serves one as a daemon (for the soak,
//! `scripts/soak.sh`). They exist only here, never in the miner itself.

use gpu_attest_miner::MinerCore;
use gpu_attest_miner::core::WorkRunning;
use gpu_attest_miner::error::MinerError;
use gpu_attest_proto::convert;
use gpu_attest_proto::v1::{self, challenge_event::Event, miner_server::Miner, miner_server::MinerServer};
use gpu_attest_shared::CancelToken;
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::commitment::{WorkCommitment, device_trees};
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::engine::{self, Execution};
use gpu_attest_shared::partition::DeviceSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cheat {
    /// Commits a global checksum that is not the one its device roots give.
    WrongGlobalChecksum,
    /// Computes only the first half of the chains and commits garbage checkpoints for the rest,
    /// consistently (leaves, roots and G all cover the garbage).
    SkipChains,
    /// Commits honestly, then opens chains with checkpoint hashes other than the committed ones.
    LeafChangedAfterCommit,
    /// Splits the chains over its devices in a non-canonical way.
    WrongPartition,
    /// Answers every challenge after the first with the first one's (validly signed) commitment.
    ReplayFirstCommitment,
    /// Computes honestly but sends the commitment after the deadline (and before the
    /// challenge's finish-by time, when it has one).
    Slow,
    /// Computes honestly but sends the commitment after the challenge's finish-by time.
    PastFinishBy,
    /// As `Slow` on its first challenge, then on time: an honest host that stalled once.
    SlowOnce,
    /// `SkipChains`, committed as late as `Slow`: late work that does not verify.
    LateSkipChains,
    /// As `Slow`, and once it has committed its inventory names another device: a retest would
    /// be of other hardware.
    SlowThenOtherHardware,
    /// Has another miner's key sign the commitment and claims to be that miner.
    ForeignKey,
    /// Answers openings with signatures that do not verify.
    BadOpeningSignatures,
    /// Accepts the open request and then never sends an opening.
    StallOpenings,
    /// Pads every opening's matrix to far more than the challenge's n*n bytes, to make the
    /// validator decode and hold messages sized for a larger n.
    OversizedOpenings,
    /// Shows one CPU in its inventory (and so gets a small challenge), then commits naming eight
    /// H100s on the cuda backend, with the work split eight ways to match.
    CommitsOtherHardware,
    /// Reports progress for a device the challenge does not have, beyond any chain count.
    ImpossibleProgress,
    /// Shows 65 devices, one more than the protocol allows.
    TooManyDevices,
    /// Speaks protocol version 1, whose work function differs (PROTOCOL.md section 4).
    ProtocolVersion1,
    /// Lists one GPU twice, under two indexes.
    SameDeviceTwice,
    /// Names its device with a line break and a second, made-up device after it, so that a
    /// stored verdict would print as if it had an H100.
    NameWithALineBreak,
    /// Claims a backend this protocol version does not define.
    UnknownBackend,
    /// Computes the challenge before answering, then refuses it as busy: what a miner that
    /// refuses only the runs it would fail does with a run it would fail.
    RefusesAfterComputing,
    /// Sends only empty events, never `Accepted`, never a refusal.
    NeverAccepts,
    /// Computes honestly and sends its commitment without `Accepted` before it.
    CommitsBeforeAccepting,
}

impl Cheat {
    /// Every cheat with its name on the command line.
    pub const NAMED: &'static [(Cheat, &'static str)] = &[
        (Cheat::WrongGlobalChecksum, "wrong-global-checksum"),
        (Cheat::SkipChains, "skip-chains"),
        (Cheat::LeafChangedAfterCommit, "leaf-changed-after-commit"),
        (Cheat::WrongPartition, "wrong-partition"),
        (Cheat::ReplayFirstCommitment, "replay-first-commitment"),
        (Cheat::Slow, "slow"),
        (Cheat::PastFinishBy, "past-finish-by"),
        (Cheat::SlowOnce, "slow-once"),
        (Cheat::LateSkipChains, "late-skip-chains"),
        (Cheat::SlowThenOtherHardware, "slow-then-other-hardware"),
        (Cheat::ForeignKey, "foreign-key"),
        (Cheat::BadOpeningSignatures, "bad-opening-signatures"),
        (Cheat::StallOpenings, "stall-openings"),
        (Cheat::OversizedOpenings, "oversized-openings"),
        (Cheat::CommitsOtherHardware, "commits-other-hardware"),
        (Cheat::ImpossibleProgress, "impossible-progress"),
        (Cheat::TooManyDevices, "too-many-devices"),
        (Cheat::ProtocolVersion1, "protocol-version-1"),
        (Cheat::SameDeviceTwice, "same-device-twice"),
        (Cheat::NameWithALineBreak, "name-with-a-line-break"),
        (Cheat::UnknownBackend, "unknown-backend"),
        (Cheat::RefusesAfterComputing, "refuses-after-computing"),
        (Cheat::NeverAccepts, "never-accepts"),
        (Cheat::CommitsBeforeAccepting, "commits-before-accepting"),
    ];

    pub fn name(self) -> &'static str {
        Cheat::NAMED
            .iter()
            .find(|(cheat, _)| *cheat == self)
            .map(|(_, name)| *name)
            .expect("every cheat is named")
    }

    pub fn from_name(name: &str) -> Option<Cheat> {
        Cheat::NAMED.iter().find(|(_, n)| *n == name).map(|(cheat, _)| *cheat)
    }
}

/// How long [`Cheat::RefusesAfterComputing`] waits after computing: past the accept window the
/// tests give the validator.
pub const PAST_THE_ACCEPT_WINDOW: Duration = Duration::from_millis(600);

/// Eight H100s, as a miner that has none would describe them.
pub fn claimed_h100s() -> Vec<gpu_attest_shared::statement::DeviceInfo> {
    (0..8)
        .map(|i| gpu_attest_shared::statement::DeviceInfo {
            index: i,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: format!("GPU-{i:08}"),
            memory_bytes: 80 << 30,
            sm_count: 132,
            compute_capability: (9, 0),
            pci_bus_id: format!("00000000:{:02X}:00.0", i + 0x18),
            driver_version: "570.86.15".into(),
        })
        .collect()
}

pub struct CheatingMiner {
    core: Arc<MinerCore>,
    cheat: Cheat,
    first: Arc<Mutex<Option<v1::Commitment>>>,
}

type Events<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl CheatingMiner {
    pub fn new(core: Arc<MinerCore>, cheat: Cheat) -> Self {
        CheatingMiner {
            core,
            cheat,
            first: Arc::default(),
        }
    }

    /// The Miner service, sending messages as large as the real miner's.
    pub fn into_service(self) -> MinerServer<CheatingMiner> {
        MinerServer::new(self).max_encoding_message_size(gpu_attest_miner::server::MAX_RESPONSE_BYTES)
    }
}

fn garbage(chains: &mut [ChainResult]) {
    for chain in chains {
        for h in chain.checkpoints.iter_mut().skip(1) {
            *h = Digest::hash(&h.0);
        }
    }
}

#[tonic::async_trait]
impl Miner for CheatingMiner {
    type RunChallengeStream = Events<v1::ChallengeEvent>;
    type OpenChainsStream = Events<v1::ChainOpening>;
    type WalkStatesStream = Events<v1::DeviceWalkRoot>;
    type WalkLinesStream = Events<v1::DeviceWalkRoot>;
    type OpenLinesStream = Events<v1::LocalityOpening>;

    async fn get_inventory(&self, _: Request<v1::GetInventoryRequest>) -> Result<Response<v1::Inventory>, Status> {
        let mut inventory = gpu_attest_proto::convert::inventory_to_wire(&self.core.inventory());
        match self.cheat {
            Cheat::TooManyDevices => {
                let device = inventory.devices[0].clone();
                inventory.devices = vec![device; 65];
            }
            Cheat::ProtocolVersion1 => inventory.protocol_version = 1,
            Cheat::SameDeviceTwice => {
                let mut first = inventory.devices[0].clone();
                first.uuid = "GPU-11111111".into();
                let second = v1::DeviceInfo {
                    index: 1,
                    ..first.clone()
                };
                inventory.devices = vec![first, second];
            }
            Cheat::NameWithALineBreak => inventory.devices[0]
                .name
                .push_str("\n  device 1: NVIDIA H100 80GB HBM3"),
            Cheat::UnknownBackend => inventory.backend = "rocm".into(),
            Cheat::SlowThenOtherHardware if self.first.lock().unwrap().is_some() => {
                inventory.devices[0].name = "cpu: a bigger one".into();
            }
            _ => {}
        }
        Ok(Response::new(inventory))
    }

    async fn run_challenge(
        &self,
        request: Request<v1::Challenge>,
    ) -> Result<Response<Self::RunChallengeStream>, Status> {
        let running = self.core.running().started();
        let (challenge, signature) = convert::challenge_from_wire(request.get_ref()).map_err(MinerError::from)?;
        let accepted = self
            .core
            .accept(challenge, &signature, gpu_attest_miner::core::now_ms())?;
        match self.cheat {
            Cheat::RefusesAfterComputing => {
                let core = self.core.clone();
                tokio::task::spawn_blocking(move || {
                    let mut accepted = accepted;
                    core.execute(&mut accepted, &|_| {}, &CancelToken::new())
                })
                .await
                .unwrap()?;
                tokio::time::sleep(PAST_THE_ACCEPT_WINDOW).await;
                return Err(Status::resource_exhausted("busy with another challenge"));
            }
            Cheat::NeverAccepts => {
                let nothing = tokio_stream::StreamExt::then(tokio_stream::iter(std::iter::repeat(())), |_| async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(v1::ChallengeEvent { event: None })
                });
                return Ok(Response::new(Box::pin(nothing)));
            }
            _ => {}
        }
        // Accepted at once, as an honest miner does; the cheat happens in what follows.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        if self.cheat != Cheat::CommitsBeforeAccepting {
            let _ = tx
                .send(Ok(v1::ChallengeEvent {
                    event: Some(Event::Accepted(v1::Accepted {
                        devices: self.core.backend().backend.device_count(),
                        backend: "cpu".into(),
                    })),
                }))
                .await;
        }
        let (core, cheat, first) = (self.core.clone(), self.cheat, self.first.clone());
        tokio::spawn(async move {
            let events = match after_accepting(core.clone(), cheat, &first, accepted).await {
                Ok(events) => events,
                Err(status) => vec![Err(status)],
            };
            for event in events {
                if tx.send(event).await.is_err() {
                    break;
                }
            }
            core.running().ended(running);
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn open_chains(
        &self,
        request: Request<v1::OpenChainsRequest>,
    ) -> Result<Response<Self::OpenChainsStream>, Status> {
        // Walk samples (a version 3 commitment) and walk steps (version 4) are opened honestly,
        // after the chains: these cheats are at the chains.
        let running = self.core.running().started();
        let request = convert::open_request_from_wire(request.get_ref()).map_err(MinerError::from)?;
        let round = self.core.check_open_request(request)?;
        let (recent, samples, walks, steps) = (round.recent, round.chains, round.walks, round.steps);
        if self.cheat == Cheat::StallOpenings {
            return Ok(Response::new(Box::pin(tokio_stream::pending())));
        }
        let core = self.core.clone();
        let openings = tokio::task::spawn_blocking(move || {
            let chains = samples.into_iter().map(|s| core.open(&recent, s, &CancelToken::new()));
            let walks = walks.into_iter().map(|w| core.open_walk(&recent, w));
            let steps = steps.into_iter().map(|step| core.open_step(&recent, step));
            let openings = chains
                .chain(walks)
                .chain(steps)
                .map(|o| o.map(|o| gpu_attest_miner::wire::opening(&o)).map_err(Status::from))
                .collect::<Vec<_>>();
            // The round is over, as the real miner's ends: its pools go now, and the memory it
            // freed once its openings are dropped (`EndsWorkOnDrop`), so that the soak measures
            // the cheats and not a leakier copy of the miner.
            recent.finish_round();
            openings
        })
        .await
        .unwrap();
        let ends = EndsWorkOnDrop {
            core: self.core.clone(),
            running: Some(running),
        };
        let cheat = self.cheat;
        let openings = openings.into_iter().map(move |o| {
            o.map(|mut o| {
                match cheat {
                    Cheat::BadOpeningSignatures => o.signature[0] ^= 1,
                    Cheat::OversizedOpenings => o.start_matrix.resize(o.start_matrix.len() + (2 << 20), 0),
                    _ => {}
                }
                o
            })
        });
        let openings = tokio_stream::StreamExt::map(tokio_stream::iter(openings.collect::<Vec<_>>()), move |o| {
            let _ends_with_the_stream = &ends;
            o
        });
        Ok(Response::new(Box::pin(openings)))
    }

    /// Walks honestly: these cheats are at the chains.
    async fn walk_pool(&self, request: Request<v1::WalkRequest>) -> Result<Response<v1::WalkStatement>, Status> {
        let running = self.core.running().started();
        let request = convert::walk_request_from_wire(request.get_ref()).map_err(MinerError::from)?;
        let (recent, walk) = self.core.check_walk_request(request)?;
        let core = self.core.clone();
        let statement = tokio::task::spawn_blocking(move || core.walk(&recent, &walk, &CancelToken::new()))
            .await
            .unwrap();
        self.core.running().ended(running);
        let statement = statement?;
        Ok(Response::new(gpu_attest_miner::wire::walk_statement(&statement)))
    }

    /// Walks honestly, as the real miner does (version 4, which these cheaters' inventories say
    /// by default): these cheats are at the chains.
    async fn walk_states(&self, request: Request<v1::WalkRequest>) -> Result<Response<Self::WalkStatesStream>, Status> {
        let honest = gpu_attest_miner::service::MinerService::new(self.core.clone());
        let roots = Miner::walk_states(&honest, request).await?.into_inner();
        Ok(Response::new(Box::pin(roots)))
    }

    // The locality walk as the honest miner answers it: these cheats are of the chain phase.
    async fn walk_lines(
        &self,
        request: Request<v1::LocalityRequest>,
    ) -> Result<Response<Self::WalkLinesStream>, Status> {
        let honest = gpu_attest_miner::service::MinerService::new(self.core.clone());
        Ok(Response::new(Box::pin(
            Miner::walk_lines(&honest, request).await?.into_inner(),
        )))
    }

    async fn open_lines(
        &self,
        request: Request<v1::OpenLinesRequest>,
    ) -> Result<Response<Self::OpenLinesStream>, Status> {
        let honest = gpu_attest_miner::service::MinerService::new(self.core.clone());
        Ok(Response::new(Box::pin(
            Miner::open_lines(&honest, request).await?.into_inner(),
        )))
    }
}

/// Ends an opening round's work when the stream of its openings is dropped (the stream is
/// dropped before the closure that holds this): the openings, all computed before the first is
/// sent, are freed only then, and the real miner too releases free memory once its round's
/// last opening is gone. Ended earlier, the freed openings stayed resident until the next
/// release, and the soak saw these cheaters swing by their size.
struct EndsWorkOnDrop {
    core: Arc<MinerCore>,
    running: Option<WorkRunning>,
}

impl Drop for EndsWorkOnDrop {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            self.core.running().ended(running);
        }
    }
}

/// The events a cheating miner sends after `Accepted`: it computes, then cheats at its step.
async fn after_accepting(
    core: Arc<MinerCore>,
    cheat: Cheat,
    first: &Mutex<Option<v1::Commitment>>,
    accepted: gpu_attest_miner::core::AcceptedChallenge,
) -> Result<Vec<Result<v1::ChallengeEvent, Status>>, Status> {
    let deadline_ms = accepted.challenge.deadline_ms;
    let finish_by_ms = accepted.challenge.finish_by_ms;
    let (worker, work) = (core.clone(), accepted.work.clone());
    let (accepted, honest) = tokio::task::spawn_blocking(move || {
        // The pools of a version 3 challenge are filled honestly: these cheats are at the chains.
        let mut accepted = accepted;
        let result = worker
            .execute(&mut accepted, &|_| {}, &CancelToken::new())
            .and_then(|execution| {
                worker.fill(&mut accepted, &|_, _| {}, &CancelToken::new())?;
                Ok(execution)
            });
        (accepted, result)
    })
    .await
    .unwrap();
    let honest = honest?;
    let devices = core.backend().backend.device_count();
    let (committed, kept): (Execution, Execution) = match cheat {
        Cheat::SkipChains | Cheat::LateSkipChains => {
            let mut chains = honest.chains.clone();
            let half = chains.len() / 2;
            garbage(&mut chains[half..]);
            let forged = engine::commit(&work, devices, chains).unwrap();
            (forged.clone(), forged)
        }
        Cheat::LeafChangedAfterCommit => {
            let mut changed = honest.clone();
            garbage(&mut changed.chains);
            (honest, changed)
        }
        Cheat::WrongPartition => {
            let m = work.num_chains();
            let partition = [
                DeviceSlice {
                    index: 0,
                    offset: 0,
                    count: m - 1,
                },
                DeviceSlice {
                    index: 1,
                    offset: m - 1,
                    count: 1,
                },
            ];
            let trees = device_trees(&partition, &honest.chains).unwrap();
            let commitment = WorkCommitment::from_trees(work.params().nonce, &trees);
            let forged = Execution {
                commitment,
                trees,
                chains: honest.chains,
            };
            (forged.clone(), forged)
        }
        Cheat::CommitsOtherHardware => {
            let eight_ways = engine::commit(&work, 8, honest.chains).unwrap();
            (eight_ways.clone(), eight_ways)
        }
        _ => (honest.clone(), honest),
    };
    let mut statement = core.statement(&accepted, &committed, 1);
    if cheat == Cheat::CommitsOtherHardware {
        statement.inventory = claimed_h100s();
        statement.backend = "cuda".into();
        statement.kernel = "tensor".into();
    }
    if cheat == Cheat::WrongGlobalChecksum {
        statement.work.global.0[0] ^= 1;
    }
    let mut commitment = gpu_attest_miner::wire::commitment(&core.sign_commitment(&statement), None);
    if cheat == Cheat::ForeignKey {
        let other = gpu_attest_shared::keys::KeyPair::from_seed([0xf0; 32]);
        statement.miner_key = other.public_key();
        commitment = gpu_attest_proto::convert::commitment_to_wire(&statement, &statement.sign(&other));
    }
    if cheat == Cheat::ReplayFirstCommitment {
        let mut first = first.lock().unwrap();
        match &*first {
            Some(earlier) => commitment = earlier.clone(),
            None => *first = Some(commitment.clone()),
        }
    }
    core.remember(accepted, kept);
    let send_at = match cheat {
        Cheat::Slow | Cheat::LateSkipChains => Some(deadline_ms + 300),
        Cheat::PastFinishBy => Some(finish_by_ms.expect("a challenge with a finish-by time") + 300),
        Cheat::SlowOnce => {
            let earlier = first.lock().unwrap().replace(commitment.clone());
            earlier.is_none().then_some(deadline_ms + 300)
        }
        Cheat::SlowThenOtherHardware => {
            *first.lock().unwrap() = Some(commitment.clone());
            Some(deadline_ms + 300)
        }
        _ => None,
    };
    if let Some(send_at) = send_at {
        let wait = send_at.saturating_sub(gpu_attest_miner::core::now_ms());
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    let mut events = Vec::new();
    if cheat == Cheat::ImpossibleProgress {
        events.push(Ok(v1::ChallengeEvent {
            event: Some(Event::Progress(v1::Progress {
                device: devices + 4,
                done: work.num_chains() + 10,
                total: 0,
            })),
        }));
    }
    events.push(Ok(v1::ChallengeEvent {
        event: Some(Event::Commitment(commitment)),
    }));
    Ok(events)
}
