//! One connection to one miner, used for the whole attestation: inventory, challenge and
//! openings go over the same channel, so the miner that was sized is the miner that answers.

use super::AttestError;
use super::decoding::own_decode_failure;
use crate::config::ValidatorConfig;
use crate::untrusted::miner_text;
use gpu_attest_daemon::dial::{DialError, dial, made_by_the_connection};
use gpu_attest_daemon::errors::error_chain;
use gpu_attest_daemon::tls::check_plaintext_client;
use gpu_attest_proto::convert::{challenge_to_wire, inventory_from_wire};
use gpu_attest_proto::v1::{self, miner_client::MinerClient};
use gpu_attest_shared::inventory::Inventory;
use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::statement::Challenge;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

/// Largest message accepted from a miner besides an opening: an inventory, a progress event or a
/// commitment, each at most some tens of KiB (64 devices, their text held to the limits of
/// PROTOCOL.md 14.2).
pub const MAX_MINER_MESSAGE_BYTES: usize = 1 << 20;

/// Largest opening accepted for a challenge of size n: its n*n matrix, plus at most 1025
/// checkpoint hashes, 64 proof siblings and a signature, well inside the 1 MiB beside it. An
/// opening sized for n = 8192 (64 MiB) is refused while decoding at a smaller n, so a miner
/// cannot make the validator hold more than the challenge calls for.
pub fn max_opening_bytes(n: usize) -> usize {
    n * n + MAX_MINER_MESSAGE_BYTES
}
/// The TCP connect alone, inside the whole dial's bound (`deadline.connect_ms`): a host that
/// does not answer SYNs is given up on sooner.
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts `host:port` as shorthand for `http://host:port`.
pub fn normalise_url(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

/// The longest miner URL accepted: a scheme, a host name of at most 253 bytes and a port.
pub const MAX_URL_BYTES: usize = 300;

/// Why `url` (already normalised) is not a miner address this validator dials:
/// `http://` or `https://` (lower case), a host and an optional port, and nothing else. A
/// path, query, fragment or user name would be ignored or sent somewhere unseen, and the same
/// miner written two ways would be two miners.
pub fn miner_url_problem(url: &str) -> Option<&'static str> {
    if url.len() > MAX_URL_BYTES {
        return Some("it is longer than any host and port");
    }
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return Some("a miner URL starts with http:// or https:// (lower case)");
    };
    if rest.is_empty() {
        return Some("it names no host");
    }
    if rest.contains('@') {
        return Some("it holds a user name or password, which a miner does not take");
    }
    if rest.contains(['/', '?', '#']) {
        return Some("a miner URL is a host and a port only: no path, query or fragment (and no trailing /)");
    }
    if rest.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Some("it holds a space or a control character");
    }
    None
}

/// `url` as an error may quote it: any password and query left out (as the store shows its
/// own URL), escaped, and at most 128 characters, since it came from outside and may be
/// anything.
pub fn shown_url(url: &str) -> String {
    let redacted = crate::store::redact_url(url);
    crate::untrusted::miner_text(&redacted.chars().take(128).collect::<String>())
        + if redacted.chars().count() > 128 { "..." } else { "" }
}

pub struct MinerConnection {
    url: String,
    client: MinerClient<Channel>,
    /// The bound on reaching the miner, used again for its answer to `GetInventory`.
    answer_within: Duration,
}

