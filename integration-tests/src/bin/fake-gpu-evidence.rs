//! The GPUs of the fake NVML (`fake-driver/libnvidia-ml.c`), signing with the test PKI:
//! `fake-gpu-evidence report <index> <nonce hex>` prints GPU `index`'s attestation report over
//! that nonce as hex; `fake-gpu-evidence chain <index>` prints its certificate chain as PEM.
//! GPU `index` is test device `00FACE00000000<index>`.

use gpu_attest_integration_tests::test_pki::{ReportSpec, TestPki, signed_report};
use std::process::ExitCode;

fn gpu(index: &str) -> Option<TestPki> {
    let index: u8 = index.parse().ok().filter(|i| *i < 16)?;
    Some(TestPki::device(0x70 + index, &format!("00FACE00000000{index:02X}")))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["report", index, nonce] => {
            let (Some(pki), Ok(Ok(nonce))) = (gpu(index), hex::decode(nonce).map(<[u8; 32]>::try_from)) else {
                return ExitCode::FAILURE;
            };
            print!("{}", hex::encode(signed_report(&pki.leaf_key, &ReportSpec::new(nonce))));
            ExitCode::SUCCESS
        }
        ["chain", index] => match gpu(index) {
            Some(pki) => {
                print!("{}", pki.chain_pem());
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
        _ => {
            eprintln!("usage: fake-gpu-evidence report <index> <nonce hex> | chain <index>");
            ExitCode::FAILURE
        }
    }
}
