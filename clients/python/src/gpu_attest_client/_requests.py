"""Requests, built once for the sync and the asyncio client alike."""

from __future__ import annotations

from typing import Optional, Union

from gpu_attest.v1 import validator_pb2 as pb

MAX_PAGE_SIZE = 500


def miner_key(key: Union[bytes, str]) -> bytes:
    """A miner's ed25519 public key, as 32 bytes or 64 hex digits."""
    if isinstance(key, str):
        try:
            key = bytes.fromhex(key)
        except ValueError:
            raise ValueError(f"{key!r} is not a miner key: 64 hex digits") from None
    if len(key) != 32:
        raise ValueError(f"a miner key is 32 bytes, not {len(key)}")
    return key


def list_verdicts(miner_url: str, passed: Optional[bool], since_unix_ms: int, page_size: int,
                  page_token: str) -> pb.ListVerdictsRequest:
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be in 1..={MAX_PAGE_SIZE}")
    request = pb.ListVerdictsRequest(
        miner_url=miner_url, since_unix_ms=since_unix_ms, page_size=page_size, page_token=page_token
    )
    if passed is not None:
        request.passed = passed
    return request


def watch_verdicts(after_id: Optional[int], miner_url: str) -> pb.WatchVerdictsRequest:
    request = pb.WatchVerdictsRequest(miner_url=miner_url)
    if after_id is not None:
        request.after_id = after_id
    return request
