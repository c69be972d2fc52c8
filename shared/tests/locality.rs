//! The locality walk (docs/design/locality.md) end to end in the engine: a device's chains
//! committed as the chain phase commits them, its pool walked in generations, segments opened
//! and checked. The cheaters here are the design's: a walk split into pieces walked side by side
//! (a made-up end state, a made-up generation, a made-up node of the locality tree), a line made
//! up, a line from another chain, a generation's ends changed after the root was sent.

use gpu_attest_shared::chain::leaf_hash;
use gpu_attest_shared::digest::Digest;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::locality::{
    ChunkPaths, LineWalk, LocalityCommitments, LocalityRejection, LocalityWalk, SegmentOpening, ShapeError, State,
    check_segment, open_segment, open_walker, segment_start, step, walk_lines,
};
use gpu_attest_shared::memory::slice::{SLICE_BYTES, StateSlices};
use gpu_attest_shared::memory::slice_walk::{HeldStates, SliceSource};
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree, inner_node};
use gpu_attest_shared::params::{ChallengeParams, Work};
use gpu_attest_shared::{CancelToken, reference};

/// One device at n = 512 (4 slices a state): 6 chains of 2 steps, the first 4 its pool. Its
/// openings share one `ChunkPaths`, as a miner's round does, so later ones cut their paths from
/// what earlier ones kept.
struct Device {
    work: Work,
    pool: ChainPool,
    chains: Vec<Vec<Digest>>,
    held: HeldStates,
    paths: ChunkPaths,
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
        let states: Vec<Matrix> = (0..POOL_CHAINS)
            .map(|i| reference::chain_state(work.key(), i, N as usize, 2))
            .collect();
        let pool = ChainPool::new(0, 0, POOL_CHAINS, N as usize).unwrap();
        Device {
            held: HeldStates::new(pool, states).unwrap(),
            pool,
            work,
            chains,
            paths: ChunkPaths::default(),
        }
    }

    fn tree(&self) -> MerkleTree {
        let leaves: Vec<Digest> = self
            .chains
            .iter()
            .enumerate()
            .map(|(i, c)| leaf_hash(i as u64, c))
            .collect();
        MerkleTree::new(&leaves)
    }

    fn chain_opening(&self) -> impl Fn(u64) -> (Vec<Digest>, MerkleProof) + '_ {
        let tree = self.tree();
        move |i| (self.chains[i as usize].clone(), tree.proof(i).unwrap())
    }

    fn committed(&self, locality_root: Digest) -> LocalityCommitments {
        LocalityCommitments {
            device_root: self.tree().root(),
            device_chains: CHAINS,
            locality_root,
        }
    }

    fn walk(&self, walk: &LocalityWalk) -> LineWalk {
        walk_lines(walk, &self.held, &CancelToken::new()).unwrap()
    }

    fn open(&self, walk: &LocalityWalk, walked: &LineWalk, g: u32, w: u32) -> SegmentOpening {
        open_segment(walk, &self.held, walked, (g, w), &self.chain_opening(), &self.paths)
            .unwrap()
            .unwrap_or_else(|| panic!("segment ({g}, {w}) is in the walk"))
    }

    fn check(&self, walk: &LocalityWalk, root: Digest, opening: &SegmentOpening) -> Result<(), LocalityRejection> {
        check_segment(&self.work, walk, &self.pool, &self.committed(root), opening)
    }
}

fn walk() -> LocalityWalk {
    LocalityWalk {
        nonce: [3; 32],
        seed: [8; 32],
        global: Digest([9; 32]),
        walkers: 3,
        generations: 5,
        steps: 40,
    }
}

/// The locality tree's node `index` at `level` (leaves at 0) over generation digests `digests`:
/// the root of digests `index * 2^level ..`, as 20.3's tree builds it.
fn node(digests: &[Digest], level: u32, index: usize) -> Digest {
    let size = 1usize << level;
    MerkleTree::new(&digests[index * size..((index + 1) * size).min(digests.len())]).root()
}

