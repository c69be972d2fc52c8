//! Protocol version 4's pool (docs/design/protocol-v4.md 2.1 and 2.2): the final states
//! `X_{i,K}` of the first `N_j` chains of device `j`, kept resident, read by the walk in 64 KiB
//! slices. Nothing is computed for the pool beyond the chains themselves.
//!
//! A slice is checked two ways: against the state's hash (the chain's last checkpoint, by the
//! slice's BLAKE3 path, [`super::slice`]), and against the work function, one row at a time: row
//! `r` of `X_{i,K}` depends only on row `r` of `A_i` and on `B_i`, so a validator makes it with
//! `K` vector-matrix products instead of the whole chain ([`StateRows`]).

use super::slice::SLICE_BYTES;
use crate::matrix::{Matrix, a_row, generate_b};
use crate::mix::mix;
use crate::params::Work;
use crate::partition::DeviceSlice;
use thiserror::Error;

/// Most steps per walker in version 4: every state is a leaf of its walker's tree, and an
/// opened step carries two paths of `log2(L + 1)` siblings.
pub const MAX_WALK_STEPS: u32 = 1 << 20;
/// Most slices in one device's pool: `2^24` slices are 1 TiB.
pub const MAX_POOL_SLICES: u64 = 1 << 24;

/// The memory phase of a version 4 challenge (PROTOCOL.md 20), as the validator sets it: the
/// walk's shape, and how many of each device's chains keep their final states as its pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainPoolParams {
    /// W: walkers per device.
    pub walkers: u32,
    /// L: steps per walker.
    pub walk_steps: u32,
    /// N_j, one per device in index order.
    pub pool_chains: Vec<u64>,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChainPoolParamsError {
    #[error("walkers {0} is outside 1..={max}", max = super::params::MAX_WALKERS)]
    Walkers(u32),
    #[error("walk_steps {0} is outside 1..={MAX_WALK_STEPS}")]
    WalkSteps(u32),
    #[error("{given} pool sizes for {devices} devices: one per device")]
    PoolCount { given: usize, devices: usize },
    #[error(transparent)]
    Pool(#[from] ChainPoolError),
    #[error("device {device}'s pool of {pool} chains is more than the {chains} chains it runs")]
    OverChains { device: u32, pool: u64, chains: u64 },
    #[error("device {device}'s pool of {slices} slices is more than {MAX_POOL_SLICES}")]
    TooManySlices { device: u32, slices: u64 },
}

impl ChainPoolParams {
    /// Bytes each device's walk reads: `W * L` slices of 64 KiB.
    pub fn walk_bytes(&self) -> u64 {
        u64::from(self.walkers) * u64::from(self.walk_steps) * SLICE_BYTES as u64
    }

    /// Each device's pool under `work`, split over devices as `partition` (section 6) says,
    /// after every limit of PROTOCOL.md 20.1 and 20.4 is checked.
    pub fn pools(&self, work: &Work, partition: &[DeviceSlice]) -> Result<Vec<ChainPool>, ChainPoolParamsError> {
        if !(1..=super::params::MAX_WALKERS).contains(&self.walkers) {
            return Err(ChainPoolParamsError::Walkers(self.walkers));
        }
        if !(1..=MAX_WALK_STEPS).contains(&self.walk_steps) {
            return Err(ChainPoolParamsError::WalkSteps(self.walk_steps));
        }
        chain_pools(work, partition, &self.pool_chains)
    }
}

/// Each device's pool of its first `pool_chains[j]` chains (`1 <= N_j <= count_j`, one per
/// device of `partition`), in whole slices and at most [`MAX_POOL_SLICES`] a device.
pub fn chain_pools(
    work: &Work,
    partition: &[DeviceSlice],
    pool_chains: &[u64],
) -> Result<Vec<ChainPool>, ChainPoolParamsError> {
    if pool_chains.len() != partition.len() {
        return Err(ChainPoolParamsError::PoolCount {
            given: pool_chains.len(),
            devices: partition.len(),
        });
    }
    let mut pools = Vec::with_capacity(partition.len());
    for (slice, &chains) in partition.iter().zip(pool_chains) {
        if chains > slice.count {
            return Err(ChainPoolParamsError::OverChains {
                device: slice.index,
                pool: chains,
                chains: slice.count,
            });
        }
        let pool = ChainPool::new(slice.index, slice.offset, chains, work.n())?;
        if pool.slices() > MAX_POOL_SLICES {
            return Err(ChainPoolParamsError::TooManySlices {
                device: slice.index,
                slices: pool.slices(),
            });
        }
        pools.push(pool);
    }
    Ok(pools)
}

/// One device's pool: chains `first_chain .. first_chain + chains` of the challenge, whose final
/// states are `n x n` bytes each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainPool {
    pub device: u32,
    pub first_chain: u64,
    pub chains: u64,
    pub n: usize,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChainPoolError {
    #[error("n = {0} is not a multiple of 256: a state must be whole 64 KiB slices")]
    NotWholeSlices(usize),
    #[error("device {device}'s pool has no chains")]
    Empty { device: u32 },
}

impl ChainPool {
    pub fn new(device: u32, first_chain: u64, chains: u64, n: usize) -> Result<Self, ChainPoolError> {
        if n == 0 || !n.is_multiple_of(256) {
            return Err(ChainPoolError::NotWholeSlices(n));
        }
        if chains == 0 {
            return Err(ChainPoolError::Empty { device });
        }
        Ok(ChainPool {
            device,
            first_chain,
            chains,
            n,
        })
    }

    /// Bytes in one state, `n^2`.
    pub fn state_bytes(&self) -> u64 {
        (self.n * self.n) as u64
    }

    /// `R = n^2 / 65536`: slices in one state.
    pub fn slices_per_state(&self) -> u64 {
        self.state_bytes() / SLICE_BYTES as u64
    }

    /// `P_j = N_j * R`: slices the walk chooses among.
    pub fn slices(&self) -> u64 {
        self.chains * self.slices_per_state()
    }

    /// Pool slice `e`: the chain whose state holds it, and the slice's index in that state.
    pub fn locate(&self, e: u64) -> (u64, u64) {
        let r = self.slices_per_state();
        (self.first_chain + e / r, e % r)
    }

    /// State rows whose bytes lie in one slice where every slice holds whole rows (`n` a power of
    /// two): `65536 / n`. Elsewhere a slice holds `65536 / n` rows and parts of one or two more:
    /// [`ChainPool::slice_rows`] says which.
    pub fn rows_per_slice(&self) -> u32 {
        (SLICE_BYTES / self.n) as u32
    }

    /// The rows of a state that have bytes in its slice `q` (PROTOCOL.md 20.1): the first, and
    /// how many. Where `n` divides 65536 they are `65536 / n` whole rows from `q * 65536 / n`;
    /// at any other allowed `n` (768, say: 85.33 rows a slice) the first and last may be cut by
    /// the slice's edges.
    pub fn slice_rows(&self, q: u64) -> (u32, u32) {
        let (slice, n) = (SLICE_BYTES as u64, self.n as u64);
        let first = q * slice / n;
        let last = ((q + 1) * slice - 1) / n;
        (first as u32, (last - first + 1) as u32)
    }

    /// The bytes row `row` and slice `q` share: as a range of the row, and as one of the slice.
    /// Empty ranges where they share none.
    pub fn row_in_slice(&self, row: u32, q: u64) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let n = self.n as u64;
        let (row_start, slice_start) = (u64::from(row) * n, q * SLICE_BYTES as u64);
        let low = row_start.max(slice_start);
        let high = (row_start + n).min(slice_start + SLICE_BYTES as u64).max(low);
        let of = |base: u64| (low - base) as usize..(high - base) as usize;
        (of(row_start), of(slice_start))
    }
}

