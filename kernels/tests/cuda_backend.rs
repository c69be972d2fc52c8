//! The CUDA backend against the CPU backend, bit for bit: every kernel, several n, M, K and c,
//! every single device and the multi-device split, chain openings (`advance`), and the memory
//! phase's pools, walks and walk openings.
//!
//! Needs a CUDA GPU, so every test is ignored by default: `cargo test` lists them as ignored on
//! a machine without one (CI has none), and `scripts/gpu-check.sh` runs them with `--ignored` on
//! a GPU host, where no GPU is a failure, never a pass.

use gpu_attest_kernels::detect::detect;
use gpu_attest_kernels::plan;
use gpu_attest_kernels::pool::WalkLimits;
use gpu_attest_kernels::{CudaBackend, CudaOptions, GpuInfo, GpuKernel};
use gpu_attest_shared::backend::{Backend, CancelToken, ResidentPool};
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::engine::{PoolExecution, execute, execute_with_pools};
use gpu_attest_shared::gemm::CpuGemm;
use gpu_attest_shared::matrix::generate_a;
use gpu_attest_shared::memory::chain_pool::ChainPoolParams;
use gpu_attest_shared::memory::check::{CommittedEntries, check_segment};
use gpu_attest_shared::memory::locality::{ChunkPaths, LocalityWalk};
use gpu_attest_shared::memory::pool::{HostPool, PoolBytes, entry_rows_match, make_entry};
use gpu_attest_shared::memory::slice_walk::{
    DeviceCommitments, DeviceWalk as StateWalk, SliceWalk, StepOpening, check_step,
};
use gpu_attest_shared::memory::walk::{WalkSpec, walk_all};
use gpu_attest_shared::memory::{MemoryParams, PoolSpec};
use gpu_attest_shared::merkle::MerkleTree;
use gpu_attest_shared::params::{ChallengeParams, Work};

/// The GPUs of this host; a run without any fails (these tests run only when asked for).
fn gpus() -> Vec<GpuInfo> {
    match detect() {
        Ok(d) => d.gpus,
        Err(e) => panic!("no GPU to test on: {e}"),
    }
}

/// The CUDA backend on `gpu` alone, with the kernel `auto` chooses.
fn backend_on(gpu: &GpuInfo) -> CudaBackend {
    CudaBackend::new(&CudaOptions {
        ordinals: Some(vec![gpu.ordinal]),
        ..CudaOptions::default()
    })
    .unwrap()
}

fn work(n: u32, num_chains: u64, iterations: u32, checkpoint_every: u32, tag: u8) -> Work {
    Work::new(ChallengeParams {
        nonce: [tag; 32],
        seed: [tag.wrapping_add(1); 32],
        miner_key: [tag.wrapping_add(2); 32],
        n,
        num_chains,
        iterations,
        checkpoint_every,
    })
    .unwrap()
}

/// Every kernel all `gpus` run, or of those only the ones GPU_ATTEST_TEST_KERNELS names (a comma
/// list): scripts/gpu-check.sh tests a kernel that has not yet run on a GPU in a process of its
/// own, so that a fault in it (which poisons the process's contexts) cannot fail the others.
fn kernels_for(gpus: &[GpuInfo]) -> Vec<GpuKernel> {
    let named: Option<Vec<GpuKernel>> = std::env::var("GPU_ATTEST_TEST_KERNELS").ok().map(|list| {
        list.split(',')
            .map(|name| {
                name.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("GPU_ATTEST_TEST_KERNELS: {e}"))
            })
            .collect()
    });
    GpuKernel::ALL
        .into_iter()
        .filter(|k| named.as_ref().is_none_or(|named| named.contains(k)))
        .filter(|k| gpus.iter().all(|g| k.supports(g.compute_capability)))
        .collect()
}

