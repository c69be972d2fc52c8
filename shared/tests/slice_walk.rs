//! Version 4's walk over the pool chains' final states, end to end in the engine: a device's
//! chains committed as the chain phase commits them, its pool walked, steps opened and checked.
//! Each cheater here is one of docs/design/protocol-v4.md section 9's, and each check it fails
//! is the defence named there. (These are the engine's tests, with chains made by the naive
//! reference; integration-tests/tests/timed/walk_v4.rs runs the walk through the miner's server.)

use gpu_attest_shared::chain::leaf_hash;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice::slice_path;
use gpu_attest_shared::memory::slice_walk::{
    DeviceCommitments, HeldStates, SliceSource, SliceWalk, StepOpening, StepRejection, check_step, open_kept_step,
    open_step, step, walk_device, walk_device_until, walker_states,
};
use gpu_attest_shared::memory::step::entry_index;
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use gpu_attest_shared::params::{ChallengeParams, Work};
use gpu_attest_shared::reference;
use gpu_attest_shared::{BackendError, CancelToken};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// One device of a challenge at n = 512 (4 slices a state): 6 chains of 2 steps, the first 4
/// of them its pool. Small enough for the naive reference; the planner's floor on K does not
/// apply to the engine.
struct Device {
    work: Work,
    pool: ChainPool,
    chains: Vec<Vec<Digest>>,
    states: Vec<Matrix>,
}

const N: u32 = 512;
const CHAINS: u64 = 6;
const POOL_CHAINS: u64 = 4;

impl Device {
    fn honest() -> Self {
        let work = Work::new(ChallengeParams {
            nonce: [3; 32],
            seed: [4; 32],
            miner_key: [5; 32],
            n: N,
            num_chains: CHAINS,
            iterations: 2,
            checkpoint_every: 1,
        })
        .unwrap();
        let chains = (0..CHAINS).map(|i| reference::chain(&work, i).checkpoints).collect();
        let states = (0..POOL_CHAINS)
            .map(|i| reference::chain_state(work.key(), i, N as usize, 2))
            .collect();
        Device {
            pool: ChainPool::new(0, 0, POOL_CHAINS, N as usize).unwrap(),
            work,
            chains,
            states,
        }
    }

    fn leaves(&self) -> Vec<Digest> {
        self.chains
            .iter()
            .enumerate()
            .map(|(i, c)| leaf_hash(i as u64, c))
            .collect()
    }

    fn held(&self) -> HeldStates {
        HeldStates::new(self.pool, self.states.clone()).unwrap()
    }

    fn chain_opening(&self) -> impl Fn(u64) -> (Vec<Digest>, MerkleProof) + '_ {
        let tree = MerkleTree::new(&self.leaves());
        move |i| (self.chains[i as usize].clone(), tree.proof(i).unwrap())
    }

    fn committed(&self, walk_root: Digest) -> DeviceCommitments {
        DeviceCommitments {
            device_root: MerkleTree::new(&self.leaves()).root(),
            device_chains: CHAINS,
            walk_root,
        }
    }
}

fn walk() -> SliceWalk {
    SliceWalk {
        nonce: [3; 32],
        walk_seed: [8; 32],
        global: Digest([9; 32]),
        walkers: 3,
        steps: 24,
    }
}

/// Every row of a slice at n = 512: 128.
fn all_rows() -> Vec<u32> {
    (0..128).collect()
}