/// Rows of `X_{chain, work.iterations()}`, made alone: `x_0` is row `row` of `A_chain` (its `n`
/// bytes of ChaCha8 stream `2 chain` at offset `row * n`), and
/// `x_{k+1}[c] = mix(sum over i of x_k[i] * B[i][c], k, row, c)`, exactly the chain's step.
/// `B_chain` is made once, for every row a check draws from the chain.
pub struct StateRows<'a> {
    work: &'a Work,
    chain: u64,
    b: Matrix,
}

impl<'a> StateRows<'a> {
    pub fn new(work: &'a Work, chain: u64) -> Self {
        StateRows {
            work,
            chain,
            b: generate_b(work.key(), chain, work.n()),
        }
    }

    pub fn row(&self, row: u32) -> Vec<i8> {
        let n = self.work.n();
        let b = self.b.as_slice();
        let mut bytes = vec![0u8; n];
        a_row(self.work.key(), self.chain, row, &mut bytes);
        let mut x: Vec<i8> = bytes.into_iter().map(|v| v as i8).collect();
        let mut y = vec![0i32; n];
        // One row of B's products at a time, made in i16 (|x b| <= 2^14 fits) and then added
        // into the i32 sums: two loops the compiler vectorises on any x86-64, 1.75 times the
        // speed of one i32 loop here (`cargo bench -p gpu-attest-shared --bench row_check`).
        let mut products = vec![0i16; n];
        for k in 0..self.work.iterations() {
            y.fill(0);
            for (&xi, b_row) in x.iter().zip(b.chunks_exact(n)) {
                let xi = i16::from(xi);
                for (p, &bc) in products.iter_mut().zip(b_row) {
                    *p = xi * i16::from(bc);
                }
                for (acc, &p) in y.iter_mut().zip(&products) {
                    *acc += i32::from(p);
                }
            }
            for (c, (out, &acc)) in x.iter_mut().zip(&y).enumerate() {
                *out = mix(acc, k, row, c as u32);
            }
        }
        x
    }
}