/// Generation `g`'s parents as a reader of the design would find them: for each set bit `k` of
/// `g`, lowest first, node `g / 2^k - 1` at level `k` (the subtree of the `2^k` generations just
/// before the ones already covered), or what `made_up` puts in its place.
fn parents_by_the_book(digests: &[Digest], g: u32, made_up: &dyn Fn(u32, usize) -> Option<Digest>) -> Vec<Digest> {
    (0..32)
        .filter(|k| g >> k & 1 == 1)
        .map(|k| {
            let index = (g >> k) as usize - 1;
            made_up(k, index).unwrap_or_else(|| node(digests, k, index))
        })
        .collect()
}

/// Walker `w` of generation `g` walked by the book from `parents`.
fn walk_walker(device: &Device, walk: &LocalityWalk, g: u32, w: u32, parents: &[Digest]) -> State {
    let slices = device.pool.slices();
    let mut s = walk.start(0, g, w, parents);
    for _ in 0..walk.steps {
        let line = s.names(slices);
        s = step(&s, line.of(device.held.slice(line.slice)));
    }
    s
}

/// The walk again as a reader of the design would write it: each generation's walkers from the
/// nodes left of its leaf, one line a step; except that a walker for which `made_up(g, w)` gives
/// a state does not walk and commits that state as its end.
fn walk_by_the_book(
    device: &Device,
    walk: &LocalityWalk,
    made_up: &dyn Fn(u32, u32) -> Option<State>,
) -> Vec<Vec<State>> {
    let mut generations: Vec<Vec<State>> = Vec::new();
    let mut digests = Vec::new();
    for g in 0..walk.generations {
        let parents = parents_by_the_book(&digests, g, &|_, _| None);
        let ends: Vec<State> = (0..walk.walkers)
            .map(|w| made_up(g, w).unwrap_or_else(|| walk_walker(device, walk, g, w, &parents)))
            .collect();
        digests.push(walk.generation_digest(0, g, &ends));
        generations.push(ends);
    }
    generations
}

/// A walk committed from `ends`, generation by generation, as a miner would send its root.
fn committed(walk: &LocalityWalk, ends: Vec<Vec<State>>) -> LineWalk {
    let digests: Vec<Digest> = ends
        .iter()
        .enumerate()
        .map(|(g, e)| walk.generation_digest(0, g as u32, e))
        .collect();
    LineWalk {
        walkers: walk.walkers,
        ends: ends.concat(),
        root: MerkleTree::new(&digests).root(),
        digests,
    }
}

#[test]
fn an_honest_device_passes_every_opened_segment() {
    let device = Device::honest();
    let walk = walk();
    let walked = device.walk(&walk);
    let by_the_book = committed(&walk, walk_by_the_book(&device, &walk, &|_, _| None));
    assert_eq!(walked, by_the_book);
    for g in 0..walk.generations {
        for w in 0..walk.walkers {
            let opening = device.open(&walk, &walked, g, w);
            assert_eq!(opening.lines.len(), walk.steps as usize);
            device
                .check(&walk, walked.root, &opening)
                .unwrap_or_else(|e| panic!("generation {g}, walker {w}: {e}"));
        }
    }
    assert!(
        open_segment(
            &walk,
            &device.held,
            &walked,
            (walk.generations, 0),
            &device.chain_opening(),
            &device.paths
        )
        .unwrap()
        .is_none()
    );
    assert!(
        open_segment(
            &walk,
            &device.held,
            &walked,
            (0, walk.walkers),
            &device.chain_opening(),
            &device.paths
        )
        .unwrap()
        .is_none()
    );
    // Another seed walks elsewhere.
    let other = LocalityWalk {
        seed: [1; 32],
        ..walk.clone()
    };
    assert_ne!(device.walk(&other).root, walked.root);
}

