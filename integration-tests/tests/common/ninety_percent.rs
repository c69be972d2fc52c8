//! A version 4 miner holding 90% of its pool's states, making up the rest from two sources at
//! once: every other missing state it computes again from the work function (`K` steps from
//! `A_i`, as a GPU cheater would on idle tensor cores), and the others it fetches, slice by
//! slice, from another process over a Unix socket (a slower tier of memory). Its walk is
//! consistent; what it cannot hide is the time.
//!
//! So that a test's length does not depend on how fast this CPU computes again, it stops
//! making anything up `give_up` after its walk began and serves zeros from then on (a cheater
//! that has already lost on time).

use super::memory_cheats::EntryServer;
use gpu_attest_shared::backend::{ChainProgress, PoolStates};
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::matrix::{Matrix, generate_a};
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice::SLICE_BYTES;
use gpu_attest_shared::memory::slice_walk::{DeviceWalk, SliceSource, SliceWalk, StepOpening, step};
use gpu_attest_shared::memory::walk::entry_index;
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use gpu_attest_shared::statement::DeviceInfo;
use gpu_attest_shared::{Backend, BackendError, CancelToken, Digest, Work};
use std::borrow::Cow;
use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The CPU backend, its pool states held but for every tenth.
pub struct NinetyPercentHolder {
    pub cpu: Arc<CpuBackend>,
    /// This test binary and its ignored test that serves entries (`serve_entries`).
    pub server_exe: PathBuf,
    pub server_test: String,
    pub dir: PathBuf,
    pub give_up: Duration,
}

/// Whether the holder lacks pool state `k` (every tenth), and if so whether it computes it
/// again (`Some(true)`) or fetches it (`Some(false)`).
fn missing(k: u64) -> Option<bool> {
    (k % 10 == 9).then_some(k % 20 == 9)
}

impl Backend for NinetyPercentHolder {
    fn describe(&self) -> String {
        self.cpu.describe()
    }
    fn device_count(&self) -> u32 {
        self.cpu.device_count()
    }
    fn devices(&self) -> Vec<DeviceInfo> {
        self.cpu.devices()
    }
    fn run_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<Vec<ChainResult>, BackendError> {
        self.cpu.run_chains(device, work, chains, progress, cancel)
    }
    fn run_pool_chains(
        &self,
        device: u32,
        work: &Work,
        chains: Range<u64>,
        pool: ChainPool,
        progress: ChainProgress<'_>,
        cancel: &CancelToken,
    ) -> Result<(Vec<ChainResult>, Box<dyn PoolStates>), BackendError> {
        let (results, states) = self.cpu.run_pool_chains(device, work, chains, pool, progress, cancel)?;
        // The fetched states go to the other process; all of them stay here only so that the
        // held ones can be read (the walk never reads a missing one from here).
        let fetched: Vec<u8> = (0..pool.chains)
            .filter(|&k| missing(k) == Some(false))
            .flat_map(|k| states.source().slice(k).to_vec())
            .collect();
        let server = (!fetched.is_empty()).then(|| {
            EntryServer::start_with(
                fetched,
                &self.dir.join(format!("device-{device}")),
                &self.server_exe,
                &self.server_test,
            )
        });
        Ok((
            results,
            Box::new(Holder {
                states,
                cpu: self.cpu.clone(),
                work: work.clone(),
                server,
                connection: Mutex::new(None),
                give_up: self.give_up,
            }),
        ))
    }
    fn keeps_chain_pools(&self) -> bool {
        true
    }
    fn advance(
        &self,
        work: &Work,
        chain: u64,
        start: Matrix,
        first: u32,
        steps: u32,
        cancel: &CancelToken,
    ) -> Result<Matrix, BackendError> {
        self.cpu.advance(work, chain, start, first, steps, cancel)
    }
}

struct Holder {
    states: Box<dyn PoolStates>,
    cpu: Arc<CpuBackend>,
    work: Work,
    server: Option<EntryServer>,
    connection: Mutex<Option<UnixStream>>,
    give_up: Duration,
}

impl Holder {
    /// Slice `e` of the pool (n = 256: one state a slice), from wherever the holder has it.
    fn slice(&self, e: u64, since: Instant, cancel: &CancelToken) -> Cow<'_, [u8]> {
        let pool = self.states.source().pool();
        let (chain, _) = pool.locate(e);
        let k = chain - pool.first_chain;
        match missing(k) {
            None => Cow::Borrowed(self.states.source().slice(e)),
            Some(_) if since.elapsed() > self.give_up => Cow::Owned(vec![0; SLICE_BYTES]),
            Some(true) => {
                let a = generate_a(self.work.key(), chain, self.work.n());
                let state = self
                    .cpu
                    .advance(&self.work, chain, a, 0, self.work.iterations(), cancel)
                    .map(|m| m.as_bytes().to_vec())
                    .unwrap_or_else(|_| vec![0; SLICE_BYTES]);
                Cow::Owned(state)
            }
            Some(false) => {
                let fetched_index = (0..k).filter(|&j| missing(j) == Some(false)).count() as u64;
                let server = self.server.as_ref().expect("a server for the fetched states");
                let mut connection = self.connection.lock().unwrap();
                let stream = connection.get_or_insert_with(|| server.connect());
                stream.write_all(&fetched_index.to_le_bytes()).unwrap();
                let mut bytes = vec![0u8; SLICE_BYTES];
                stream.read_exact(&mut bytes).unwrap();
                Cow::Owned(bytes)
            }
        }
    }
}

impl PoolStates for Holder {
    fn source(&self) -> &dyn SliceSource {
        self.states.source()
    }

    fn walk(&self, walk: &SliceWalk, cancel: &CancelToken) -> Result<DeviceWalk, BackendError> {
        let pool = self.states.source().pool();
        let started = Instant::now();
        let mut walker_roots = Vec::with_capacity(walk.walkers as usize);
        for w in 0..walk.walkers {
            let mut state = walk.start_state(pool.device, w);
            let mut trace = vec![state];
            for t in 0..walk.steps {
                cancel.check()?;
                let e = entry_index(&state, pool.slices());
                state = step(&self.slice(e, started, cancel), &state, t);
                trace.push(state);
            }
            walker_roots.push(MerkleTree::new(&trace).root());
        }
        let root = MerkleTree::new(&walker_roots).root();
        Ok(DeviceWalk {
            walker_roots,
            root,
            kept: Vec::new(),
        })
    }

    /// Its openings are not what this cheater is caught by: it opens none.
    fn open(
        &self,
        _: &SliceWalk,
        _: &DeviceWalk,
        _: u32,
        _: u32,
        _: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Option<StepOpening> {
        None
    }
}
