//! Telling this validator's own failure to decode a miner's message from a status the miner
//! sent. tonic reports both as a `Status`; PROTOCOL.md 14.1 says a receiver's decode failure is
//! never the peer's refusal or failure, so each is stored as the `malformed-*` reason of the
//! message it was reading.
//!
//! The statuses are told apart by what tonic's decoder writes (the code and the start of the
//! message). A miner can send a status that reads the same, which only changes which failure its
//! verdict names: both fail.

use tonic::{Code, Status};

/// What went wrong decoding, for the reason's message, when `status` is this validator's own
/// failure to decode what the miner sent; `None` when the miner sent the status.
pub fn own_decode_failure(status: &Status) -> Option<String> {
    let message = status.message();
    let ours = match status.code() {
        // The length prefix is over the limit this validator set for the message.
        Code::OutOfRange => message.starts_with("Error, decoded message length too large"),
        Code::Internal => {
            // Not a protobuf message of the method's type.
            message.starts_with("failed to decode Protobuf message")
                // The stream ended inside a message: its length prefix promised more. (With
                // trailers after the short message, tonic reports a unary answer as missing.)
                || message == "Unexpected EOF decoding stream."
                || message == "Missing response message."
                // A compression flag other than 0 or 1, or one without an encoding.
                || message.starts_with("protocol error: received message with")
                || message.starts_with("Error decompressing")
        }
        Code::ResourceExhausted => message.starts_with("Error decompressing"),
        _ => false,
    };
    ours.then(|| could_not_decode(message))
}

/// The reason's words for a message this validator could not decode, tonic's `message` given.
pub fn could_not_decode(message: &str) -> String {
    format!("it could not be decoded ({})", message.trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoders_own_statuses_are_told_from_the_miners() {
        for ours in [
            Status::out_of_range(
                "Error, decoded message length too large: found 100000000 bytes, the limit is: 1048576 bytes",
            ),
            Status::internal("failed to decode Protobuf message: WalkStatement.nonce: invalid wire type"),
            Status::internal("Unexpected EOF decoding stream."),
            Status::internal("Missing response message."),
            Status::internal(
                "protocol error: received message with invalid compression flag: 7 (valid flags are 0 and 1)",
            ),
        ] {
            let said = own_decode_failure(&ours);
            assert!(
                said.as_deref()
                    .is_some_and(|s| s.starts_with("it could not be decoded")),
                "{ours:?}"
            );
        }
        for theirs in [
            Status::internal("the walk kernel faulted"),
            Status::out_of_range("walk_steps is past this miner's limit"),
            Status::unavailable("Error, decoded message length too large"),
            Status::resource_exhausted("busy"),
        ] {
            assert_eq!(own_decode_failure(&theirs), None, "{theirs:?}");
        }
    }
}
