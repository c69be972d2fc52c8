//! One attestation, start to finish: inventory, plan, signed challenge, commitment checks,
//! sampled or full verification, stored verdict.
//!
//! Failures before the miner accepts the challenge (unreachable, not a miner, challenge refused)
//! are errors and store no verdict; once it has accepted, every outcome is a verdict, pass or fail,
//! with all its reasons.

use crate::config::{Policy, ValidatorConfig};
use crate::planner::{Plan, PlanError, plan};
use crate::store::{Store, StoreError, StoredParams, Verdict};
use gpu_attest_proto::convert::{challenge_to_wire, commitment_from_wire, opening_from_wire, sample_to_wire};
use gpu_attest_proto::transport::check_plaintext_client;
use gpu_attest_proto::v1::{self, challenge_event::Event, miner_client::MinerClient};
use gpu_attest_shared::engine::DeviceProgress;
use gpu_attest_shared::identity::{Identity, PublicKey};
use gpu_attest_shared::opening::{SampleRequest, draw_samples};
use gpu_attest_shared::statement::{Challenge, Commitment, DeviceInfo, open_request_bytes, opening_bytes};
use gpu_attest_shared::verify::{VerifyError, check_commitment, verify_full, verify_opening};
use gpu_attest_shared::{Backend, CancelToken, Work};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// Largest message accepted from a miner: an opening carries an n*n matrix (64 MiB at n = 8192).
pub const MAX_MINER_MESSAGE_BYTES: usize = 72 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const INVENTORY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What an attestation reports while it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttestEvent {
    Phase { name: &'static str, detail: String },
    Progress(DeviceProgress),
}

#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error("invalid miner URL {url:?}: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("cannot reach miner at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("{url} is not a gpu-attest miner ({detail})")]
    NotAMiner { url: String, detail: String },
    #[error("cannot plan a challenge for {url}: {source}")]
    Plan { url: String, source: PlanError },
    #[error("miner at {url} refused the challenge ({code:?}): {message}")]
    Refused { url: String, code: Code, message: String },
    #[error(
        "miner at {url} presents key {presented}, but it is registered with {registered}; register it again with replace_key to accept the new key"
    )]
    KeyChanged {
        url: String,
        registered: PublicKey,
        presented: PublicKey,
    },
    #[error("this validator could not verify: {0}")]
    Verify(String),
    #[error(transparent)]
    Transport(#[from] gpu_attest_proto::transport::TransportError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

pub struct Attestor {
    identity: Identity,
    config: ValidatorConfig,
    backend: Arc<dyn Backend>,
    backend_is_gpu: bool,
    store: Arc<Store>,
}

fn random32() -> Result<[u8; 32], AttestError> {
    let mut out = [0u8; 32];
    getrandom::fill(&mut out).map_err(|e| AttestError::Random(e.to_string()))?;
    Ok(out)
}

/// Accepts `host:port` as shorthand for `http://host:port`.
pub fn normalise_url(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

impl Attestor {
    pub fn new(
        identity: Identity,
        config: ValidatorConfig,
        backend: Arc<dyn Backend>,
        backend_is_gpu: bool,
        store: Arc<Store>,
    ) -> Self {
        Attestor {
            identity,
            config,
            backend,
            backend_is_gpu,
            store,
        }
    }

    pub fn public_key(&self) -> PublicKey {
        self.identity.public_key()
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn policy(&self) -> Policy {
        match self.config.policy {
            Policy::Auto if self.backend_is_gpu => Policy::Full,
            Policy::Auto => Policy::Sampled,
            other => other,
        }
    }

    async fn connect(&self, url: &str) -> Result<MinerClient<Channel>, AttestError> {
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| AttestError::BadUrl {
                url: url.into(),
                detail: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT);
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(self.config.miner_tls.client_config(url)?)
                .map_err(|e| AttestError::BadUrl {
                    url: url.into(),
                    detail: error_chain(&e),
                })?;
        } else if let Some(warning) = check_plaintext_client(url, self.config.allow_plaintext_miners)? {
            tracing::warn!("{warning}");
        }
        let channel = endpoint.connect().await.map_err(|e| AttestError::Unreachable {
            url: url.into(),
            detail: error_chain(&e),
        })?;
        Ok(MinerClient::new(channel).max_decoding_message_size(MAX_MINER_MESSAGE_BYTES))
    }

    /// Fetches a miner's inventory (used by registration too).
    pub async fn inventory(&self, url: &str) -> Result<v1::Inventory, AttestError> {
        let url = normalise_url(url);
        let mut client = self.connect(&url).await?;
        let mut request = tonic::Request::new(v1::GetInventoryRequest {});
        request.set_timeout(INVENTORY_TIMEOUT);
        let inventory = client.get_inventory(request).await.map_err(|s| match s.code() {
            Code::Unavailable | Code::DeadlineExceeded => AttestError::Unreachable {
                url: url.clone(),
                detail: s.message().into(),
            },
            code => AttestError::NotAMiner {
                url: url.clone(),
                detail: format!("GetInventory answered {code:?}: {}", s.message()),
            },
        })?;
        let inventory = inventory.into_inner();
        if PublicKey::from_slice(&inventory.miner_key).is_err() {
            return Err(AttestError::NotAMiner {
                url,
                detail: "inventory carries no 32-byte miner key".into(),
            });
        }
        Ok(inventory)
    }

    /// Attests the miner at `url` and stores the verdict.
    pub async fn attest(
        &self,
        url: &str,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<Verdict, AttestError> {
        let url = normalise_url(url);
        let phase = |name, detail: String| on_event(AttestEvent::Phase { name, detail });
        let inventory = self.inventory(&url).await?;
        let miner_key = PublicKey::from_slice(&inventory.miner_key).expect("checked by inventory()");
        self.store.check_not_revoked(&miner_key)?;
        if let Some(registered) = self.store.miner(&url)?
            && registered.miner_key != miner_key
        {
            return Err(AttestError::KeyChanged {
                url,
                registered: registered.miner_key,
                presented: miner_key,
            });
        }
        let nonce = loop {
            let candidate = random32()?;
            if self.store.claim_nonce(&candidate, &url, now_ms())? {
                break candidate;
            }
        };
        let plan = plan(
            &inventory,
            &self.config.challenge,
            &self.config.deadline,
            &self.config.rates,
            nonce,
            random32()?,
            miner_key.0,
        )
        .map_err(|source| AttestError::Plan {
            url: url.clone(),
            source,
        })?;
        let issued_at_ms = now_ms();
        let challenge = Challenge {
            params: plan.params,
            issued_at_ms,
            deadline_ms: issued_at_ms + plan.deadline_ms,
            validator_key: self.public_key(),
        };
        let signature = challenge.sign(&self.identity);
        phase(
            "challenge-sent",
            format!(
                "n={} chains={} iterations={} checkpoint every {}; expected {} ms, deadline {} ms",
                plan.params.n,
                plan.params.num_chains,
                plan.params.iterations,
                plan.params.checkpoint_every,
                plan.expected_ms,
                plan.deadline_ms
            ),
        );
        let mut client = self.connect(&url).await?;
        // The miner cancels at the deadline itself; the grace covers a miner that does not.
        let grace = Duration::from_millis(plan.deadline_ms / 10 + 2_000);
        let wait_limit = Duration::from_millis(plan.deadline_ms) + grace;
        let sent = Instant::now();
        let mut stream = match client.run_challenge(challenge_to_wire(&challenge, &signature)).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Err(refused(&url, status)),
        };
        let mut outcome = Outcome::new(&url, &inventory, &plan, self.policy(), self.config.samples);
        let received = tokio::time::timeout(wait_limit, async {
            let mut accepted = false;
            loop {
                match stream.message().await {
                    Ok(Some(v1::ChallengeEvent {
                        event: Some(Event::Accepted(a)),
                    })) => {
                        accepted = true;
                        phase(
                            "computing",
                            format!("miner accepted: {} device(s), {} backend", a.devices, a.backend),
                        );
                    }
                    Ok(Some(v1::ChallengeEvent {
                        event: Some(Event::Progress(p)),
                    })) => {
                        on_event(AttestEvent::Progress(DeviceProgress {
                            device: p.device,
                            done: p.done,
                            total: p.total,
                        }));
                    }
                    Ok(Some(v1::ChallengeEvent {
                        event: Some(Event::Commitment(c)),
                    })) => return Ok(Some(c)),
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(None),
                    Err(status) if !accepted => return Err(refused(&url, status)),
                    Err(status) => {
                        outcome.fail(format!(
                            "miner failed after accepting the challenge ({:?}): {}",
                            status.code(),
                            status.message()
                        ));
                        return Ok(None);
                    }
                }
            }
        })
        .await;
        let measured_ms = sent.elapsed().as_millis() as u64;
        outcome.measured_ms = measured_ms;
        let wire_commitment = match received {
            Ok(Ok(Some(c))) => Some(c),
            Ok(Ok(None)) => {
                outcome.fail_if_clean("miner ended the stream without a commitment".into());
                None
            }
            Ok(Err(refusal)) => return Err(refusal),
            Err(_) => {
                outcome.fail(format!(
                    "no commitment within {} ms (deadline {} ms)",
                    wait_limit.as_millis(),
                    plan.deadline_ms
                ));
                None
            }
        };
        drop(stream);
        if let Some(wire) = wire_commitment {
            phase("commitment-received", format!("after {measured_ms} ms"));
            if measured_ms > plan.deadline_ms {
                outcome.fail(format!(
                    "commitment arrived after {measured_ms} ms; the deadline was {} ms",
                    plan.deadline_ms
                ));
            }
            self.check_and_verify(&mut client, &challenge, &wire, &mut outcome, on_event)
                .await?;
        }
        let mut verdict = outcome.into_verdict(&plan.params);
        verdict.id = self.store.insert_verdict(&verdict)?;
        phase(
            "verdict",
            if verdict.passed {
                "pass".into()
            } else {
                verdict.reasons.join("; ")
            },
        );
        Ok(verdict)
    }

    async fn check_and_verify(
        &self,
        client: &mut MinerClient<Channel>,
        challenge: &Challenge,
        wire: &v1::Commitment,
        outcome: &mut Outcome,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<(), AttestError> {
        let (commitment, signature) = match commitment_from_wire(wire) {
            Ok(pair) => pair,
            Err(e) => {
                return {
                    outcome.fail(format!("malformed commitment: {e}"));
                    Ok(())
                };
            }
        };
        outcome.record_commitment(&commitment);
        let expected_miner = PublicKey(challenge.params.miner_key);
        if commitment.miner_key != expected_miner {
            return {
                outcome.fail(format!(
                    "commitment is from key {}, the challenge was for {expected_miner}",
                    commitment.miner_key
                ));
                Ok(())
            };
        }
        if commitment.verify(&signature).is_err() {
            return {
                outcome.fail("commitment signature does not verify with the miner's key".into());
                Ok(())
            };
        }
        if commitment.validator_key != self.public_key() {
            return {
                outcome.fail("commitment answers another validator's challenge".into());
                Ok(())
            };
        }
        // The planner validated these parameters before the challenge was sent.
        let work = Work::new(challenge.params).map_err(|e| AttestError::Plan {
            url: outcome.url.clone(),
            source: PlanError::Params(e),
        })?;
        if let Err(rejection) = check_commitment(&work, &commitment.work) {
            return {
                outcome.fail(rejection.to_string());
                Ok(())
            };
        }
        if commitment.work.devices.len() != commitment.inventory.len() {
            outcome.fail(format!(
                "work is split over {} devices but the inventory lists {}",
                commitment.work.devices.len(),
                commitment.inventory.len()
            ));
        }
        on_event(AttestEvent::Phase {
            name: "verifying",
            detail: format!("{:?} policy", outcome.policy),
        });
        match outcome.policy {
            Policy::Full => self.verify_full(&work, &commitment, outcome, on_event).await,
            _ => self.verify_sampled(client, &work, &commitment, outcome).await,
        }
    }

    async fn verify_full(
        &self,
        work: &Work,
        commitment: &Commitment,
        outcome: &mut Outcome,
        on_event: &(dyn Fn(AttestEvent) + Send + Sync),
    ) -> Result<(), AttestError> {
        let (backend, work, committed) = (self.backend.clone(), work.clone(), commitment.work.clone());
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
                Some(p) = rx.recv() => on_event(AttestEvent::Progress(p)),
                joined = &mut job => break joined,
            }
        };
        match result.map_err(|e| AttestError::Verify(e.to_string()))? {
            Ok(()) => Ok(()),
            Err(VerifyError::Rejected(r)) => {
                outcome.fail(r.to_string());
                Ok(())
            }
            Err(e) => Err(AttestError::Verify(e.to_string())),
        }
    }

    async fn verify_sampled(
        &self,
        client: &mut MinerClient<Channel>,
        work: &Work,
        commitment: &Commitment,
        outcome: &mut Outcome,
    ) -> Result<(), AttestError> {
        let mut rng = ChaCha20Rng::from_seed(random32()?);
        let samples = draw_samples(&mut rng, work, self.config.samples);
        let nonce = work.params().nonce;
        let request = v1::OpenChainsRequest {
            nonce: nonce.to_vec(),
            samples: samples.iter().map(sample_to_wire).collect(),
            validator_key: self.public_key().0.to_vec(),
            signature: self.identity.sign(&open_request_bytes(&nonce, &samples)).to_vec(),
        };
        // A miner that stalls must not hold this validator (its scheduler attests one miner at a
        // time): all openings must arrive within twice the challenge's deadline, counting only
        // the time spent waiting for the miner, not this validator's own recomputation.
        let budget = Duration::from_millis(outcome.deadline_ms.max(5_000) * 2);
        let mut waited = Duration::ZERO;
        let started = Instant::now();
        let opened = tokio::time::timeout(budget, client.open_chains(request)).await;
        waited += started.elapsed();
        let mut stream = match opened {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(s)) => {
                outcome.fail(format!(
                    "miner refused to open chains ({:?}): {}",
                    s.code(),
                    s.message()
                ));
                return Ok(());
            }
            Err(_) => {
                outcome.fail(format!(
                    "miner did not answer the open request within {} ms",
                    budget.as_millis()
                ));
                return Ok(());
            }
        };
        for sample in samples {
            let started = Instant::now();
            let next = tokio::time::timeout(budget.saturating_sub(waited), stream.message()).await;
            waited += started.elapsed();
            let wire = match next {
                Ok(Ok(Some(wire))) => wire,
                Ok(Ok(None)) => {
                    outcome.fail(format!(
                        "miner sent no opening for chain {} segment {}",
                        sample.chain, sample.segment
                    ));
                    return Ok(());
                }
                Ok(Err(s)) => {
                    outcome.fail(format!(
                        "opening chain {} failed ({:?}): {}",
                        sample.chain,
                        s.code(),
                        s.message()
                    ));
                    return Ok(());
                }
                Err(_) => {
                    outcome.fail(format!(
                        "miner did not send all openings within {} ms",
                        budget.as_millis()
                    ));
                    return Ok(());
                }
            };
            if let Some(reason) = self.check_opening(work, commitment, sample, &wire).await? {
                outcome.fail(reason);
            }
        }
        Ok(())
    }

    /// `Ok(Some(reason))` when the opening is wrong; `Err` only when this validator cannot check.
    async fn check_opening(
        &self,
        work: &Work,
        commitment: &Commitment,
        sample: SampleRequest,
        wire: &v1::ChainOpening,
    ) -> Result<Option<String>, AttestError> {
        let (nonce, opening, signature) = match opening_from_wire(wire, work.n()) {
            Ok(t) => t,
            Err(e) => return Ok(Some(format!("malformed opening of chain {}: {e}", sample.chain))),
        };
        if nonce != work.params().nonce {
            return Ok(Some(format!(
                "opening of chain {} is for another challenge",
                sample.chain
            )));
        }
        if commitment
            .miner_key
            .verify(&opening_bytes(&nonce, &opening), &signature)
            .is_err()
        {
            return Ok(Some(format!(
                "opening of chain {} is not signed by the miner",
                sample.chain
            )));
        }
        let (backend, work, committed) = (self.backend.clone(), work.clone(), commitment.work.clone());
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
            Ok(()) => Ok(None),
            Err(VerifyError::Rejected(r)) => Ok(Some(r.to_string())),
            Err(e) => Err(AttestError::Verify(e.to_string())),
        }
    }
}

