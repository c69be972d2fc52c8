//! What a verdict proves about throughput: the operations the challenge required, done within
//! the time this validator measured, beside the rate the planner expected of the claimed
//! hardware. The measured time, not the miner's report, is the evidence.

use crate::verdict::StoredParams;
use crate::verdict::class::RateSource;
use crate::verdict::memory::FillWork;
use crate::verdict::reason::{Reason, ReasonCode};
use serde::{Deserialize, Serialize};

/// What the planner expected of the claimed hardware, and on what evidence.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Expectation {
    /// The sum of the claimed devices' rates.
    pub ops_per_sec: f64,
    /// The weakest source among the devices' classes; `None` for verdicts stored before it was
    /// recorded.
    pub source: Option<RateSource>,
    /// The fewest distinct miners behind an observed rate among the classes; 0 if shipped.
    pub miners: u32,
    /// Deadline over expected time: the tight slack for observed rates, the first-contact slack
    /// for shipped ones (0 when not recorded).
    pub slack: f64,
    /// The sum of the claimed devices' physical ceilings: each class's datasheet peak where the
    /// rate table gives one (GPU models: dense int8), else its backend's ceiling (the
    /// instruction set's at 5 GHz a core on CPUs). 0 when not recorded.
    #[serde(default)]
    pub peak_ops_per_sec: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Operations the challenge required: 2 n^3 M K, plus the pools' fill (2^31 an entry) in
    /// a version 3 challenge.
    pub operations: f64,
    /// Operations per second the measured time proves, `operations / measured`: a lower bound
    /// on the key holder's int8 rate, whatever software it ran. Only for a passing verdict or a
    /// graded miss ([`graded_miss`]): any other failure proves nothing.
    pub proven_ops_per_sec: Option<f64>,
    /// The proven rate spread over the devices the challenge was sized for.
    pub proven_ops_per_sec_per_device: Option<f64>,
    /// What the planner expected of the claimed hardware (the sum of its devices' rates).
    pub expected_ops_per_sec: f64,
    /// The share of the class's rate the measured time proves: the work as the deadline timed
    /// it (the chains, and the fill at its weight, PROTOCOL.md 18.6) over the measured time,
    /// over the expected rate. Below 1 the hardware did less than its class is expected to.
    /// Without pools, `proven_ops_per_sec / expected_ops_per_sec`.
    pub proven_to_expected: Option<f64>,
    /// Where the expected rate came from: `calibrated`, `shared` or `shipped` (first contact).
    pub rate_source: Option<RateSource>,
    /// Distinct miners behind an observed rate.
    pub rate_miners: u32,
    /// The slack the deadline was set with.
    pub slack: f64,
    /// The claimed devices' peak ([`Expectation::peak_ops_per_sec`]); 0 when not recorded.
    #[serde(default)]
    pub claimed_peak_ops_per_sec: f64,
    /// The proven rate's share of that peak ([`share_of_peak`]): what a pass says about the
    /// silicon, since a cheater with a faster kernel keeps the rest (SECURITY.md "Compute").
    #[serde(default)]
    pub proven_share_of_peak: Option<f64>,
}

/// `proven / peak`; None where nothing is proven or the peak was not recorded.
pub fn share_of_peak(proven_ops_per_sec: Option<f64>, peak_ops_per_sec: f64) -> Option<f64> {
    proven_ops_per_sec
        .filter(|_| peak_ops_per_sec > 0.0)
        .map(|proven| proven / peak_ops_per_sec)
}

/// Whether a failed verdict is a *graded miss* (PROTOCOL.md 17): every reason is a late
/// commitment, and the commitment came by the challenge's finish-by time (`finish_by_ms` from
/// sending; 0 when it had none). Its work was then verified as a pass's is, so it proves the rate
/// its measured time implies: too slow, but by how much is known. Work past the finish-by time,
/// or any other failure, proves nothing.
pub fn graded_miss(reasons: &[Reason], measured_ms: u64, finish_by_ms: u64) -> bool {
    !reasons.is_empty()
        && reasons.iter().all(|r| r.code == ReasonCode::LateCommitment)
        && finish_by_ms > 0
        && measured_ms <= finish_by_ms
}

/// Operations a challenge with these parameters requires.
pub fn operations(params: &StoredParams) -> f64 {
    2.0 * f64::from(params.n).powi(3) * params.num_chains as f64 * f64::from(params.iterations)
}