#[test]
fn an_honest_device_passes_every_opened_step() {
    let device = Device::honest();
    let walk = walk();
    let held = device.held();
    let walked = walk_device(&walk, &held);
    let committed = device.committed(walked.root);
    for w in 0..walk.walkers {
        // The folded root is the tree over the whole trace.
        assert_eq!(
            walked.walker_roots[w as usize],
            MerkleTree::new(&walker_states(&walk, &held, w)).root()
        );
        for t in [0, 1, 11, walk.steps - 1] {
            let opening = open_step(&walk, &held, &walked.walker_roots, w, t, device.chain_opening()).unwrap();
            check_step(&device.work, &walk, &device.pool, &committed, &opening, &all_rows())
                .unwrap_or_else(|e| panic!("walker {w}, step {t}: {e}"));
        }
    }
    // Walks bound to another seed or device differ.
    let other = SliceWalk {
        walk_seed: [1; 32],
        ..walk.clone()
    };
    assert_ne!(walk_device(&other, &held).root, walked.root);
    assert!(
        open_step(
            &walk,
            &held,
            &walked.walker_roots,
            0,
            walk.steps,
            device.chain_opening()
        )
        .is_none()
    );
}

/// A cheater that faked step `t` (it did not hold the slice) and chose the state after it: the
/// rest of its trace is honest from there, and committed. Opening the faked step fails on its
/// own, and every other step passes: with every state committed, one fake buys one step.
#[test]
fn a_faked_step_fails_its_own_opening_and_no_other() {
    let device = Device::honest();
    let walk = walk();
    let held = device.held();
    let faked_at = 9usize;
    let mut states = walker_states(&walk, &held, 0);
    states[faked_at + 1] = Digest([0xAB; 32]);
    for t in faked_at + 1..walk.steps as usize {
        let e = entry_index(&states[t], device.pool.slices());
        states[t + 1] = step(held.slice(e), &states[t], t as u32);
    }
    let mut roots = walk_device(&walk, &held).walker_roots;
    let tree = MerkleTree::new(&states);
    roots[0] = tree.root();
    let committed = device.committed(MerkleTree::new(&roots).root());
    let open = |t: usize| {
        let mut opening = open_step(&walk, &held, &roots, 0, t as u32, device.chain_opening()).unwrap();
        // The cheater answers from its own trace.
        opening.start_proof = tree.proof(0).unwrap();
        opening.before = states[t];
        opening.after = states[t + 1];
        opening.before_proof = tree.proof(t as u64).unwrap();
        opening.after_proof = tree.proof(t as u64 + 1).unwrap();
        prove_slice(
            &device,
            &held,
            entry_index(&states[t], device.pool.slices()),
            &mut opening,
        );
        check_step(&device.work, &walk, &device.pool, &committed, &opening, &[0, 127])
    };
    assert_eq!(
        open(faked_at),
        Err(StepRejection::StepMismatch {
            walker: 0,
            step: faked_at as u32
        })
    );
    for t in (0..walk.steps as usize).filter(|&t| t != faked_at) {
        assert_eq!(open(t), Ok(()), "step {t}");
    }
}

/// The parts of an opening that prove pool slice `e`: its bytes, its path, its chain's
/// checkpoints and the chain's place in the device root.
fn prove_slice(device: &Device, held: &HeldStates, e: u64, opening: &mut StepOpening) {
    let (chain, q) = device.pool.locate(e);
    let (checkpoints, chain_proof) = device.chain_opening()(chain);
    opening.slice = held.slice(e).to_vec();
    opening.slice_path = slice_path(device.states[chain as usize].as_bytes(), q).unwrap();
    opening.checkpoints = checkpoints;
    opening.chain_proof = chain_proof;
}

