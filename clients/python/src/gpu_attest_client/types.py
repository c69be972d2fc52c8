"""What the validator API returns, as plain typed values.

Each value keeps the protobuf message it came from in ``raw``, for the fields not lifted here.
"""

from __future__ import annotations

import datetime as _dt
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from ._json import share_of_peak


class ReasonCode(str, enum.Enum):
    """Why a verdict failed (PROTOCOL.md section 16). Codes never change meaning; a validator
    newer than this client may send one it does not know, which reads as the code's text."""

    NOT_ACCEPTED = "not-accepted"
    HARDWARE_MISMATCH = "hardware-mismatch"
    IMPOSSIBLE_PROGRESS = "impossible-progress"
    STREAM_OUT_OF_ORDER = "stream-out-of-order"
    MINER_FAILED = "miner-failed"
    NO_COMMITMENT = "no-commitment"
    COMMITMENT_TIMED_OUT = "commitment-timed-out"
    LATE_COMMITMENT = "late-commitment"
    MALFORMED_COMMITMENT = "malformed-commitment"
    COMMITMENT_WRONG_MINER = "commitment-wrong-miner"
    COMMITMENT_SIGNATURE = "commitment-signature"
    COMMITMENT_WRONG_VALIDATOR = "commitment-wrong-validator"
    NONCE_MISMATCH = "nonce-mismatch"
    DEVICE_COUNT = "device-count"
    PARTITION_NOT_CANONICAL = "partition-not-canonical"
    EMPTY_DEVICE_ROOT = "empty-device-root"
    GLOBAL_CHECKSUM_MISMATCH = "global-checksum-mismatch"
    REEXECUTION_MISMATCH = "reexecution-mismatch"
    OPEN_REFUSED = "open-refused"
    OPENINGS_TIMED_OUT = "openings-timed-out"
    OPENING_MISSING = "opening-missing"
    OPENING_FAILED = "opening-failed"
    MALFORMED_OPENING = "malformed-opening"
    OPENING_WRONG_CHALLENGE = "opening-wrong-challenge"
    OPENING_SIGNATURE = "opening-signature"
    OPENING_FOR_WRONG_REQUEST = "opening-for-wrong-request"
    CHECKPOINT_COUNT = "checkpoint-count"
    LEAF_NOT_COMMITTED = "leaf-not-committed"
    START_MATRIX_MISMATCH = "start-matrix-mismatch"
    OPENED_MATRIX_SIZE = "opened-matrix-size"
    OPENED_MATRIX_MISMATCH = "opened-matrix-mismatch"
    SEGMENT_MISMATCH = "segment-mismatch"
    POOL_NOT_CANONICAL = "pool-not-canonical"
    WALK_REFUSED = "walk-refused"
    WALK_TIMED_OUT = "walk-timed-out"
    LATE_WALK = "late-walk"
    MALFORMED_WALK = "malformed-walk"
    WALK_SIGNATURE = "walk-signature"
    WALK_WRONG_CHALLENGE = "walk-wrong-challenge"
    WALK_NOT_CANONICAL = "walk-not-canonical"
    WALK_OPENING_SIGNATURE = "walk-opening-signature"
    WALK_OPENING_FOR_WRONG_REQUEST = "walk-opening-for-wrong-request"
    WALK_CHECKPOINT_COUNT = "walk-checkpoint-count"
    WALK_LEAF_NOT_COMMITTED = "walk-leaf-not-committed"
    WALK_START_MISMATCH = "walk-start-mismatch"
    MALFORMED_WALK_OPENING = "malformed-walk-opening"
    POOL_ENTRY_NOT_COMMITTED = "pool-entry-not-committed"
    POOL_ENTRY_MISMATCH = "pool-entry-mismatch"
    WALK_SEGMENT_MISMATCH = "walk-segment-mismatch"
    WALK_STATE_NOT_COMMITTED = "walk-state-not-committed"
    LOCALITY_REFUSED = "locality-refused"
    LOCALITY_TIMED_OUT = "locality-timed-out"
    LOCALITY_ROOT_SIGNATURE = "locality-root-signature"
    MALFORMED_LOCALITY = "malformed-locality"
    LOCALITY_OPENING_SIGNATURE = "locality-opening-signature"
    LOCALITY_OPENING_FOR_WRONG_REQUEST = "locality-opening-for-wrong-request"
    LOCALITY_GENERATION_NOT_COMMITTED = "locality-generation-not-committed"
    LOCALITY_LINE_NOT_COMMITTED = "locality-line-not-committed"
    LOCALITY_SEGMENT_MISMATCH = "locality-segment-mismatch"
    IDENTITY_NOT_OFFERED = "identity-not-offered"
    IDENTITY_DEVTOOLS = "identity-devtools"
    IDENTITY_MALFORMED = "identity-malformed"
    IDENTITY_STATEMENT_SIGNATURE = "identity-statement-signature"
    IDENTITY_CHAIN = "identity-chain"
    IDENTITY_CHAIN_EXPIRED = "identity-chain-expired"
    IDENTITY_UNTRUSTED_ROOT = "identity-untrusted-root"
    IDENTITY_SIGNATURE = "identity-signature"
    IDENTITY_WRONG_NONCE = "identity-wrong-nonce"
    IDENTITY_DEVICE_MISMATCH = "identity-device-mismatch"
    IDENTITY_SKU_MISMATCH = "identity-sku-mismatch"
    IDENTITY_UNKNOWN_MODEL = "identity-unknown-model"
    UNCLASSIFIED = "unclassified"


