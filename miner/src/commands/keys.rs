//! `miner public-key` and `keygen`: the miner's identity.

use super::{Answer, CommandError};
use gpu_attest_shared::identity::Identity;
use std::path::Path;

/// Prints the public key of an existing key file, for the validator's operator.
pub(super) fn public_key(key_file: &Path) -> Result<Answer, CommandError> {
    println!("{}", Identity::load_file(key_file)?.public_key());
    Ok(Answer::Yes)
}

/// Creates the miner's key file (owner-only; never overwrites) and prints its public key.
pub(super) fn keygen(key_file: &Path) -> Result<Answer, CommandError> {
    let identity = Identity::create_file(key_file)?;
    println!("wrote {} (owner-only)", key_file.display());
    println!("public key: {}", identity.public_key());
    Ok(Answer::Yes)
}
