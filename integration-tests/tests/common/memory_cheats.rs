//! Miners that cheat at the memory phase (PROTOCOL.md 18), for the tests: the real CPU backend
//! for the chains, and a pool that is not what an honest miner holds. They exist only here.
//!
//! Each cheat fills the honest pool first (15 entries here, a fraction of a second) and then
//! uses only what the cheat would have: the held half of it, a made-up pool, or walk steps
//! that read nothing. What the validator sees is exactly what such a miner would send.

use gpu_attest_shared::backend::{ChainProgress, ResidentPool};
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::gemm::CpuGemm;
use gpu_attest_shared::matrix::Matrix;
use gpu_attest_shared::memory::check::CommittedEntries;
use gpu_attest_shared::memory::pool::{EntrySource, HostPool, PoolBytes, make_entry};
use gpu_attest_shared::memory::walk::{DeviceWalk, WalkSpec, WalkerTrace, entry_index, step, walk_all};
use gpu_attest_shared::memory::{ENTRY_BYTES, PoolSpec};
use gpu_attest_shared::{Backend, BackendError, CancelToken, Digest, Work};
use std::borrow::Cow;
use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryCheat {
    /// Holds only the first `held` entries of its pool and makes each other one again, at the
    /// work function's full cost, whenever the walk reads it.
    Recomputes { held: u64 },
    /// Holds the first half of its pool and fetches the rest, one entry per read, from another
    /// process over a Unix socket: a slower tier of memory. The other process is this test
    /// binary (`exe`) running its test `server_test`, with its files in `dir`.
    FetchesFromAnotherProcess {
        exe: PathBuf,
        server_test: String,
        dir: PathBuf,
    },
    /// Commits a pool of cheap entries (ChaCha8 keystream, no GEMM at all) and walks it.
    CheapPool,
    /// Walks honestly except in every odd segment, whose steps read no entry and just hash.
    FakesHalfTheSteps,
}

/// The CPU backend with a cheating pool.
pub struct CheatingPools {
    pub cpu: CpuBackend,
    pub gemm: Arc<CpuGemm>,
    pub cheat: MemoryCheat,
}

impl CheatingPools {
    pub fn new(cpu: CpuBackend, cheat: MemoryCheat) -> Self {
        CheatingPools {
            gemm: Arc::new(CpuGemm::new(cpu.threads(), Some(cpu.kernel())).unwrap()),
            cpu,
            cheat,
        }
    }
}

impl Backend for CheatingPools {
    fn describe(&self) -> String {
        self.cpu.describe()
    }
    fn device_count(&self) -> u32 {
        self.cpu.device_count()
    }
    fn devices(&self) -> Vec<gpu_attest_shared::statement::DeviceInfo> {
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
    fn holds_pools(&self) -> bool {
        true
    }
    fn fill_pool(
        &self,
        spec: &PoolSpec,
        progress: &(dyn Fn(u64) + Sync),
        cancel: &CancelToken,
    ) -> Result<Box<dyn ResidentPool>, BackendError> {
        let committed = match self.cheat {
            MemoryCheat::CheapPool => {
                let cheap = self
                    .gemm
                    .install(|| PoolBytes::keystream(spec.key(), spec.entries() as usize))
                    .unwrap();
                HostPool::from_bytes(spec, cheap).unwrap()
            }
            _ => HostPool::fill(&self.gemm, spec, progress, cancel)?,
        };
        let server = match &self.cheat {
            MemoryCheat::FetchesFromAnotherProcess { exe, server_test, dir } => {
                Some(EntryServer::start(&committed, dir, exe, server_test))
            }
            _ => None,
        };
        Ok(Box::new(CheatPool {
            pool: Arc::new(committed),
            gemm: self.gemm.clone(),
            cheat: self.cheat.clone(),
            server,
        }))
    }
}

struct CheatPool {
    pool: Arc<HostPool>,
    gemm: Arc<CpuGemm>,
    cheat: MemoryCheat,
    server: Option<EntryServer>,
}

impl ResidentPool for CheatPool {
    fn spec(&self) -> &PoolSpec {
        self.pool.spec()
    }
    fn root(&self) -> Digest {
        self.pool.root()
    }
    fn walk(&self, walk: &WalkSpec, cancel: &CancelToken) -> Result<DeviceWalk, BackendError> {
        match &self.cheat {
            MemoryCheat::Recomputes { held } => {
                let source = Recomputed {
                    pool: &self.pool,
                    gemm: &self.gemm,
                    held: *held,
                };
                self.gemm.install(|| walk_all(&source, walk, cancel))
            }
            MemoryCheat::FetchesFromAnotherProcess { .. } => {
                let Some(server) = &self.server else {
                    return Err(BackendError::Cancelled);
                };
                let source = Fetched {
                    pool: &self.pool,
                    server,
                    connections: Mutex::new(Vec::new()),
                };
                self.gemm.install(|| walk_all(&source, walk, cancel))
            }
            MemoryCheat::CheapPool => self.gemm.install(|| walk_all(self.pool.as_ref(), walk, cancel)),
            MemoryCheat::FakesHalfTheSteps => Ok(faked_walk(&self.pool, walk)),
        }
    }
    /// A miner may make entries again to open them (PROTOCOL.md 18.4): the openings are honest.
    fn committed(&self) -> &dyn CommittedEntries {
        self.pool.as_ref()
    }
}

/// The held entries from memory; every other one made again.
struct Recomputed<'a> {
    pool: &'a HostPool,
    gemm: &'a CpuGemm,
    held: u64,
}

