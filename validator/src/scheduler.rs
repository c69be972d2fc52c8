//! Attests every registered miner on an interval, one at a time, until shutdown.

use crate::attest::Attestor;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

pub async fn run(attestor: Arc<Attestor>, interval: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => break,
        }
        let miners = match attestor.store().miners() {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "scheduler cannot read registered miners");
                continue;
            }
        };
        for miner in miners {
            if *shutdown.borrow() {
                break;
            }
            let attest = attestor.attest(&miner.url, &|_| {});
            let result = tokio::select! {
                r = attest => r,
                _ = shutdown.changed() => break,
            };
            match result {
                Ok(v) if v.passed => info!(url = %miner.url, verdict = v.id, "scheduled attestation passed"),
                Ok(v) => warn!(url = %miner.url, verdict = v.id, reasons = ?v.reasons, "scheduled attestation failed"),
                Err(e) => warn!(url = %miner.url, error = %e, "scheduled attestation could not run"),
            }
        }
    }
    info!("scheduler stopped");
}