impl Throughput {
    /// What a verdict proves of `params`' chains and `fill`, the pools of a version 3
    /// challenge (PROTOCOL.md 18.6): both are done within the measured time, and both are
    /// checked (the chains by their openings, the pools by their entries' rows), so the proven
    /// rate counts both, each operation once. The share of the class's rate counts the fill at
    /// its weight, as the planner timed it: this project's kernels fill at n = 256 several
    /// times slower than they run the chains, so that share, and the class rate a pass teaches
    /// ([`Throughput::proven_class_rate`]), are the chains' and compare with a verdict without
    /// pools. `proves`: the verdict passed, or is a graded miss.
    pub fn of(
        params: &StoredParams,
        fill: FillWork,
        devices: usize,
        measured_ms: u64,
        expected: &Expectation,
        proves: bool,
    ) -> Self {
        let expected_ops_per_sec = expected.ops_per_sec;
        let chains = operations(params);
        let operations = chains + fill.ops;
        let timed_as = chains + fill.weighted_ops();
        // A commitment cannot arrive in less than a millisecond of measured time.
        let seconds = measured_ms.max(1) as f64 / 1000.0;
        let proven = proves.then(|| operations / seconds);
        Throughput {
            operations,
            proven_ops_per_sec: proven,
            proven_ops_per_sec_per_device: proven.map(|p| p / devices.max(1) as f64),
            expected_ops_per_sec,
            proven_to_expected: proves
                .then(|| timed_as / seconds)
                .filter(|_| expected_ops_per_sec > 0.0)
                .map(|p| p / expected_ops_per_sec),
            rate_source: expected.source,
            rate_miners: expected.miners,
            slack: expected.slack,
            claimed_peak_ops_per_sec: expected.peak_ops_per_sec,
            proven_share_of_peak: share_of_peak(proven, expected.peak_ops_per_sec),
        }
    }

    /// The class's rate this verdict proves: its share of the class's rate times that rate,
    /// the fill counted at its weight (PROTOCOL.md 15.1, 18.6). What a pass teaches its class.
    pub fn proven_class_rate(&self) -> Option<f64> {
        self.proven_to_expected.map(|share| share * self.expected_ops_per_sec)
    }
}

impl std::fmt::Display for Throughput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let expected = format!(
            "{} ({})",
            show_rate(self.expected_ops_per_sec),
            self.expectation().basis()
        );
        match (
            self.proven_ops_per_sec,
            self.proven_ops_per_sec_per_device,
            self.proven_to_expected,
        ) {
            (Some(proven), Some(per_device), ratio) => {
                write!(
                    f,
                    "proved {} ({} per device) over {:.3e} operations; expected {expected}",
                    show_rate(proven),
                    show_rate(per_device),
                    self.operations
                )?;
                if let Some(r) = ratio {
                    write!(f, ", {r:.2}x the class's rate")?;
                }
                match self.proven_share_of_peak {
                    Some(share) => write!(f, ", {:.1}% of the claimed peak", share * 100.0),
                    None => Ok(()),
                }
            }
            _ => write!(
                f,
                "nothing proven ({:.3e} operations required; expected {expected})",
                self.operations
            ),
        }
    }
}

impl Expectation {
    /// Where the expected rate came from, for people: "calibrated from 3 miners, slack 1.50".
    pub fn basis(&self) -> String {
        let slack = if self.slack > 0.0 {
            format!(", slack {:.2}", self.slack)
        } else {
            String::new()
        };
        let miners = match self.miners {
            1 => "1 miner".to_string(),
            m => format!("{m} miners"),
        };
        match self.source {
            Some(RateSource::Calibrated) => format!("calibrated from {miners}{slack}"),
            Some(RateSource::Shared) => format!("shared table from {miners}{slack}"),
            Some(RateSource::Related) => format!("calibrated for another name of this model, from {miners}{slack}"),
            Some(RateSource::Shipped) => format!("shipped table: first contact{slack}"),
            None => "rate source not recorded".into(),
        }
    }
}

impl Throughput {
    pub fn expectation(&self) -> Expectation {
        Expectation {
            ops_per_sec: self.expected_ops_per_sec,
            source: self.rate_source,
            miners: self.rate_miners,
            slack: self.slack,
            peak_ops_per_sec: self.claimed_peak_ops_per_sec,
        }
    }
}