class RateSource(str, enum.Enum):
    """Where the expected rate came from (PROTOCOL.md 15.1), in order of trust."""

    CALIBRATED = "calibrated"
    SHARED = "shared"
    RELATED = "related"
    SHIPPED = "shipped"
    UNKNOWN = ""


def _code(text: str) -> Union[ReasonCode, str]:
    try:
        return ReasonCode(text)
    except ValueError:
        return text


def _rate_source(text: str) -> RateSource:
    try:
        return RateSource(text)
    except ValueError:
        return RateSource.UNKNOWN


def _utc(unix_ms: int) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(unix_ms / 1000, tz=_dt.timezone.utc)


@dataclass(frozen=True)
class FailReason:
    code: Union[ReasonCode, str]
    message: str


def _utc_or_none(unix_ms: int) -> Optional[_dt.datetime]:
    return _utc(unix_ms) if unix_ms else None


@dataclass(frozen=True)
class MinerRecord:
    """A registered miner and, from ``list_miners``, where it stands: its latest verdict, its
    latest pass, when it is due next, the scheduler's backoff, and whether it is revoked."""

    url: str
    name: str
    miner_key: str  # hex
    registered_at: _dt.datetime
    last_verdict_id: Optional[int]
    last_verdict_passed: Optional[bool]
    last_verdict_at: Optional[_dt.datetime]
    last_pass_at: Optional[_dt.datetime]
    next_due_at: Optional[_dt.datetime]
    failures_in_a_row: int
    last_error: str
    revoked: bool
    # ``register_miner`` only: whether the miner said its allow-list holds this validator's key
    # (False: it will refuse every challenge until its operator adds the key); None when it did
    # not say, and always from ``list_miners``.
    allows_this_validator: Optional[bool]
    raw: Any = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, m) -> "MinerRecord":
        attested = m.last_verdict_id != 0
        return cls(
            url=m.url,
            name=m.name,
            miner_key=m.miner_key.hex(),
            registered_at=_utc(m.registered_at_unix_ms),
            last_verdict_id=m.last_verdict_id if attested else None,
            last_verdict_passed=m.last_verdict_passed if attested else None,
            last_verdict_at=_utc_or_none(m.last_verdict_at_unix_ms),
            last_pass_at=_utc_or_none(m.last_pass_at_unix_ms),
            next_due_at=_utc_or_none(m.next_due_unix_ms),
            failures_in_a_row=m.failures_in_a_row,
            last_error=m.last_error,
            revoked=m.revoked,
            # ValidatorStanding: 1 ALLOWED, 2 NOT_ALLOWED, 0 UNSTATED (common.proto).
            allows_this_validator={1: True, 2: False}.get(m.allows_this_validator),
            raw=m,
        )


@dataclass(frozen=True)
class RevokedKey:
    miner_key: str  # hex
    reason: str
    revoked_at: _dt.datetime

    @classmethod
    def from_proto(cls, k) -> "RevokedKey":
        return cls(k.miner_key.hex(), k.reason, _utc(k.revoked_at_unix_ms))


