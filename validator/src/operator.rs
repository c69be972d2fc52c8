//! The operator's client for a running validator's API: what `validator miners ...` does. It
//! speaks the same gRPC API as any dashboard, so a running validator is managed without a
//! hand-written client and without stopping it.

use crate::store::VerdictFilter;
use crate::verdict::Verdict;
use crate::verdict_wire::verdict_from_wire;
use gpu_attest_daemon::dial::dial;
use gpu_attest_daemon::errors::error_chain;
use gpu_attest_daemon::tls::{TlsFiles, TransportError, check_plaintext_client};
use gpu_attest_proto::v1::{self, validator_client::ValidatorClient};
use gpu_attest_shared::keys::PublicKey;
use serde::Serialize;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// The TCP connect alone.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The TCP connect and the TLS and HTTP/2 handshakes together.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Registration fetches the miner's inventory: the validator dials the miner and asks it, each
/// within its `deadline.connect_ms` (at most 15 s).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("invalid validator API address {url:?}: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("cannot reach the validator API at {url} ({detail}); is `validator serve` running there?")]
    Unreachable { url: String, detail: String },
    #[error(
        "refusing plaintext to the validator API at {0}: it has no accounts of its own, so reach it on loopback or over https:// with --api-ca"
    )]
    Plaintext(String),
    #[error(transparent)]
    Tls(TransportError),
    #[error("the validator refused ({code:?}): {message}")]
    Refused { code: tonic::Code, message: String },
    #[error(
        "the server at {url} does not serve the validator API ({message}); is --api the address `validator serve` listens on (its `listen` setting), not a miner's?"
    )]
    NotTheValidator { url: String, message: String },
    #[error("the connection to the validator API at {url} failed ({detail}); {hint}")]
    Transport {
        url: String,
        detail: String,
        hint: &'static str,
    },
    #[error("miner key must be 64 hex digits: {0}")]
    BadKey(String),
    #[error("the validator at {0} ended the attestation without a verdict")]
    NoVerdict(String),
}

/// How one watch stream ended.
enum Watched {
    /// The caller wants no more verdicts.
    Stopped,
    /// The stream was lost (why, for the operator); a reconnect resumes it.
    Lost(String),
}

/// How long `follow` waits before it asks again after losing the validator.
const RECONNECT: std::time::Duration = std::time::Duration::from_secs(2);

/// A watch that ended this way ends because the validator went (a restart, a network fault,
/// a connection closed to make room), not because it refused: worth following again.
fn reconnectable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Aborted
    )
}

impl From<tonic::Status> for OperatorError {
    fn from(s: tonic::Status) -> Self {
        OperatorError::Refused {
            code: s.code(),
            message: s.message().into(),
        }
    }
}

/// A registered miner as the CLI prints it.
#[derive(Debug, Serialize)]
pub struct Miner {
    pub url: String,
    pub name: String,
    pub miner_key: String,
    pub registered_at_unix_ms: u64,
    /// Its latest verdict (0: never attested), whether it passed, and when.
    pub last_verdict_id: u64,
    pub last_verdict_passed: bool,
    pub last_verdict_at_unix_ms: u64,
    /// Its latest pass; 0 if it never passed.
    pub last_pass_at_unix_ms: u64,
    /// When the scheduler attests it next; 0 before its first scheduled attempt.
    pub next_due_unix_ms: u64,
    /// Scheduled attempts in a row that could not attest it, and the latest one's error.
    pub failures_in_a_row: u32,
    pub last_error: String,
    pub revoked: bool,
}

