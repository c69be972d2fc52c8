//! `validator tls-certs`: the certificates a first deployment starts from (the key files come
//! from `keygen`, which both daemons share).

use super::{Answer, CommandError};
use gpu_attest_daemon::certs::CertsRequest;
use std::path::Path;

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
