"""Every call of the validator API, written once for ``Client`` and ``AsyncClient`` alike.

Each call is a plan (``_plan``): it builds the request, names the RPC, sets the stream's
deadline, turns the responses into this client's types, and holds the control flow (pages,
reconnects); the clients only carry its effects out. What a call does is changed here, never in
``client.py`` or ``aio.py``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, List, Optional, Union

import grpc

from gpu_attest.v1 import validator_pb2 as pb

from ._plan import Emit, Open, Plan, Receive, Sleep, Unary
from .errors import GpuAttestError, Unavailable
from .types import AttestEvent, MinerRecord, RevokedKey, Verdict, event_from_proto

MAX_PAGE_SIZE = 500


# Miners.


def register_miner(url: str, name: str, replace_key: bool) -> Plan[MinerRecord]:
    request = pb.RegisterMinerRequest(url=url, name=name, replace_key=replace_key)
    return MinerRecord.from_proto((yield Unary("RegisterMiner", request)))


def list_miners() -> Plan[List[MinerRecord]]:
    response = yield Unary("ListMiners", pb.ListMinersRequest())
    return [MinerRecord.from_proto(m) for m in response.miners]


def remove_miner(url: str) -> Plan[bool]:
    return (yield Unary("RemoveMiner", pb.RemoveMinerRequest(url=url))).removed


def revoke_miner_key(miner_key: Union[bytes, str], reason: str) -> Plan[bool]:
    request = pb.RevokeMinerKeyRequest(miner_key=_miner_key(miner_key), reason=reason)
    return (yield Unary("RevokeMinerKey", request)).newly_revoked


def list_revoked_keys() -> Plan[List[RevokedKey]]:
    response = yield Unary("ListRevokedKeys", pb.ListRevokedKeysRequest())
    return [RevokedKey.from_proto(k) for k in response.keys]


def list_rates() -> Plan[pb.ListRatesResponse]:
    return (yield Unary("ListRates", pb.ListRatesRequest()))


def _miner_key(key: Union[bytes, str]) -> bytes:
    """A miner's ed25519 public key, as 32 bytes or 64 hex digits."""
    if isinstance(key, str):
        try:
            key = bytes.fromhex(key)
        except ValueError:
            raise ValueError(f"{key!r} is not a miner key: 64 hex digits") from None
    if len(key) != 32:
        raise ValueError(f"a miner key is 32 bytes, not {len(key)}")
    return key


# Attestation.


def attest_events(url: str, timeout: Optional[float]) -> Plan[None]:
    call = yield _attest_miner(url, timeout)
    while (event := (yield from _next(call, event_from_proto))) is not None:
        yield Emit(event)


def attest(url: str, on_event: Optional[Callable[[AttestEvent], None]],
           timeout: Optional[float]) -> Plan[Verdict]:
    call = yield _attest_miner(url, timeout)
    while (event := (yield from _next(call, event_from_proto))) is not None:
        if isinstance(event, Verdict):
            return event
        if on_event is not None:
            on_event(event)
    raise GpuAttestError(grpc.StatusCode.UNKNOWN, f"the attestation of {url} ended without a verdict")


def _attest_miner(url: str, timeout: Optional[float]) -> Open:
    # The caller's timeout bounds the whole attestation; unset, the validator's own deadlines
    # for the challenge do.
    return Open("AttestMiner", pb.AttestMinerRequest(url=url), timeout)


# Verdicts.


def list_verdicts(miner_url: str, passed: Optional[bool], since_unix_ms: int, limit: Optional[int],
                  page_size: int) -> Plan[None]:
    token, seen = "", 0
    while True:
        request = _list_verdicts_request(miner_url, passed, since_unix_ms, page_size, token)
        response = yield Unary("ListVerdicts", request)
        for v in response.verdicts:
            if limit is not None and seen >= limit:
                return
            seen += 1
            yield Emit(Verdict.from_proto(v))
        token = response.next_page_token
        if not token:
            return


def watch_verdicts(after_id: Optional[int], miner_url: str) -> Plan[None]:
    call = yield _watch_verdicts(after_id, miner_url)
    while (verdict := (yield from _next(call, Verdict.from_proto))) is not None:
        yield Emit(verdict)


