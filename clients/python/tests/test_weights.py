"""The weights example's policy, on verdicts made here: each rule it states changes the
weights, so that deleting a rule fails a test. (test_client.py runs the script itself against a
real validator.)"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest

from gpu_attest_client import FailReason, RateSource, ReasonCode, Verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from weights import weights  # noqa: E402


def verdict(
    id: int,
    url: str,
    *,
    passed: bool = True,
    rate: float = 1e12,
    share: float = 1.0,
    source: RateSource = RateSource.CALIBRATED,
    reasons=(),
) -> Verdict:
    return Verdict(
        id=id,
        miner_url=url,
        miner_key="00" * 32,
        passed=passed,
        reasons=list(reasons),
        created_at=dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc),
        backend="cuda",
        kernel="wgmma",
        devices=["NVIDIA H100 80GB HBM3"],
        measured_ms=1000,
        expected_ms=1000,
        deadline_ms=1500,
        proven_ops_per_sec=rate,
        expected_ops_per_sec=rate / share if share else rate,
        proven_to_expected=share,
        rate_source=source,
        rate_miners=3,
        slack=1.5,
        proven_memory_bytes=None,
        retested=False,
        protocol_version=3,
        raw=None,
    )


LATE = [FailReason(ReasonCode.LATE_COMMITMENT, "too slow: proved 0.60x of the class rate")]
CHEAT = [FailReason(ReasonCode.GLOBAL_CHECKSUM_MISMATCH, "G does not match")]


def test_passes_are_weighted_by_the_rate_they_proved():
    got = weights([verdict(1, "a", rate=3e12), verdict(2, "b", rate=1e12)])
    assert got == pytest.approx({"a": 0.75, "b": 0.25})


def test_a_graded_miss_scores_its_rate_times_its_share_and_a_cheat_nothing():
    got = weights(
        [
            verdict(1, "honest", rate=1e12),
            verdict(2, "slow", passed=False, rate=1e12, share=0.5, reasons=LATE),
            verdict(3, "cheat", passed=False, rate=0.0, share=0.0, reasons=CHEAT),
        ]
    )
    # 1e12 against 1e12 * 0.5: the slow host is paid less than its rate.
    assert got == pytest.approx({"honest": 1 / 1.5, "slow": 0.5 / 1.5, "cheat": 0.0})


def test_first_contact_is_weighted_down():
    both = [verdict(1, "known", rate=1e12), verdict(2, "new", rate=1e12, source=RateSource.SHIPPED)]
    assert weights(both) == pytest.approx({"known": 1 / 1.5, "new": 0.5 / 1.5})
    assert weights(both, first_contact_weight=1.0) == pytest.approx({"known": 0.5, "new": 0.5})


def test_the_newest_verdict_of_each_miner_counts_in_any_order():
    history = [verdict(7, "a", passed=False, rate=0.0, share=0.0, reasons=CHEAT), verdict(3, "a", rate=1e12)]
    history += [verdict(5, "b", rate=1e12)]
    assert weights(reversed(history)) == pytest.approx({"a": 0.0, "b": 1.0})


def test_nothing_proven_anywhere_weighs_nothing():
    assert weights([verdict(1, "a", passed=False, rate=0.0, share=0.0, reasons=CHEAT)]) == {"a": 0.0}
    assert weights([]) == {}
