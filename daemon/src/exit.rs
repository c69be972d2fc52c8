//! Exit statuses, the same for both binaries (README, "Exit statuses"), so that a script or a
//! supervisor reads them one way.

/// The command ran and its answer is no: an attestation whose verdict is FAIL, a self-check
/// that a kernel failed.
pub const ANSWER_NO: u8 = 1;

/// The command ran and its answer is yes in part: an audit that confirmed everything it could
/// re-derive and took the rest as stated (it lists what).
pub const ANSWER_IN_PART: u8 = 3;

/// The command could not do what was asked: bad usage, a bad config or key file, a peer out of
/// reach, a database error. Command-line usage errors (clap's) have this status too.
pub const ERROR: u8 = 2;

/// A device went out of service (EX_TEMPFAIL): a fresh process is expected to get it back.
pub use crate::devices::EXIT_DEVICE_FAULT as DEVICE_FAULT;

/// What a command that ran to its end says: yes (a pass, a job done) or no (a fail verdict, a
/// kernel that failed its self-check). Errors are the other statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Yes,
    No,
    /// Yes for what could be checked, the rest unchecked: [`ANSWER_IN_PART`].
    InPart,
}

impl Answer {
    /// Yes for a pass, no for a fail.
    pub fn from_passed(passed: bool) -> Self {
        if passed { Answer::Yes } else { Answer::No }
    }

    /// Its exit status: 0, or [`ANSWER_NO`].
    pub fn exit_status(self) -> u8 {
        match self {
            Answer::Yes => 0,
            Answer::No => ANSWER_NO,
            Answer::InPart => ANSWER_IN_PART,
        }
    }
}