def follow_verdicts(after_id: Optional[int], miner_url: str, retry_seconds: float) -> Plan[None]:
    last = after_id
    while True:
        try:
            if last is None:
                # Where to start is fixed before the first watch, not at its first verdict: a
                # reconnect before that verdict resumes from here and misses none stored
                # meanwhile.
                newest = yield Unary("ListVerdicts", _list_verdicts_request("", None, 0, 1, ""))
                last = newest.verdicts[0].id if newest.verdicts else 0
            call = yield _watch_verdicts(last, miner_url)
            while (verdict := (yield from _next(call, Verdict.from_proto))) is not None:
                last = verdict.id
                yield Emit(verdict)
        except Unavailable:
            yield Sleep(retry_seconds)


def _list_verdicts_request(miner_url: str, passed: Optional[bool], since_unix_ms: int, page_size: int,
                           page_token: str) -> pb.ListVerdictsRequest:
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be in 1..={MAX_PAGE_SIZE}")
    request = pb.ListVerdictsRequest(
        miner_url=miner_url, since_unix_ms=since_unix_ms, page_size=page_size, page_token=page_token
    )
    if passed is not None:
        request.passed = passed
    return request


def _watch_verdicts(after_id: Optional[int], miner_url: str) -> Open:
    request = pb.WatchVerdictsRequest(miner_url=miner_url)
    if after_id is not None:
        request.after_id = after_id
    # No deadline: a watch runs until the caller stops it or the validator does.
    return Open("WatchVerdicts", request, None)


# The largest transcript a validator keeps (PROTOCOL.md 21.1): 2^31 - 1 bytes.
MAX_TRANSCRIPT_BYTES = 2**31 - 1


def _receive_transcript(verdict_id: int, timeout: Optional[float], take: Callable[[bytes], object]) -> Plan[int]:
    """A verdict's kept transcript (PROTOCOL.md 21), each chunk handed to ``take`` as it
    arrives, and its size. DATA_LOSS where the chunks come short of, or run past, the size the
    validator stated (or the largest it keeps)."""
    call = yield Open("GetTranscript", pb.GetTranscriptRequest(verdict_id=verdict_id), timeout)
    total = None
    received = 0
    while (chunk := (yield Receive(call))) is not None:
        total = chunk.total_bytes
        received += len(chunk.data)
        if received > total or received > MAX_TRANSCRIPT_BYTES:
            break
        take(chunk.data)
    if total is None or received != total:
        raise GpuAttestError(
            grpc.StatusCode.DATA_LOSS,
            f"verdict {verdict_id}'s transcript came to {received} bytes of {total}: ask again",
        )
    return received


def transcript(verdict_id: int, timeout: Optional[float]) -> Plan[bytes]:
    """A verdict's kept transcript (PROTOCOL.md 21), whole, from its chunks."""
    parts: List[bytes] = []
    yield from _receive_transcript(verdict_id, timeout, parts.append)
    return b"".join(parts)


def save_transcript(verdict_id: int, path, timeout: Optional[float]) -> Plan[int]:
    """A verdict's kept transcript written to a new file at ``path`` as its chunks arrive (a
    host of many GPUs writes transcripts of up to 2 GiB, which need not be held whole here), and
    its size. An existing file is never overwritten. A transfer that fails, comes short or runs
    past what the validator stated removes its file; one cut off by a crash of this process can
    leave a partial file, which ``validator audit`` refuses as not a whole transcript."""
    # Opened first, so that a file in the way is refused before anything is asked.
    out = open(path, "xb")
    try:
        written = yield from _receive_transcript(verdict_id, timeout, out.write)
        out.close()
    except BaseException:
        out.close()
        # The original error stands, whatever became of the file meanwhile.
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return written


def _next(call, parse: Callable) -> Plan:
    """The next message of the stream ``call`` as ``parse`` reads it, skipping those it reads
    as None (an event newer than this client); None at the stream's end."""
    while (message := (yield Receive(call))) is not None:
        parsed = parse(message)
        if parsed is not None:
            return parsed
    return None
