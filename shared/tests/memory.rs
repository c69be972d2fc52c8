//! The memory proof (PROTOCOL.md section 18) against its naive definition: pool entries on
//! every CPU kernel, the host pool's root, the walk, and the check of an opened walk segment,
//! which must pass an honest opening and name the first thing wrong with a tampered one.

use gpu_attest_shared::gemm::{CpuGemm, KernelKind};
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::check::{WalkCheckError, WalkOpening, check_segment, draw_rows, open_segment};
use gpu_attest_shared::memory::pool::{HostPool, PoolBytes, entry_leaf, entry_rows_match, make_entry};
use gpu_attest_shared::memory::walk::{DeviceWalk, WalkSpec, walk_all};
use gpu_attest_shared::memory::{MemoryParams, PoolSpec};
use gpu_attest_shared::merkle::root_of;
use gpu_attest_shared::{CancelToken, Digest, Work, reference, vectors};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use std::sync::OnceLock;

/// The pool of PROTOCOL.md 18.7: device 0 of section 12's challenge, 4 entries.
fn vector_pool() -> PoolSpec {
    let work = Work::new(vectors::vector_params()).unwrap();
    PoolSpec::new(&work, 0, 4 * 65536, 1000).unwrap()
}

/// Its entries, made once by the naive oracle (about a second).
fn naive_entries() -> &'static [Matrix] {
    static ENTRIES: OnceLock<Vec<Matrix>> = OnceLock::new();
    ENTRIES.get_or_init(|| reference::pool(&vector_pool()))
}

fn walk_params() -> MemoryParams {
    MemoryParams {
        pool_permille: 1000,
        walkers: 3,
        walk_steps: 16,
        walk_checkpoint_every: 4,
    }
}

fn walk_spec(pool_root: Digest) -> WalkSpec {
    WalkSpec {
        nonce: vectors::vector_params().nonce,
        walk_seed: core::array::from_fn(|i| 0x60 + i as u8),
        device: 0,
        pool_root,
        entries: vector_pool().entries(),
        params: walk_params(),
    }
}

fn filled(gemm: &CpuGemm) -> HostPool {
    HostPool::fill(gemm, &vector_pool(), &|_| {}, &CancelToken::new()).unwrap()
}

/// A pool made of given bytes is committed by exactly their leaves: the reference entries give
/// the reference root; entries of the wrong count are refused.
#[test]
fn a_pool_from_bytes_commits_to_those_bytes() {
    let spec = vector_pool();
    let mut bytes = gpu_attest_shared::aligned::AlignedBytes::try_zeroed(4 * 65536).unwrap();
    for (slot, entry) in bytes.as_mut_slice().chunks_mut(65536).zip(naive_entries()) {
        slot.copy_from_slice(entry.as_bytes());
    }
    let pool = HostPool::from_bytes(&spec, PoolBytes::new(bytes).unwrap()).unwrap();
    let leaves: Vec<Digest> = naive_entries().iter().map(|m| entry_leaf(m.as_bytes())).collect();
    assert_eq!(pool.root(), root_of(&leaves));
    assert_eq!(pool.entry_bytes(2), naive_entries()[2].as_bytes());
    let three = PoolBytes::keystream(&[1; 32], 3).unwrap();
    assert!(HostPool::from_bytes(&spec, three).is_none());
}

#[test]
fn pool_entries_and_root_match_the_reference_on_every_kernel() {
    let spec = vector_pool();
    let leaves: Vec<Digest> = naive_entries().iter().map(|m| entry_leaf(m.as_bytes())).collect();
    let root = root_of(&leaves);
    let mut kernels = 0;
    for kernel in KernelKind::ALL.into_iter().filter(|k| k.is_available()) {
        let gemm = CpuGemm::new(2, Some(kernel)).unwrap();
        for (e, want) in naive_entries().iter().enumerate() {
            assert_eq!(&make_entry(&gemm, &spec, e as u64), want, "{kernel}, entry {e}");
        }
        assert_eq!(filled(&gemm).root(), root, "{kernel}");
        kernels += 1;
    }
    assert!(kernels >= 1, "no CPU kernel ran");
}

#[test]
fn the_walk_matches_the_reference() {
    let pool = filled(&CpuGemm::new(2, None).unwrap());
    let spec = walk_spec(pool.root());
    let walk = walk_all(&pool, &spec, &CancelToken::new()).unwrap();
    for w in 0..spec.params.walkers {
        assert_eq!(
            walk.traces[w as usize],
            reference::walk(&spec, naive_entries(), w),
            "walker {w}"
        );
    }
    // Every walker starts elsewhere, and a walk over another seed is another walk.
    assert_ne!(walk.traces[0].checkpoints[0], walk.traces[1].checkpoints[0]);
    let other = WalkSpec {
        walk_seed: [0; 32],
        ..spec.clone()
    };
    assert_ne!(
        walk_all(&pool, &other, &CancelToken::new()).unwrap().root(),
        walk.root()
    );
}