/// What `miners add` did: the registration as it now stands, and what changed.
#[derive(Debug, Serialize)]
pub struct Registration {
    #[serde(flatten)]
    pub miner: Miner,
    pub change: RegistrationChange,
    /// Whether the miner said its allow-list holds this validator's key: `Some(false)` means it
    /// will refuse every challenge; `None`, that it did not say (PROTOCOL.md 14.2).
    pub allows_this_validator: Option<bool>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RegistrationChange {
    /// The URL was not registered before.
    New,
    /// It was registered under another name, which the new one replaced.
    Renamed { previous_name: String },
    /// It was registered with another key, which `--replace-key` replaced (a rename may
    /// have come with it).
    KeyReplaced { previous_key: String },
    /// It was registered already, as it is now.
    Unchanged,
}

impl From<v1::MinerRecord> for Miner {
    fn from(m: v1::MinerRecord) -> Self {
        Miner {
            url: m.url,
            name: m.name,
            miner_key: hex::encode(m.miner_key),
            registered_at_unix_ms: m.registered_at_unix_ms,
            last_verdict_id: m.last_verdict_id,
            last_verdict_passed: m.last_verdict_passed,
            last_verdict_at_unix_ms: m.last_verdict_at_unix_ms,
            last_pass_at_unix_ms: m.last_pass_at_unix_ms,
            next_due_unix_ms: m.next_due_unix_ms,
            failures_in_a_row: m.failures_in_a_row,
            last_error: m.last_error,
            revoked: m.revoked,
        }
    }
}

/// A revoked miner key as the CLI prints it.
#[derive(Debug, Serialize)]
pub struct Revoked {
    pub miner_key: String,
    pub reason: String,
    pub revoked_at_unix_ms: u64,
}

pub struct Operator {
    url: String,
    client: ValidatorClient<Channel>,
    /// Whether it presents a client certificate (`--api-cert`, `--api-key`).
    presents_certificate: bool,
}

impl Operator {
    /// Connects to the API at `url`; `tls` gives the CA (and a client identity for mutual TLS)
    /// for an `https://` address.
    pub async fn connect(url: &str, tls: &TlsFiles) -> Result<Self, OperatorError> {
        let bad_url = |detail: String| OperatorError::BadUrl {
            url: url.into(),
            detail,
        };
        // Without a scheme the address would parse as something else and fail to connect,
        // which would read as a validator that is not running.
        if !url.contains("://") {
            return Err(bad_url(format!(
                "no scheme: write http://{url} (loopback) or https://{url} (with --api-ca)"
            )));
        }
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| bad_url(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT);
        if url.starts_with("https://") {
            // A client key that is not its certificate's is named with its files here, not
            // reported by tonic as an invalid address.
            tls.check_readable().map_err(OperatorError::Tls)?;
            let config = tls.client_config(url).map_err(OperatorError::Tls)?;
            endpoint = endpoint.tls_config(config).map_err(|e| bad_url(e.to_string()))?;
        } else if check_plaintext_client(url, false).is_err() {
            return Err(OperatorError::Plaintext(url.into()));
        }
        let channel = dial(&endpoint, DIAL_TIMEOUT)
            .await
            .map_err(|e| OperatorError::Unreachable {
                url: url.into(),
                detail: error_chain(&e),
            })?;
        Ok(Operator {
            url: url.into(),
            client: ValidatorClient::new(channel),
            presents_certificate: tls.cert.is_some() && tls.key.is_some(),
        })
    }

    /// Registers the miner at `url` (an empty `name` keeps a registered miner's name), and says
    /// what that changed, from the registrations listed just before.
    pub async fn add(&mut self, url: &str, name: &str, replace_key: bool) -> Result<Registration, OperatorError> {
        let before = self.list().await?;
        let request = v1::RegisterMinerRequest {
            url: url.into(),
            name: name.into(),
            replace_key,
        };
        let record = self
            .client
            .register_miner(request)
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        let allows_this_validator = match record.allows_this_validator() {
            v1::ValidatorStanding::Allowed => Some(true),
            v1::ValidatorStanding::NotAllowed => Some(false),
            v1::ValidatorStanding::Unstated => None,
        };
        let miner = Miner::from(record);
        // Matched on the URL the validator stored: it normalises the one given.
        let change = match before.into_iter().find(|m| m.url == miner.url) {
            None => RegistrationChange::New,
            Some(was) if was.miner_key != miner.miner_key => RegistrationChange::KeyReplaced {
                previous_key: was.miner_key,
            },
            Some(was) if was.name != miner.name => RegistrationChange::Renamed {
                previous_name: was.name,
            },
            Some(_) => RegistrationChange::Unchanged,
        };
        Ok(Registration {
            miner,
            change,
            allows_this_validator,
        })
    }

    /// `status` as the error it is: a server without the Validator service (a miner's port, say)
    /// answers UNIMPLEMENTED, which says nothing to an operator on its own.
    fn refused(&self, status: tonic::Status) -> OperatorError {
        if status.code() == tonic::Code::Unimplemented {
            return OperatorError::NotTheValidator {
                url: self.url.clone(),
                message: status.message().into(),
            };
        }
        if let Some(hint) = self.transport_hint(&status) {
            return OperatorError::Transport {
                url: self.url.clone(),
                detail: status.message().into(),
                hint,
            };
        }
        status.into()
    }