@dataclass(frozen=True)
class Verdict:
    """A stored verdict. ``proven_to_expected`` is the share of the class rate proven: on a
    pass at least 1/slack, on a graded miss (a FAIL whose late work verified) below that. It
    counts a memory phase's pool fill at its weight, as the deadline does (PROTOCOL.md 18.6),
    while ``proven_ops_per_sec`` counts every operation once: with pools, the share is the
    larger, and ``proven_ops_per_sec`` the bound no faster fill kernel can break."""

    id: int
    miner_url: str
    miner_key: str  # hex
    passed: bool
    reasons: List[FailReason]
    created_at: _dt.datetime
    backend: str
    kernel: str
    devices: List[str]
    measured_ms: int
    expected_ms: int
    deadline_ms: int
    proven_ops_per_sec: float
    expected_ops_per_sec: float
    proven_to_expected: float
    rate_source: RateSource
    rate_miners: int
    slack: float
    #: Summed over the devices' ``proven_bytes``; None without a memory phase. Version 3: the
    #: pools the walk covered on a pass. Version 4: the least of the pools the host was shown
    #: to hold, somewhere among its devices (each device's ``walk.held_at_least`` of its claim,
    #: ``to_json()``); 0 where nothing was shown.
    proven_memory_bytes: Optional[int]
    retested: bool
    #: The protocol version whose rules judged it: 4 (or 3, from a miner of an older release) with
    #: the memory phase, 2 without; 0 from a validator older than the field.
    protocol_version: int
    raw: Any = field(repr=False, compare=False)
    #: The claimed devices' peak (PROTOCOL.md 16.1); 0.0 when the validator did not record one.
    claimed_peak_ops_per_sec: float = 0.0
    #: ``proven_ops_per_sec`` over that peak: what a pass says of the silicon (SECURITY.md
    #: "Compute"); None when nothing is proven or no peak was recorded.
    proven_share_of_peak: Optional[float] = None
    #: The size of the transcript the validator keeps beside it (PROTOCOL.md 21), in bytes;
    #: None when it keeps none. ``save_transcript(id, path)`` writes it for ``validator audit``.
    transcript_bytes: Optional[int] = None

    @property
    def codes(self) -> List[Union[ReasonCode, str]]:
        return [r.code for r in self.reasons]

    @property
    def first_contact(self) -> bool:
        """Timed by the shipped table, not by what miners of its class proved."""
        return self.rate_source == RateSource.SHIPPED

    def to_json(self) -> Dict[str, Any]:
        """The verdict as PROTOCOL.md 16.1's JSON object: what `validator verdicts --json` and
        `validator miners verdicts --json` print for it, field for field."""
        from ._json import verdict_json

        return verdict_json(self.raw)

    @classmethod
    def from_proto(cls, v) -> "Verdict":
        memory = None
        if v.HasField("memory"):
            memory = sum(d.proven_bytes for d in v.memory.devices)
        return cls(
            id=v.id,
            miner_url=v.miner_url,
            miner_key=v.miner_key.hex(),
            passed=v.passed,
            reasons=[FailReason(_code(r.code), r.message) for r in v.fail_reasons],
            created_at=_utc(v.created_at_unix_ms),
            backend=v.backend,
            kernel=v.kernel,
            devices=[d.name for d in v.inventory],
            measured_ms=v.measured_ms,
            expected_ms=v.expected_ms,
            deadline_ms=v.deadline_ms,
            proven_ops_per_sec=v.proven_ops_per_sec,
            expected_ops_per_sec=v.expected_ops_per_sec,
            proven_to_expected=v.proven_to_expected,
            rate_source=_rate_source(v.rate_source),
            rate_miners=v.rate_miners,
            slack=v.slack,
            proven_memory_bytes=memory,
            retested=v.HasField("first_run"),
            protocol_version=v.protocol_version,
            claimed_peak_ops_per_sec=v.claimed_peak_ops_per_sec,
            proven_share_of_peak=share_of_peak(v.proven_ops_per_sec, v.claimed_peak_ops_per_sec),
            transcript_bytes=v.transcript_bytes or None,
            raw=v,
        )


@dataclass(frozen=True)
class Phase:
    """An attestation reached a phase: challenge-sent, computing, commitment-received, verifying."""

    name: str
    detail: str


@dataclass(frozen=True)
class Progress:
    """Chains done on one of the miner's devices."""

    device: int
    done: int
    total: int


AttestEvent = Union[Phase, Progress, Verdict]


def event_from_proto(e) -> Optional[AttestEvent]:
    kind = e.WhichOneof("event")
    if kind == "phase":
        return Phase(e.phase.name, e.phase.detail)
    if kind == "progress":
        return Progress(e.progress.device, e.progress.done, e.progress.total)
    if kind == "verdict":
        return Verdict.from_proto(e.verdict)
    return None