#[test]
fn a_cancelled_walk_and_fill_stop() {
    let gemm = CpuGemm::new(2, None).unwrap();
    let cancel = CancelToken::new();
    cancel.cancel();
    assert!(HostPool::fill(&gemm, &vector_pool(), &|_| {}, &cancel).is_err());
    let pool = filled(&gemm);
    assert!(walk_all(&pool, &walk_spec(pool.root()), &cancel).is_err());
}

/// The pool, its walk and the spec, with one honest opening of walker 1, segment 2.
fn honest() -> (HostPool, DeviceWalk, WalkSpec, WalkOpening) {
    let pool = filled(&CpuGemm::new(2, None).unwrap());
    let spec = walk_spec(pool.root());
    let walk = walk_all(&pool, &spec, &CancelToken::new()).unwrap();
    let opening = open_segment(&pool, &walk, &spec, 1, 2).unwrap().unwrap();
    (pool, walk, spec, opening)
}

fn check(spec: &WalkSpec, walk_root: &Digest, opening: &WalkOpening) -> Result<(), WalkCheckError> {
    check_segment(spec, &vector_pool(), walk_root, (1, 2), opening, &whole_entry_is_made)
}

/// Check 7 as a validator makes it: 8 rows of each entry, drawn from a generator of its own.
fn drawn_rows(seed: u8) -> impl Fn(u64, &[u8]) -> bool {
    let rng = std::cell::RefCell::new(ChaCha8Rng::from_seed([seed; 32]));
    move |e, bytes| entry_rows_match(&vector_pool(), e, bytes, &draw_rows(&mut *rng.borrow_mut()))
}

/// The test's oracle for check 7: the whole entry, made naively.
fn whole_entry_is_made(e: u64, bytes: &[u8]) -> bool {
    naive_entries()[e as usize].as_bytes() == bytes
}

#[test]
fn an_honest_walk_opening_passes() {
    let (_, walk, spec, opening) = honest();
    assert_eq!(check(&spec, &walk.root(), &opening), Ok(()));
    assert_eq!(opening.entries.len(), 4);
    // Checked as a validator checks it, with drawn rows of each entry.
    assert_eq!(
        check_segment(&spec, &vector_pool(), &walk.root(), (1, 2), &opening, &drawn_rows(3)),
        Ok(())
    );
}

#[test]
fn every_tampered_walk_opening_fails_with_its_own_reason() {
    let (pool, walk, spec, opening) = honest();
    let root = walk.root();
    let code = |o: &WalkOpening| check(&spec, &root, o).unwrap_err().code();

    let mut o = opening.clone();
    o.segment = 1;
    assert_eq!(code(&o), "walk-opening-for-wrong-request");

    let mut o = opening.clone();
    o.checkpoints.pop();
    assert_eq!(code(&o), "walk-checkpoint-count");

    let mut o = opening.clone();
    o.checkpoints[4].0[0] ^= 1;
    assert_eq!(code(&o), "walk-leaf-not-committed");

    let mut o = opening.clone();
    o.entries.pop();
    assert_eq!(code(&o), "malformed-walk-opening");

    let mut o = opening.clone();
    o.entries[1].bytes.pop();
    assert_eq!(code(&o), "malformed-walk-opening");

    // An entry changed in one byte is not the committed one.
    let mut o = opening.clone();
    o.entries[2].bytes[100] ^= 1;
    assert_eq!(code(&o), "pool-entry-not-committed");

    // A walk over a fake pool, committed as such: the paths hold, the entries are not the
    // work function's. (Checked against the fake pool's own root.)
    let fake = FakePool::zeros(pool.spec().entries());
    let fake_spec = WalkSpec {
        pool_root: fake.root(),
        ..spec.clone()
    };
    let fake_walk = walk_all(&fake, &fake_spec, &CancelToken::new()).unwrap();
    let fake_opening = fake.open(&fake_walk, &fake_spec, 1, 2);
    // The whole entries made, and the validator's way, rows drawn from its own generator: both
    // catch it.
    let drawn = drawn_rows(11);
    for is_made in [&whole_entry_is_made as &dyn Fn(u64, &[u8]) -> bool, &drawn] {
        let err = check_segment(
            &fake_spec,
            &vector_pool(),
            &fake_walk.root(),
            (1, 2),
            &fake_opening,
            is_made,
        )
        .unwrap_err();
        assert_eq!(err.code(), "pool-entry-mismatch", "{err}");
    }

    // A walk whose committed trace skips work: the leaf and entries hold, the steps don't.
    let mut forged = walk.traces.clone();
    forged[1].checkpoints[3] = Digest([7; 32]);
    let forged_walk = DeviceWalk::new(forged);
    let mut o = opening.clone();
    o.checkpoints = forged_walk.traces[1].checkpoints.clone();
    o.proof = forged_walk.tree.proof(1).unwrap();
    assert_eq!(
        check(&spec, &forged_walk.root(), &o).unwrap_err().code(),
        "walk-segment-mismatch"
    );

    // A walk that did not start where this walk request says (an old walk, replayed).
    let stale = WalkSpec {
        walk_seed: [9; 32],
        ..spec.clone()
    };
    let stale_walk = walk_all(&pool, &stale, &CancelToken::new()).unwrap();
    let o = open_segment(&pool, &stale_walk, &stale, 1, 2).unwrap().unwrap();
    assert_eq!(
        check(&spec, &stale_walk.root(), &o).unwrap_err().code(),
        "walk-start-mismatch"
    );
}