fn refused(url: &str, status: Status) -> AttestError {
    match status.code() {
        Code::Unimplemented => AttestError::NotAMiner {
            url: url.into(),
            detail: format!("RunChallenge: {}", status.message()),
        },
        Code::Unavailable => AttestError::Unreachable {
            url: url.into(),
            detail: status.message().into(),
        },
        code => AttestError::Refused {
            url: url.into(),
            code,
            message: status.message().into(),
        },
    }
}

/// The full cause chain of a transport error, which tonic otherwise hides behind "transport error".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.dedup();
    parts.join(": ")
}

/// A verdict being assembled.
struct Outcome {
    url: String,
    miner_key: String,
    policy: Policy,
    samples: u32,
    reasons: Vec<String>,
    measured_ms: u64,
    expected_ms: u64,
    deadline_ms: u64,
    inventory: Vec<DeviceInfo>,
    backend: String,
    kernel: String,
    global: String,
}

impl Outcome {
    fn new(url: &str, inventory: &v1::Inventory, plan: &Plan, policy: Policy, samples: u32) -> Self {
        Outcome {
            url: url.into(),
            miner_key: hex::encode(&inventory.miner_key),
            policy,
            samples: if policy == Policy::Full { 0 } else { samples },
            reasons: Vec::new(),
            measured_ms: 0,
            expected_ms: plan.expected_ms,
            deadline_ms: plan.deadline_ms,
            inventory: inventory
                .devices
                .iter()
                .map(gpu_attest_proto::convert::device_from_wire)
                .collect(),
            backend: inventory.backend.clone(),
            kernel: inventory.kernel.clone(),
            global: hex::encode([0u8; 32]),
        }
    }