/// Shapes that cover: the smallest n, n not a multiple of the tensor kernel's 128 tile, one
/// chain and many (batching), K = c and c < K, and one large n.
const SHAPES: [(u32, u64, u32, u32); 6] = [
    (64, 5, 3, 1),
    (192, 3, 4, 2),
    (256, 17, 2, 2),
    (512, 2, 6, 3),
    (1024, 2, 2, 1),
    (2048, 1, 2, 2),
];

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn every_kernel_matches_the_cpu_on_every_device() {
    let gpus = gpus();
    let cpu = CpuBackend::new(0, None).unwrap();
    let cancel = CancelToken::new();
    for kernel in kernels_for(&gpus) {
        for gpu in &gpus {
            let options = CudaOptions {
                ordinals: Some(vec![gpu.ordinal]),
                kernel: Some(kernel),
                ..CudaOptions::default()
            };
            let cuda = CudaBackend::new(&options).unwrap();
            for (tag, &(n, m, k, c)) in SHAPES.iter().enumerate() {
                let work = work(n, m, k, c, tag as u8);
                let want = execute(&cpu, &work, &|_| {}, &cancel).unwrap();
                let got = execute(&cuda, &work, &|_| {}, &cancel).unwrap();
                assert_eq!(
                    got.chains, want.chains,
                    "{kernel} on device {} ({}) differs at n={n} M={m} K={k} c={c}",
                    gpu.ordinal, gpu.name
                );
                println!("ok: {kernel} on {} ({}) n={n} M={m} K={k} c={c}", gpu.ordinal, gpu.name);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn multi_gpu_split_commits_like_the_cpu_with_as_many_devices() {
    let gpus = gpus();
    let cancel = CancelToken::new();
    // Every GPU, and (with 3 or more) a subset given out of order.
    let mut subsets: Vec<Vec<u32>> = vec![gpus.iter().map(|g| g.ordinal).collect()];
    if gpus.len() >= 3 {
        subsets.push(vec![gpus[2].ordinal, gpus[0].ordinal]);
    }
    for ordinals in subsets {
        let cuda = CudaBackend::new(&CudaOptions {
            ordinals: Some(ordinals.clone()),
            ..CudaOptions::default()
        })
        .unwrap();
        let cpu = CpuBackend::new(0, None)
            .unwrap()
            .with_logical_devices(cuda.device_count());
        for (m, tag) in [(1u64, 40u8), (7, 41), (cuda.device_count() as u64 * 3 + 1, 42)] {
            let work = work(256, m, 3, 1, tag);
            let want = execute(&cpu, &work, &|_| {}, &cancel).unwrap();
            let got = execute(&cuda, &work, &|_| {}, &cancel).unwrap();
            assert_eq!(got.commitment, want.commitment, "devices {ordinals:?}, M={m}");
            println!("ok: devices {ordinals:?} M={m}: G = {}", got.commitment.global);
        }
    }
}

/// The test mode of several slots a GPU (`CudaOptions::slots_per_gpu`): one GPU opened as two
/// slots, each with a context of its own, its own streams and its own host thread, exactly as
/// separate GPUs are. A device's chains are split over its slots by the canonical partition at
/// their offsets, and the commitment must be the CPU's bit for bit, for every shape and with
/// progress reaching every chain; then every GPU of the host, each as two slots, against the
/// CPU with as many devices (the device-sorted roots and the global checksum). The claim stays
/// one device per GPU. What it cannot show: peer-to-peer copies, PCIe or NVLink topology, or a
/// fault on one GPU leaving another running.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn one_gpu_opened_as_two_slots_commits_like_the_cpu() {
    let gpus = gpus();
    let cancel = CancelToken::new();
    let on_slots = |ordinals: Vec<u32>| {
        CudaBackend::new(&CudaOptions {
            ordinals: Some(ordinals),
            slots_per_gpu: 2,
            ..CudaOptions::default()
        })
        .unwrap()
    };
    let one = on_slots(vec![gpus[0].ordinal]);
    assert_eq!(one.device_count(), 1, "the claim is the hardware: one device");
    assert_eq!(one.devices().len(), 1);
    assert!(!one.holds_pools() && !one.keeps_chain_pools(), "slots hold no pool");
    assert!(one.describe().contains("2 slots"), "{}", one.describe());
    let cpu = CpuBackend::new(0, None).unwrap();
    for (tag, &(n, m, k, c)) in SHAPES.iter().enumerate() {
        let work = work(n, m, k, c, 80 + tag as u8);
        let want = execute(&cpu, &work, &|_| {}, &cancel).unwrap();
        let most = std::sync::atomic::AtomicU64::new(0);
        let got = execute(
            &one,
            &work,
            &|p| {
                most.fetch_max(p.done, std::sync::atomic::Ordering::Relaxed);
            },
            &cancel,
        )
        .unwrap();
        assert_eq!(
            got.commitment, want.commitment,
            "two slots of {}: n={n} M={m} K={k} c={c}",
            gpus[0].name
        );
        assert_eq!(got.chains, want.chains);
        assert_eq!(most.into_inner(), m, "progress reaches every chain");
        println!("ok: two slots of {} n={n} M={m} K={k} c={c}", gpus[0].name);
    }
    let all = on_slots(gpus.iter().map(|g| g.ordinal).collect());
    let cpu = CpuBackend::new(0, None)
        .unwrap()
        .with_logical_devices(all.device_count());
    for (m, tag) in [(1u64, 90u8), (all.device_count() as u64 * 5 + 3, 91)] {
        let work = work(256, m, 3, 1, tag);
        let want = execute(&cpu, &work, &|_| {}, &cancel).unwrap();
        let got = execute(&all, &work, &|_| {}, &cancel).unwrap();
        assert_eq!(
            got.commitment,
            want.commitment,
            "{} GPUs as two slots each, M={m}",
            gpus.len()
        );
        println!(
            "ok: {} GPUs as two slots each, M={m}: G = {}",
            gpus.len(),
            got.commitment.global
        );
    }
}

/// Checkpoints hashed on the host (the fallback) and on the device agree with the CPU.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn host_and_device_hashing_agree() {
    let _ = gpus();
    let cancel = CancelToken::new();
    let cpu = CpuBackend::new(0, None).unwrap();
    let on_host = CudaBackend::new(&CudaOptions {
        ordinals: Some(vec![0]),
        host_hashing: true,
        ..CudaOptions::default()
    })
    .unwrap();
    for (n, m, k, c) in [(64u32, 9u64, 4u32, 2u32), (192, 2, 2, 1), (1024, 3, 2, 2)] {
        let work = work(n, m, k, c, 60);
        let want = execute(&cpu, &work, &|_| {}, &cancel).unwrap();
        let got = execute(&on_host, &work, &|_| {}, &cancel).unwrap();
        assert_eq!(got.chains, want.chains, "host hashing, n={n} M={m} K={k} c={c}");
    }
    println!("ok: host hashing on {}", on_host.describe());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn advance_matches_the_cpu() {
    let _ = gpus();
    let cancel = CancelToken::new();
    let cpu = CpuBackend::new(0, None).unwrap();
    let cuda = CudaBackend::new(&CudaOptions::default()).unwrap();
    for n in [64u32, 320, 1024] {
        let work = work(n, 4, 9, 3, 77);
        let start = generate_a(work.key(), 3, work.n());
        for (first, steps) in [(0u32, 3u32), (3, 3), (2, 7), (8, 1)] {
            let want = cpu.advance(&work, 3, start.clone(), first, steps, &cancel).unwrap();
            let got = cuda.advance(&work, 3, start.clone(), first, steps, &cancel).unwrap();
            assert_eq!(got, want, "n={n} steps {first}..{}", first + steps);
        }
    }
    println!("ok: advance on {}", cuda.describe());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn cancellation_stops_a_gpu_challenge() {
    let _ = gpus();
    let cuda = CudaBackend::new(&CudaOptions::default()).unwrap();
    let cancel = CancelToken::new();
    cancel.cancel();
    let err = execute(&cuda, &work(1024, 8, 64, 8, 9), &|_| {}, &cancel).unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
    // The devices stay usable afterwards.
    let again = execute(&cuda, &work(64, 2, 2, 1, 10), &|_| {}, &CancelToken::new());
    assert!(again.is_ok(), "{again:?}");
}

/// A walk over a pool's entries, the same for the GPU and the CPU.
fn walk_over(pool: &dyn ResidentPool, walkers: u32, walk_steps: u32, walk_checkpoint_every: u32) -> WalkSpec {
    WalkSpec {
        nonce: [0x31; 32],
        walk_seed: [0x32; 32],
        device: pool.spec().device(),
        pool_root: pool.root(),
        entries: pool.spec().entries(),
        params: MemoryParams {
            pool_permille: 950,
            walkers,
            walk_steps,
            walk_checkpoint_every,
        },
    }
}

/// A pool filled on the GPU is the CPU's, entry for entry (the same root), with every kernel and
/// both ways of hashing; its walk gives the CPU's checkpoints, carried over several launches and
/// several rounds of copies; and its openings are the CPU's, and pass the validator's check.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn a_gpu_pool_is_the_cpu_pool_and_walks_and_opens_as_it_does() {
    let gpus = gpus();
    let cancel = CancelToken::new();
    let cpu = CpuBackend::new(0, None).unwrap();
    let work = work(64, 1, 1, 1, 50);
    let spec = PoolSpec::with_entries(&work, 0, 37);
    let cpu_pool = cpu.fill_pool(&spec, &|_| {}, &cancel).unwrap();
    // 300 walkers, 8 steps a launch, 5 segments of checkpoints: 8 launches in 4 rounds.
    let walk = walk_over(cpu_pool.as_ref(), 300, 64, 4);
    let limits = WalkLimits {
        launch_bytes: 300 * 8 * 65536,
        checkpoint_bytes: 300 * 32 * 5,
    };
    let want = cpu_pool.walk(&walk, &cancel).unwrap();
    let rows: Vec<u32> = (0..256).step_by(17).collect();
    for kernel in kernels_for(&gpus) {
        for host_hashing in [false, true] {
            let cuda = CudaBackend::new(&CudaOptions {
                ordinals: Some(vec![gpus[0].ordinal]),
                kernel: Some(kernel),
                host_hashing,
                ..CudaOptions::default()
            })
            .unwrap();
            assert!(cuda.holds_pools());
            let pool = cuda
                .fill_device_pool(&spec, &|_| {}, &cancel)
                .unwrap()
                .with_walk_limits(limits);
            let case = format!(
                "{kernel}, hashing on the {}",
                if host_hashing { "host" } else { "device" }
            );
            assert_eq!(pool.root(), cpu_pool.root(), "{case}: the pool root");
            let got = pool.walk(&walk, &cancel).unwrap();
            assert_eq!(got.traces, want.traces, "{case}: the walk's checkpoints");
            for (walker, segment) in [(0u32, 0u32), (1, 2), (299, 15), (150, 7)] {
                let opening = pool.open(&got, &walk, walker, segment).unwrap().unwrap();
                assert_eq!(
                    Some(&opening),
                    cpu_pool.open(&want, &walk, walker, segment).unwrap().as_ref(),
                    "{case}: opening of walker {walker} segment {segment}"
                );
                check_segment(&walk, &spec, &got.root(), (walker, segment), &opening, &|e, bytes| {
                    entry_rows_match(&spec, e, bytes, &rows)
                })
                .unwrap();
            }
            assert!(pool.open(&got, &walk, 300, 0).unwrap().is_none(), "no walker 300");
            assert!(pool.open(&got, &walk, 0, 16).unwrap().is_none(), "no segment 16");
            println!("ok: pool and walk on {} ({case})", gpus[0].name);
        }
    }
}

/// A pool of more entries than one batch makes: its root is that of its own bytes, read back
/// (so every leaf is in its place), the entries at the batch's edges are the work function's,
/// and the default walk over it is the CPU's walk over the same bytes.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn a_gpu_pool_past_one_batch_is_made_and_walked_whole() {
    let gpus = gpus();
    let cancel = CancelToken::new();
    let cuda = backend_on(&gpus[0]);
    let entries = plan::MAX_BATCH + 37;
    let spec = PoolSpec::with_entries(&work(64, 1, 1, 1, 51), 0, entries);
    let made = std::sync::atomic::AtomicU64::new(0);
    let pool = cuda
        .fill_device_pool(&spec, &|n| made.store(n, std::sync::atomic::Ordering::Relaxed), &cancel)
        .unwrap();
    assert_eq!(made.into_inner(), entries, "progress reaches every entry");
    let mut bytes = gpu_attest_shared::aligned::AlignedBytes::try_zeroed(spec.bytes() as usize).unwrap();
    for (e, slot) in bytes.as_mut_slice().chunks_mut(65536).enumerate() {
        slot.copy_from_slice(&pool.entry(e as u64).unwrap().0);
    }
    let host = HostPool::from_bytes(&spec, PoolBytes::new(bytes).unwrap()).unwrap();
    assert_eq!(
        host.root(),
        pool.root(),
        "the root commits to the entries where they lie"
    );
    let gemm = CpuGemm::new(0, None).unwrap();
    for e in [0, plan::MAX_BATCH - 1, plan::MAX_BATCH, entries - 1] {
        assert_eq!(host.entry_bytes(e), make_entry(&gemm, &spec, e).as_bytes(), "entry {e}");
    }
    let walk = walk_over(&pool, 8192, 16, 8);
    let got = pool.walk(&walk, &cancel).unwrap();
    let want = walk_all(&host, &walk, &cancel).unwrap();
    assert_eq!(got.root(), want.root(), "the walk root");
    println!(
        "ok: a pool of {entries} entries and a walk of 8192 walkers on {}",
        gpus[0].name
    );
}

/// The memory phase as a challenge runs it on a whole GPU: chains of a large n first, then a pool
/// of 95% of the device's claimed memory in what they leave (their buffers must count as free
/// again), walked; then a fill cancelled part-way, after which the next pool still fits.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn a_challenge_sized_pool_fits_after_the_chains_and_after_a_cancelled_fill() {
    let gpus = gpus();
    let cuda = backend_on(&gpus[0]);
    let claimed = cuda.devices()[0].memory_bytes;
    let chains = work(2048, 4, 4, 2, 52);
    execute(&cuda, &chains, &|_| {}, &CancelToken::new()).unwrap();
    let spec = PoolSpec::new(&chains, 0, claimed, 950).unwrap();
    cuda.check_pool_capacity(&spec).unwrap();
    let started = std::time::Instant::now();
    let pool = cuda.fill_device_pool(&spec, &|_| {}, &CancelToken::new()).unwrap();
    let fill_seconds = started.elapsed().as_secs_f64();
    let rows: Vec<u32> = (0..256).step_by(51).collect();
    for e in [0, spec.entries() / 2, spec.entries() - 1] {
        let (bytes, _) = pool.entry(e).unwrap();
        assert!(entry_rows_match(&spec, e, &bytes, &rows), "entry {e}");
    }
    let walk = walk_over(&pool, 8192, 64, 8);
    let started = std::time::Instant::now();
    let walked = pool.walk(&walk, &CancelToken::new()).unwrap();
    let walk_seconds = started.elapsed().as_secs_f64();
    assert_eq!(walked.traces.len(), 8192);
    let first_root = pool.root();
    drop(pool);
    // Cancelled after the first batch: the pool's memory must come back.
    let cancel = CancelToken::new();
    let stop = cancel.clone();
    let cancelled = cuda.fill_device_pool(&spec, &|_| stop.cancel(), &cancel);
    assert!(cancelled.is_err(), "a cancelled fill fails");
    cuda.check_pool_capacity(&spec).unwrap();
    let again = cuda.fill_device_pool(&spec, &|_| {}, &CancelToken::new()).unwrap();
    assert_eq!(again.root(), first_root, "the same pool again");
    println!(
        "ok: a pool of {} MiB ({} entries, 95% of {} MiB) on {}: filled in {fill_seconds:.1} s \
         ({:.0} TOPS at n = 256), 8192 walkers x 64 steps in {walk_seconds:.2} s ({:.0} GB/s)",
        spec.bytes() >> 20,
        spec.entries(),
        claimed >> 20,
        gpus[0].name,
        spec.fill_ops() as f64 / fill_seconds / 1e12,
        walk.params.walk_bytes() as f64 / walk_seconds / 1e9
    );
}

/// Opens step `step` of walker `walker` of device 0's version 4 walk and checks it as a
/// validator does, with rows of the slice made again from the work function.
fn open_and_check_v4(
    work: &Work,
    kept: &PoolExecution,
    walk: &SliceWalk,
    walked: &StateWalk,
    walker: u32,
    step: u32,
) -> StepOpening {
    let chains = &kept.execution.chains;
    let leaves: Vec<Digest> = chains.iter().map(|c| c.leaf()).collect();
    let tree = MerkleTree::new(&leaves);
    let chain = |i: u64| (chains[i as usize].checkpoints.clone(), tree.proof(i).unwrap());
    let opening = kept.pools[0]
        .open(walk, walked, walker, step, &chain)
        .unwrap()
        .unwrap_or_else(|| panic!("step {step} of walker {walker} opens"));
    let device = &kept.execution.commitment.devices[0];
    let committed = DeviceCommitments {
        device_root: device.root,
        device_chains: device.slice.count,
        walk_root: walked.root,
    };
    let pool = *kept.pools[0].pool();
    let rows: Vec<u32> = (0..pool.rows_per_slice()).step_by(7).collect();
    check_step(work, walk, &pool, &committed, &opening, &rows)
        .unwrap_or_else(|e| panic!("step {step} of walker {walker}: {e}"));
    opening
}

/// Version 4's locality walk on the GPU against the CPU, bit for bit, over pools kept by the
/// chains at n = 256 (one slice a state), 512 (four) and 2048 (64): every end state, generation
/// digest and the root, for 70 walkers (a leaf message of three chunks) over six generations,
/// and three openings, whose chunk paths come from slices hashed on the device where a state has
/// several. Run after the backend's self-checks, the locality walk's among them; and refused
/// (UNIMPLEMENTED, as a miner that cannot walk lines answers) where the miner has not turned it on.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn a_gpu_locality_walk_and_its_openings_are_the_cpus() {
    let gpus = gpus();
    let cpu = CpuBackend::new(0, None).unwrap();
    let cancel = CancelToken::new();
    for gpu in &gpus {
        let cuda = CudaBackend::new(&CudaOptions {
            ordinals: Some(vec![gpu.ordinal]),
            locality_walk: true,
            ..CudaOptions::default()
        })
        .unwrap();
        cuda.check_chain_pools().expect("the version 4 self-check");
        cuda.check_locality().expect("the locality walk's self-check");
        for (tag, (n, m, pool_chains)) in [(256u32, 6u64, 4u64), (512, 3, 2), (2048, 2, 2)]
            .into_iter()
            .enumerate()
        {
            let work = work(n, m, 2, 1, 90 + tag as u8);
            let want = execute_with_pools(&cpu, &work, &[pool_chains], &|_| {}, &cancel).unwrap();
            let got = execute_with_pools(&cuda, &work, &[pool_chains], &|_| {}, &cancel).unwrap();
            let walk = LocalityWalk {
                nonce: [tag as u8; 32],
                seed: [9; 32],
                global: want.execution.commitment.global,
                walkers: 70,
                generations: 6,
                steps: 40,
            };
            let walked = got.pools[0].walk_lines(&walk, &cancel).unwrap();
            let cpu_walked = want.pools[0].walk_lines(&walk, &cancel).unwrap();
            assert_eq!(walked, cpu_walked, "n = {n}: the locality walk");
            let no_chain = |_: u64| (Vec::new(), gpu_attest_shared::merkle::MerkleProof::default());
            let (gpu_paths, cpu_paths) = (ChunkPaths::default(), ChunkPaths::default());
            for segment in [(0, 0), (5, 69), (3, 17)] {
                let opened = got.pools[0]
                    .open_lines(&walk, &walked, segment, &no_chain, &gpu_paths)
                    .unwrap();
                let expected = want.pools[0]
                    .open_lines(&walk, &cpu_walked, segment, &no_chain, &cpu_paths)
                    .unwrap();
                assert!(opened.is_some(), "n = {n}: segment {segment:?} opened");
                assert_eq!(opened, expected, "n = {n}: the opening of segment {segment:?}");
            }
        }
        let off = backend_on(gpu);
        let work = work(256, 4, 2, 1, 99);
        let kept = execute_with_pools(&off, &work, &[2], &|_| {}, &cancel).unwrap();
        let walk = LocalityWalk {
            nonce: [99; 32],
            seed: [9; 32],
            global: kept.execution.commitment.global,
            walkers: 1,
            generations: 1,
            steps: 1,
        };
        assert!(
            matches!(
                kept.pools[0].walk_lines(&walk, &cancel),
                Err(gpu_attest_shared::backend::BackendError::Unsupported { .. })
            ),
            "a GPU walks lines only where the miner turned it on"
        );
    }
}

