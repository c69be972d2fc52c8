//! The dishonest miners of the library's `cheats`, served on loopback for a test.

pub use gpu_attest_integration_tests::cheats::*;

use super::Running;
use gpu_attest_miner::MinerCore;
use std::sync::Arc;

pub async fn spawn_cheater(core: Arc<MinerCore>, cheat: Cheat) -> Running {
    let (listener, address) = super::listener().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CheatingMiner::new(core, cheat).into_service())
            .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    Running {
        address,
        stop: Some(stop),
    }
}
