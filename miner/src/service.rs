//! The `Miner` gRPC service: a thin async shell around [`MinerCore`].

use crate::answers::Kind;
use crate::core::{AcceptedChallenge, MinerCore, Signed, now_ms};
use crate::error::MinerError;
use crate::metrics::ChallengeOutcome;
use crate::openings::{RoundLimits, Sample, run_lines_round, run_round};
use gpu_attest_daemon::connections::{holds_connection, trust_connection};
use gpu_attest_proto::convert::{
    challenge_from_wire, inventory_to_wire, open_request_from_wire, walk_request_from_wire,
};
use gpu_attest_proto::v1::{self, challenge_event::Event, miner_server::Miner};
use gpu_attest_shared::engine::{EngineError, Execution};
use gpu_attest_shared::evidence::DeviceEvidence;

use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::statement::memory_v4::WalkRoot;
use gpu_attest_shared::{BackendError, CancelToken};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Progress events buffered per stream; when the validator reads slower, extra ones are dropped
/// (progress is informational) rather than slowing the devices.
const EVENT_BUFFER: usize = 256;

#[derive(Clone)]
pub struct MinerService {
    core: Arc<MinerCore>,
}

impl MinerService {
    pub fn new(core: Arc<MinerCore>) -> Self {
        MinerService { core }
    }
}

/// Whether the allow-list holds the validator key a GetInventory request `asked` about, so that
/// an operator registering this miner learns at once that its challenges would be refused:
/// unstated when `asked` is not 32 bytes (a validator that asks nothing).
fn standing_of(core: &MinerCore, asked: &[u8]) -> v1::ValidatorStanding {
    match <[u8; 32]>::try_from(asked) {
        Ok(key) if core.is_allowed(&PublicKey(key)) => v1::ValidatorStanding::Allowed,
        Ok(_) => v1::ValidatorStanding::NotAllowed,
        Err(_) => v1::ValidatorStanding::Unstated,
    }
}

fn peer(request: &Request<impl Sized>) -> String {
    request
        .remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "unknown peer".into())
}

#[tonic::async_trait]
impl Miner for MinerService {
    type RunChallengeStream = EventStream<v1::ChallengeEvent>;
    type OpenChainsStream = EventStream<v1::ChainOpening>;
    type WalkStatesStream = EventStream<v1::DeviceWalkRoot>;
    type WalkLinesStream = EventStream<v1::DeviceWalkRoot>;
    type OpenLinesStream = EventStream<v1::LocalityOpening>;

    async fn get_inventory(
        &self,
        request: Request<v1::GetInventoryRequest>,
    ) -> Result<Response<v1::Inventory>, Status> {
        let mut inventory = inventory_to_wire(&self.core.inventory());
        inventory.self_checks = crate::selftest::to_wire(&self.core.backend().self_checks);
        let standing = standing_of(&self.core, &request.get_ref().validator_key);
        if standing == v1::ValidatorStanding::NotAllowed {
            // What a refused challenge would have said, without the warning one logs.
            debug!(peer = %peer(&request), validator = %hex::encode(&request.get_ref().validator_key), "inventory asked for by a validator that is not allowed");
        }
        inventory.validator_standing = standing as i32;
        Ok(Response::new(inventory))
    }

    async fn run_challenge(
        &self,
        request: Request<v1::Challenge>,
    ) -> Result<Response<Self::RunChallengeStream>, Status> {
        // Counted from before the devices are taken, so that a stopping miner never sees a
        // moment with the challenge neither running nor committed.
        let running = self.core.running().started();
        let peer = peer(&request);
        let accepted = challenge_from_wire(request.get_ref())
            .map_err(MinerError::from)
            .and_then(|(challenge, signature)| self.core.accept(challenge, &signature, now_ms()))
            .inspect_err(|e| {
                warn!(%peer, error = %e, "challenge refused");
                self.core.metrics().challenge(ChallengeOutcome::Refused, Some(e.code()));
            })?;
        // An allowed validator signed it: its open request, on this connection, must not be
        // refused because a stranger at its address spent the address's request rate.
        trust_connection(request.extensions());
        self.core
            .record_answer(&accepted.challenge.params.nonce, Kind::Challenge, request.get_ref());
        info!(
            %peer,
            nonce = %hex::encode(accepted.challenge.params.nonce),
            n = accepted.work.n(),
            chains = accepted.work.num_chains(),
            iterations = accepted.work.iterations(),
            "challenge accepted"
        );
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        let core = self.core.clone();
        tokio::spawn(async move {
            run_accepted(core.clone(), accepted, tx).await;
            core.running().ended(running);
        });
        // An allowed validator's challenge keeps its connection until the commitment is out.
        Ok(holds_connection(Response::new(Box::pin(ReceiverStream::new(rx)))))
    }

