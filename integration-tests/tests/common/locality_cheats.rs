//! Version 4 pools whose locality walk (PROTOCOL.md 20.10) is not the honest one: the cheaters
//! of `timed/locality.rs`. Each wraps the CPU backend's honest states and changes only the
//! locality walk; the chains, the version 4 walk and its openings stay honest.

use super::pool_cheat::PoolCheat;
use gpu_attest_shared::backend::PoolStates;
use gpu_attest_shared::chain::ChainResult;
use gpu_attest_shared::cpu::CpuBackend;
use gpu_attest_shared::memory::chain_pool::ChainPool;
use gpu_attest_shared::memory::locality::{LineWalk, LocalityWalk, State};
use gpu_attest_shared::memory::slice_walk::{DeviceWalk, SliceSource, SliceWalk, StepOpening};
use gpu_attest_shared::merkle::{MerkleProof, MerkleTree};
use gpu_attest_shared::{BackendError, CancelToken, Digest, Work};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub enum LocalityCheat {
    /// Walks the first generation and makes up every later generation's ends: the time of one
    /// generation for the whole walk (the limit of a walker split into pieces walked side by
    /// side, each piece starting from a made-up state).
    MadeUpEnds,
    /// Serves its lines from afar: the honest walk, then as long again as `delay` says a hop
    /// per step would have cost.
    FromAfar(Duration),
    /// A pool that cannot walk lines (as one held on a GPU in this release): the miner answers
    /// UNIMPLEMENTED.
    NoLineWalk,
}

impl PoolCheat for LocalityCheat {
    fn cheat(
        &self,
        _: &Arc<CpuBackend>,
        _: u32,
        _: &Work,
        _: ChainPool,
        _: &mut [ChainResult],
        states: Box<dyn PoolStates>,
    ) -> Box<dyn PoolStates> {
        Box::new(Cheating { states, cheat: *self })
    }
}

struct Cheating {
    states: Box<dyn PoolStates>,
    cheat: LocalityCheat,
}

impl PoolStates for Cheating {
    fn pool(&self) -> &ChainPool {
        self.states.pool()
    }

    fn host_states(&self) -> Option<&dyn SliceSource> {
        match self.cheat {
            LocalityCheat::NoLineWalk => None,
            _ => self.states.host_states(),
        }
    }

    fn walk(
        &self,
        walk: &SliceWalk,
        cancel: &CancelToken,
        ended: &(dyn Fn(Digest) + Sync),
    ) -> Result<DeviceWalk, BackendError> {
        self.states.walk(walk, cancel, ended)
    }

    fn open(
        &self,
        walk: &SliceWalk,
        walked: &DeviceWalk,
        walker: u32,
        step: u32,
        chain: &dyn Fn(u64) -> (Vec<Digest>, MerkleProof),
    ) -> Result<Option<StepOpening>, BackendError> {
        self.states.open(walk, walked, walker, step, chain)
    }

    fn walk_lines(&self, walk: &LocalityWalk, cancel: &CancelToken) -> Result<LineWalk, BackendError> {
        match self.cheat {
            LocalityCheat::NoLineWalk => Err(BackendError::Unsupported {
                what: "walk lines of a pool held on a device",
            }),
            LocalityCheat::FromAfar(delay) => {
                let walked = self.states.walk_lines(walk, cancel)?;
                std::thread::sleep(delay);
                Ok(walked)
            }
            LocalityCheat::MadeUpEnds => {
                let first = LocalityWalk {
                    generations: 1,
                    ..walk.clone()
                };
                let mut ends = self.states.walk_lines(&first, cancel)?.ends;
                for g in 1..walk.generations {
                    ends.extend((0..walk.walkers).map(|w| State([u64::from(g), u64::from(w), 7, 7])));
                }
                let device = self.pool().device;
                let digests: Vec<Digest> = ends
                    .chunks(walk.walkers as usize)
                    .enumerate()
                    .map(|(g, e)| walk.generation_digest(device, g as u32, e))
                    .collect();
                Ok(LineWalk {
                    walkers: walk.walkers,
                    root: MerkleTree::new(&digests).root(),
                    ends,
                    digests,
                })
            }
        }
    }
}
