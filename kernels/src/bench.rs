//! GPU measurements for `miner bench`: the fused kernels, a cuBLASLt int8 GEMM followed by a
//! separate mix pass (the baseline the fused kernels must beat), a whole challenge against its
//! GEMM-only time, and the memory walk (`super::walk`). Timed with CUDA events on the device's
//! stream (`super::timing`).

use super::backend::CudaBackend;
use super::device::DeviceRuntime;
use super::raw::cublaslt;
use super::raw::device_memory::alloc_uninit;
use super::raw::launch::MixArgs;
use super::timing::time_launches;
use cudarc::driver::{CudaSlice, LaunchConfig};
use gpu_attest_shared::backend::{BackendError, CancelToken};
use gpu_attest_shared::params::{ChallengeParams, Work};
use std::time::{Duration, Instant};

/// Dense int8 tensor-core peaks, TOPS, from NVIDIA's data sheets; matched on the device name.
const INT8_PEAKS: [(&str, f64); 8] = [
    ("H200", 1979.0),
    ("H100 SXM", 1979.0),
    ("H100 80GB HBM3", 1979.0),
    ("H100 NVL", 1671.0),
    ("H100 PCIe", 1513.0),
    ("A100", 624.0),
    ("L40S", 733.0),
    ("L4", 242.5),
];

/// Copy bandwidth, bytes/s, for the floor's memory term: measured copy bandwidth of each model.
const BANDWIDTHS: [(&str, f64); 4] = [
    ("H200", 4.3e12),
    ("H100 SXM", 3.0e12),
    ("H100 80GB HBM3", 3.0e12),
    ("A100", 1.6e12),
];

fn lookup(table: &[(&str, f64)], name: &str) -> Option<f64> {
    table.iter().find(|(key, _)| name.contains(key)).map(|&(_, v)| v)
}

/// The device's dense int8 peak in TOPS, when it is in the table.
pub fn int8_peak_tops(name: &str) -> Option<f64> {
    lookup(&INT8_PEAKS, name)
}

/// The floor for one GEMM step (BENCHMARKS.md): max(2 n^3 / peak, 3 n^2 / bandwidth), in seconds.
pub fn step_floor_seconds(name: &str, n: usize) -> Option<f64> {
    let n = n as f64;
    let compute = 2.0 * n * n * n / (int8_peak_tops(name)? * 1e12);
    let memory = lookup(&BANDWIDTHS, name).map_or(0.0, |bw| 3.0 * n * n / bw);
    Some(compute.max(memory))
}

/// Chains per launch for a benchmark at size n: enough work per launch (about 2^37 operations)
/// that launch overhead does not hide the kernel, as the miner's own batches do.
pub fn bench_batch(n: usize) -> usize {
    let ops = 2 * (n as u64).pow(3);
    ((1u64 << 37) / ops).clamp(1, 256) as usize
}

/// The first `batch` chains of a fixed key, as the miner starts them: (X_0, free scratch, B^T).
fn operands(rt: &DeviceRuntime, n: usize, batch: usize) -> Result<BenchOperands, BackendError> {
    let len = batch * n * n;
    let (mut x, mut scratch, mut bt) = (rt.alloc(len)?, rt.alloc(len)?, rt.alloc(len)?);
    rt.load_chains(&[0x5eed_u32; 8], 0..batch as u64, n, &mut x, &mut scratch, &mut bt)?;
    Ok((x, scratch, bt))
}

type BenchOperands = (CudaSlice<i8>, CudaSlice<i8>, CudaSlice<i8>);

/// Seconds per fused GEMM+mix launch over `batch` chains of size n.
pub fn fused_step_seconds(rt: &DeviceRuntime, n: usize, batch: usize, budget: Duration) -> Result<f64, BackendError> {
    let (mut x, mut next, bt) = operands(rt, n, batch)?;
    time_launches(rt, budget, |step| {
        rt.gemm_mix(&x, &bt, &mut next, batch, n, step)?;
        std::mem::swap(&mut x, &mut next);
        Ok(())
    })
}

/// cuBLASLt's int8 GEMM (int32 out), then the separate mix pass: what a miner without fused
/// kernels would run per step. Err with a reason when cuBLASLt is missing or refuses the shape.
pub fn cublaslt_mix_seconds(rt: &DeviceRuntime, n: usize, batch: usize, budget: Duration) -> Result<f64, String> {
    if !cublaslt::library_present() {
        return Err("cuBLASLt (libcublasLt) not found".into());
    }
    let len = batch * n * n;
    let e = |e: BackendError| e.to_string();
    let (mut x, mut next, bt) = operands(rt, n, batch).map_err(e)?;
    // Undefined contents are enough: written by the GEMM before the mix reads it.
    let mut y: CudaSlice<i32> = alloc_uninit::<i32>(&rt.stream, len).map_err(|err| rt.err(err).to_string())?;
    let gemm = cublaslt::LtInt8Gemm::new(n, batch)?;
    let (count, n_u32) = (len as u64, n as u32);
    let cfg = LaunchConfig::for_num_elems(len as u32);
    time_launches(rt, budget, |step| {
        gemm.run(&rt.stream, &bt, &x, &mut y)
            .map_err(|detail| BackendError::Device {
                device: rt.index,
                detail,
            })?;
        // Both buffers hold `len` elements, whole n x n matrices.
        let args = MixArgs {
            y: &y,
            out: &mut next,
            count,
            step,
            n: n_u32,
        };
        rt.mix.launch(&rt.stream, cfg, args).map_err(|err| rt.err(err))?;
        std::mem::swap(&mut x, &mut next);
        Ok(())
    })
    .map_err(e)
}

