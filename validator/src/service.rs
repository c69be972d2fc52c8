//! The `Validator` gRPC API. Errors become statuses here and only here.

use crate::attest::{AttestError, AttestEvent, Attestor, normalise_url, now_ms};
use crate::backoffs::Backoff;
use crate::in_flight::{InFlight, Joined};
use crate::store::{MinerRecord, MinerStanding, StoreError, VerdictFilter};
use crate::untrusted::caller_text_problem;
use crate::verdict_wire::verdict_to_wire;
use crate::watch::{self, Follower};
use gpu_attest_daemon::connections::holds_connection;
use gpu_attest_daemon::slots::{Crowded, Slot, Slots};
use gpu_attest_proto::v1::{self, attest_event::Event, validator_server::Validator};
use gpu_attest_shared::keys::PublicKey;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};
use tracing::{info, warn};

/// The longest miner name and revocation reason kept: enough for any label or sentence, few
/// enough that a full list of miners fits in one reply.
pub const MAX_NAME_BYTES: usize = 128;
pub const MAX_REASON_BYTES: usize = 512;

const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 500;

/// Verdict watchers served at once: each holds a task and polls the database every second.
pub const MAX_WATCHERS: usize = 64;

/// Verdict watchers one client (one address) may hold at once: enough for a dashboard, a
/// scheduler and a few scripts on one host, and few enough that one client cannot take every
/// place.
pub const MAX_WATCHERS_PER_CLIENT: usize = 8;

/// Verdicts a watcher may have sent but not yet read: past this the watcher waits for its
/// client, and reads nothing more from the database meanwhile.
const WATCH_BUFFER: usize = 16;

#[derive(Clone)]
pub struct ValidatorService {
    attestor: Arc<Attestor>,
    /// Attestations the API is running, which a second request for the same miner follows.
    in_flight: InFlight,
    watchers: Arc<Slots>,
    /// Turns true when the server starts to stop: verdict watchers end their streams then.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// Transcripts being sent: each is held whole in memory until its stream ends (up to 2 GiB
    /// for a host of many GPUs), so only [`TRANSCRIPT_READS`] at once.
    transcript_reads: Arc<tokio::sync::Semaphore>,
}

impl ValidatorService {
    /// Refreshes the registered-miners gauge after a registration changed; a store that cannot
    /// be read now leaves it as it was (the scheduler's next round counts again).
    async fn count_registered(&self) {
        match self.attestor.store().miners().await {
            Ok(miners) => self.attestor.metrics().registered_miners(&miners),
            Err(e) => warn!(error = %e, "cannot count the registered miners for the metrics"),
        }
    }

    pub fn new(attestor: Arc<Attestor>, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        ValidatorService {
            attestor,
            in_flight: InFlight::default(),
            watchers: Arc::new(Slots::new(MAX_WATCHERS, MAX_WATCHERS_PER_CLIENT)),
            stopping,
            transcript_reads: Arc::new(tokio::sync::Semaphore::new(TRANSCRIPT_READS)),
        }
    }
}