/// No generation can begin before every walker of every generation before it has ended: each of
/// their end states changes every start of every later generation (the first build's starts
/// took in the generation before alone). And no generation can be walked before the seed is
/// known: the digests and the starts are bound to the nonce, the seed, the device, the
/// generation and the walker.
#[test]
fn every_end_of_every_generation_moves_every_later_start() {
    let walk = LocalityWalk {
        generations: 11,
        ..walk()
    };
    let ends = |g: u32| -> Vec<State> { (0..3u64).map(|w| State([u64::from(g), w, 1, 2])).collect() };
    let starts = |all: &[Vec<State>]| -> Vec<Vec<State>> {
        let digests: Vec<Digest> = all
            .iter()
            .enumerate()
            .map(|(g, e)| walk.generation_digest(0, g as u32, e))
            .collect();
        (0..walk.generations)
            .map(|g| {
                let parents = parents_by_the_book(&digests, g, &|_, _| None);
                (0..3).map(|w| walk.start(0, g, w, &parents)).collect()
            })
            .collect()
    };
    let honest: Vec<Vec<State>> = (0..walk.generations).map(ends).collect();
    let base = starts(&honest);
    for changed_g in 0..walk.generations {
        for changed_w in 0..3 {
            let mut other = honest.clone();
            other[changed_g as usize][changed_w].0[3] ^= 1;
            let moved = starts(&other);
            for g in 0..walk.generations {
                for w in 0..3 {
                    assert_eq!(
                        moved[g as usize][w] != base[g as usize][w],
                        g > changed_g,
                        "end ({changed_g}, {changed_w}) against the start of ({g}, {w})"
                    );
                }
            }
        }
    }
    let all = honest.concat();
    let digest = walk.generation_digest(2, 7, &all);
    assert_ne!(walk.generation_digest(3, 7, &all), digest, "the device is bound");
    assert_ne!(walk.generation_digest(2, 8, &all), digest, "the generation is bound");
    let parents = [Digest([4; 32]), Digest([5; 32])];
    let start = walk.start(2, 6, 1, &parents);
    assert_ne!(walk.start(3, 6, 1, &parents), start, "the device is bound");
    assert_ne!(walk.start(2, 5, 1, &parents), start, "the generation is bound");
    assert_ne!(walk.start(2, 6, 0, &parents), start, "the walker is bound");
    assert_ne!(walk.start(2, 6, 1, &parents[..1]), start, "every parent is bound");
    for other in [
        LocalityWalk {
            seed: [7; 32],
            ..walk.clone()
        },
        LocalityWalk {
            nonce: [7; 32],
            ..walk.clone()
        },
        LocalityWalk {
            global: Digest([7; 32]),
            ..walk.clone()
        },
    ] {
        assert_ne!(other.start(2, 6, 1, &parents), start, "the walk is bound");
    }
    assert_ne!(
        LocalityWalk {
            seed: [7; 32],
            ..walk.clone()
        }
        .generation_digest(2, 7, &all),
        digest,
        "the walk is bound"
    );
}

/// A made-up generation (every end made up, nothing walked) saves its own time and no more: the
/// generations after it still start from every honest generation before it, so they cannot be
/// walked side by side with those. Its segments fail; the rest pass. (The first build, whose
/// generations started from the one before alone, let one made-up generation split the walk in
/// two at this cost: 1 in `G` of the segments.)
#[test]
fn a_made_up_generation_fails_its_own_segments_and_splits_nothing() {
    let device = Device::honest();
    let walk = walk();
    let made_up = 2u32;
    let ends = walk_by_the_book(&device, &walk, &|g, w| {
        (g == made_up).then_some(State([9, 9, 9, u64::from(w)]))
    });
    let cheat = committed(&walk, ends);
    for g in 0..walk.generations {
        for w in 0..walk.walkers {
            let checked = device.check(&walk, cheat.root, &device.open(&walk, &cheat, g, w));
            assert_eq!(checked.is_ok(), g != made_up, "generation {g}, walker {w}: {checked:?}");
        }
    }
}