    async fn open_chains(
        &self,
        request: Request<v1::OpenChainsRequest>,
    ) -> Result<Response<Self::OpenChainsStream>, Status> {
        // Counted before the request marks the commitment opened (see `run_challenge`).
        let running = self.core.running().started();
        let peer = peer(&request);
        let round = open_request_from_wire(request.get_ref())
            .map_err(MinerError::from)
            .and_then(|decoded| self.core.check_open_request(decoded))
            .inspect_err(|e| {
                warn!(%peer, error = %e, "open request refused");
                self.core.metrics().opening(false);
            })?;
        trust_connection(request.extensions());
        self.core
            .record_answer(&round.recent.nonce, Kind::OpenRequest, request.get_ref());
        let (tx, rx) = mpsc::channel(2);
        let limits = RoundLimits::for_commitment(&self.core, &round.recent);
        let core = self.core.clone();
        tokio::spawn(async move {
            let samples = round
                .chains
                .into_iter()
                .map(Sample::Chain)
                .chain(round.walks.into_iter().map(Sample::Walk))
                .chain(round.steps.into_iter().map(Sample::Step))
                .collect();
            run_round(core.clone(), round.recent, samples, tx, limits).await;
            core.running().ended(running);
        });
        // So does its opening round, which ends on its own (`RoundLimits`).
        Ok(holds_connection(Response::new(Box::pin(ReceiverStream::new(rx)))))
    }

    async fn walk_pool(&self, request: Request<v1::WalkRequest>) -> Result<Response<v1::WalkStatement>, Status> {
        let running = self.core.running().started();
        let peer = peer(&request);
        let (recent, walk) = walk_request_from_wire(request.get_ref())
            .map_err(MinerError::from)
            .and_then(|decoded| self.core.check_walk_request(decoded))
            .inspect_err(|e| {
                warn!(%peer, error = %e, "walk request refused");
            })?;
        trust_connection(request.extensions());
        self.core
            .record_answer(&walk.nonce, Kind::WalkRequest, request.get_ref());
        let nonce_bytes = walk.nonce;
        let nonce = hex::encode(walk.nonce);
        // The walk reads the pools where the devices hold them: it waits for the devices (a
        // challenge cannot have started since the commitment, under the hold).
        let devices = self.core.running().lock_devices().await;
        // A validator that hangs up, or a walk past the validator's deadline by much, stops it.
        let cancel = CancelToken::new();
        let _stop_on_drop = CancelOnDrop(cancel.clone());
        let deadline_watch = cancel_long_past(walk.deadline_ms, &cancel);
        let core = self.core.clone();
        let worker_cancel = cancel.clone();
        let started = Instant::now();
        let walked = tokio::task::spawn_blocking(move || core.walk(&recent, &walk, &worker_cancel)).await;
        deadline_watch.abort();
        drop(devices);
        self.core.running().ended(running);
        let statement = match walked {
            Ok(result) => result
                .map(|signed| crate::wire::walk_statement(&signed))
                .map_err(Status::from),
            Err(join) => Err(Status::internal(format!("walk worker failed: {join}"))),
        }
        .inspect_err(|e| warn!(%nonce, error = %e.message(), "walk failed"))?;
        self.core.record_answer(&nonce_bytes, Kind::WalkStatement, &statement);
        info!(%nonce, walk_ms = started.elapsed().as_millis() as u64, "walk statement sent");
        Ok(Response::new(statement))
    }

    async fn walk_states(&self, request: Request<v1::WalkRequest>) -> Result<Response<Self::WalkStatesStream>, Status> {
        let running = self.core.running().started();
        let peer = peer(&request);
        let (recent, walk) = walk_request_from_wire(request.get_ref())
            .map_err(MinerError::from)
            .and_then(|decoded| self.core.check_states_walk_request(decoded))
            .inspect_err(|e| warn!(%peer, error = %e, "walk request refused"))?;
        trust_connection(request.extensions());
        self.core
            .record_answer(&walk.nonce, Kind::WalkRequest, request.get_ref());
        let (nonce, deadline_ms) = (walk.nonce, walk.deadline_ms);
        let rx = stream_roots(
            self.core.clone(),
            running,
            nonce,
            deadline_ms,
            Kind::WalkRoot,
            "walk",
            move |core, cancel, send| core.walk_states(&recent, &walk, cancel, send),
        );
        Ok(holds_connection(Response::new(Box::pin(ReceiverStream::new(rx)))))
    }

