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
use super::pool_cheat::{PoolCheat, host_slices};
use super::step_fakes::committed_walk;
use gpu_attest_shared::backend::PoolStates;
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::matrix::generate_a;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::slice::SLICE_BYTES;
use gpu_attest_shared::memory::slice_walk::{DeviceWalk, SliceWalk, StepOpening, step};
use gpu_attest_shared::memory::step::entry_index;
use gpu_attest_shared::merkle::MerkleProof;
use gpu_attest_shared::{Backend, BackendError, CancelToken, Digest, Work};
use std::borrow::Cow;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The cheat: pool states held but for every tenth (the CPU backend wears it as
/// `CheatingCpu<NinetyPercent>`).
pub struct NinetyPercent {
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

impl PoolCheat for NinetyPercent {
    fn cheat(
        &self,
        cpu: &Arc<CpuBackend>,
        device: u32,
        work: &Work,
        pool: ChainPool,
        _: &mut [ChainResult],
        states: Box<dyn PoolStates>,
    ) -> Box<dyn PoolStates> {
        // The fetched states go to the other process; all of them stay here only so that the
        // held ones can be read (the walk never reads a missing one from here).
        let fetched: Vec<u8> = (0..pool.chains)
            .filter(|&k| missing(k) == Some(false))
            .flat_map(|k| host_slices(states.as_ref()).slice(k).to_vec())
            .collect();
        let server = (!fetched.is_empty()).then(|| {
            EntryServer::start_with(
                fetched,
                &self.dir.join(format!("device-{device}")),
                &self.server_exe,
                &self.server_test,
            )
        });
        Box::new(Holder {
            states,
            cpu: cpu.clone(),
            work: work.clone(),
            server,
            connections: Mutex::new(Vec::new()),
            give_up: self.give_up,
        })
    }
}

struct Holder {
    states: Box<dyn PoolStates>,
    cpu: Arc<CpuBackend>,
    work: Work,
    server: Option<EntryServer>,
    /// Connections to the other process, one a walking thread at most.
    connections: Mutex<Vec<UnixStream>>,
    give_up: Duration,
}

impl Holder {
    /// Slice `e` of the pool (n = 256: one state a slice), from wherever the holder has it.
    fn slice(&self, e: u64, since: Instant, cancel: &CancelToken) -> Cow<'_, [u8]> {
        let pool = self.states.pool();
        let (chain, _) = pool.locate(e);
        let k = chain - pool.first_chain;
        match missing(k) {
            None => Cow::Borrowed(host_slices(self.states.as_ref()).slice(e)),
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
                let taken = self.connections.lock().unwrap().pop();
                let mut stream = taken.unwrap_or_else(|| server.connect());
                stream.write_all(&fetched_index.to_le_bytes()).unwrap();
                let mut bytes = vec![0u8; SLICE_BYTES];
                stream.read_exact(&mut bytes).unwrap();
                self.connections.lock().unwrap().push(stream);
                Cow::Owned(bytes)
            }
        }
    }
}

impl PoolStates for Holder {
    fn pool(&self) -> &ChainPool {
        self.states.pool()
    }

    /// The walkers split over the CPU's threads, as the honest walk runs them, so that what
    /// makes this walk late is the missing states alone.
    fn walk(
        &self,
        walk: &SliceWalk,
        cancel: &CancelToken,
        ended: &(dyn Fn(Digest) + Sync),
    ) -> Result<DeviceWalk, BackendError> {
        let pool = self.states.pool();
        let started = Instant::now();
        let trace = |w: u32| -> Result<Vec<Digest>, BackendError> {
            let mut state = walk.start_state(pool.device, w);
            let mut trace = vec![state];
            for t in 0..walk.steps {
                cancel.check()?;
                let e = entry_index(&state, pool.slices());
                state = step(&self.slice(e, started, cancel), &state, t);
                trace.push(state);
            }
            Ok(trace)
        };
        let threads = self.cpu.threads().max(1) as u32;
        let traces: Result<Vec<Vec<Vec<Digest>>>, BackendError> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|first| {
                    let trace = &trace;
                    scope.spawn(move || {
                        (first..walk.walkers)
                            .step_by(threads as usize)
                            .map(trace)
                            .collect::<Result<Vec<_>, _>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a walking thread"))
                .collect()
        });
        // Back in walker order: thread `i` walked walkers `i, i + threads, ...`.
        let mut by_thread = traces?;
        let traces = (0..walk.walkers)
            .map(|w| std::mem::take(&mut by_thread[(w % threads) as usize][(w / threads) as usize]))
            .collect::<Vec<_>>();
        let walked = committed_walk(&traces);
        ended(walked.root);
        Ok(walked)
    }

    /// Its openings are not what this cheater is caught by: it opens none.
    fn open(
        &self,
        _: &SliceWalk,
        _: &DeviceWalk,
        _: u32,
        _: u32,
        _: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Result<Option<StepOpening>, BackendError> {
        Ok(None)
    }
}