/// A rate for people: `8.5e11 op/s`.
pub fn show_rate(ops_per_sec: f64) -> String {
    format!("{ops_per_sec:.2e} op/s")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: u32, chains: u64, iterations: u32) -> StoredParams {
        StoredParams {
            nonce: String::new(),
            seed: String::new(),
            miner_key: String::new(),
            n,
            num_chains: chains,
            iterations,
            checkpoint_every: 1,
        }
    }

    fn expected(ops_per_sec: f64) -> Expectation {
        Expectation {
            ops_per_sec,
            source: Some(RateSource::Calibrated),
            miners: 3,
            slack: 1.5,
            peak_ops_per_sec: 4.0e10,
        }
    }

    #[test]
    fn a_pass_proves_operations_over_the_measured_time() {
        // 10 chains of n = 1024, K = 4: 8.59e10 operations, in 2 s on 2 devices.
        let t = Throughput::of(&params(1024, 10, 4), FillWork::NONE, 2, 2_000, &expected(1.0e10), true);
        assert_eq!(t.operations, 2.0 * 1024f64.powi(3) * 10.0 * 4.0);
        let proven = t.proven_ops_per_sec.unwrap();
        assert!((proven - t.operations / 2.0).abs() < 1.0);
        assert!((t.proven_ops_per_sec_per_device.unwrap() - proven / 2.0).abs() < 1.0);
        assert!((t.proven_to_expected.unwrap() - proven / 1.0e10).abs() < 1e-9);
        assert_eq!(
            (t.rate_source, t.rate_miners, t.slack),
            (Some(RateSource::Calibrated), 3, 1.5)
        );
        let shown = t.to_string();
        assert!(shown.contains("calibrated from 3 miners, slack 1.50"), "{shown}");
        // 4.29e10 proven of a 4.0e10 peak: the share is stated, and said.
        assert_eq!(t.claimed_peak_ops_per_sec, 4.0e10);
        assert!((t.proven_share_of_peak.unwrap() - proven / 4.0e10).abs() < 1e-12);
        assert!(shown.contains("107.4% of the claimed peak"), "{shown}");
        // Nothing proven, or no peak recorded: no share.
        let failed = Throughput::of(&params(1024, 10, 4), FillWork::NONE, 2, 2_000, &expected(1.0e10), false);
        assert_eq!(failed.proven_share_of_peak, None);
        let unrecorded = Expectation {
            peak_ops_per_sec: 0.0,
            ..expected(1.0e10)
        };
        let old = Throughput::of(&params(1024, 10, 4), FillWork::NONE, 2, 2_000, &unrecorded, true);
        assert_eq!(old.proven_share_of_peak, None);
    }

    /// A host whose chains run at the class's rate, and whose fill runs at that rate over the
    /// fill's weight, proves the whole of the class's rate and teaches that rate, not one
    /// diluted by the slower fill. The H200 attestation of BENCHMARKS.md (17999 chains of
    /// n = 2048, K = 16, and a pool of 135998 MiB) proved 3.77e14 op/s, while its chains ran at
    /// about 9e14: a class learned from that figure would have timed every later challenge 1.5
    /// to 2.4 times loose.
    #[test]
    fn a_pass_with_pools_teaches_the_rate_its_chains_run_at() {
        let params = params(2048, 17_999, 16);
        let rate = 9.0e14;
        let fill = FillWork {
            ops: 2_175_968.0 * 2f64.powi(31),
            weight: 4.0,
        };
        let seconds = operations(&params) / rate + fill.ops / (rate / fill.weight);
        let measured_ms = (seconds * 1000.0).round() as u64;
        let t = Throughput::of(&params, fill, 1, measured_ms, &expected(rate), true);
        let class_rate = t.proven_class_rate().unwrap();
        assert!(
            (class_rate / rate - 1.0).abs() < 1e-3,
            "taught {class_rate:e} of a class at {rate:e}"
        );
        assert!((t.proven_to_expected.unwrap() - 1.0).abs() < 1e-3);
        // What the verdict states as proven is the work done, each operation once, over the
        // time: a bound no fill kernel, however fast, can make false, and well under the rate.
        assert_eq!(
            t.operations,
            operations(&params) + fill.ops,
            "the work stated is the work done"
        );
        let proven = t.proven_ops_per_sec.unwrap();
        assert_eq!(proven, t.operations / (measured_ms as f64 / 1000.0));
        assert!(proven < 0.45 * rate, "{proven:e}");
    }

    #[test]
    fn only_a_late_commitment_by_the_finish_by_time_is_a_graded_miss() {
        let late = || Reason::new(ReasonCode::LateCommitment, "after 5000 ms");
        assert!(graded_miss(&[late()], 5_000, 6_000));
        assert!(graded_miss(&[late()], 6_000, 6_000));
        // Past the finish-by time, without one, a pass, or with any other reason: not graded.
        assert!(!graded_miss(&[late()], 6_001, 6_000));
        assert!(!graded_miss(&[late()], 5_000, 0));
        assert!(!graded_miss(&[], 5_000, 6_000));
        let wrong = Reason::new(ReasonCode::SegmentMismatch, "chain 2 segment 0");
        assert!(!graded_miss(&[late(), wrong], 5_000, 6_000));
    }

    #[test]
    fn a_fail_proves_nothing() {
        let t = Throughput::of(&params(64, 5, 4), FillWork::NONE, 1, 100, &expected(1.0e8), false);
        assert!(t.operations > 0.0);
        assert_eq!(t.proven_ops_per_sec, None);
        assert_eq!(t.proven_ops_per_sec_per_device, None);
        assert_eq!(t.proven_to_expected, None);
        assert_eq!(t.expected_ops_per_sec, 1.0e8);
    }
}
