//! A backend checks itself before anyone relies on it.
//!
//! Two cases, each compared checkpoint by checkpoint with a reference computed on the CPU by the
//! portable kernel (the plainest code there is, itself checked against the naive definition in
//! the GEMM oracle tests):
//!
//! - the PROTOCOL.md section 12 vector challenge (n = 64), whose chain-0 checkpoints are also
//!   compared with the published hashes, so a reference gone wrong cannot pass anything;
//! - a mid-sized challenge (n = 1024 by default: full tiles, many k-steps, two chains of four
//!   steps, a checkpoint after every step), which exercises what n = 64 cannot.
//!
//! The first difference is reported by case, chain and checkpoint. A backend that faults fails
//! with the error. The mid-sized case is also timed and the rate reported, but its few small
//! steps time launches and hashing more than the GEMM: no kernel choice rests on it, and
//! `miner bench` is what measures speed. The kernels crate's `checks` runs this for each kernel
//! on each device, caches the outcomes and chooses the kernel.

use crate::backend::{Backend, CancelToken};
use crate::chain::ChainResult;
use crate::cpu::CpuBackend;
use crate::digest::Digest;
use crate::engine::{EngineError, execute};
use crate::gemm::KernelKind;
use crate::params::{ChallengeParams, ParamsError, Work};
use crate::vectors::{VECTOR_CHAIN0_CHECKPOINTS, vector_params};
use std::time::Instant;
use thiserror::Error;

/// The default size of the mid-sized case.
pub const MID_N: u32 = 1024;

/// The mid-sized challenge at size `n`: two chains of four steps, a checkpoint after each.
pub fn mid_params(n: u32) -> ChallengeParams {
    ChallengeParams {
        nonce: [0x5e; 32],
        seed: [0x1f; 32],
        miner_key: [0x7a; 32],
        n,
        num_chains: 2,
        iterations: 4,
        checkpoint_every: 1,
    }
}

#[derive(Debug, Error)]
pub enum SelftestError {
    #[error("the {case} case is not a valid challenge: {0}", case = .1)]
    Params(ParamsError, &'static str),
    #[error("the {case} case failed to run: {source}")]
    Failed {
        case: &'static str,
        #[source]
        source: EngineError,
    },
    #[error("the {case} case differs at chain {chain}, checkpoint {checkpoint}: got {got}, expected {want}")]
    Differs {
        case: &'static str,
        chain: u64,
        checkpoint: usize,
        got: Digest,
        want: Digest,
    },
    #[error("the {case} case returned {got} chains, expected {want}")]
    ChainCount {
        case: &'static str,
        got: usize,
        want: usize,
    },
    #[error("the reference CPU backend cannot start: {0}")]
    ReferenceBackend(String),
    #[error("the reference (portable CPU kernel) does not reproduce PROTOCOL.md's vector: {0}")]
    Reference(Box<SelftestError>),
}

/// One case with the reference result every backend must reproduce.
struct Case {
    name: &'static str,
    work: Work,
    reference: Vec<ChainResult>,
}

/// The cases with their references, computed once and checked against any number of backends.
pub struct Suite {
    cases: Vec<Case>,
}

/// What a backend that passed showed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Passed {
    /// GEMM operations per second over the mid-sized case (2 n^3 per step), the whole challenge
    /// timed: generation and hashing included.
    pub ops_per_sec: f64,
}

fn work(params: ChallengeParams, case: &'static str) -> Result<Work, SelftestError> {
    Work::new(params).map_err(|e| SelftestError::Params(e, case))
}

fn run(backend: &dyn Backend, work: &Work, case: &'static str) -> Result<Vec<ChainResult>, SelftestError> {
    execute(backend, work, &|_| {}, &CancelToken::new())
        .map(|e| e.chains)
        .map_err(|source| SelftestError::Failed { case, source })
}

/// The first difference between `got` and `want`, chain by chain and checkpoint by checkpoint.
pub fn compare(case: &'static str, got: &[ChainResult], want: &[ChainResult]) -> Result<(), SelftestError> {
    if got.len() != want.len() {
        return Err(SelftestError::ChainCount {
            case,
            got: got.len(),
            want: want.len(),
        });
    }
    for (g, w) in got.iter().zip(want) {
        let checkpoints = g.checkpoints.len().max(w.checkpoints.len());
        for checkpoint in 0..checkpoints {
            let (got_digest, want_digest) = (g.checkpoints.get(checkpoint), w.checkpoints.get(checkpoint));
            if got_digest != want_digest || g.index != w.index {
                return Err(SelftestError::Differs {
                    case,
                    chain: w.index,
                    checkpoint,
                    got: got_digest.copied().unwrap_or_default(),
                    want: want_digest.copied().unwrap_or_default(),
                });
            }
        }
    }
    Ok(())
}

