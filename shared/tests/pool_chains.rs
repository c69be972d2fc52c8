//! Version 4's pool on the CPU backend (PROTOCOL.md 20.1): the chain phase keeps the final
//! states of each device's first `N_j` chains, and nothing else changes. The commitment is the
//! plain execution's, each kept state is the one its chain's last checkpoint hashes, and the
//! walk over the kept states gives PROTOCOL.md 20.6's roots.

use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::engine::{self, EngineError, execute_with_pools};
use gpu_attest_shared::memory::chain_pool::{ChainPoolError, ChainPoolParamsError};
use gpu_attest_shared::memory::slice::SLICE_BYTES;
use gpu_attest_shared::memory::slice_walk::SliceWalk;
use gpu_attest_shared::reference;
use gpu_attest_shared::{CancelToken, ChallengeParams, Digest, Work};

use gpu_attest_shared::vectors::{v4_vector_params as params, v4_walk_seed};

fn hex(d: Digest) -> String {
    d.to_hex()
}

#[test]
fn the_kept_states_walk_to_the_published_roots() {
    let work = Work::new(params()).unwrap();
    let cpu = CpuBackend::new(2, None).unwrap();
    let plain = engine::execute(&cpu, &work, &|_| {}, &CancelToken::new()).unwrap();
    let kept = execute_with_pools(&cpu, &work, &[2], &|_| {}, &CancelToken::new()).unwrap();
    assert_eq!(
        kept.execution.commitment, plain.commitment,
        "keeping states changes no hash"
    );
    assert_eq!(kept.pools.len(), 1);
    let walk = SliceWalk {
        nonce: params().nonce,
        walk_seed: v4_walk_seed(),
        global: plain.commitment.global,
        walkers: 2,
        steps: 8,
    };
    let told = std::sync::Mutex::new(None);
    let walked = kept.pools[0]
        .walk(&walk, &CancelToken::new(), &|root| *told.lock().unwrap() = Some(root))
        .unwrap();
    assert_eq!(
        *told.lock().unwrap(),
        Some(walked.root),
        "the walk told its root as it ended"
    );
    // PROTOCOL.md 20.6: walker roots 0 and 1, and walk_root_0.
    assert_eq!(
        hex(walked.walker_roots[0]),
        "bdeac83a16e3a8f48520a88286865e17e9815a02b9b36c8d82b58d0d3ea4e1fa"
    );
    assert_eq!(
        hex(walked.walker_roots[1]),
        "38698f51c74b267b52271242aa8ff957c31fd961dbe9c823cd85523e3527222e"
    );
    assert_eq!(
        hex(walked.root),
        "36a2a25de267bf7f64b56911b53dcefe1de76b6a0bf944f8a395d0ee28a3de9a"
    );
}

/// Two logical devices, each keeping its own first chains: pool `j` starts at device `j`'s
/// offset, and every slice of it is the reference state's bytes.
#[test]
fn each_device_keeps_its_own_first_chains() {
    let params = ChallengeParams {
        n: 256,
        num_chains: 5,
        iterations: 3,
        checkpoint_every: 1,
        ..params()
    };
    let work = Work::new(params).unwrap();
    let cpu = CpuBackend::new(2, None).unwrap().with_logical_devices(2);
    let kept = execute_with_pools(&cpu, &work, &[2, 1], &|_| {}, &CancelToken::new()).unwrap();
    let devices = &kept.execution.commitment.devices;
    assert_eq!(kept.pools.len(), 2);
    for (j, (pool, wanted)) in kept.pools.iter().zip([2u64, 1]).enumerate() {
        let source = pool.host_states().expect("the CPU backend's states are in host memory");
        let described = pool.pool();
        assert_eq!(described.device, j as u32);
        assert_eq!(
            described.first_chain, devices[j].slice.offset,
            "device {j}'s pool starts at its offset"
        );
        assert_eq!(described.chains, wanted);
        for e in 0..described.slices() {
            let (chain, q) = described.locate(e);
            let state = reference::chain_state(work.key(), chain, 256, 3);
            assert_eq!(
                source.slice(e),
                &state.as_bytes()[q as usize * SLICE_BYTES..][..SLICE_BYTES],
                "device {j}, slice {e}"
            );
            assert_eq!(
                Some(&state.digest()),
                kept.execution.chains[chain as usize].checkpoints.last(),
                "the kept state is the one the commitment hashes"
            );
        }
    }
}

#[test]
fn pools_the_chains_cannot_fill_are_refused_before_any_work() {
    let params = ChallengeParams {
        n: 256,
        num_chains: 4,
        iterations: 1,
        checkpoint_every: 1,
        ..params()
    };
    let work = Work::new(params).unwrap();
    let cpu = CpuBackend::new(1, None).unwrap().with_logical_devices(2);
    let run = |pools: &[u64]| {
        execute_with_pools(&cpu, &work, pools, &|_| {}, &CancelToken::new())
            .err()
            .expect("refused")
    };
    let pool = |e| EngineError::Pool(e);
    assert_eq!(
        run(&[1]),
        pool(ChainPoolParamsError::PoolCount { given: 1, devices: 2 })
    );
    assert_eq!(
        run(&[1, 3]),
        pool(ChainPoolParamsError::OverChains {
            device: 1,
            pool: 3,
            chains: 2
        })
    );
    assert_eq!(run(&[1, 0]), pool(ChainPoolError::Empty { device: 1 }.into()));
    let odd = Work::new(ChallengeParams { n: 320, ..params }).unwrap();
    let refused = execute_with_pools(&cpu, &odd, &[1, 1], &|_| {}, &CancelToken::new()).err();
    assert_eq!(refused, Some(pool(ChainPoolError::NotWholeSlices(320).into())));
}
