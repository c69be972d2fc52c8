//! The daemons' TOML config files: defaults overlaid with a file, errors in one line.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::Path;
use thiserror::Error;

/// The most CPU threads a daemon may be told to use: far above any machine's cores, and low
/// enough that a typo cannot make it start thousands of threads.
pub const MAX_CPU_THREADS: usize = 1024;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    /// One line: where in the file, and what is wrong there. (The TOML error's own text spans
    /// several lines with a snippet; the daemons print errors as one line.)
    #[error("config file {path} is not valid: {location}{message}")]
    Parse {
        path: String,
        location: String,
        message: String,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The defaults overlaid with `path`'s TOML, if a path is given. Keys the file leaves out keep
/// their defaults (configs use `#[serde(default)]`); unknown keys are an error.
pub fn load_config<T: DeserializeOwned + Default>(path: Option<&Path>) -> Result<T, ConfigError> {
    let Some(path) = path else { return Ok(T::default()) };
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    parse_config(&text, &shown)
}

/// The defaults overlaid with the TOML `text`, read from the file `shown` (for the message).
pub fn parse_config<T: DeserializeOwned + Default>(text: &str, shown: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e: toml::de::Error| ConfigError::Parse {
        path: shown.to_owned(),
        location: e.span().map_or_else(String::new, |span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: ")
        }),
        message: e.message().trim().replace('\n', "; "),
    })
}

/// A config as TOML: what `--print-config` shows, and a complete file to start from.
pub fn config_to_toml<T: Serialize>(config: &T) -> String {
    toml::to_string_pretty(config).expect("configs serialise to TOML")
}
