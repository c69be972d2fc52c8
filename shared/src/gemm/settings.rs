//! The engine's tuning settings from the environment: how much of k a pass takes
//! ([`K_BLOCK_ENV`]) and whether the kernels get cache hints ([`CACHE_HINTS_ENV`]). Neither
//! changes a result; a value that is neither a setting nor "auto" is refused, not ignored.

use super::{CACHE_HINTS_ENV, GemmError, K_BLOCK_ENV};

/// [`K_BLOCK_ENV`]: None when unset, empty or "auto".
pub(super) fn k_block_from_env() -> Result<Option<usize>, GemmError> {
    match std::env::var(K_BLOCK_ENV) {
        Ok(given) => parse_k_block(&given),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(given)) => Err(GemmError::BadKBlock {
            given: given.to_string_lossy().into_owned(),
        }),
    }
}

fn parse_k_block(given: &str) -> Result<Option<usize>, GemmError> {
    let value = given.trim();
    if value.is_empty() || value.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match value.parse::<usize>() {
        Ok(k) if k > 0 && k.is_multiple_of(64) => Ok(Some(k)),
        _ => Err(GemmError::BadKBlock {
            given: given.to_string(),
        }),
    }
}

/// [`CACHE_HINTS_ENV`]: on unless it says "off".
pub(super) fn cache_hints_from_env() -> Result<bool, GemmError> {
    match std::env::var(CACHE_HINTS_ENV) {
        Ok(given) => parse_cache_hints(&given),
        Err(std::env::VarError::NotPresent) => Ok(true),
        Err(std::env::VarError::NotUnicode(given)) => Err(GemmError::BadCacheHints {
            given: given.to_string_lossy().into_owned(),
        }),
    }
}

fn parse_cache_hints(given: &str) -> Result<bool, GemmError> {
    match given.trim().to_ascii_lowercase().as_str() {
        "" | "auto" | "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(GemmError::BadCacheHints {
            given: given.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_block_setting_takes_multiples_of_64_or_auto() {
        assert_eq!(parse_k_block("auto").unwrap(), None);
        assert_eq!(parse_k_block(" ").unwrap(), None);
        assert_eq!(parse_k_block(" 512 ").unwrap(), Some(512));
        for bad in ["0", "100", "-64", "1k"] {
            let err = parse_k_block(bad).unwrap_err().to_string();
            assert!(
                err.contains(K_BLOCK_ENV) && err.contains(bad) && err.contains("multiple of 64"),
                "{err}"
            );
        }
    }

    #[test]
    fn cache_hint_setting_is_auto_on_or_off() {
        for on in ["", " auto", "ON", "on "] {
            assert!(parse_cache_hints(on).unwrap(), "{on:?}");
        }
        assert!(!parse_cache_hints("Off").unwrap());
        let err = parse_cache_hints("nta").unwrap_err().to_string();
        assert!(
            err.contains(CACHE_HINTS_ENV) && err.contains("nta") && err.contains("off"),
            "{err}"
        );
    }
}
