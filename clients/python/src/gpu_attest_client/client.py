"""The synchronous client."""

from __future__ import annotations

import time
from typing import Callable, Iterator, List, Optional, Union

import grpc

from gpu_attest.v1 import validator_pb2 as pb
from gpu_attest.v1 import validator_pb2_grpc as rpc

from . import _requests
from ._channel import PathLike, target
from .errors import GpuAttestError, Unavailable, from_rpc_error
from .types import AttestEvent, MinerRecord, RevokedKey, Verdict, event_from_proto


class Client:
    """The validator API (`validator serve`), over one channel.

    >>> with Client("http://127.0.0.1:7071") as api:
    ...     for verdict in api.list_verdicts(limit=10):
    ...         print(verdict.miner_url, verdict.passed, verdict.codes)

    Every failed call raises a :class:`~gpu_attest_client.errors.GpuAttestError` subclass that
    carries the gRPC status code and the validator's message.
    """

    def __init__(self, api: str = "http://127.0.0.1:7071", *, ca: Optional[PathLike] = None,
                 cert: Optional[PathLike] = None, key: Optional[PathLike] = None,
                 timeout: float = 30.0):
        self._api = api
        where = target(api, ca, cert, key)
        if where.credentials is None:
            self._channel = grpc.insecure_channel(where.address)
        else:
            self._channel = grpc.secure_channel(where.address, where.credentials)
        self._stub = rpc.ValidatorStub(self._channel)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self._api) from None

    # Miners.

    def register_miner(self, url: str, name: str = "", *, replace_key: bool = False) -> MinerRecord:
        """Registers the miner at ``url`` (the validator fetches its inventory and binds the URL
        to its key); renames it when already registered and ``name`` is given."""
        request = pb.RegisterMinerRequest(url=url, name=name, replace_key=replace_key)
        return MinerRecord.from_proto(self._call(self._stub.RegisterMiner, request))

    def list_miners(self) -> List[MinerRecord]:
        response = self._call(self._stub.ListMiners, pb.ListMinersRequest())
        return [MinerRecord.from_proto(m) for m in response.miners]

    def remove_miner(self, url: str) -> bool:
        """Stops attesting the miner (its verdicts stay); False when it was not registered."""
        return self._call(self._stub.RemoveMiner, pb.RemoveMinerRequest(url=url)).removed

    def revoke_miner_key(self, miner_key: Union[bytes, str], reason: str) -> bool:
        """Never challenges or registers this key again; False when it was revoked already."""
        request = pb.RevokeMinerKeyRequest(miner_key=_requests.miner_key(miner_key), reason=reason)
        return self._call(self._stub.RevokeMinerKey, request).newly_revoked

    def list_revoked_keys(self) -> List[RevokedKey]:
        """Every revoked miner key with its reason, newest revocation first."""
        response = self._call(self._stub.ListRevokedKeys, pb.ListRevokedKeysRequest())
        return [RevokedKey.from_proto(k) for k in response.keys]

    def list_rates(self) -> pb.ListRatesResponse:
        """The rate table the validator plans with (PROTOCOL.md 15.1): ``classes`` (each with its
        rate, per ``unit``, and its ``source``), ``shipped`` and ``calibration_min_miners``, as
        `validator rates show` prints it."""
        return self._call(self._stub.ListRates, pb.ListRatesRequest())

    # Attestation.

    def attest_events(self, url: str, timeout: Optional[float] = None) -> Iterator[AttestEvent]:
        """Attests the miner at ``url`` now: its phases and progress as they happen, then the
        stored :class:`Verdict` as the last event. ``timeout`` bounds the whole attestation
        (unset: as long as the validator takes; it has the challenge's deadlines of its own)."""
        try:
            for event in self._stub.AttestMiner(pb.AttestMinerRequest(url=url), timeout=timeout):
                converted = event_from_proto(event)
                if converted is not None:
                    yield converted
        except grpc.RpcError as e:
            raise from_rpc_error(e, self._api) from None

    def attest(self, url: str, on_event: Optional[Callable[[AttestEvent], None]] = None,
               timeout: Optional[float] = None) -> Verdict:
        """Attests the miner at ``url`` and returns the stored verdict; ``on_event`` sees every
        phase and progress event before it."""
        for event in self.attest_events(url, timeout):
            if isinstance(event, Verdict):
                return event
            if on_event is not None:
                on_event(event)
        raise GpuAttestError(grpc.StatusCode.UNKNOWN, f"the attestation of {url} ended without a verdict")

    # Verdicts.

    def list_verdicts(self, miner_url: str = "", *, passed: Optional[bool] = None,
                      since_unix_ms: int = 0, limit: Optional[int] = None,
                      page_size: int = 100) -> Iterator[Verdict]:
        """Stored verdicts, newest first, fetched a page at a time; at most ``limit``."""
        token, seen = "", 0
        while True:
            request = _requests.list_verdicts(miner_url, passed, since_unix_ms, page_size, token)
            response = self._call(self._stub.ListVerdicts, request)
            for v in response.verdicts:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield Verdict.from_proto(v)
            token = response.next_page_token
            if not token:
                return

    def watch_verdicts(self, after_id: Optional[int] = None, miner_url: str = "") -> Iterator[Verdict]:
        """Every verdict as it is stored, in id order: first those with ids above ``after_id``
        (unset: from now on). Ends with :class:`~gpu_attest_client.errors.Unavailable` when the
        validator stops; :meth:`follow_verdicts` reconnects instead."""
        try:
            for v in self._stub.WatchVerdicts(_requests.watch_verdicts(after_id, miner_url)):
                yield Verdict.from_proto(v)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self._api) from None

    def follow_verdicts(self, after_id: Optional[int] = None, miner_url: str = "",
                        retry_seconds: float = 2.0) -> Iterator[Verdict]:
        """:meth:`watch_verdicts` that reconnects when the validator is unavailable, resuming
        after the last verdict it yielded, so that a restart loses nothing. Runs until the
        caller stops iterating."""
        last = after_id
        while True:
            try:
                if last is None:
                    # Where to start is fixed before the first watch, not at its first verdict:
                    # a reconnect before that verdict resumes from here and misses none stored
                    # meanwhile.
                    newest = next(self.list_verdicts(limit=1, page_size=1), None)
                    last = newest.id if newest is not None else 0
                for verdict in self.watch_verdicts(last, miner_url):
                    last = verdict.id
                    yield verdict
            except Unavailable:
                time.sleep(retry_seconds)