/// Version 4 on the GPU against the CPU, bit for bit: the commitment of chains whose first
/// ones keep their final states on the device, the walk over those states (every walker's kept
/// trace and root, over two launches, the second carrying on from the first's states), and
/// openings that a validator's `check_step` passes (one whose states lie in two blocks), at
/// n = 256 (one slice a state), 512 (PROTOCOL.md 20.6's shape: four) and 2048 (64), and at
/// n = 256 over more chains than one batch holds (4096), so that later batches keep their
/// states at their offsets in the pool.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn a_gpu_v4_pool_is_the_cpus_and_walks_and_opens_as_it_does() {
    let gpus = gpus();
    let cpu = CpuBackend::new(0, None).unwrap();
    let cancel = CancelToken::new();
    for gpu in &gpus {
        let cuda = backend_on(gpu);
        cuda.check_chain_pools().expect("the version 4 self-check");
        assert!(cuda.keeps_chain_pools());
        for (tag, (n, m, k, c, pool_chains)) in [
            (256u32, 6u64, 3u32, 1u32, 4u64),
            (512, 3, 2, 1, 2),
            (2048, 2, 2, 2, 1),
            (256, plan::MAX_BATCH + 100, 2, 1, plan::MAX_BATCH + 50),
        ]
        .into_iter()
        .enumerate()
        {
            let work = work(n, m, k, c, 60 + tag as u8);
            let want = execute_with_pools(&cpu, &work, &[pool_chains], &|_| {}, &cancel).unwrap();
            let got = execute_with_pools(&cuda, &work, &[pool_chains], &|_| {}, &cancel).unwrap();
            assert_eq!(
                got.execution.commitment, want.execution.commitment,
                "n = {n}: the commitment"
            );
            let walk = SliceWalk {
                nonce: [tag as u8; 32],
                walk_seed: [7; 32],
                global: want.execution.commitment.global,
                walkers: 300,
                steps: 150,
            };
            let told = std::sync::Mutex::new(None);
            let walked = got.pools[0]
                .walk(&walk, &cancel, &|root| *told.lock().unwrap() = Some(root))
                .unwrap();
            let cpu_walked = want.pools[0].walk(&walk, &cancel, &|_| {}).unwrap();
            assert_eq!(walked, cpu_walked, "n = {n}: the walk");
            assert_eq!(
                *told.lock().unwrap(),
                Some(walked.root),
                "n = {n}: the root told as it ended"
            );
            for (walker, step) in [(0, 0), (5, 63), (17, 64), (299, 149)] {
                let on_gpu = open_and_check_v4(&work, &got, &walk, &walked, walker, step);
                let on_cpu = open_and_check_v4(&work, &want, &walk, &cpu_walked, walker, step);
                assert_eq!(on_gpu, on_cpu, "n = {n}: step {step} of walker {walker}");
            }
        }
        println!(
            "ok: version 4 pools, walks and openings on {} match the CPU's",
            gpu.name
        );
    }
}

