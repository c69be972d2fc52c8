//! Learning a class's rate from the rates that passing verdicts proved.
//!
//! Robust by construction, because each observation comes from a miner that wants the bar low
//! (to pass with less hardware) or high (to squeeze out competitors):
//! - each miner key gets one vote, the median of its newest observations, so one miner cannot
//!   move the rate alone however often it is attested;
//! - the class rate is the median of the votes, so slow outliers (a throttled host, a host that
//!   holds back) do not drag it down while they are fewer than half;
//! - nothing is learned until `min_miners` distinct keys have voted;
//! - the result never exceeds the class's physical ceiling, so a miner that claims fewer devices
//!   than it has (and so proves an impossible per-device rate) cannot raise the bar above what
//!   the hardware can do.

use crate::config::calibration::CalibrationConfig;
use crate::store::Observation;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A learned rate and the evidence behind it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Learned {
    pub ops_per_unit: f64,
    /// Distinct miner keys that voted.
    pub miners: u32,
    /// Observations the votes were taken from.
    pub observations: u32,
    /// The median was above the class's ceiling and was cut to it.
    pub capped: bool,
}

/// The median of a non-empty list (the mean of the middle two for an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The class rate from `observations`, newest first; `None` until `min_miners` keys have voted.
/// Observations that are not positive finite numbers are ignored.
pub fn learn(observations: &[Observation], config: &CalibrationConfig, ceiling: f64) -> Option<Learned> {
    let per_miner = config.per_miner.max(1) as usize;
    let mut by_miner: HashMap<[u8; 32], Vec<f64>> = HashMap::new();
    for o in observations
        .iter()
        .filter(|o| o.ops_per_unit.is_finite() && o.ops_per_unit > 0.0)
    {
        let votes = by_miner.entry(o.miner_key).or_default();
        if votes.len() < per_miner {
            votes.push(o.ops_per_unit);
        }
    }
    let miners = by_miner.len() as u32;
    if miners < config.min_miners.max(1) {
        return None;
    }
    let used = by_miner.values().map(Vec::len).sum::<usize>() as u32;
    let mut votes: Vec<f64> = by_miner.into_values().map(|mut v| median(&mut v)).collect();
    let rate = median(&mut votes);
    Some(Learned {
        ops_per_unit: rate.min(ceiling),
        miners,
        observations: used,
        capped: rate > ceiling,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(miner: u8, rate: f64) -> Observation {
        Observation {
            miner_key: [miner; 32],
            ops_per_unit: rate,
        }
    }

    const CEILING: f64 = 1.0e15;

    #[test]
    fn nothing_is_learned_until_enough_miners_have_voted() {
        let config = CalibrationConfig::default();
        let two = [obs(1, 100.0), obs(2, 110.0), obs(1, 90.0)];
        assert_eq!(learn(&two, &config, CEILING), None);
        let three = [obs(1, 100.0), obs(2, 110.0), obs(3, 105.0)];
        let learned = learn(&three, &config, CEILING).unwrap();
        assert_eq!(learned.ops_per_unit, 105.0);
        assert_eq!((learned.miners, learned.observations, learned.capped), (3, 3, false));
    }

    #[test]
    fn one_miner_cannot_move_the_rate_alone() {
        // Miner 9 is attested a thousand times and always claims a slow rate: one vote.
        let mut all = vec![obs(1, 100.0), obs(2, 101.0), obs(3, 99.0)];
        all.extend((0..1000).map(|_| obs(9, 1.0)));
        let learned = learn(&all, &CalibrationConfig::default(), CEILING).unwrap();
        assert_eq!(learned.miners, 4);
        assert_eq!(learned.ops_per_unit, 99.5, "the median of 1, 99, 100, 101");
        // A fast one is just as powerless.
        let mut all = vec![obs(1, 100.0), obs(2, 101.0), obs(3, 99.0)];
        all.extend((0..1000).map(|_| obs(9, 1.0e6)));
        assert_eq!(
            learn(&all, &CalibrationConfig::default(), CEILING)
                .unwrap()
                .ops_per_unit,
            100.5
        );
    }

    #[test]
    fn slow_outliers_do_not_drag_the_rate_down() {
        // Two of five miners are throttled (or holding back): the rate stays with the majority.
        let all = [obs(1, 100.0), obs(2, 98.0), obs(3, 102.0), obs(4, 10.0), obs(5, 20.0)];
        assert_eq!(
            learn(&all, &CalibrationConfig::default(), CEILING)
                .unwrap()
                .ops_per_unit,
            98.0
        );
        // Within a miner too: one slow run among its newest does not change its vote.
        let mut all = vec![obs(2, 100.0), obs(3, 100.0)];
        all.extend([obs(1, 100.0), obs(1, 5.0), obs(1, 100.0)]);
        assert_eq!(
            learn(&all, &CalibrationConfig::default(), CEILING)
                .unwrap()
                .ops_per_unit,
            100.0
        );
    }

    #[test]
    fn the_rate_never_exceeds_the_ceiling() {
        // Miners that hide devices prove impossible per-device rates; the bar stops at the peak.
        let all = [obs(1, 5.0e15), obs(2, 6.0e15), obs(3, 7.0e15)];
        let learned = learn(&all, &CalibrationConfig::default(), CEILING).unwrap();
        assert_eq!(learned.ops_per_unit, CEILING);
        assert!(learned.capped);
    }

    #[test]
    fn only_the_newest_observations_of_each_miner_vote() {
        let config = CalibrationConfig {
            per_miner: 2,
            ..CalibrationConfig::default()
        };
        // Newest first: miner 1 got faster (a software upgrade); its old runs no longer count.
        let all = [
            obs(1, 200.0),
            obs(1, 200.0),
            obs(1, 50.0),
            obs(1, 50.0),
            obs(1, 50.0),
            obs(2, 200.0),
            obs(3, 200.0),
        ];
        let learned = learn(&all, &config, CEILING).unwrap();
        assert_eq!(learned.ops_per_unit, 200.0);
        assert_eq!(learned.observations, 4);
    }

    #[test]
    fn garbage_observations_are_ignored() {
        let all = [
            obs(1, f64::NAN),
            obs(2, -5.0),
            obs(3, f64::INFINITY),
            obs(4, 100.0),
            obs(5, 100.0),
            obs(6, 100.0),
        ];
        let learned = learn(&all, &CalibrationConfig::default(), CEILING).unwrap();
        assert_eq!((learned.ops_per_unit, learned.miners), (100.0, 3));
    }
}