    /// What a connection that failed under a call most likely needs, where the transport's own
    /// words ("h2 protocol error", "transport error") would not tell an operator.
    fn transport_hint(&self, status: &tonic::Status) -> Option<&'static str> {
        let message = status.message();
        let transport = gpu_attest_daemon::dial::made_by_the_connection(status)
            && matches!(
                status.code(),
                tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Internal
            )
            && ["h2 protocol error", "transport error", "operation was canceled"]
                .iter()
                .any(|words| message.contains(words));
        if !transport {
            return None;
        }
        Some(if self.url.starts_with("http://") {
            "is the API served over TLS? Then use https:// with --api-ca"
        } else if !self.presents_certificate {
            "does the API require a client certificate (its [tls] ca is set)? Then give --api-cert and --api-key"
        } else {
            "the TLS session failed: is the client certificate one the API's CA signed?"
        })
    }

    pub async fn list(&mut self) -> Result<Vec<Miner>, OperatorError> {
        let miners = self
            .client
            .list_miners(v1::ListMinersRequest {})
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        Ok(miners.miners.into_iter().map(Miner::from).collect())
    }

    /// `true` if the miner was registered.
    pub async fn remove(&mut self, url: &str) -> Result<bool, OperatorError> {
        let request = v1::RemoveMinerRequest { url: url.into() };
        Ok(self
            .client
            .remove_miner(request)
            .await
            .map_err(|s| self.refused(s))?
            .into_inner()
            .removed)
    }

    /// Stored verdicts, newest first, following the API's pages up to `query.limit`. The API
    /// pages by its own tokens, so `query.before_id` is not used.
    pub async fn verdicts(&mut self, query: &VerdictFilter) -> Result<Vec<Verdict>, OperatorError> {
        let mut out = Vec::new();
        let mut page_token = String::new();
        while (out.len() as u32) < query.limit {
            let request = v1::ListVerdictsRequest {
                miner_url: query.miner_url.clone().unwrap_or_default(),
                passed: query.passed,
                since_unix_ms: query.since_ms,
                page_size: (query.limit - out.len() as u32).min(500),
                page_token,
            };
            let page = self
                .client
                .list_verdicts(request)
                .await
                .map_err(|s| self.refused(s))?
                .into_inner();
            // An empty page that names a next one would have us ask forever: a server that
            // misbehaves gets what it sent so far.
            let progressed = !page.verdicts.is_empty();
            out.extend(page.verdicts.iter().map(verdict_from_wire));
            if page.next_page_token.is_empty() || !progressed {
                break;
            }
            page_token = page.next_page_token;
        }
        out.truncate(query.limit as usize);
        Ok(out)
    }

    /// Every verdict the validator stores, as it stores it, oldest first (WatchVerdicts,
    /// PROTOCOL.md 16.2): those with ids above `after` first when given, else only those stored
    /// from now on. A lost connection is taken up again from the last verdict seen, so none is
    /// missed across a restart of the validator. Returns `Ok` once `on_verdict` says stop, and
    /// otherwise only on a refusal.
    pub async fn follow(
        &mut self,
        after: Option<u64>,
        miner_url: Option<String>,
        mut on_verdict: impl FnMut(Verdict) -> bool,
    ) -> Result<(), OperatorError> {
        // "From now on" is pinned to an id at once, so that a reconnect resumes from there.
        let mut after = match after {
            Some(id) => id,
            None => self.newest_verdict_id().await?,
        };
        loop {
            let lost = match self.watch_once(&mut after, &miner_url, &mut on_verdict).await? {
                Watched::Stopped => return Ok(()),
                Watched::Lost(why) => why,
            };
            eprintln!(
                "lost the validator at {} ({lost}); following again from verdict #{after} in {} s",
                self.url,
                RECONNECT.as_secs()
            );
            tokio::time::sleep(RECONNECT).await;
        }
    }