/// Version 4 as a challenge sizes it on a whole GPU: the final states of as many n = 2048
/// chains as fill 96% of the claimed memory (PROTOCOL.md 20.9's pool share), the batches of
/// the other chains beside them, walked by 8192 walkers; opened steps pass `check_step`.
/// Prints the chain phase's and the walk's times and the walk's bandwidth.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU host (scripts/gpu-check.sh does)"]
fn a_challenge_sized_v4_pool_fits_beside_its_chains_and_walks() {
    let gpus = gpus();
    let cuda = backend_on(&gpus[0]);
    let claimed = cuda.devices()[0].memory_bytes;
    let n = 2048u32;
    let pool_chains = (0.96 * claimed as f64 / f64::from(n * n)).floor() as u64;
    let work = work(n, pool_chains + 16, 2, 2, 70);
    let cancel = CancelToken::new();
    let started = std::time::Instant::now();
    let kept = execute_with_pools(&cuda, &work, &[pool_chains], &|_| {}, &cancel).unwrap();
    let chain_seconds = started.elapsed().as_secs_f64();
    let walk = SliceWalk {
        nonce: [1; 32],
        walk_seed: [2; 32],
        global: kept.execution.commitment.global,
        walkers: 8192,
        steps: 1024,
    };
    let started = std::time::Instant::now();
    let root_after = std::sync::Mutex::new(None);
    let walked = kept.pools[0]
        .walk(&walk, &cancel, &|_| {
            *root_after.lock().unwrap() = Some(started.elapsed())
        })
        .unwrap();
    let walk_seconds = started.elapsed().as_secs_f64();
    let root_seconds = root_after.lock().unwrap().expect("the root was told").as_secs_f64();
    for (walker, step) in [(0, 0), (4097, 512), (8191, 1023)] {
        open_and_check_v4(&work, &kept, &walk, &walked, walker, step);
    }
    let bytes = ChainPoolParams {
        walkers: walk.walkers,
        walk_steps: walk.steps,
        pool_chains: vec![pool_chains],
    }
    .walk_bytes() as f64;
    println!(
        "ok: version 4 on {}: {pool_chains} states of n = {n} ({} MiB, 96% of {} MiB) kept by {} chains in \
         {chain_seconds:.1} s; 8192 walkers x 1024 steps: root after {root_seconds:.3} s ({:.0} GB/s), \
         kept traces back after {walk_seconds:.3} s",
        gpus[0].name,
        (pool_chains * u64::from(n * n)) >> 20,
        claimed >> 20,
        work.num_chains(),
        bytes / root_seconds / 1e9
    );
}
