//! The retest band (PROTOCOL.md 14.7): a graded miss only just past the deadline gets one
//! immediate retest with a fresh challenge, and the verdict is the retest's. An honest host that
//! stalled once is not stored as a FAIL; the first run stays on record inside the verdict.

use crate::config::DeadlineConfig;
use crate::verdict::Verdict;
use crate::verdict::throughput::graded_miss;

/// Why `first` gets a retest, for the attestation's events; `None` when it does not. Only a
/// graded miss (its work verified, so only its time failed) whose commitment came within
/// `retest_band` deadlines, and never a retest itself: a miner gets at most two runs.
pub fn due(first: &Verdict, deadline: &DeadlineConfig) -> Option<String> {
    let graded = graded_miss(&first.reasons, first.measured_ms, first.finish_by_ms);
    if !graded || first.first_run.is_some() || first.deadline_ms == 0 {
        return None;
    }
    let band_ms = band_ms(first.deadline_ms, deadline.retest_band);
    (first.measured_ms <= band_ms).then(|| {
        format!(
            "the commitment came after {} ms, {:.2} deadlines, within the retest band ({} ms): one fresh challenge decides",
            first.measured_ms,
            first.measured_ms as f64 / first.deadline_ms as f64,
            band_ms
        )
    })
}

/// PROTOCOL.md 14.7: `ceil(deadline_ms * band)`.
pub fn band_ms(deadline_ms: u64, band: f64) -> u64 {
    (deadline_ms as f64 * band).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_support::passing_verdict;
    use crate::verdict::FirstRun;
    use crate::verdict::reason::{Reason, ReasonCode};

    fn late(measured_ms: u64) -> Verdict {
        let mut v = passing_verdict([1; 32]);
        v.passed = false;
        v.deadline_ms = 1_000;
        v.finish_by_ms = 2_000;
        v.measured_ms = measured_ms;
        v.reasons = vec![Reason::new(ReasonCode::LateCommitment, "late")];
        v
    }

    #[test]
    fn only_a_graded_miss_within_the_band_is_retested_and_only_once() {
        let config = DeadlineConfig::default();
        assert_eq!(config.retest_band, 1.15);
        assert!(due(&late(1_150), &config).is_some());
        assert!(due(&late(1_151), &config).is_none());
        // A pass, a miss that proved nothing, and a retest are not retested.
        assert!(due(&passing_verdict([1; 32]), &config).is_none());
        let mut unverified = late(1_100);
        unverified
            .reasons
            .push(Reason::new(ReasonCode::SegmentMismatch, "chain 2"));
        unverified.throughput.proven_ops_per_sec = None;
        assert!(due(&unverified, &config).is_none());
        let mut retest = late(1_100);
        retest.first_run = Some(FirstRun::from(&late(1_050)));
        assert!(due(&retest, &config).is_none());
        // A band of 1.0 turns retests off.
        let off = DeadlineConfig {
            retest_band: 1.0,
            ..config
        };
        assert!(due(&late(1_001), &off).is_none());
    }
}
