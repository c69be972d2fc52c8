//! `validator public-key`, `keygen` and `tls-certs`: the files a deployment starts from.

use super::{Answer, CommandError};
use gpu_attest_daemon::certs::CertsRequest;
use gpu_attest_shared::identity::Identity;
use std::path::Path;

/// Prints the public key of an existing key file, for allow-lists and registration.
pub(super) fn public_key(key_file: &Path) -> Result<Answer, CommandError> {
    println!("{}", Identity::load_file(key_file)?.public_key());
    Ok(Answer::Yes)
}

/// Creates the validator's key file (owner-only; never overwrites) and prints its public key.
pub(super) fn keygen(key_file: &Path) -> Result<Answer, CommandError> {
    let identity = Identity::create_file(key_file)?;
    println!("wrote {} (owner-only)", key_file.display());
    println!("public key: {}", identity.public_key());
    Ok(Answer::Yes)
}

/// Makes a private CA and the certificates `request` names in `out`, then says which config
/// setting takes which file.
pub(super) fn tls_certs(out: &Path, request: CertsRequest) -> Result<Answer, CommandError> {
    for path in gpu_attest_daemon::certs::make(out, &request)? {
        println!("wrote {}", path.display());
    }
    println!(
        "validator: [tls] cert/key = validator.pem/validator.key, ca = ca.pem (mutual TLS); [miner_tls] ca = ca.pem, cert/key = validator.pem/validator.key"
    );
    println!(
        "each miner: [tls] cert/key = miner-HOST.pem/miner-HOST.key, ca = ca.pem to require the validator's certificate"
    );
    println!("operators: --api https://HOST:PORT --api-ca ca.pem --api-cert operator.pem --api-key operator.key");
    Ok(Answer::Yes)
}
