//! Logs: structured, to stderr, the level from the environment. Colour only on a terminal, so
//! that files and the journal get plain text; JSON lines for a log pipeline on request.

use std::io::IsTerminal;

/// The variable that picks the log format: `text` (the default) or `json`.
pub const FORMAT_VARIABLE: &str = "GPU_ATTEST_LOG_FORMAT";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{FORMAT_VARIABLE}={0:?} is not a log format: use text or json")]
pub struct UnknownLogFormat(pub String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per event for people; coloured only when stderr is a terminal and `NO_COLOR`
    /// is unset.
    Text,
    /// One JSON object per line, for a log pipeline.
    Json,
}

impl LogFormat {
    /// The format `value` (of [`FORMAT_VARIABLE`]) names; unset means text.
    pub fn parse(value: Option<&str>) -> Result<Self, UnknownLogFormat> {
        match value.map(str::trim) {
            None | Some("" | "text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(other) => Err(UnknownLogFormat(other.to_owned())),
        }
    }
}

/// Structured logs to stderr; the level comes from `GPU_ATTEST_LOG` (default `info`), the format
/// from [`FORMAT_VARIABLE`].
pub fn init_logging() -> Result<(), UnknownLogFormat> {
    let format = LogFormat::parse(std::env::var(FORMAT_VARIABLE).ok().as_deref())?;
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPU_ATTEST_LOG").unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            logs.with_ansi(colour).init();
        }
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_text_unless_json_is_asked_for() {
        assert_eq!(LogFormat::parse(None), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some("text")), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some(" json ")), Ok(LogFormat::Json));
        let refused = LogFormat::parse(Some("yaml")).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "GPU_ATTEST_LOG_FORMAT=\"yaml\" is not a log format: use text or json"
        );
    }
}
