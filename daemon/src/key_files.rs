//! `public-key` and `keygen`, which both daemons offer alike: the ed25519 key a daemon signs
//! its statements with, in a file of its own (`gpu_attest_shared::keys`).

use gpu_attest_shared::keys::{KeyError, KeyPair};
use std::path::Path;

/// Prints the public key of an existing key file, for allow-lists and registration.
pub fn print_public_key(key_file: &Path) -> Result<(), KeyError> {
    println!("{}", KeyPair::load_file(key_file)?.public_key());
    Ok(())
}

/// Creates a key file (owner-only; never overwrites) and prints where, and its public key.
/// With `keep_existing`, a key file already there is loaded instead (so a bad one is still an
/// error) and its public key printed: a service's first-start step then says nothing alarming
/// on every later start.
pub fn create_and_print(key_file: &Path, keep_existing: bool) -> Result<(), KeyError> {
    let keys = match KeyPair::create_file(key_file) {
        Ok(keys) => {
            println!("wrote {} (owner-only)", key_file.display());
            keys
        }
        Err(KeyError::Exists { .. }) if keep_existing => {
            let keys = KeyPair::load_file(key_file)?;
            println!("kept {} (already there)", key_file.display());
            keys
        }
        Err(error) => return Err(error),
    };
    println!("public key: {}", keys.public_key());
    Ok(())
}