impl From<AttestError> for Status {
    fn from(e: AttestError) -> Status {
        let code = match &e {
            AttestError::BadUrl { .. } => Code::InvalidArgument,
            AttestError::Plan { .. } | AttestError::Inventory { .. } => Code::FailedPrecondition,
            // The miner, not this call, ran out of time: a transient condition, retried later.
            AttestError::Unreachable { .. } | AttestError::TimedOut { .. } => Code::Unavailable,
            AttestError::NotAMiner { .. } | AttestError::Refused { .. } | AttestError::KeyChanged { .. } => {
                Code::FailedPrecondition
            }
            AttestError::Store(StoreError::KeyChanged { .. } | StoreError::Revoked(..)) => Code::FailedPrecondition,
            AttestError::Store(StoreError::KeyRegisteredElsewhere { .. }) => Code::AlreadyExists,
            AttestError::Store(StoreError::Unwritable(_)) => Code::Unavailable,
            AttestError::Transport(_) | AttestError::RetestChanged { .. } => Code::FailedPrecondition,
            AttestError::Verify(_) | AttestError::Store(_) | AttestError::Random(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        AttestError::Store(e).into()
    }
}

fn miner_to_wire(m: &MinerRecord) -> v1::MinerRecord {
    v1::MinerRecord {
        url: m.url.clone(),
        name: m.name.clone(),
        miner_key: m.miner_key.0.to_vec(),
        registered_at_unix_ms: m.registered_at_ms,
        ..Default::default()
    }
}

/// A registered miner with where it stands: the database's figures and this scheduler's backoff.
fn standing_to_wire(m: &MinerRecord, s: &MinerStanding, backoff: Option<Backoff>) -> v1::MinerRecord {
    let backoff = backoff.unwrap_or_default();
    v1::MinerRecord {
        last_verdict_id: s.last_verdict_id,
        last_verdict_passed: s.last_verdict_passed,
        last_verdict_at_unix_ms: s.last_verdict_at_ms,
        last_pass_at_unix_ms: s.last_pass_at_ms,
        next_due_unix_ms: s.next_due_ms,
        failures_in_a_row: backoff.failures,
        last_error: backoff.last_error,
        revoked: s.revoked,
        ..miner_to_wire(m)
    }
}

/// A caller that proved who it is (a client certificate), or one on this machine: one whose
/// long calls may keep a connection from being closed to make room.
fn is_trusted_caller<T>(request: &Request<T>) -> bool {
    request.peer_certs().is_some() || request.remote_addr().is_some_and(|a| a.ip().is_loopback())
}

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::AttestEvent, Status>> + Send>>;
type VerdictStream = Pin<Box<dyn Stream<Item = Result<v1::Verdict, Status>> + Send>>;
type TranscriptStream = Pin<Box<dyn Stream<Item = Result<v1::TranscriptChunk, Status>> + Send>>;

/// The largest piece of a transcript one message carries: well under any client's default
/// message limit (4 MiB).
const TRANSCRIPT_CHUNK_BYTES: usize = 1 << 20;

/// Transcripts sent at once (GetTranscript): each is read whole from the store and held until
/// its stream ends.
const TRANSCRIPT_READS: usize = 2;

/// How long a watcher waits for its client to take a verdict before it ends the watch: a client
/// that stops reading does not keep a watcher's place for good.
const STALLED_CLIENT: std::time::Duration = std::time::Duration::from_secs(60);

/// What ends a watch when this validator stops: its client watches again from `last`.
fn stopping_status(last: u64) -> Status {
    Status::unavailable(format!(
        "this validator is stopping; watch again with after_id = {last} to miss nothing"
    ))
}

/// Sends `follower`'s verdicts to `tx` until the client goes, stops reading, or the server
/// stops; it reads again at once when this process stores a verdict, and every [`watch::POLL`]
/// for those other validators store.
async fn run_watcher(
    attestor: Arc<Attestor>,
    mut follower: Follower,
    tx: mpsc::Sender<Result<v1::Verdict, Status>>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    _place: Slot,
) {
    let store = attestor.store().clone();
    let mut stored = store.stored_verdicts();
    loop {
        if *stopping.borrow() {
            let _ = tx.try_send(Err(stopping_status(follower.last())));
            return;
        }
        let step = match follower.next(&store).await {
            Ok(step) => step,
            Err(e) => {
                warn!(error = %e, "a verdict watcher could not read the database");
                let _ = tx
                    .send(Err(Status::unavailable(format!(
                        "this validator cannot read its verdicts now ({e}); watch again with after_id = {}",
                        follower.last()
                    ))))
                    .await;
                return;
            }
        };
        for v in &step.verdicts {
            tokio::select! {
                sent = tokio::time::timeout(STALLED_CLIENT, tx.send(Ok(verdict_to_wire(v)))) => {
                    // Gone, or not reading: the watch ends.
                    if !matches!(sent, Ok(Ok(()))) {
                        return;
                    }
                }
                _ = stopping.changed() => {
                    let _ = tx.try_send(Err(stopping_status(follower.last())));
                    return;
                }
            }
        }
        if step.more {
            continue;
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = stopping.changed() => {
                let _ = tx.try_send(Err(stopping_status(follower.last())));
                return;
            }
            _ = stored.changed() => {}
            _ = tokio::time::sleep(watch::POLL) => {}
        }
    }
}

#[tonic::async_trait]
impl Validator for ValidatorService {
    type AttestMinerStream = EventStream;
    type WatchVerdictsStream = VerdictStream;
    type GetTranscriptStream = TranscriptStream;

    async fn register_miner(
        &self,
        request: Request<v1::RegisterMinerRequest>,
    ) -> Result<Response<v1::MinerRecord>, Status> {
        // Probing the miner may take longer than a connection may stay quiet: a trusted
        // caller's connection is held meanwhile (see attest_miner for who is trusted).
        let _held = is_trusted_caller(&request)
            .then(|| gpu_attest_daemon::connections::hold_connection_while_handling(request.extensions()))
            .flatten();
        let request = request.into_inner();
        if request.url.is_empty() {
            return Err(Status::invalid_argument("url is required"));
        }
        if let Some(problem) = caller_text_problem("name", &request.name, MAX_NAME_BYTES) {
            return Err(Status::invalid_argument(problem));
        }
        let url = normalise_url(&request.url);
        let (inventory, standing) = self.attestor.inventory(&url).await?;
        let key = inventory.miner_key;
        let name = (!request.name.is_empty()).then_some(request.name.as_str());
        let record = self
            .attestor
            .store()
            .register_miner(&url, name, key, request.replace_key, now_ms())
            .await?;
        info!(%url, miner_key = %key, replace_key = request.replace_key, "miner registered");
        if standing == v1::ValidatorStanding::NotAllowed {
            warn!(%url, validator_key = %self.attestor.public_key(), "the miner says it does not allow this validator: it will refuse every challenge until its operator adds this key to its allowed_validators");
        }
        self.count_registered().await;
        let mut record = miner_to_wire(&record);
        record.set_allows_this_validator(standing);
        Ok(Response::new(record))
    }

    async fn list_miners(&self, _: Request<v1::ListMinersRequest>) -> Result<Response<v1::ListMinersResponse>, Status> {
        let miners = self.attestor.store().miner_standings().await?;
        let backoffs = self.attestor.backoffs();
        Ok(Response::new(v1::ListMinersResponse {
            miners: miners
                .iter()
                .map(|(m, s)| standing_to_wire(m, s, backoffs.get(&m.url)))
                .collect(),
        }))
    }

    async fn remove_miner(
        &self,
        request: Request<v1::RemoveMinerRequest>,
    ) -> Result<Response<v1::RemoveMinerResponse>, Status> {
        let url = normalise_url(&request.into_inner().url);
        let removed = self.attestor.store().remove_miner(&url).await?;
        self.attestor.metrics().forget_miner(&url);
        self.attestor.backoffs().clear(&url);
        if removed {
            info!(%url, "miner removed");
            self.count_registered().await;
        }
        Ok(Response::new(v1::RemoveMinerResponse { removed }))
    }

    async fn revoke_miner_key(
        &self,
        request: Request<v1::RevokeMinerKeyRequest>,
    ) -> Result<Response<v1::RevokeMinerKeyResponse>, Status> {
        let request = request.into_inner();
        let key = PublicKey::from_slice(&request.miner_key)
            .map_err(|_| Status::invalid_argument("miner_key must be 32 bytes"))?;
        if request.reason.trim().is_empty() {
            return Err(Status::invalid_argument("a reason is required, for the record"));
        }
        if let Some(problem) = caller_text_problem("reason", &request.reason, MAX_REASON_BYTES) {
            return Err(Status::invalid_argument(problem));
        }
        let newly_revoked = self
            .attestor
            .store()
            .revoke_key(&key, &request.reason, now_ms())
            .await?;
        warn!(miner_key = %key, reason = %request.reason, "miner key revoked");
        Ok(Response::new(v1::RevokeMinerKeyResponse { newly_revoked }))
    }

    async fn list_revoked_keys(
        &self,
        _: Request<v1::ListRevokedKeysRequest>,
    ) -> Result<Response<v1::ListRevokedKeysResponse>, Status> {
        let keys = self.attestor.store().revoked_keys().await?;
        Ok(Response::new(v1::ListRevokedKeysResponse {
            keys: keys
                .into_iter()
                .map(|k| v1::RevokedKey {
                    miner_key: k.miner_key.0.to_vec(),
                    reason: k.reason,
                    revoked_at_unix_ms: k.revoked_at_ms,
                })
                .collect(),
        }))
    }

    async fn list_rates(&self, _: Request<v1::ListRatesRequest>) -> Result<Response<v1::ListRatesResponse>, Status> {
        let table = crate::rates::report::table(self.attestor.store(), self.attestor.config(), now_ms()).await?;
        Ok(Response::new(crate::rates::report::table_to_wire(&table)))
    }

    async fn attest_miner(
        &self,
        request: Request<v1::AttestMinerRequest>,
    ) -> Result<Response<Self::AttestMinerStream>, Status> {
        // A caller that proved who it is (a client certificate), or one on this machine, keeps
        // its connection while it follows the attestation. On an API served over TLS without
        // client certificates (which SECURITY.md advises against) a stranger could otherwise
        // hold connections by never reading the stream.
        let trusted = is_trusted_caller(&request);
        let url = request.into_inner().url;
        if url.is_empty() {
            return Err(Status::invalid_argument("url is required"));
        }
        let (tx, rx) = mpsc::channel(256);
        let respond = |rx| {
            let response = Response::new(Box::pin(ReceiverStream::new(rx)) as Self::AttestMinerStream);
            if trusted { holds_connection(response) } else { response }
        };
        let publisher = match self.in_flight.join(&normalise_url(&url)) {
            Joined::Started(publisher) => publisher,
            // An earlier request is attesting this miner (its client may have gone): this one
            // follows it rather than challenge the miner again, which would refuse as busy.
            Joined::Following(followed) => {
                let _ = tx.try_send(Ok(v1::AttestEvent {
                    event: Some(Event::Phase(v1::Phase {
                        name: "following".into(),
                        detail: "an earlier request is attesting this miner; following that attestation to its verdict"
                            .into(),
                    })),
                }));
                tokio::spawn(crate::in_flight::follow(followed, tx));
                return Ok(respond(rx));
            }
        };
        let attestor = self.attestor.clone();
        // The attestation runs to its stored verdict even if the caller goes away; a later
        // request for the same miner follows it meanwhile.
        tokio::spawn(async move {
            let (events, followers) = (tx.clone(), publisher.events());
            let forward = move |e: AttestEvent| {
                let event = match e {
                    AttestEvent::Phase { name, detail } => Event::Phase(v1::Phase {
                        name: name.into(),
                        detail,
                    }),
                    AttestEvent::Progress(p) => Event::Progress(v1::Progress {
                        device: p.device,
                        done: p.done,
                        total: p.total,
                    }),
                };
                let event = v1::AttestEvent { event: Some(event) };
                let _ = followers.send(Ok(event.clone()));
                let _ = events.try_send(Ok(event));
            };
            let result = attestor.attest(&url, &forward).await;
            let last = match result {
                Ok(verdict) => Ok(v1::AttestEvent {
                    event: Some(Event::Verdict(verdict_to_wire(&verdict))),
                }),
                Err(e) => {
                    warn!(%url, error = %e, "attestation failed");
                    Err(Status::from(e))
                }
            };
            publisher.finish(last.clone());
            let _ = tx.send(last).await;
        });
        Ok(respond(rx))
    }

    async fn watch_verdicts(
        &self,
        request: Request<v1::WatchVerdictsRequest>,
    ) -> Result<Response<Self::WatchVerdictsStream>, Status> {
        let trusted = is_trusted_caller(&request);
        let client = request.remote_addr().map(|a| a.ip());
        let r = request.into_inner();
        let place = self
            .watchers
            .take(client)
            .map_err(|crowded| match crowded {
                Crowded::ClientFull(n) => Status::resource_exhausted(format!(
                    "this client already holds {n} verdict watches, as many as one client may; close one (one watch without miner_url follows every miner)"
                )),
                Crowded::Full(n) => Status::resource_exhausted(format!(
                    "this validator serves at most {n} verdict watchers at once; close one, or retry later"
                )),
            })?;
        let newest = self.attestor.store().newest_verdict_id().await?;
        let after_id = match r.after_id {
            // An id this database never gave: it was replaced or restored, and following from
            // there would pass over every verdict up to it without a word.
            Some(id) if id > newest => {
                return Err(Status::out_of_range(format!(
                    "after_id {id} is beyond this validator's newest verdict, #{newest}: its database is not the one that id came from; watch from 0, or without after_id"
                )));
            }
            Some(id) => id,
            None => newest,
        };
        let miner_url = (!r.miner_url.is_empty()).then(|| normalise_url(&r.miner_url));
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(run_watcher(
            self.attestor.clone(),
            Follower::after(after_id, miner_url),
            tx,
            self.stopping.clone(),
            place,
        ));
        let response = Response::new(Box::pin(ReceiverStream::new(rx)) as Self::WatchVerdictsStream);
        // As attest_miner: only a trusted caller's watch keeps its connection from being closed
        // to make room.
        Ok(if trusted { holds_connection(response) } else { response })
    }

    async fn get_transcript(
        &self,
        request: Request<v1::GetTranscriptRequest>,
    ) -> Result<Response<TranscriptStream>, Status> {
        let id = request.into_inner().verdict_id;
        let Ok(reading) = self.transcript_reads.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "{TRANSCRIPT_READS} transcripts are being sent already (each held whole while it is); ask again when one has ended"
            )));
        };
        let Some(bytes) = self.attestor.store().transcript(id).await? else {
            return Err(Status::not_found(format!(
                "verdict {id} has no kept transcript: the validator keeps failing verdicts' by default ([transcripts] keep), within its budget, and none from before this release"
            )));
        };
        let total_bytes = bytes.len() as u64;
        // Each chunk copied out as it is sent, not all of them first: a transcript is tens of MB
        // to GBs. The stream holds the read's place until it ends or is dropped.
        let chunks = (0..bytes.len()).step_by(TRANSCRIPT_CHUNK_BYTES).map(move |start| {
            let _reading = &reading;
            let end = (start + TRANSCRIPT_CHUNK_BYTES).min(bytes.len());
            Ok(v1::TranscriptChunk {
                data: bytes[start..end].to_vec(),
                total_bytes,
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn list_verdicts(
        &self,
        request: Request<v1::ListVerdictsRequest>,
    ) -> Result<Response<v1::ListVerdictsResponse>, Status> {
        let r = request.into_inner();
        let before_id = if r.page_token.is_empty() {
            None
        } else {
            Some(
                r.page_token
                    .parse::<u64>()
                    .map_err(|_| Status::invalid_argument("page_token is not one this server issued"))?,
            )
        };
        let page = match r.page_size {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let filter = VerdictFilter {
            miner_url: (!r.miner_url.is_empty()).then(|| normalise_url(&r.miner_url)),
            passed: r.passed,
            since_ms: r.since_unix_ms,
            before_id,
            limit: page + 1,
        };
        let mut verdicts = self.attestor.store().verdicts(&filter).await?;
        let next_page_token = if verdicts.len() > page as usize {
            verdicts.truncate(page as usize);
            verdicts.last().map(|v| v.id.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(v1::ListVerdictsResponse {
            verdicts: verdicts.iter().map(verdict_to_wire).collect(),
            next_page_token,
        }))
    }
}

#[cfg(test)]
mod transcript_reads {
    use super::*;
    use tokio_stream::StreamExt;

    /// Each transcript sent is held whole until its stream ends, so at most TRANSCRIPT_READS are
    /// sent at once: the next is refused with RESOURCE_EXHAUSTED until one ends, and a stream
    /// still sends the kept bytes whole.
    #[tokio::test]
    async fn at_most_two_transcripts_are_sent_at_once() {
        let (store, _scratch) = crate::store::test_stores("transcript-reads").await.remove(0);
        let id = crate::store::test_support::stored_passing_verdict(&store, 1).await;
        let kept: Vec<u8> = (0..3 * TRANSCRIPT_CHUNK_BYTES + 5).map(|i| i as u8).collect();
        store.keep_transcript(id, &kept, 1 << 30, 1).await.unwrap();
        let attestor = Arc::new(Attestor::new(
            gpu_attest_shared::keys::KeyPair::from_seed([1; 32]),
            crate::config::ValidatorConfig::default(),
            Arc::new(gpu_attest_shared::cpu::CpuBackend::new(1, None).unwrap()),
            false,
            Arc::new(store),
        ));
        let (_stop, stopping) = tokio::sync::watch::channel(false);
        let service = ValidatorService::new(attestor, stopping);
        let ask = || service.get_transcript(Request::new(v1::GetTranscriptRequest { verdict_id: id }));
        let first = ask().await.unwrap();
        let second = ask().await.unwrap();
        let refused = ask().await.err().expect("a third read at once is refused");
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        drop(first);
        let third = ask().await.unwrap();
        let mut sent = Vec::new();
        let mut chunks = third.into_inner();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.unwrap();
            assert_eq!(chunk.total_bytes, kept.len() as u64);
            sent.extend_from_slice(&chunk.data);
        }
        assert_eq!(sent, kept);
        // The whole stream read and dropped: its place is free again.
        drop(chunks);
        assert!(ask().await.is_ok());
        drop(second);
    }
}