    fn fail(&mut self, reason: String) {
        self.reasons.push(reason);
    }

    fn fail_if_clean(&mut self, reason: String) {
        if self.reasons.is_empty() {
            self.reasons.push(reason);
        }
    }

    /// The commitment's own account of what it ran on replaces the earlier inventory.
    fn record_commitment(&mut self, c: &Commitment) {
        self.inventory = c.inventory.clone();
        self.backend = c.backend.clone();
        self.kernel = c.kernel.clone();
        self.global = c.work.global.to_hex();
    }

    fn into_verdict(self, params: &gpu_attest_shared::ChallengeParams) -> Verdict {
        Verdict {
            id: 0,
            miner_url: self.url,
            miner_key: self.miner_key,
            nonce: hex::encode(params.nonce),
            passed: self.reasons.is_empty(),
            reasons: self.reasons,
            policy: match self.policy {
                Policy::Full => "full",
                _ => "sampled",
            }
            .into(),
            samples: self.samples,
            params: StoredParams::from(params),
            measured_ms: self.measured_ms,
            expected_ms: self.expected_ms,
            deadline_ms: self.deadline_ms,
            inventory: self.inventory,
            backend: self.backend,
            kernel: self.kernel,
            global_checksum: self.global,
            created_at_ms: now_ms(),
        }
    }
}
