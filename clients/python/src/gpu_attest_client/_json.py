"""A verdict as PROTOCOL.md 16.1's JSON: the object `validator verdicts --json` and `validator
miners verdicts --json` print, made from the API's message, so that a script reads one schema
whichever it took its verdicts from. The validator's own conversion is
`validator/src/verdict_wire.rs`; a test holds the two equal."""

from __future__ import annotations

from typing import Any, Dict, List, Optional


def share_of_peak(proven_ops_per_sec: float, peak_ops_per_sec: float) -> Optional[float]:
    """``proven / peak``, as the validator computes it; None when either is 0."""
    if proven_ops_per_sec > 0.0 and peak_ops_per_sec > 0.0:
        return proven_ops_per_sec / peak_ops_per_sec
    return None


def _none_if_zero(x: float) -> Optional[float]:
    # A failed verdict proves no rate: 0 on the wire, null in the JSON.
    return None if x == 0 else x


def _reasons(reasons) -> List[Dict[str, str]]:
    return [{"code": r.code, "message": r.message} for r in reasons]


def _device(d) -> Dict[str, Any]:
    return {
        "index": d.index,
        "name": d.name,
        "uuid": d.uuid,
        "memory_bytes": d.memory_bytes,
        "sm_count": d.sm_count,
        "compute_capability": [d.compute_capability_major, d.compute_capability_minor],
        "pci_bus_id": d.pci_bus_id,
        "driver_version": d.driver_version,
    }


def _device_walk(w) -> Dict[str, Any]:
    # Version 4: one device's own walk (PROTOCOL.md 20.9).
    return {
        "measured_ms": w.measured_ms,
        "expected_ms": w.expected_ms,
        "deadline_ms": w.deadline_ms,
        "expected_bytes_per_sec": w.expected_bytes_per_sec,
        "proven_bytes_per_sec": _none_if_zero(w.proven_bytes_per_sec),
        "bandwidth_source": w.bandwidth_source,
        "steps_opened": w.steps_opened,
        "rows_checked": w.rows_checked,
        "sized_as": w.sized_as,
        "held_at_least": w.held_at_least if w.HasField("held_at_least") else None,
        "bound_as": w.bound_as,
    }


def _device_locality(l) -> Dict[str, Any]:
    # The locality walk (PROTOCOL.md 20.10): its figures, and the largest share of its
    # sequence's steps that could each have crossed a hop of hop_ns (None: nothing shown).
    return {
        "walkers": l.walkers,
        "generations": l.generations,
        "steps": l.steps,
        "segments_opened": l.segments_opened,
        "measured_us": l.measured_us,
        "expected_us": l.expected_us,
        "deadline_us": l.deadline_us,
        "step_ns": l.step_ns,
        "hop_ns": l.hop_ns,
        "sequential_at_least": l.sequential_at_least,
        "hop_share_at_most": l.hop_share_at_most if l.HasField("hop_share_at_most") else None,
    }


def _memory_device(d) -> Dict[str, Any]:
    out: Dict[str, Any] = {
        "claimed_bytes": d.claimed_bytes,
        "pool_entries": d.pool_entries,
        "proven_bytes": d.proven_bytes,
    }
    if d.HasField("walk"):
        out["walk"] = _device_walk(d.walk)
    if d.HasField("locality"):
        out["locality"] = _device_locality(d.locality)
    return out


def _memory(m) -> Dict[str, Any]:
    return {
        "pool_permille": m.pool_permille,
        "walkers": m.walkers,
        "walk_steps": m.walk_steps,
        "walk_checkpoint_every": m.walk_checkpoint_every,
        "walk_samples": m.walk_samples,
        "devices": [_memory_device(d) for d in m.devices],
        "walk_bytes": m.walk_bytes,
        "walk_measured_ms": m.walk_measured_ms,
        "walk_expected_ms": m.walk_expected_ms,
        "walk_deadline_ms": m.walk_deadline_ms,
        "expected_walk_bytes_per_sec": m.expected_walk_bytes_per_sec,
        "proven_walk_bytes_per_sec": _none_if_zero(m.proven_walk_bytes_per_sec),
        "bandwidth_source": m.bandwidth_source,
        "bandwidth_miners": m.bandwidth_miners,
        "slack": m.slack,
        "fill_weight": m.fill_weight,
        "host_held_at_least": m.host_held_at_least if m.HasField("host_held_at_least") else None,
        "proves": m.proves,
    }


def _identity_device(d) -> Dict[str, Any]:
    out: Dict[str, Any] = {"index": d.index, "status": d.status, "line": d.line}
    if d.reason:
        out["reason"] = d.reason
    if len(d.part) == 2:
        out["part"] = list(d.part)
    return out


def verdict_json(v) -> Dict[str, Any]:
    """PROTOCOL.md 16.1's object for the API's ``Verdict`` message ``v``."""
    p = v.params
    return {
        "id": v.id,
        "miner_url": v.miner_url,
        "miner_key": v.miner_key.hex(),
        "nonce": v.nonce.hex(),
        "passed": v.passed,
        "reasons": _reasons(v.fail_reasons),
        "policy": v.policy,
        "samples": v.samples,
        "params": {
            "nonce": p.nonce.hex(),
            "seed": p.seed.hex(),
            "miner_key": p.miner_key.hex(),
            "n": p.n,
            "num_chains": p.num_chains,
            "iterations": p.iterations,
            "checkpoint_every": p.checkpoint_every,
        },
        "measured_ms": v.measured_ms,
        "expected_ms": v.expected_ms,
        "deadline_ms": v.deadline_ms,
        "finish_by_ms": v.finish_by_ms,
        "inventory": [_device(d) for d in v.inventory],
        "backend": v.backend,
        "kernel": v.kernel,
        "global_checksum": v.global_checksum.hex(),
        "created_at_ms": v.created_at_unix_ms,
        "throughput": {
            "operations": v.operations,
            "proven_ops_per_sec": _none_if_zero(v.proven_ops_per_sec),
            "proven_ops_per_sec_per_device": _none_if_zero(v.proven_ops_per_sec_per_device),
            "expected_ops_per_sec": v.expected_ops_per_sec,
            "proven_to_expected": _none_if_zero(v.proven_to_expected),
            "rate_source": v.rate_source or None,
            "rate_miners": v.rate_miners,
            "slack": v.slack,
            "claimed_peak_ops_per_sec": v.claimed_peak_ops_per_sec,
            "proven_share_of_peak": share_of_peak(v.proven_ops_per_sec, v.claimed_peak_ops_per_sec),
        },
        "memory": _memory(v.memory) if v.HasField("memory") else None,
        "identity": (
            {"policy": v.identity.policy, "devices": [_identity_device(d) for d in v.identity.devices]}
            if v.HasField("identity")
            else None
        ),
        "first_run": (
            {
                "nonce": v.first_run.nonce.hex(),
                "measured_ms": v.first_run.measured_ms,
                "expected_ms": v.first_run.expected_ms,
                "deadline_ms": v.first_run.deadline_ms,
                "finish_by_ms": v.first_run.finish_by_ms,
                "proven_ops_per_sec": _none_if_zero(v.first_run.proven_ops_per_sec),
                "reasons": _reasons(v.first_run.fail_reasons),
            }
            if v.HasField("first_run")
            else None
        ),
        "protocol_version": v.protocol_version,
        "transcript_bytes": v.transcript_bytes or None,
    }