/// How a walk is cut short in practice: to start generation `g` while earlier generations are
/// still walking, a miner commits ends it made up for every generation it has not finished and
/// hashes the tree honestly from them (a made-up node could not reach the signed root, below).
/// Each unfinished generation then fails its openings, and only those: a walk cut short by `k`
/// generations fails at least `k` of them. Cuts of one generation (3, so that 4 .. 7 start
/// early), of a whole subtree (0 .. 3, the split in two) and of a run across subtrees (2 .. 5).
#[test]
fn made_up_ends_of_the_unfinished_generations_fail_each_of_them_and_only_them() {
    let device = Device::honest();
    let walk = LocalityWalk {
        generations: 8,
        ..walk()
    };
    for unfinished in [3..4u32, 0..4, 2..6] {
        let ends = walk_by_the_book(&device, &walk, &|g, w| {
            unfinished
                .contains(&g)
                .then_some(State([7, u64::from(g), u64::from(w), 7]))
        });
        let cheat = committed(&walk, ends);
        for g in 0..walk.generations {
            for w in 0..walk.walkers {
                let checked = device.check(&walk, cheat.root, &device.open(&walk, &cheat, g, w));
                if unfinished.contains(&g) {
                    assert_eq!(
                        checked,
                        Err(LocalityRejection::SegmentMismatch {
                            generation: g,
                            walker: w
                        }),
                        "cut {unfinished:?}: generation {g} was not walked"
                    );
                } else {
                    assert_eq!(checked, Ok(()), "cut {unfinished:?}: generation {g}, walker {w}");
                }
            }
        }
    }
}

/// The same split with the node over 0 .. 3 made up instead of their ends. Generations 4 .. 7,
/// walked honestly from the made-up node, pass; every generation under it fails, whatever its
/// ends, since no proof through the node reaches the root by any of them. Making up the ends
/// (above) fails the same generations, so a cheater gains nothing by either.
#[test]
fn a_made_up_node_splits_the_walk_and_fails_every_generation_under_it() {
    let device = Device::honest();
    let walk = LocalityWalk {
        generations: 8,
        ..walk()
    };
    let made_up_node = Digest([0xAB; 32]);
    let made_up = |level: u32, index: usize| (level, index) == (2, 0);
    let replace = |level: u32, index: usize| made_up(level, index).then_some(made_up_node);
    // Generations 0 .. 3 walked honestly (at the same time as 4 .. 7, which do not need them).
    let mut digests = Vec::new();
    let mut ends = Vec::new();
    for g in 0..walk.generations {
        let parents = parents_by_the_book(&digests, g, &replace);
        let walked: Vec<State> = (0..walk.walkers)
            .map(|w| walk_walker(&device, &walk, g, w, &parents))
            .collect();
        digests.push(walk.generation_digest(0, g, &walked));
        ends.push(walked);
    }
    let right_half = node(&digests, 2, 1);
    let root = inner_node(&made_up_node, &right_half);
    for g in 0..walk.generations {
        // The proof through the made-up node, which is the only one that reaches the root.
        let proof = MerkleProof {
            siblings: (0..3)
                .map(|k| {
                    let index = (g >> k ^ 1) as usize;
                    replace(k, index).unwrap_or_else(|| node(&digests, k, index))
                })
                .collect(),
        };
        for w in 0..walk.walkers {
            let opening = open_walker(
                &walk,
                &device.held,
                (g, w),
                (ends[g as usize].clone(), proof.clone()),
                &device.chain_opening(),
                &device.paths,
            )
            .unwrap();
            let checked = device.check(&walk, root, &opening);
            if g < 4 {
                assert_eq!(
                    checked,
                    Err(LocalityRejection::GenerationNotCommitted { generation: g }),
                    "generation {g} is under the made-up node"
                );
            } else {
                assert_eq!(checked, Ok(()), "generation {g}, walker {w}");
            }
        }
    }
}

/// A walker that did not walk (its end made up, say because its lines were far) fails its own
/// segment and only it: the openings catch such a cheat at the share of segments made up.
#[test]
fn a_made_up_end_state_fails_its_segment_and_only_its_segment() {
    let device = Device::honest();
    let walk = walk();
    let honest = device.walk(&walk);
    // Generation 2's walker 1 did not walk: its end was guessed; generations 3 and 4 were walked
    // from what it committed.
    let (faked_g, faked_w) = (2u32, 1u32);
    let ends = walk_by_the_book(&device, &walk, &|g, w| {
        ((g, w) == (faked_g, faked_w)).then_some(State([1, 2, 3, 4]))
    });
    let cheat = committed(&walk, ends);
    assert_ne!(cheat.root, honest.root);
    for g in 0..walk.generations {
        for w in 0..walk.walkers {
            let checked = device.check(&walk, cheat.root, &device.open(&walk, &cheat, g, w));
            if (g, w) == (faked_g, faked_w) {
                assert_eq!(
                    checked,
                    Err(LocalityRejection::SegmentMismatch {
                        generation: g,
                        walker: w
                    })
                );
                assert_eq!(checked.unwrap_err().code(), "locality-segment-mismatch");
            } else {
                assert_eq!(checked, Ok(()), "generation {g}, walker {w}");
            }
        }
    }
}