    async fn walk_lines(
        &self,
        request: Request<v1::LocalityRequest>,
    ) -> Result<Response<Self::WalkLinesStream>, Status> {
        let running = self.core.running().started();
        let peer = peer(&request);
        let (recent, walk) = self
            .core
            .check_locality_request(request.get_ref())
            .inspect_err(|e| warn!(%peer, error = %e, "locality request refused"))?;
        trust_connection(request.extensions());
        self.core
            .record_answer(&recent.nonce, Kind::LocalityRequest, request.get_ref());
        let (nonce, deadline_ms) = (recent.nonce, walk.deadline_ms);
        let rx = stream_roots(
            self.core.clone(),
            running,
            nonce,
            deadline_ms,
            Kind::LocalityRoot,
            "locality walk",
            move |core, cancel, send| core.walk_lines(&recent, &walk, cancel, send),
        );
        Ok(holds_connection(Response::new(Box::pin(ReceiverStream::new(rx)))))
    }

    async fn open_lines(
        &self,
        request: Request<v1::OpenLinesRequest>,
    ) -> Result<Response<Self::OpenLinesStream>, Status> {
        let running = self.core.running().started();
        let peer = peer(&request);
        let round = gpu_attest_proto::locality::open_request_from_wire(request.get_ref())
            .map_err(MinerError::from)
            .and_then(|decoded| self.core.check_lines_open_request(decoded))
            .inspect_err(|e| warn!(%peer, error = %e, "locality open request refused"))?;
        trust_connection(request.extensions());
        self.core
            .record_answer(&round.recent.nonce, Kind::LocalityOpenRequest, request.get_ref());
        let (tx, rx) = mpsc::channel(2);
        let limits = RoundLimits::for_commitment(&self.core, &round.recent);
        let core = self.core.clone();
        tokio::spawn(async move {
            run_lines_round(core.clone(), round.recent, round.samples, tx, limits).await;
            core.running().ended(running);
        });
        Ok(holds_connection(Response::new(Box::pin(ReceiverStream::new(rx)))))
    }
}

/// Runs a walk whose signed roots go out one per device as each device's walk ends (version 4's
/// walk and the locality walk), on the devices, stopped when the validator hangs up or the walk
/// runs long past its deadline; the stream ends after the last root, or with the status the walk
/// failed with. `what` names the walk in the log.
#[allow(clippy::too_many_arguments)]
fn stream_roots(
    core: Arc<MinerCore>,
    running: crate::core::WorkRunning,
    nonce: [u8; 32],
    deadline_ms: u64,
    kind: Kind,
    what: &'static str,
    walk: impl FnOnce(&MinerCore, &CancelToken, &(dyn Fn(Signed<WalkRoot>) + Sync)) -> Result<(), MinerError>
    + Send
    + 'static,
) -> mpsc::Receiver<Result<v1::DeviceWalkRoot, Status>> {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    tokio::spawn(async move {
        let shown = hex::encode(nonce);
        // The walk reads the states where the devices hold them (see `walk_pool`).
        let devices = core.running().lock_devices().await;
        let cancel = CancelToken::new();
        let hung_up = {
            let (tx, cancel) = (tx.clone(), cancel.clone());
            tokio::spawn(async move {
                tx.closed().await;
                cancel.cancel();
            })
        };
        let deadline_watch = cancel_long_past(deadline_ms, &cancel);
        let (worker, worker_tx, started) = (core.clone(), tx.clone(), Instant::now());
        let walked = tokio::task::spawn_blocking(move || {
            // Each root goes out as its device's walk ends: the validator clocks each device
            // from the request to its own root.
            let send = |root: Signed<WalkRoot>| {
                let wire = crate::wire::walk_root(&root);
                worker.record_answer(&nonce, kind, &wire);
                let _ = worker_tx.blocking_send(Ok(wire));
            };
            walk(&worker, &cancel, &send)
        })
        .await;
        deadline_watch.abort();
        hung_up.abort();
        drop(devices);
        core.running().ended(running);
        let failed = match walked {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(Status::from(e)),
            Err(join) => Some(Status::internal(format!("{what} worker failed: {join}"))),
        };
        match failed {
            None => info!(nonce = %shown, walk_ms = started.elapsed().as_millis() as u64, "{what}: roots sent"),
            Some(status) => {
                warn!(nonce = %shown, error = %status.message(), "{what} failed");
                let _ = tx.send(Err(status)).await;
            }
        }
    });
    rx
}

/// Cancels `cancel` once a walk runs well past its validator's deadline (twice the time the
/// deadline gave, plus 2 s): the validator has failed it by then, and the devices are wanted.
fn cancel_long_past(deadline_ms: u64, cancel: &CancelToken) -> tokio::task::JoinHandle<()> {
    let limit =
        std::time::Duration::from_millis(deadline_ms.saturating_sub(now_ms())) * 2 + std::time::Duration::from_secs(2);
    let cancel = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(limit).await;
        cancel.cancel();
    })
}

/// Cancels its token when dropped: tonic drops a unary handler's future when the client goes
/// away, and the blocking work it started must stop with it.
struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The events of one challenge's stream, as the miner sends them.
type ChallengeEvents = mpsc::Sender<Result<v1::ChallengeEvent, Status>>;