/// One device's figures at one size.
#[derive(Clone, Debug)]
pub struct GpuBench {
    pub device: u32,
    pub name: String,
    pub n: usize,
    pub batch: usize,
    /// Seconds per chain step (one GEMM+mix of one chain), fused kernel.
    pub fused_step: f64,
    /// Seconds per chain step, cuBLASLt int8 then mix; Err: why it could not run.
    pub cublaslt_step: Result<f64, String>,
    /// A whole challenge of about the budget's length (generation, 32 steps per chain,
    /// checkpoints, copies, hashing) over the GEMM-only time of the same steps.
    pub challenge_over_gemm: f64,
}

impl CudaBackend {
    /// The memory walk bench ([`super::walk_bench::bench_walk`]) on device `device` (its partition
    /// index).
    pub fn bench_walk(
        &self,
        device: u32,
        pool_bytes: u64,
        walkers: u32,
        budget: Duration,
    ) -> Result<super::walk_bench::WalkBench, BackendError> {
        self.on_device(device, |rt| {
            super::walk_bench::bench_walk(rt, pool_bytes, walkers, budget)
        })
    }

    /// Measures device `device` at size `n` for about `budget` per figure.
    pub fn bench(&self, device: u32, n: usize, budget: Duration) -> Result<GpuBench, BackendError> {
        let batch = bench_batch(n);
        let (fused, cublaslt, name) = self.on_device(device, |rt| {
            let fused = fused_step_seconds(rt, n, batch, budget)?;
            let cublaslt = cublaslt_mix_seconds(rt, n, batch, budget);
            Ok((fused, cublaslt, rt.gpu.name.clone()))
        })?;
        let (chains, iterations) = whole_challenge_shape(batch, fused, budget);
        let params = ChallengeParams {
            n: n as u32,
            num_chains: chains,
            iterations,
            checkpoint_every: 8,
            nonce: [1; 32],
            seed: [2; 32],
            miner_key: [3; 32],
        };
        let work = Work::new(params).map_err(|e| BackendError::Device {
            device,
            detail: e.to_string(),
        })?;
        // The faster of two runs: one run's pause (a clock ramp, another process) is not the
        // pipeline's cost, and a single 6 ms run once read 1.9x where every other read 1.1x.
        let mut challenge = f64::INFINITY;
        for _ in 0..WHOLE_CHALLENGE_RUNS {
            let started = Instant::now();
            self.on_device(device, |rt| {
                rt.run_chains(&work, 0..chains, &|_| {}, &CancelToken::new())
            })?;
            challenge = challenge.min(started.elapsed().as_secs_f64());
        }
        let gemm_only = fused / batch as f64 * chains as f64 * f64::from(iterations);
        Ok(GpuBench {
            device,
            name,
            n,
            batch,
            fused_step: fused / batch as f64,
            cublaslt_step: cublaslt.map(|s| s / batch as f64),
            challenge_over_gemm: challenge / gemm_only,
        })
    }
}

/// Runs of the whole challenge; the fastest counts.
const WHOLE_CHALLENGE_RUNS: usize = 2;

/// Chains and steps of the whole challenge `bench` times against its GEMM-only time: 32 steps
/// per chain with a checkpoint every 8, as a validator's challenges are shaped, and enough
/// chains (whole launches of `batch`) for about `budget` of GEMM work, at most 64 launches'
/// worth (on an H100 that is 0.3-0.5 s of work), so that the one-time costs (buffers, the
/// first generation) weigh on it as they do on a longer challenge. `launch_seconds` is one
/// fused step of `batch` chains.
///
/// The GEMM-only time it is compared with is the bench's own launches of `batch` chains; the
/// challenge launches as many chains at once as free VRAM allows, which fill the GPU better, so
/// the ratio can come out under 1.
fn whole_challenge_shape(batch: usize, launch_seconds: f64, budget: Duration) -> (u64, u32) {
    const ITERATIONS: u32 = 32;
    let launches = budget.as_secs_f64() / (launch_seconds * f64::from(ITERATIONS));
    let batches = if launches.is_finite() {
        launches.clamp(1.0, 64.0) as u64
    } else {
        1
    };
    (batches * batch as u64, ITERATIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_challenge_lasts_about_the_budget() {
        // 8 chains per launch at 150 us a launch: 32 steps take 4.8 ms, so 2 s is 416 batches,
        // capped at 64.
        assert_eq!(whole_challenge_shape(8, 150e-6, Duration::from_secs(2)), (512, 32));
        // 1 chain at 4 ms a launch: 0.5 s is about 3.9 launches of 32 steps.
        assert_eq!(whole_challenge_shape(1, 4e-3, Duration::from_millis(500)), (3, 32));
        // Never fewer than one batch, whatever the figures.
        assert_eq!(whole_challenge_shape(64, 1.0, Duration::from_millis(1)), (64, 32));
        assert_eq!(whole_challenge_shape(64, 0.0, Duration::from_secs(1)), (64, 32));
    }
}