#[test]
fn every_kind_of_tampering_has_its_rejection() {
    let device = Device::honest();
    let walk = walk();
    let walked = device.walk(&walk);
    let opening = device.open(&walk, &walked, 3, 2);
    let check = |o: &SegmentOpening| device.check(&walk, walked.root, o);
    assert_eq!(check(&opening), Ok(()));

    let mut line = opening.clone();
    line.lines[17].chunk[5] ^= 1;
    let rejected = check(&line).unwrap_err();
    assert!(
        matches!(rejected, LocalityRejection::LineNotCommitted { step: 17, .. }),
        "{rejected}"
    );
    assert_eq!(rejected.code(), "locality-line-not-committed");

    let mut path = opening.clone();
    path.lines[3].chunk_path.siblings[0][0] ^= 1;
    assert!(matches!(
        check(&path),
        Err(LocalityRejection::LineNotCommitted { step: 3, .. })
    ));

    // Another chain's checkpoints (and its proof) under this line.
    let mut chain = opening.clone();
    let other = device.chain_opening()(5);
    chain.lines[0].checkpoints = other.0;
    chain.lines[0].chain_proof = other.1;
    let rejected = check(&chain).unwrap_err();
    assert!(
        matches!(rejected, LocalityRejection::ChainNotCommitted { step: 0, .. }),
        "{rejected}"
    );
    assert_eq!(rejected.code(), "leaf-not-committed");

    let mut sibling = opening.clone();
    sibling.ends_proof.siblings[0].0[0] ^= 1;
    assert_eq!(
        check(&sibling),
        Err(LocalityRejection::GenerationNotCommitted { generation: 3 })
    );
    let mut ends = opening.clone();
    ends.ends[2].0[1] ^= 1;
    assert_eq!(
        check(&ends),
        Err(LocalityRejection::GenerationNotCommitted { generation: 3 })
    );
    let mut short = opening.clone();
    short.ends.pop();
    assert!(matches!(
        check(&short),
        Err(LocalityRejection::WrongWalkerCount { generation: 3, .. })
    ));
    let mut dropped = opening.clone();
    dropped.lines.pop();
    assert_eq!(
        check(&dropped),
        Err(LocalityRejection::WrongLineCount { got: 39, want: 40 })
    );
    // A segment answered for another walker or generation than the one it names.
    let mut renamed = opening.clone();
    renamed.walker = 1;
    assert!(check(&renamed).is_err());
    let mut moved = device.open(&walk, &walked, 4, 2);
    moved.generation = 3;
    assert!(check(&moved).is_err());
    let mut outside = opening.clone();
    outside.generation = walk.generations;
    assert_eq!(
        check(&outside).unwrap_err().code(),
        "locality-opening-for-wrong-request"
    );
    // The first generation has no parents: its proof's siblings all lie right of its path.
    let first = device.open(&walk, &walked, 0, 0);
    assert!(
        first
            .ends_proof
            .left_siblings(0, u64::from(walk.generations))
            .is_empty()
    );
    assert_eq!(check(&first), Ok(()));
}