impl MinerConnection {
    /// Connects to the miner at `url` (already normalised) with the validator's TLS settings,
    /// within `deadline.connect_ms` for the TCP connect and the handshakes together.
    pub async fn connect(url: &str, config: &ValidatorConfig) -> Result<Self, AttestError> {
        let bad_url = |detail: String| AttestError::BadUrl {
            url: shown_url(url),
            detail,
        };
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| bad_url(e.to_string()))?
            .connect_timeout(TCP_CONNECT_TIMEOUT);
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(config.miner_tls.client_config(url)?)
                .map_err(|e| bad_url(error_chain(&e)))?;
        } else if let Some(warning) = check_plaintext_client(url, config.allow_plaintext_miners)? {
            tracing::warn!("{warning}");
        }
        let answer_within = Duration::from_millis(config.deadline.connect_ms);
        let channel = dial(&endpoint, answer_within).await.map_err(|e| match e {
            DialError::TimedOut { .. } => AttestError::TimedOut {
                url: url.into(),
                detail: e.to_string(),
            },
            DialError::Transport(e) => AttestError::Unreachable {
                url: url.into(),
                detail: error_chain(&e),
            },
        })?;
        Ok(MinerConnection {
            url: url.into(),
            client: MinerClient::new(channel).max_decoding_message_size(MAX_MINER_MESSAGE_BYTES),
            answer_within,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The miner's inventory, converted and checked (protocol version, device count), and
    /// whether the miner says its allow-list holds `asking`, this validator's key: a hint for
    /// operators that nothing else may rely on (PROTOCOL.md 14.2).
    pub async fn inventory(&mut self, asking: PublicKey) -> Result<(Inventory, v1::ValidatorStanding), AttestError> {
        // The bound is kept here, not sent as the call's grpc-timeout: tonic would then enforce
        // it too, at the same instant, and report its own expiry as a cancelled call.
        let request = tonic::Request::new(v1::GetInventoryRequest {
            validator_key: asking.0.to_vec(),
        });
        let answered = tokio::time::timeout(self.answer_within, self.client.get_inventory(request)).await;
        let Ok(answered) = answered else {
            return Err(AttestError::TimedOut {
                url: self.url.clone(),
                detail: format!(
                    "connected, but no answer to GetInventory within {} ms (a host that accepts connections and never answers, one that is stopped or overloaded, or something that is not a gRPC server)",
                    self.answer_within.as_millis()
                ),
            });
        };
        let wire = answered
            .map_err(|s| match (own_decode_failure(&s), s.code()) {
                (Some(why), _) => AttestError::NotAMiner {
                    url: self.url.clone(),
                    detail: format!("its inventory: {why}"),
                },
                // Cancelled: the connection ended under the call (the client's own status for a
                // connection its peer closed or reset, as a crowded miner does): not an answer.
                (None, Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled) => AttestError::Unreachable {
                    url: self.url.clone(),
                    detail: miner_text(s.message()),
                },
                // The connection failed under the call (tonic reports that as Unknown, with the
                // transport error as its source): the miner did not answer, wrongly or at all.
                (None, Code::Unknown) if made_by_the_connection(&s) => AttestError::Unreachable {
                    url: self.url.clone(),
                    detail: error_chain(&s),
                },
                (None, code) => AttestError::NotAMiner {
                    url: self.url.clone(),
                    detail: format!("GetInventory answered {code:?}: {}", miner_text(s.message())),
                },
            })?
            .into_inner();
        let inventory = inventory_from_wire(&wire).map_err(|e| AttestError::NotAMiner {
            url: self.url.clone(),
            detail: format!("malformed inventory: {e}"),
        })?;
        inventory.check().map_err(|source| AttestError::Inventory {
            url: self.url.clone(),
            source,
        })?;
        // An enum value this release does not know says nothing.
        let standing =
            v1::ValidatorStanding::try_from(wire.validator_standing).unwrap_or(v1::ValidatorStanding::Unstated);
        Ok((inventory, standing))
    }

    /// Sends the signed challenge; a refusal before the stream starts is an error, not a verdict.
    pub async fn run_challenge(
        &mut self,
        challenge: &Challenge,
        signature: &[u8; 64],
    ) -> Result<Streaming<v1::ChallengeEvent>, AttestError> {
        match self.client.run_challenge(challenge_to_wire(challenge, signature)).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(refused(&self.url, status)),
        }
    }

    /// Asks for openings of a challenge of size `n`, accepting messages of at most
    /// [`max_opening_bytes`]`(n)`.
    pub async fn open_chains(
        &mut self,
        request: v1::OpenChainsRequest,
        n: usize,
    ) -> Result<Streaming<v1::ChainOpening>, Status> {
        let mut client = self.client.clone().max_decoding_message_size(max_opening_bytes(n));
        Ok(client.open_chains(request).await?.into_inner())
    }
}

