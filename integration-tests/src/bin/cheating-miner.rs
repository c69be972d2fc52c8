//! A dishonest miner daemon, for the soak (`scripts/soak.sh`) and for trying a validator by hand.
//! It is the real miner's core on the CPU backend with one thing changed:
//! - `--cheat NAME` changes one step of the honest flow (`--list` names them all);
//! - `--claim-cores N` states N cores per device while computing on `--threads`: with N above
//!   the threads, a miner that proves less compute than it claims (its timing must fail it).
//!
//! It prints `listening on ADDRESS` once it serves, as the miner does, and stops on SIGTERM or
//! Ctrl-C. It lives with the tests, never in the miner.

use clap::Parser;
use gpu_attest_integration_tests::cheats::{Cheat, CheatingMiner};
use gpu_attest_miner::MinerCore;
use gpu_attest_miner::backends::SelectedBackend;
use gpu_attest_miner::config::Limits;
use gpu_attest_miner::nonces::NonceLog;
use gpu_attest_shared::cpu::{CpuBackend, DEFAULT_CLAIMED_MEMORY_BYTES};
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "A dishonest gpu-attest miner on the CPU backend, for soaks and manual checks")]
struct Args {
    /// The step it cheats on; none: the honest flow (with `--claim-cores`, an under-provisioned
    /// miner).
    #[arg(long)]
    cheat: Option<String>,
    /// Lists the cheats and exits.
    #[arg(long)]
    list: bool,
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Its identity key (made with `miner keygen`).
    #[arg(long, required_unless_present = "list")]
    key_file: Option<PathBuf>,
    /// Public key (hex) of a validator it answers; repeatable.
    #[arg(long = "allow-validator")]
    allowed: Vec<String>,
    /// Threads it computes on.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Cores each device states; default: the threads.
    #[arg(long)]
    claim_cores: Option<u32>,
    /// Devices the CPU is presented as (sharing the threads).
    #[arg(long, default_value_t = 1)]
    devices: u32,
    /// Memory each device claims and fills in the memory phase, in MiB (the miner's
    /// `cpu_memory_mib`).
    #[arg(long, default_value_t = DEFAULT_CLAIMED_MEMORY_BYTES >> 20, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    memory_mib: u64,
}

fn backend(args: &Args) -> Result<SelectedBackend, String> {
    let cpu = CpuBackend::new(args.threads, None).map_err(|e| e.to_string())?;
    let cores = args.claim_cores.unwrap_or(cpu.threads() as u32);
    let cpu = cpu
        .claiming(cores, args.memory_mib << 20)
        .with_logical_devices(args.devices);
    Ok(SelectedBackend {
        kernel: cpu.kernel().to_string(),
        backend: Arc::new(cpu),
        name: "cpu".into(),
        notes: Vec::new(),
        self_checks: Vec::new(),
    })
}

async fn serve(args: Args, cheat: Option<Cheat>) -> Result<(), String> {
    let key_file = args.key_file.as_ref().expect("clap requires it without --list");
    let identity = KeyPair::load_file(key_file).map_err(|e| format!("{}: {e}", key_file.display()))?;
    let mut allowed = HashSet::new();
    for key in &args.allowed {
        allowed.insert(PublicKey::from_hex(key).ok_or_else(|| format!("--allow-validator {key}: not a public key"))?);
    }
    let core = Arc::new(MinerCore::new(
        identity,
        allowed,
        Limits::default(),
        backend(&args)?,
        Duration::from_secs(60),
        NonceLog::in_memory(),
    ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", args.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on {address}");
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    let served = match cheat {
        Some(cheat) => {
            tonic::transport::Server::builder()
                .add_service(CheatingMiner::new(core, cheat).into_service())
                .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), stop)
                .await
        }
        None => {
            let options = gpu_attest_miner::server::plaintext_options(&Limits::default());
            gpu_attest_miner::server::serve(core, listener, options, stop).await
        }
    };
    served.map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    // Set up as the real `miner` binary is, so the soak compares like with like.
    gpu_attest_daemon::allocator::return_freed_memory();
    let args = Args::parse();
    if args.list {
        for (_, name) in Cheat::NAMED {
            println!("{name}");
        }
        return ExitCode::SUCCESS;
    }
    let cheat = match args.cheat.as_deref().map(|name| (name, Cheat::from_name(name))) {
        None => None,
        Some((_, Some(cheat))) => Some(cheat),
        Some((name, None)) => {
            eprintln!("cheating-miner: no cheat is named {name:?}; --list names them");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cheating-miner: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args, cheat)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cheating-miner: {e}");
            ExitCode::FAILURE
        }
    }
}
