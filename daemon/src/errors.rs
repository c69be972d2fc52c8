//! Errors as a person reads them: one line, each cause once.

/// An error and its causes on one line, joined by ": ". Most of the project's errors already
/// print their cause in their own message ("key file x: No such file or directory"), and a
/// plain walk of the chain would print it again for every level that did; so a cause whose
/// text its immediate parent's message already holds is left out. Causes that add something
/// (tonic's "transport error" hides the reason two levels down) are kept, even when the same
/// words occur further out in the line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut parent = line.clone();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !parent.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        parent = text;
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("key file {path}: {source}")]
    struct KeyFile {
        path: String,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{source}; run `keygen` first")]
    struct Startup {
        source: KeyFile,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("transport error")]
    struct Transport {
        source: std::io::Error,
    }

    fn not_found() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory")
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let e = Startup {
            source: KeyFile {
                path: "/k".into(),
                source: not_found(),
            },
        };
        assert_eq!(
            error_chain(&e),
            "key file /k: No such file or directory; run `keygen` first"
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("request timed out: {source}")]
    struct Request {
        source: Transport,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("timed out")]
    struct TimedOut;

    /// "timed out" occurs further out in the line, but the level above it ("transport error")
    /// does not carry it, so it is the reason and stays.
    #[test]
    fn a_short_cause_repeated_only_further_out_is_kept() {
        let e = Request {
            source: Transport {
                source: std::io::Error::other(TimedOut),
            },
        };
        assert_eq!(error_chain(&e), "request timed out: transport error: timed out");
    }

    #[test]
    fn a_cause_that_adds_something_is_kept() {
        let e = Transport { source: not_found() };
        assert_eq!(error_chain(&e), "transport error: No such file or directory");
    }
}