/// A pool of zero entries committed under its own root: what a miner without the memory, or
/// the compute to fill it, might try.
struct FakePool {
    zeros: Vec<i8>,
    entries: u64,
    tree: gpu_attest_shared::merkle::MerkleTree,
}

impl FakePool {
    fn zeros(entries: u64) -> Self {
        let zeros = vec![0i8; 65536];
        let leaf = entry_leaf(bytemuck::cast_slice(&zeros));
        FakePool {
            zeros,
            entries,
            tree: gpu_attest_shared::merkle::MerkleTree::new(&vec![leaf; entries as usize]),
        }
    }

    fn root(&self) -> Digest {
        self.tree.root()
    }

    fn open(&self, walk: &DeviceWalk, spec: &WalkSpec, walker: u32, segment: u32) -> WalkOpening {
        use gpu_attest_shared::memory::check::OpenedEntry;
        use gpu_attest_shared::memory::walk::{entry_index, step};
        let trace = &walk.traces[walker as usize];
        let every = spec.params.walk_checkpoint_every;
        let mut state = trace.checkpoints[segment as usize];
        let mut entries = Vec::new();
        for t in segment * every..(segment + 1) * every {
            let e = entry_index(&state, spec.entries);
            entries.push(OpenedEntry {
                bytes: bytemuck::cast_slice(&self.zeros).to_vec(),
                proof: self.tree.proof(e).unwrap(),
            });
            state = step(&self.zeros, &state, t);
        }
        WalkOpening {
            device: spec.device,
            walker,
            segment,
            checkpoints: trace.checkpoints.clone(),
            proof: walk.tree.proof(u64::from(walker)).unwrap(),
            entries,
        }
    }
}

impl gpu_attest_shared::memory::pool::EntrySource for FakePool {
    fn entries(&self) -> u64 {
        self.entries
    }

    fn entry(&self, _: u64) -> std::borrow::Cow<'_, [i8]> {
        std::borrow::Cow::Borrowed(&self.zeros)
    }
}

#[test]
fn the_cpu_backend_holds_a_pool_and_walks_it_as_the_engine_does() {
    use gpu_attest_shared::backend::{Backend, BackendError};
    use gpu_attest_shared::cpu::CpuBackend;
    let backend = CpuBackend::new(2, None).unwrap();
    let held = backend.fill_pool(&vector_pool(), &|_| {}, &CancelToken::new()).unwrap();
    let direct = filled(&CpuGemm::new(2, None).unwrap());
    assert_eq!(held.root(), direct.root());
    assert_eq!(held.spec(), direct.spec());
    let spec = walk_spec(held.root());
    let walk = held.walk(&spec, &CancelToken::new()).unwrap();
    assert_eq!(
        walk.root(),
        walk_all(&direct, &spec, &CancelToken::new()).unwrap().root()
    );
    let opening = held.open(&walk, &spec, 1, 2).unwrap().unwrap();
    assert_eq!(check(&spec, &walk.root(), &opening), Ok(()));
    assert!(held.open(&walk, &spec, 3, 0).unwrap().is_none(), "walker 3 of 3");
    assert!(held.open(&walk, &spec, 0, 4).unwrap().is_none(), "segment 4 of 4");
    // A pool of a device the backend does not have is refused, not filled.
    let work = Work::new(vectors::vector_params()).unwrap();
    let elsewhere = PoolSpec::with_entries(&work, 1, 4);
    assert!(matches!(
        backend.fill_pool(&elsewhere, &|_| {}, &CancelToken::new()),
        Err(BackendError::NoSuchDevice { device: 1, count: 1 })
    ));
}