/// A cheater that committed a cheap state for one pool chain (random bytes, with their true
/// hash as the chain's last checkpoint, so its leaf and device root agree) and walks it
/// honestly: the slice path and the step hold; the row made from `A_i` does not.
#[test]
fn a_cheap_pool_state_fails_its_row_check() {
    let mut device = Device::honest();
    let cheap = 2usize;
    let mut bytes = vec![0u8; (N * N) as usize];
    ChaCha8Rng::seed_from_u64(1).fill_bytes(&mut bytes);
    device.states[cheap] = Matrix::from_bytes(N as usize, &bytes).unwrap();
    *device.chains[cheap].last_mut().unwrap() = device.states[cheap].digest();
    let walk = SliceWalk {
        walkers: 4,
        steps: 40,
        ..walk()
    };
    let held = device.held();
    let walked = walk_device(&walk, &held);
    let committed = device.committed(walked.root);
    let mut caught = 0;
    for w in 0..walk.walkers {
        let states = walker_states(&walk, &held, w);
        for t in 0..walk.steps {
            let e = entry_index(&states[t as usize], device.pool.slices());
            let opening = open_step(&walk, &held, &walked.walker_roots, w, t, device.chain_opening()).unwrap();
            let checked = check_step(&device.work, &walk, &device.pool, &committed, &opening, &[5]);
            if device.pool.locate(e).0 == cheap as u64 {
                let row = device.pool.locate(e).1 as u32 * 128 + 5;
                assert_eq!(
                    checked,
                    Err(StepRejection::PoolStateMismatch {
                        chain: cheap as u64,
                        row
                    })
                );
                caught += 1;
            } else {
                assert_eq!(checked, Ok(()), "walker {w} step {t}");
            }
        }
    }
    assert!(caught > 0, "the walk read the cheap state");
}

/// A miner that answers a step with bytes of another slice (one it holds, in place of the one
/// it lacks) fails the slice's path to its state's hash.
#[test]
fn a_slice_that_is_not_its_states_fails_its_path() {
    let device = Device::honest();
    let walk = walk();
    let held = device.held();
    let walked = walk_device(&walk, &held);
    let committed = device.committed(walked.root);
    let mut opening = open_step(&walk, &held, &walked.walker_roots, 1, 5, device.chain_opening()).unwrap();
    let e = entry_index(&opening.before, device.pool.slices());
    let other = (e + 1) % device.pool.slices();
    opening.slice = held.slice(other).to_vec();
    let (chain, _) = device.pool.locate(e);
    assert!(matches!(
        check_step(&device.work, &walk, &device.pool, &committed, &opening, &[]),
        Err(StepRejection::SliceNotCommitted { chain: c, .. }) if c == chain
    ));
}

/// A walker that began somewhere of its own choosing (ground for a run of held slices) fails
/// every opening, since each proves the start the challenge gives it.
#[test]
fn a_walker_that_chose_its_start_fails_every_opening() {
    let device = Device::honest();
    let walk = walk();
    let held = device.held();
    let mut states = vec![Digest([0x11; 32])];
    for t in 0..walk.steps {
        let s = *states.last().unwrap();
        let e = entry_index(&s, device.pool.slices());
        states.push(step(held.slice(e), &s, t));
    }
    let tree = MerkleTree::new(&states);
    let mut roots = walk_device(&walk, &held).walker_roots;
    roots[2] = tree.root();
    let committed = device.committed(MerkleTree::new(&roots).root());
    let mut opening = open_step(&walk, &held, &roots, 2, 7, device.chain_opening()).unwrap();
    opening.start_proof = tree.proof(0).unwrap();
    opening.before = states[7];
    opening.after = states[8];
    opening.before_proof = tree.proof(7).unwrap();
    opening.after_proof = tree.proof(8).unwrap();
    assert_eq!(
        check_step(&device.work, &walk, &device.pool, &committed, &opening, &[]),
        Err(StepRejection::StartNotCommitted(2))
    );
}

/// A state not in the walker's tree, a walker root not in the walk root, and checkpoints that
/// are not the chain's each fail as what they are.
#[test]
fn uncommitted_parts_fail_as_what_they_are() {
    let device = Device::honest();
    let walk = walk();
    let held = device.held();
    let walked = walk_device(&walk, &held);
    let committed = device.committed(walked.root);
    let honest = open_step(&walk, &held, &walked.walker_roots, 0, 3, device.chain_opening()).unwrap();
    let check = |o: &StepOpening| check_step(&device.work, &walk, &device.pool, &committed, o, &[]);
    assert_eq!(check(&honest), Ok(()));

    let mut o = honest.clone();
    o.after = Digest([1; 32]);
    assert_eq!(check(&o), Err(StepRejection::StateNotCommitted { walker: 0, step: 3 }));
    let mut o = honest.clone();
    o.walker_root = Digest([2; 32]);
    assert_eq!(check(&o), Err(StepRejection::WalkerNotCommitted(0)));
    let mut o = honest.clone();
    o.checkpoints[0] = Digest([3; 32]);
    assert!(matches!(check(&o), Err(StepRejection::ChainNotCommitted(_))));
    let mut o = honest.clone();
    o.checkpoints.pop();
    assert!(matches!(check(&o), Err(StepRejection::ChainNotCommitted(_))));
    let mut o = honest;
    o.step = walk.steps;
    assert!(matches!(check(&o), Err(StepRejection::OutOfRange { .. })));
}