    /// One `WatchVerdicts` stream from `after`, moving `after` on with each verdict handed to
    /// `on_verdict`, until `on_verdict` stops or the stream is lost in a way a reconnect mends.
    async fn watch_once(
        &mut self,
        after: &mut u64,
        miner_url: &Option<String>,
        on_verdict: &mut impl FnMut(Verdict) -> bool,
    ) -> Result<Watched, OperatorError> {
        let request = v1::WatchVerdictsRequest {
            after_id: Some(*after),
            miner_url: miner_url.clone().unwrap_or_default(),
        };
        let mut stream = match self.client.watch_verdicts(request).await {
            Ok(stream) => stream.into_inner(),
            Err(s) if reconnectable(&s) => return Ok(Watched::Lost(s.message().to_string())),
            Err(s) => return Err(self.refused(s)),
        };
        loop {
            match stream.message().await {
                Ok(Some(verdict)) => {
                    *after = (*after).max(verdict.id);
                    if !on_verdict(verdict_from_wire(&verdict)) {
                        return Ok(Watched::Stopped);
                    }
                }
                Ok(None) => return Ok(Watched::Lost("the validator ended the stream".to_string())),
                Err(s) if reconnectable(&s) => return Ok(Watched::Lost(s.message().to_string())),
                Err(s) => return Err(self.refused(s)),
            }
        }
    }

    /// The newest stored verdict's id (0 when there is none).
    async fn newest_verdict_id(&mut self) -> Result<u64, OperatorError> {
        let newest = VerdictFilter {
            limit: 1,
            ..Default::default()
        };
        Ok(self.verdicts(&newest).await?.first().map_or(0, |v| v.id))
    }

    /// The rate table the validator plans with (ListRates), as `validator rates show` has it.
    pub async fn rates(&mut self) -> Result<crate::rates::report::RateTable, OperatorError> {
        let table = self
            .client
            .list_rates(v1::ListRatesRequest {})
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        Ok(crate::rates::report::table_from_wire(&table))
    }

    /// Verdict `id`'s kept transcript (GetTranscript), whole: its chunks in order, checked
    /// against the size each one states.
    pub async fn transcript(&mut self, id: u64) -> Result<Vec<u8>, OperatorError> {
        let mut stream = self
            .client
            .get_transcript(v1::GetTranscriptRequest { verdict_id: id })
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        let (mut bytes, mut total) = (Vec::new(), 0);
        while let Some(chunk) = stream.message().await.map_err(|s| self.refused(s))? {
            total = chunk
                .total_bytes
                .min(gpu_attest_proto::transcript::MAX_TRANSCRIPT_BYTES as u64);
            if bytes.len() as u64 + chunk.data.len() as u64 > total {
                break;
            }
            bytes.extend_from_slice(&chunk.data);
        }
        if bytes.len() as u64 != total {
            return Err(OperatorError::Refused {
                code: tonic::Code::DataLoss,
                message: format!(
                    "verdict {id}'s transcript came to {} bytes of the {total} it stated; ask again",
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    /// Every revoked key, newest revocation first.
    pub async fn revoked(&mut self) -> Result<Vec<Revoked>, OperatorError> {
        let keys = self
            .client
            .list_revoked_keys(v1::ListRevokedKeysRequest {})
            .await
            .map_err(|s| self.refused(s))?
            .into_inner()
            .keys;
        Ok(keys
            .into_iter()
            .map(|k| Revoked {
                miner_key: hex::encode(&k.miner_key),
                reason: k.reason,
                revoked_at_unix_ms: k.revoked_at_unix_ms,
            })
            .collect())
    }

    /// Attests the miner at `url` now (AttestMiner): `on_event` sees each phase and progress
    /// event as the validator sends it, and the stored verdict is returned.
    pub async fn attest(
        &mut self,
        url: &str,
        mut on_event: impl FnMut(&v1::attest_event::Event),
    ) -> Result<Verdict, OperatorError> {
        let mut events = self
            .client
            .attest_miner(v1::AttestMinerRequest { url: url.into() })
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        while let Some(event) = events.message().await.map_err(|s| self.refused(s))? {
            match event.event {
                Some(v1::attest_event::Event::Verdict(verdict)) => return Ok(verdict_from_wire(&verdict)),
                Some(other) => on_event(&other),
                None => {}
            }
        }
        Err(OperatorError::NoVerdict(self.url.clone()))
    }

    /// `true` if the key was not revoked before.
    pub async fn revoke(&mut self, key_hex: &str, reason: &str) -> Result<bool, OperatorError> {
        let key = hex::decode(key_hex)
            .ok()
            .and_then(|bytes| PublicKey::from_slice(&bytes).ok())
            .ok_or_else(|| OperatorError::BadKey(key_hex.into()))?;
        let request = v1::RevokeMinerKeyRequest {
            miner_key: key.0.to_vec(),
            reason: reason.into(),
        };
        Ok(self
            .client
            .revoke_miner_key(request)
            .await
            .map_err(|s| self.refused(s))?
            .into_inner()
            .newly_revoked)
    }
}
