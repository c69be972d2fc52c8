//! The miners whose scheduled attempts could not attest them, as this validator's scheduler
//! saw it: how many attempts in a row, and the latest error. The scheduler writes it and the API
//! shows it (`miners list`), so that a miner that refuses this validator, or cannot be reached,
//! shows outside the logs.

use std::collections::HashMap;
use std::sync::Mutex;

/// A miner backed off: attempts in a row that could not attest it, and the latest error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    pub failures: u32,
    pub last_error: String,
}

/// Every miner in backoff, by URL.
#[derive(Debug, Default)]
pub struct Backoffs(Mutex<HashMap<String, Backoff>>);

impl Backoffs {
    /// An attempt at `url` failed; `failures` counts it.
    pub fn failed(&self, url: &str, failures: u32, error: String) {
        self.lock().insert(
            url.to_string(),
            Backoff {
                failures,
                last_error: error,
            },
        );
    }

    /// An attempt at `url` gave a verdict (or the miner was removed): it is in backoff no more.
    pub fn clear(&self, url: &str) {
        self.lock().remove(url);
    }

    pub fn get(&self, url: &str) -> Option<Backoff> {
        self.lock().get(url).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Backoff>> {
        // A panic elsewhere while holding it leaves a map that is still whole.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_ends_the_backoff() {
        let backoffs = Backoffs::default();
        assert_eq!(backoffs.get("http://a"), None);
        backoffs.failed("http://a", 1, "refused".into());
        backoffs.failed("http://a", 2, "unreachable".into());
        assert_eq!(
            backoffs.get("http://a"),
            Some(Backoff {
                failures: 2,
                last_error: "unreachable".into()
            })
        );
        backoffs.clear("http://a");
        assert_eq!(backoffs.get("http://a"), None);
    }
}