#[test]
fn shapes_past_the_limits_are_refused_before_any_walk() {
    let ok = walk();
    assert_eq!(ok.check_shape(), Ok(()));
    assert!(matches!(
        LocalityWalk {
            walkers: 0,
            ..ok.clone()
        }
        .check_shape(),
        Err(ShapeError::Empty { .. })
    ));
    assert!(matches!(
        LocalityWalk { steps: 0, ..ok.clone() }.check_shape(),
        Err(ShapeError::Empty { .. })
    ));
    assert!(matches!(
        LocalityWalk {
            walkers: 5000,
            ..ok.clone()
        }
        .check_shape(),
        Err(ShapeError::TooManyWalkers { .. })
    ));
    assert!(matches!(
        LocalityWalk {
            steps: 5000,
            ..ok.clone()
        }
        .check_shape(),
        Err(ShapeError::SegmentTooLong { .. })
    ));
    assert!(matches!(
        LocalityWalk {
            walkers: 4096,
            generations: 2000,
            ..ok
        }
        .check_shape(),
        Err(ShapeError::TooManyEnds { .. })
    ));
}

#[test]
fn a_cancelled_walk_stops() {
    let device = Device::honest();
    let cancel = CancelToken::new();
    cancel.cancel();
    assert!(walk_lines(&walk(), &device.held, &cancel).is_err());
}

/// The slices a segment's walk reads, and nothing else of the pool: what a GPU miner copies back
/// to open a segment (kernels/src/locality.rs), with the states' slices known by their chaining
/// values alone.
struct LineSlices {
    pool: ChainPool,
    slices: std::collections::HashMap<u64, Vec<u8>>,
}

impl SliceSource for LineSlices {
    fn pool(&self) -> &ChainPool {
        &self.pool
    }

    fn slice(&self, e: u64) -> &[u8] {
        self.slices
            .get(&e)
            .unwrap_or_else(|| panic!("slice {e} was not among the segment's lines"))
    }
}

/// Slice `q` of a state as BLAKE3 chains it within the state: a complete subtree at its offset.
fn slice_cv(state: &[u8], q: usize) -> [u8; 32] {
    use blake3::hazmat::HasherExt;
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset((q * SLICE_BYTES) as u64);
    hasher.update(&state[q * SLICE_BYTES..(q + 1) * SLICE_BYTES]);
    hasher.finalize_non_root()
}

/// An opening made from the segment's own slices, each touched state known by its slices'
/// chaining values (`ChunkPaths::keep_state`, `StateSlices::from_cvs`), is the opening made
/// from the whole pool, bit for bit; and a state's chaining values are refused in the wrong number.
#[test]
fn an_opening_from_its_own_slices_and_the_states_chaining_values_is_the_whole_pools() {
    let device = Device::honest();
    let walk = walk();
    let walked = device.walk(&walk);
    let per_state = device.pool.slices_per_state();
    let cvs_of = |chain: u64| -> Vec<[u8; 32]> {
        let state = device.held.state(chain).as_bytes();
        (0..per_state as usize).map(|q| slice_cv(state, q)).collect()
    };
    let paths = ChunkPaths::default();
    for (g, w) in [
        (0, 0),
        (walk.generations - 1, walk.walkers - 1),
        (walk.generations / 2, 1),
    ] {
        let mut state = segment_start(&walk, &walked, device.pool.device, (g, w)).unwrap();
        let mut lines = LineSlices {
            pool: device.pool,
            slices: Default::default(),
        };
        for _ in 0..walk.steps {
            let line = state.names(device.pool.slices());
            let slice = device.held.slice(line.slice);
            lines.slices.insert(line.slice, slice.to_vec());
            state = step(&state, line.of(slice));
            let (chain, _) = device.pool.locate(line.slice);
            paths
                .keep_state(chain, || Ok(StateSlices::from_cvs(per_state, cvs_of(chain)).unwrap()))
                .unwrap();
        }
        let from_lines = open_segment(&walk, &lines, &walked, (g, w), &device.chain_opening(), &paths)
            .unwrap()
            .unwrap();
        assert_eq!(from_lines, device.open(&walk, &walked, g, w), "segment ({g}, {w})");
        device.check(&walk, walked.root, &from_lines).unwrap();
    }
    assert!(segment_start(&walk, &walked, 0, (walk.generations, 0)).is_none());
    assert!(StateSlices::from_cvs(per_state, cvs_of(0)[1..].to_vec()).is_err());
    assert!(StateSlices::from_cvs(1, Vec::new()).is_ok());
    assert!(StateSlices::from_cvs(1, cvs_of(0)[..1].to_vec()).is_err());
}