impl Suite {
    /// Computes the references on `threads` CPU threads (0: all cores) with the portable
    /// kernel, the mid-sized case at size `mid_n` (a multiple of 64). The vector's reference is
    /// checked against PROTOCOL.md first.
    pub fn new(mid_n: u32, threads: usize) -> Result<Self, SelftestError> {
        let reference = CpuBackend::new(threads, Some(KernelKind::Portable))
            .map_err(|e| SelftestError::ReferenceBackend(e.to_string()))?;
        let vector = work(vector_params(), "vector")?;
        let vector_reference = run(&reference, &vector, "vector")?;
        let published: Vec<Digest> = VECTOR_CHAIN0_CHECKPOINTS
            .iter()
            .map(|h| Digest::from_hex(h).expect("PROTOCOL.md's hashes are 64 hex digits"))
            .collect();
        let published = [ChainResult {
            index: 0,
            checkpoints: published,
        }];
        compare("vector", &vector_reference[..1], &published).map_err(|e| SelftestError::Reference(Box::new(e)))?;
        let mid = work(mid_params(mid_n), "mid-sized")?;
        let mid_reference = run(&reference, &mid, "mid-sized")?;
        Ok(Suite {
            cases: vec![
                Case {
                    name: "vector",
                    work: vector,
                    reference: vector_reference,
                },
                Case {
                    name: "mid-sized",
                    work: mid,
                    reference: mid_reference,
                },
            ],
        })
    }

    /// Runs every case on `backend` and compares it with the reference.
    pub fn check(&self, backend: &dyn Backend) -> Result<Passed, SelftestError> {
        let mut ops_per_sec = 0.0;
        for case in &self.cases {
            let started = Instant::now();
            let got = run(backend, &case.work, case.name)?;
            let seconds = started.elapsed().as_secs_f64();
            compare(case.name, &got, &case.reference)?;
            let n = case.work.n() as f64;
            let ops = 2.0 * n * n * n * case.work.num_chains() as f64 * f64::from(case.work.iterations());
            ops_per_sec = ops / seconds.max(1e-9);
        }
        Ok(Passed { ops_per_sec })
    }

    /// A description of the cases, for reports.
    pub fn describe(&self) -> String {
        self.cases
            .iter()
            .map(|c| {
                format!(
                    "{} (n = {}, {} chains, {} steps)",
                    c.name,
                    c.work.n(),
                    c.work.num_chains(),
                    c.work.iterations()
                )
            })
            .collect::<Vec<_>>()
            .join(" and ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendError, ChainProgress};
    use crate::matrix::Matrix;
    use std::ops::Range;

    /// The CPU backend with one checkpoint of one chain flipped, as a kernel with a bug in a
    /// tile edge would give.
    struct OffByOne {
        cpu: CpuBackend,
        chain: u64,
        checkpoint: usize,
    }

    impl Backend for OffByOne {
        fn describe(&self) -> String {
            "off by one".into()
        }
        fn device_count(&self) -> u32 {
            1
        }
        fn devices(&self) -> Vec<crate::statement::DeviceInfo> {
            vec![crate::statement::DeviceInfo::default()]
        }
        fn run_chains(
            &self,
            device: u32,
            work: &Work,
            chains: Range<u64>,
            progress: ChainProgress<'_>,
            cancel: &CancelToken,
        ) -> Result<Vec<ChainResult>, BackendError> {
            let mut results = self.cpu.run_chains(device, work, chains, progress, cancel)?;
            if work.n() > 64
                && let Some(r) = results.iter_mut().find(|r| r.index == self.chain)
            {
                r.checkpoints[self.checkpoint] = Digest::hash(b"wrong");
            }
            Ok(results)
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

    #[test]
    fn every_cpu_kernel_passes_and_a_wrong_checkpoint_is_named() {
        let suite = Suite::new(128, 0).unwrap();
        for kernel in KernelKind::ALL.into_iter().filter(|k| k.is_available()) {
            let backend = CpuBackend::new(0, Some(kernel)).unwrap();
            let passed = suite.check(&backend).unwrap_or_else(|e| panic!("{kernel}: {e}"));
            assert!(passed.ops_per_sec > 0.0);
        }
        let broken = OffByOne {
            cpu: CpuBackend::new(0, None).unwrap(),
            chain: 1,
            checkpoint: 3,
        };
        let err = suite.check(&broken).unwrap_err().to_string();
        assert!(
            err.starts_with("the mid-sized case differs at chain 1, checkpoint 3: got "),
            "{err}"
        );
    }

    #[test]
    fn the_vector_case_is_protocol_md_section_12() {
        // The suite refuses to exist if its reference does not give the published hashes, so a
        // change to these parameters or to the engine cannot pass a broken backend.
        let suite = Suite::new(64, 1).unwrap();
        assert!(
            suite.describe().starts_with("vector (n = 64, 5 chains, 4 steps)"),
            "{}",
            suite.describe()
        );
        let mut params = vector_params();
        params.seed[0] ^= 1;
        let other = run(
            &CpuBackend::new(1, Some(KernelKind::Portable)).unwrap(),
            &Work::new(params).unwrap(),
            "x",
        )
        .unwrap();
        let published = suite.cases[0].reference[..1].to_vec();
        assert!(compare("vector", &other[..1], &published).is_err());
    }
}