/// Row `row` of `X_{chain, work.iterations()}` alone ([`StateRows`], for one row).
pub fn state_row(work: &Work, chain: u64, row: u32) -> Vec<i8> {
    StateRows::new(work, chain).row(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{ChallengeParams, Work};
    use crate::reference;

    fn work(n: u32, iterations: u32) -> Work {
        Work::new(ChallengeParams {
            seed: [7; 32],
            nonce: [9; 32],
            miner_key: [1; 32],
            n,
            num_chains: 6,
            iterations,
            checkpoint_every: iterations,
        })
        .unwrap()
    }

    #[test]
    fn a_row_made_alone_is_the_chains_row() {
        for (n, iterations) in [(256, 3), (512, 2)] {
            let work = work(n, iterations);
            let n = n as usize;
            let state = reference::chain_state(work.key(), 4, n, iterations);
            for row in [0, 1, 77, n as u32 - 1] {
                let at = row as usize * n;
                assert_eq!(
                    state_row(&work, 4, row),
                    state.as_slice()[at..at + n],
                    "n = {n}, row {row}"
                );
            }
            // Another chain's row is not this one's.
            assert_ne!(state_row(&work, 5, 0), state.as_slice()[..n]);
        }
    }

    #[test]
    fn slices_are_located_in_their_chains() {
        let pool = ChainPool::new(1, 10, 3, 512).unwrap();
        assert_eq!(
            (pool.slices_per_state(), pool.slices(), pool.rows_per_slice()),
            (4, 12, 128)
        );
        assert_eq!(pool.locate(0), (10, 0));
        assert_eq!(pool.locate(5), (11, 1));
        assert_eq!(pool.locate(11), (12, 3));
        // Where n divides a slice, its rows are whole: the same rows either way.
        assert_eq!(pool.slice_rows(3), (384, 128));
        assert_eq!(pool.row_in_slice(385, 3), (0..512, 512..1024));
        // n = 768: 85.33 rows a slice. Slice 1 starts a third of the way into row 85, ends two
        // thirds into row 170, and holds rows 85 to 170, the first and last cut.
        let cut = ChainPool::new(0, 0, 1, 768).unwrap();
        assert_eq!(cut.slices_per_state(), 9);
        assert_eq!(cut.slice_rows(0), (0, 86));
        assert_eq!(cut.slice_rows(1), (85, 86));
        assert_eq!(cut.slice_rows(8), (682, 86));
        assert_eq!(cut.row_in_slice(85, 1), (256..768, 0..512));
        assert_eq!(cut.row_in_slice(170, 1), (0..512, 65024..65536));
        assert_eq!(cut.row_in_slice(86, 1), (0..768, 512..1280));
        let (none_of_row, none_of_slice) = cut.row_in_slice(171, 1);
        assert!(none_of_row.is_empty() && none_of_slice.is_empty());
        // Every byte of a state in exactly one slice, every row's bytes across its slices.
        for q in 0..9 {
            let (first, count) = cut.slice_rows(q);
            let held: usize = (first..first + count).map(|r| cut.row_in_slice(r, q).1.len()).sum();
            assert_eq!(held, 65536, "slice {q}");
        }
        assert_eq!(ChainPool::new(0, 0, 1, 300), Err(ChainPoolError::NotWholeSlices(300)));
        assert_eq!(ChainPool::new(2, 0, 0, 256), Err(ChainPoolError::Empty { device: 2 }));
    }

    /// Every limit of a version 4 challenge's memory phase, each its own error; the pools of a
    /// good one start at their devices' offsets.
    #[test]
    fn a_chain_pool_is_checked_against_the_challenge() {
        let work = work(256, 1);
        let partition = crate::partition::canonical_partition(5, 2).unwrap();
        let good = ChainPoolParams {
            walkers: 4,
            walk_steps: 16,
            pool_chains: vec![3, 1],
        };
        let pools = good.pools(&work, &partition).unwrap();
        assert_eq!(
            pools
                .iter()
                .map(|p| (p.device, p.first_chain, p.chains))
                .collect::<Vec<_>>(),
            vec![(0, 0, 3), (1, partition[1].offset, 1)]
        );
        let with = |change: fn(&mut ChainPoolParams)| {
            let mut params = good.clone();
            change(&mut params);
            params.pools(&work, &partition).unwrap_err()
        };
        assert_eq!(with(|p| p.walkers = 0), ChainPoolParamsError::Walkers(0));
        assert_eq!(
            with(|p| p.walkers = (1 << 16) + 1),
            ChainPoolParamsError::Walkers(65537)
        );
        assert_eq!(with(|p| p.walk_steps = 0), ChainPoolParamsError::WalkSteps(0));
        assert_eq!(
            with(|p| p.walk_steps = MAX_WALK_STEPS + 1),
            ChainPoolParamsError::WalkSteps(MAX_WALK_STEPS + 1)
        );
        assert_eq!(
            with(|p| p.pool_chains = vec![1]),
            ChainPoolParamsError::PoolCount { given: 1, devices: 2 }
        );
        assert_eq!(
            with(|p| p.pool_chains = vec![4, 1]),
            ChainPoolParamsError::OverChains {
                device: 0,
                pool: 4,
                chains: 3
            }
        );
        assert_eq!(
            with(|p| p.pool_chains = vec![1, 0]),
            ChainPoolParamsError::Pool(ChainPoolError::Empty { device: 1 })
        );
    }
}