#[test]
fn a_cancelled_walk_stops_and_an_uncancelled_one_is_the_plain_walk() {
    let device = Device::honest();
    let (walk, held) = (walk(), device.held());
    let running = CancelToken::new();
    assert_eq!(
        walk_device_until(&walk, &held, &running).unwrap(),
        walk_device(&walk, &held)
    );
    let stopped = CancelToken::new();
    stopped.cancel();
    assert!(matches!(
        walk_device_until(&walk, &held, &stopped),
        Err(BackendError::Cancelled)
    ));
}

/// The miner opens a step from its kept trace (two or three blocks of 64 states walked again);
/// what it sends must be exactly the opening made from the whole walker, at every place a
/// block boundary can fall: the first and last state of a block, and a last block of 1, 2 or
/// 64 states.
#[test]
fn a_step_opened_from_the_kept_trace_is_the_step_opened_from_the_whole_walk() {
    let device = Device::honest();
    let held = device.held();
    for steps in [1, 24, 63, 64, 127, 130] {
        let walk = SliceWalk {
            steps,
            walkers: 2,
            ..walk()
        };
        let walked = walk_device(&walk, &held);
        for w in 0..walk.walkers {
            assert_eq!(
                walked.walker_roots[w as usize],
                MerkleTree::new(&walker_states(&walk, &held, w)).root(),
                "L = {steps}: the root kept in blocks is the walker's tree"
            );
            let places = [0, 1, 62, 63, 64, 65, 126, 127, 128, steps.saturating_sub(2), steps - 1];
            for t in places.into_iter().filter(|&t| t < steps) {
                let whole = open_step(&walk, &held, &walked.walker_roots, w, t, device.chain_opening());
                let kept = open_kept_step(&walk, &held, &walked, w, t, device.chain_opening()).unwrap();
                assert!(whole.is_some(), "L = {steps}, walker {w}, step {t} opens");
                assert_eq!(kept, whole, "L = {steps}, walker {w}, step {t}");
            }
        }
        assert_eq!(
            open_kept_step(&walk, &held, &walked, 0, steps, device.chain_opening()),
            Ok(None)
        );
        assert_eq!(
            open_kept_step(&walk, &held, &walked, 2, 0, device.chain_opening()),
            Ok(None)
        );
    }
}

