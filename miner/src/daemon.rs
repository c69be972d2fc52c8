//! `miner serve` as a library: the core built from a config (backend, key, allow-list, nonce
//! log), then the gRPC server and the metrics endpoint until shutdown, with SIGHUP reloading
//! the allow-list. The binary calls [`run`]; tests call the same builders.

use crate::answers::AnswerLog;
use crate::backends::{self, BackendSelectError};
use crate::config::MinerConfig;
use crate::core::MinerCore;
use crate::nonces::{NonceLog, NonceLogError};
use crate::server;
use gpu_attest_daemon::config::ConfigError;
use gpu_attest_daemon::run::{Daemon, Network, ServeError};
use gpu_attest_shared::keys::{KeyError, KeyPair, PublicKey};
use gpu_attest_shared::params::PROTOCOL_VERSION;
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tracing::{info, warn};

/// Why a miner could not start or stopped serving.
#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("{source}{hint}", hint = if source.is_missing() { format!("; run `miner keygen --key-file {path}` first") } else { String::new() })]
    Key { path: String, source: KeyError },
    #[error(
        "allowed validator {0:?} is not a 64-hex-digit ed25519 key that can sign (a valid point, not of small order)"
    )]
    AllowedKey(String),
    #[error(transparent)]
    Backend(#[from] BackendSelectError),
    #[error(transparent)]
    Nonces(#[from] NonceLogError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// The validators' keys in `keys`, each checked.
pub fn parse_allowed(keys: &[String]) -> Result<HashSet<PublicKey>, DaemonError> {
    keys.iter()
        .map(|key| {
            PublicKey::from_hex(key)
                .filter(|k| k.check_usable().is_ok())
                .ok_or_else(|| DaemonError::AllowedKey(key.clone()))
        })
        .collect()
}

/// The miner `config` describes, its backend selected and checked.
pub fn core(config: &MinerConfig) -> Result<MinerCore, DaemonError> {
    let selected = backends::select(config)?;
    let identity = KeyPair::load_file(&config.key_file).map_err(|source| DaemonError::Key {
        path: config.key_file.display().to_string(),
        source,
    })?;
    let allowed = parse_allowed(&config.allowed_validators)?;
    if allowed.is_empty() {
        warn!("no validator is allowed (allowed_validators is empty): every challenge will be refused");
    }
    for note in &selected.notes {
        info!("{note}");
    }
    let nonce_file = config.nonce_file();
    let nonces = NonceLog::open(&nonce_file, crate::core::now_ms())?;
    let shown = std::path::absolute(&nonce_file).unwrap_or_else(|_| nonce_file.clone());
    info!(path = %shown.display(), "nonce log");
    let mut core = MinerCore::new(
        identity,
        allowed,
        config.limits.clone(),
        selected,
        Duration::from_secs(config.keep_commitments_secs),
        nonces,
    );
    if config.answers.enabled {
        let dir = config.answers_dir();
        let shown = std::path::absolute(&dir).unwrap_or_else(|_| dir.clone());
        // The record is the operator's evidence, not the miner's work: a directory it cannot
        // write stops the record, never the miner.
        match AnswerLog::open(&dir, config.answers.keep_days) {
            Ok(log) => {
                info!(path = %shown.display(), keep_days = config.answers.keep_days, "answer log");
                core = core.with_answer_log(log);
            }
            Err(e) => warn!(
                error = %e,
                "no answer log: this miner keeps no record of what it answers (set [answers] dir to a writable directory, or enabled = false)"
            ),
        }
    }
    if config.limits.protocol_4 && core.protocol_version() == PROTOCOL_VERSION {
        // Asked to say 4, it says 3: the version 4 walk's self-check failed (the note above
        // says why), and validators of this release refuse version 3's memory phase.
        warn!(
            "this miner says protocol version 3, not 4: validators of this release refuse its memory phase (or, with [memory] required = false, attest its compute only); the self-check note above says why version 4 is off"
        );
    }
    Ok(core)
}

/// Serves `config`'s miner until `shutdown` completes: gRPC on `config.listen`, metrics when
/// `[metrics] listen` is set. On SIGHUP, `reload` gives the configuration again and its
/// allow-list replaces the current one. Logging must be set up by the caller.
pub async fn run(
    config: MinerConfig,
    reload: impl Fn() -> Result<MinerConfig, ConfigError> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let network = Network {
        listen: config.listen,
        tls: &config.tls,
        allow_plaintext: config.allow_plaintext,
        metrics: &config.metrics,
        health: &config.health,
    };
    let tls = network.server_tls()?;
    let health_probe = network.health_probe()?;
    let core = Arc::new(core(&config)?);
    let options = server::ServeOptions {
        tls,
        health_probe,
        connections: gpu_attest_daemon::connections::limits_for_this_process(),
        ..server::plaintext_options(&config.limits)
    };
    let with_tls = options.tls.is_some();
    let daemon = Daemon {
        name: "miner",
        exposition: || core.metrics().exposition(),
        announce: |address| {
            let selected = core.backend();
            info!(
                %address,
                miner_key = %core.public_key(),
                backend = %selected.name,
                kernel = %selected.kernel,
                tls = with_tls,
                "miner listening"
            )
        },
        grpc: |listener| async {
            let reloader = tokio::spawn(reload_on_hangup(core.clone(), reload));
            let served = server::serve(core.clone(), listener, options, shutdown).await;
            reloader.abort();
            served
        },
        out_of_service: || core.backend().backend.out_of_service(),
    };
    Ok(gpu_attest_daemon::run::serve(network, daemon).await?)
}

/// SIGHUP re-reads the configuration's allow-list: adding or revoking a validator needs no
/// restart, and a revoked validator can no longer open its earlier commitments either.
async fn reload_on_hangup(core: Arc<MinerCore>, reload: impl Fn() -> Result<MinerConfig, ConfigError>) {
    #[cfg(unix)]
    {
        let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            return;
        };
        while hangups.recv().await.is_some() {
            let allowed = reload()
                .map_err(|e| e.to_string())
                .and_then(|c| parse_allowed(&c.allowed_validators).map_err(|e| e.to_string()));
            match allowed {
                Ok(allowed) => info!(validators = core.set_allowed(allowed), "allow-list reloaded"),
                Err(e) => warn!(error = %e, "allow-list not reloaded; keeping the current one"),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (core, reload);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A validator key under which nothing verifies (small order, or no point at all) on the
    /// allow-list is a mistake to name at start, not a validator that is silently never served.
    #[test]
    fn the_allow_list_takes_only_keys_that_can_sign() {
        let real = KeyPair::from_seed([3; 32]).public_key().to_hex();
        assert_eq!(parse_allowed(std::slice::from_ref(&real)).unwrap().len(), 1);
        let identity_point = format!("01{}", "00".repeat(31));
        for bad in [
            identity_point,
            "00".repeat(32),
            format!("02{}", "00".repeat(31)),
            "xyz".into(),
        ] {
            let err = parse_allowed(&[real.clone(), bad.clone()]).unwrap_err();
            assert!(
                err.to_string().contains(&bad) && err.to_string().contains("small order"),
                "{err}"
            );
        }
    }
}