impl MinerConnection {
    /// Asks the miner to walk its committed pools (PROTOCOL.md 18.4).
    pub async fn walk_pool(&mut self, request: v1::WalkRequest) -> Result<v1::WalkStatement, Status> {
        Ok(self.client.walk_pool(request).await?.into_inner())
    }

    /// Asks the miner to walk its kept states (PROTOCOL.md 20.8): one signed root per device,
    /// each as its device's walk ends.
    pub async fn walk_states(&mut self, request: v1::WalkRequest) -> Result<Streaming<v1::DeviceWalkRoot>, Status> {
        Ok(self.client.walk_states(request).await?.into_inner())
    }

    /// Asks the miner for the locality walk (PROTOCOL.md 20.10): one signed root per device.
    pub async fn walk_lines(&mut self, request: v1::LocalityRequest) -> Result<Streaming<v1::DeviceWalkRoot>, Status> {
        Ok(self.client.walk_lines(request).await?.into_inner())
    }

    /// Asks for locality segments, accepting messages of at most `max_bytes`.
    pub async fn open_lines(
        &mut self,
        request: v1::OpenLinesRequest,
        max_bytes: usize,
    ) -> Result<Streaming<v1::LocalityOpening>, Status> {
        let mut client = self.client.clone().max_decoding_message_size(max_bytes);
        Ok(client.open_lines(request).await?.into_inner())
    }
}

/// A status the miner answered instead of working: what it means for the caller. (A miner that
/// cannot be reached at all fails at `connect`, before any status.)
pub fn refused(url: &str, status: Status) -> AttestError {
    match status.code() {
        Code::Unimplemented => AttestError::NotAMiner {
            url: url.into(),
            detail: format!("RunChallenge: {}", miner_text(status.message())),
        },
        code => AttestError::Refused {
            url: url.into(),
            code,
            message: miner_text(status.message()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miner_url_is_a_scheme_a_host_and_a_port() {
        for good in [
            "http://127.0.0.1:7070",
            "https://gpu-host.example:443",
            "http://[::1]:7070",
            "http://rig",
        ] {
            assert_eq!(miner_url_problem(good), None, "{good}");
        }
        for bad in [
            "ftp://127.0.0.1:7070",
            "HTTP://127.0.0.1:7070",
            "http://",
            "http://127.0.0.1:7070/",
            "http://127.0.0.1:7070/miner",
            "http://127.0.0.1:7070?x=1",
            "http://127.0.0.1:7070#top",
            "http://user:secret@127.0.0.1:7070",
            "http://127.0.0.1:70 70",
        ] {
            assert!(miner_url_problem(bad).is_some(), "{bad}");
        }
        assert!(miner_url_problem(&format!("http://{}", "a".repeat(MAX_URL_BYTES))).is_some());
        assert_eq!(normalise_url("127.0.0.1:7070"), "http://127.0.0.1:7070");
    }

    #[test]
    fn a_quoted_url_shows_no_password_and_at_most_a_line() {
        assert_eq!(
            shown_url("http://user:secret@127.0.0.1:7070?token=x"),
            "http://user:***@127.0.0.1:7070"
        );
        let long = shown_url(&format!("http://{}", "a".repeat(500_000)));
        assert_eq!(long.len(), 131, "{long}");
        assert!(long.ends_with("aaa..."));
        assert_eq!(shown_url("http://x\u{1b}[2J"), "http://x\\u{1b}[2J");
    }
}