impl EntrySource for Recomputed<'_> {
    fn entries(&self) -> u64 {
        self.pool.spec().entries()
    }
    fn entry(&self, entry: u64) -> Cow<'_, [i8]> {
        if entry < self.held {
            return EntrySource::entry(self.pool, entry);
        }
        let made = make_entry(self.gemm, self.pool.spec(), entry);
        Cow::Owned(bytemuck::cast_slice(made.as_bytes()).to_vec())
    }
}

/// The first half from memory; the rest from the entry server, a connection per thread.
struct Fetched<'a> {
    pool: &'a HostPool,
    server: &'a EntryServer,
    connections: Mutex<Vec<UnixStream>>,
}

impl EntrySource for Fetched<'_> {
    fn entries(&self) -> u64 {
        self.pool.spec().entries()
    }
    fn entry(&self, entry: u64) -> Cow<'_, [i8]> {
        let half = self.entries() / 2;
        if entry < half {
            return EntrySource::entry(self.pool, entry);
        }
        let taken = self.connections.lock().unwrap().pop();
        let mut connection = taken.unwrap_or_else(|| self.server.connect());
        connection.write_all(&(entry - half).to_le_bytes()).unwrap();
        let mut bytes = vec![0u8; ENTRY_BYTES];
        connection.read_exact(&mut bytes).unwrap();
        self.connections.lock().unwrap().push(connection);
        Cow::Owned(bytemuck::cast_slice(&bytes).to_vec())
    }
}

/// The environment variables that make a test binary an entry server (see `serve_entries`).
pub const ENTRY_FILE_VAR: &str = "GPU_ATTEST_TEST_ENTRY_FILE";
pub const ENTRY_SOCKET_VAR: &str = "GPU_ATTEST_TEST_ENTRY_SOCKET";

/// Another process holding part of a pool and serving it on a Unix socket, 64 KiB by index;
/// killed when dropped.
pub struct EntryServer {
    child: std::process::Child,
    socket: PathBuf,
}

impl EntryServer {
    /// Starts the test binary `exe` as an entry server for `pool`'s second half: `test` names
    /// the (ignored) test in it that serves when the environment asks it to.
    fn start(pool: &HostPool, dir: &std::path::Path, exe: &std::path::Path, test: &str) -> Self {
        let half = pool.spec().entries() / 2;
        let bytes: Vec<u8> = (half..pool.spec().entries())
            .flat_map(|e| pool.entry_bytes(e).to_vec())
            .collect();
        EntryServer::start_with(bytes, dir, exe, test)
    }

    /// Starts `exe`'s `test` as an entry server for `bytes`, 64 KiB an index.
    pub fn start_with(bytes: Vec<u8>, dir: &std::path::Path, exe: &std::path::Path, test: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join("entries");
        let socket = dir.join("entries.sock");
        let _ = std::fs::remove_file(&socket);
        std::fs::write(&file, bytes).unwrap();
        let child = std::process::Command::new(exe)
            .args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(ENTRY_FILE_VAR, &file)
            .env(ENTRY_SOCKET_VAR, &socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while UnixStream::connect(&socket).is_err() {
            assert!(started.elapsed().as_secs() < 30, "the entry server did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        EntryServer { child, socket }
    }

    /// A new connection to the server.
    pub fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.socket).expect("entry server")
    }
}

impl Drop for EntryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves the entries in the file `ENTRY_FILE_VAR` names on the socket `ENTRY_SOCKET_VAR` names:
/// a little-endian u64 index in, 65536 bytes out, for as long as a client stays connected, until
/// the process is killed. Returns at once when the variables are not set.
pub fn serve_entries() {
    let (Ok(file), Ok(socket)) = (std::env::var(ENTRY_FILE_VAR), std::env::var(ENTRY_SOCKET_VAR)) else {
        return;
    };
    let entries = std::fs::read(&file).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let count = (entries.len() / ENTRY_BYTES) as u64;
    std::thread::scope(|scope| {
        for connection in listener.incoming() {
            let Ok(mut connection) = connection else { continue };
            let entries = &entries;
            scope.spawn(move || {
                let mut index = [0u8; 8];
                while connection.read_exact(&mut index).is_ok() {
                    let at = (u64::from_le_bytes(index) % count) as usize * ENTRY_BYTES;
                    if connection.write_all(&entries[at..at + ENTRY_BYTES]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// The honest walk, except that every odd segment's steps read nothing: `s' = blake3(s)`.
fn faked_walk(pool: &HostPool, walk: &WalkSpec) -> DeviceWalk {
    let every = walk.params.walk_checkpoint_every;
    let traces = (0..walk.params.walkers)
        .map(|walker| {
            let mut state = walk.start_state(walker);
            let mut checkpoints = vec![state];
            for t in 0..walk.params.walk_steps {
                let segment = t / every;
                state = if segment % 2 == 1 {
                    Digest::hash(state.as_bytes())
                } else {
                    let entry = entry_index(&state, walk.entries);
                    step(bytemuck::cast_slice(pool.entry_bytes(entry)), &state, t)
                };
                if (t + 1) % every == 0 {
                    checkpoints.push(state);
                }
            }
            WalkerTrace { walker, checkpoints }
        })
        .collect();
    DeviceWalk::new(traces)
}