/// At n = 768 a slice holds 85.33 rows, so rows are cut by slices' edges (PROTOCOL.md 20.1):
/// slice 1 holds the last two thirds of row 85 and the first two thirds of row 170. An honest
/// device passes a check of every row that has bytes in each opened slice, and a state whose
/// tail of row 85 is not the work function's fails on slice 1, where those bytes lie, and
/// passes on slice 0, where the row's head lies (the check compares the bytes the slice holds).
#[test]
fn rows_cut_by_a_slice_edge_are_checked_on_the_bytes_the_slice_holds() {
    const CUT_N: u32 = 768;
    let work = Work::new(ChallengeParams {
        nonce: [3; 32],
        seed: [4; 32],
        miner_key: [5; 32],
        n: CUT_N,
        num_chains: 1,
        iterations: 1,
        checkpoint_every: 1,
    })
    .unwrap();
    let pool = ChainPool::new(0, 0, 1, CUT_N as usize).unwrap();
    assert_eq!(pool.slices(), 9);
    let walk = SliceWalk {
        walkers: 4,
        steps: 24,
        ..walk()
    };
    let honest = reference::chain_state(work.key(), 0, CUT_N as usize, 1);
    let mut tampered = honest.clone();
    // Row 85 spans bytes 65280..66048: its last 512 bytes are slice 1's first.
    for byte in &mut tampered.as_bytes_mut()[65536..65536 + 512] {
        *byte = byte.wrapping_add(1);
    }
    let every_row: Vec<u32> = (0..86).collect();
    for (state, is_honest) in [(honest, true), (tampered, false)] {
        // The chain's last checkpoint commits whichever state is held.
        let mut checkpoints = reference::chain(&work, 0).checkpoints;
        *checkpoints.last_mut().unwrap() = state.digest();
        let tree = MerkleTree::new(&[leaf_hash(0, &checkpoints)]);
        let held = HeldStates::new(pool, vec![state]).unwrap();
        let walked = walk_device(&walk, &held);
        let committed = DeviceCommitments {
            device_root: tree.root(),
            device_chains: 1,
            walk_root: walked.root,
        };
        let chain = |i: u64| (checkpoints.clone(), tree.proof(i).unwrap());
        let mut seen = std::collections::HashSet::new();
        for w in 0..walk.walkers {
            for t in 0..walk.steps {
                let opening = open_step(&walk, &held, &walked.walker_roots, w, t, chain).unwrap();
                let q = entry_index(&opening.before, pool.slices());
                seen.insert(q);
                let checked = check_step(&work, &walk, &pool, &committed, &opening, &every_row);
                // Row 85 is the first of slice 1's rows (`r = 0`) and the 86th of slice 0's.
                let row_85 = check_step(
                    &work,
                    &walk,
                    &pool,
                    &committed,
                    &opening,
                    &[if q == 1 { 0 } else { 85 }],
                );
                match (is_honest, q) {
                    (true, _) => {
                        checked.unwrap_or_else(|e| panic!("slice {q}: {e}"));
                    }
                    (false, 1) => {
                        assert!(
                            matches!(checked, Err(StepRejection::PoolStateMismatch { row: 85, .. })),
                            "{checked:?}"
                        );
                        assert!(
                            matches!(row_85, Err(StepRejection::PoolStateMismatch { row: 85, .. })),
                            "{row_85:?}"
                        );
                    }
                    (false, 0) => assert!(row_85.is_ok(), "row 85's head is the work function's: {row_85:?}"),
                    (false, _) => assert!(checked.is_ok(), "slice {q} holds no tampered byte: {checked:?}"),
                }
            }
        }
        assert!(seen.contains(&0) && seen.contains(&1), "the walk read slices {seen:?}");
    }
}

/// Version 4's step is the naive one written from PROTOCOL.md (18.3's step under 20.4's domain),
/// over random slices and over the slices whose products reach the widest sums (every byte -128
/// or 127), at step numbers from 0 to the largest: the walk's fast `matvec` paths cannot drift
/// from the text, and a step under version 3's domain is a different state.
#[test]
fn the_v4_step_is_the_naive_step_of_the_protocol_text() {
    let mut rng = ChaCha8Rng::seed_from_u64(204);
    let mut slices: Vec<Vec<u8>> = vec![vec![0x80; 65536], vec![0x7f; 65536]];
    for _ in 0..3 {
        let mut bytes = vec![0u8; 65536];
        rng.fill_bytes(&mut bytes);
        slices.push(bytes);
    }
    for (i, bytes) in slices.iter().enumerate() {
        let matrix = Matrix::from_bytes(256, bytes).expect("65536 bytes");
        for t in [0, 1, 4095, u32::MAX] {
            let mut state = Digest([0; 32]);
            rng.fill_bytes(&mut state.0);
            let fast = step(bytes, &state, t);
            assert_eq!(fast, reference::walk_step_v4(&matrix, &state, t), "slice {i}, step {t}");
            assert_ne!(
                fast,
                reference::walk_step(&matrix, &state, t),
                "slice {i}, step {t}: the domains differ"
            );
        }
    }
}