/// What the work of one challenge produced: its execution and the devices' evidence, or why not.
type Worked = Result<(Execution, Signed<Vec<DeviceEvidence>>), MinerError>;

fn event(e: Event) -> Result<v1::ChallengeEvent, Status> {
    Ok(v1::ChallengeEvent { event: Some(e) })
}

/// Runs an accepted challenge to its commitment, cancelling on disconnect or once the time to
/// work has run out (the finish-by time, else the deadline).
async fn run_accepted(core: Arc<MinerCore>, accepted: AcceptedChallenge, tx: ChallengeEvents) {
    let devices = core.backend().backend.device_count();
    let _ = tx
        .send(event(Event::Accepted(v1::Accepted {
            devices,
            backend: core.backend().name.clone(),
        })))
        .await;
    let cancel = CancelToken::new();
    let watcher = cancel_when_gone_or_late(&tx, &cancel, accepted.time_left());
    let started = Instant::now();
    let joined = tokio::task::spawn_blocking({
        let (core, tx, cancel) = (core.clone(), tx.clone(), cancel.clone());
        move || work(&core, accepted, &tx, &cancel)
    })
    .await;
    watcher.abort();
    match joined {
        Ok((accepted, worked)) => answer(&core, &tx, accepted, worked, started).await,
        Err(join) => {
            core.metrics().challenge(ChallengeOutcome::Failed, None);
            let _ = tx
                .send(Err(Status::internal(format!("challenge worker failed: {join}"))))
                .await;
        }
    }
}

/// Cancels the work when the validator hangs up or `time_left` runs out, whichever comes first.
fn cancel_when_gone_or_late(
    tx: &ChallengeEvents,
    cancel: &CancelToken,
    time_left: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    let (tx, cancel) = (tx.clone(), cancel.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = tx.closed() => {}
            _ = tokio::time::sleep(time_left) => {}
        }
        cancel.cancel();
    })
}

/// The challenge's work (blocking): its chains with progress sent as they go, its pools, then
/// the devices' evidence.
fn work(
    core: &MinerCore,
    mut accepted: AcceptedChallenge,
    tx: &ChallengeEvents,
    cancel: &CancelToken,
) -> (AcceptedChallenge, Worked) {
    let progress = |p: gpu_attest_shared::engine::DeviceProgress| {
        let _ = tx.try_send(event(Event::Progress(v1::Progress {
            device: p.device,
            done: p.done,
            total: p.total,
        })));
    };
    let result = core.execute(&mut accepted, &progress, cancel).and_then(|execution| {
        core.fill(&mut accepted, &|_, _| {}, cancel)?;
        // Asked after the work, so that the GPUs answer while nothing else runs on them.
        let evidence = core.gather_evidence(&accepted);
        Ok((execution, evidence))
    });
    (accepted, result)
}

/// Sends the commitment for work that was done, or the error that ended it, and counts it.
async fn answer(core: &MinerCore, tx: &ChallengeEvents, accepted: AcceptedChallenge, worked: Worked, started: Instant) {
    let nonce_bytes = accepted.challenge.params.nonce;
    let nonce = hex::encode(nonce_bytes);
    let chains = accepted.challenge.params.num_chains;
    let stop_named = accepted.stop_named();
    let compute_ms = started.elapsed().as_millis() as u64;
    match worked {
        Ok((execution, evidence)) => {
            let commitment = core.commit(accepted, execution, compute_ms);
            core.metrics().computed(chains, started.elapsed());
            core.metrics().challenge(ChallengeOutcome::Committed, None);
            info!(%nonce, compute_ms, "commitment sent");
            let wire = crate::wire::commitment(&commitment, Some(&evidence));
            core.record_answer(&nonce_bytes, Kind::Commitment, &wire);
            let _ = tx.send(event(Event::Commitment(wire))).await;
        }
        Err(MinerError::Engine(EngineError::Backend(BackendError::Cancelled))) => {
            drop(accepted); // frees the devices now
            if tx.is_closed() {
                info!(%nonce, "validator disconnected; challenge cancelled");
                core.metrics().challenge(ChallengeOutcome::Cancelled, None);
            } else {
                warn!(%nonce, compute_ms, "{stop_named} passed; challenge cancelled");
                core.metrics().challenge(ChallengeOutcome::DeadlineReached, None);
                let _ = tx.send(Err(MinerError::DeadlineReached(stop_named).into())).await;
            }
        }
        Err(e) => {
            drop(accepted);
            warn!(%nonce, error = %e, "challenge failed");
            core.metrics().challenge(ChallengeOutcome::Failed, Some(e.code()));
            let _ = tx.send(Err(e.into())).await;
        }
    }
}
