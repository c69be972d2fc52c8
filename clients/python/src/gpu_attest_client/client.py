"""The blocking client: the calls of ``_calls``, carried out by blocking on the stub."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, List, Optional, Union

import grpc

from gpu_attest.v1 import validator_pb2 as pb
from gpu_attest.v1 import validator_pb2_grpc as rpc

from . import _calls, _plan
from ._channel import PathLike, connect
from .types import AttestEvent, MinerRecord, RevokedKey, Verdict


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
        self._channel = connect(grpc, api, ca, cert, key)
        self._stub = rpc.ValidatorStub(self._channel)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    # Miners.

    def register_miner(self, url: str, name: str = "", *, replace_key: bool = False) -> MinerRecord:
        """Registers the miner at ``url`` (the validator fetches its inventory and binds the URL
        to its key); renames it when already registered and ``name`` is given."""
        return self._result(_calls.register_miner(url, name, replace_key))

    def list_miners(self) -> List[MinerRecord]:
        return self._result(_calls.list_miners())

    def remove_miner(self, url: str) -> bool:
        """Stops attesting the miner (its verdicts stay); False when it was not registered."""
        return self._result(_calls.remove_miner(url))

    def revoke_miner_key(self, miner_key: Union[bytes, str], reason: str) -> bool:
        """Never challenges or registers this key again; False when it was revoked already."""
        return self._result(_calls.revoke_miner_key(miner_key, reason))

    def list_revoked_keys(self) -> List[RevokedKey]:
        """Every revoked miner key with its reason, newest revocation first."""
        return self._result(_calls.list_revoked_keys())

    def list_rates(self) -> pb.ListRatesResponse:
        """The rate table the validator plans with (PROTOCOL.md 15.1): ``classes`` (each with its
        rate, per ``unit``, and its ``source``), ``shipped`` and ``calibration_min_miners``, as
        `validator rates show` prints it."""
        return self._result(_calls.list_rates())

    def transcript(self, verdict_id: int, timeout: Optional[float] = 60.0) -> bytes:
        """Verdict ``verdict_id``'s kept transcript (PROTOCOL.md 21): the file ``validator audit``
        checks. NotFound when the validator keeps none for it."""
        return self._result(_calls.transcript(verdict_id, timeout))

    def save_transcript(self, verdict_id: int, path, timeout: Optional[float] = 60.0) -> int:
        """Writes verdict ``verdict_id``'s transcript to a new file at ``path`` (never over one
        that exists), for ``validator audit``; returns its size. A host of many GPUs writes
        transcripts of up to 2 GiB, written here as they arrive: raise ``timeout`` for those over
        a slow link."""
        return self._result(_calls.save_transcript(verdict_id, path, timeout))

    # Attestation.

    def attest_events(self, url: str, timeout: Optional[float] = None) -> Iterator[AttestEvent]:
        """Attests the miner at ``url`` now: its phases and progress as they happen, then the
        stored :class:`Verdict` as the last event. ``timeout`` bounds how long this client
        waits for the whole attestation (unset: as long as the validator takes; it has the
        challenge's deadlines of its own). It does not stop the validator: an attestation this
        client gave up on still ends in a stored verdict, which ``list_verdicts`` shows."""
        return self._iterate(_calls.attest_events(url, timeout))

    def attest(self, url: str, on_event: Optional[Callable[[AttestEvent], None]] = None,
               timeout: Optional[float] = None) -> Verdict:
        """Attests the miner at ``url`` and returns the stored verdict; ``on_event`` sees every
        phase and progress event before it."""
        return self._result(_calls.attest(url, on_event, timeout))

    # Verdicts.

    def list_verdicts(self, miner_url: str = "", *, passed: Optional[bool] = None,
                      since_unix_ms: int = 0, limit: Optional[int] = None,
                      page_size: int = 100) -> Iterator[Verdict]:
        """Stored verdicts, newest first, fetched a page at a time; at most ``limit``."""
        return self._iterate(_calls.list_verdicts(miner_url, passed, since_unix_ms, limit, page_size))

    def watch_verdicts(self, after_id: Optional[int] = None, miner_url: str = "") -> Iterator[Verdict]:
        """Every verdict as it is stored, in id order: first those with ids above ``after_id``
        (unset: from now on). Ends with :class:`~gpu_attest_client.errors.Unavailable` when the
        validator stops; :meth:`follow_verdicts` reconnects instead."""
        return self._iterate(_calls.watch_verdicts(after_id, miner_url))

    def follow_verdicts(self, after_id: Optional[int] = None, miner_url: str = "",
                        retry_seconds: float = 2.0) -> Iterator[Verdict]:
        """:meth:`watch_verdicts` that reconnects when the validator is unavailable, resuming
        after the last verdict it yielded, so that a restart loses nothing. Runs until the
        caller stops iterating."""
        return self._iterate(_calls.follow_verdicts(after_id, miner_url, retry_seconds))

    # Carrying plans out: what AsyncClient does by awaiting, done by blocking.

    def _result(self, plan: _plan.Plan[Any]) -> Any:
        run = _plan.Run(plan, self._api)
        for _ in self._drive(run):
            pass  # a call with a result emits nothing
        return run.result

    def _iterate(self, plan: _plan.Plan[None]) -> Iterator[Any]:
        return self._drive(_plan.Run(plan, self._api))

    def _drive(self, run: _plan.Run) -> Iterator[Any]:
        try:
            while (effect := run.next()) is not None:
                if isinstance(effect, _plan.Emit):
                    yield effect.value
                    continue
                try:
                    run.gave(self._perform(effect))
                except grpc.RpcError as e:
                    run.failed(e)
        finally:
            run.close()

    def _perform(self, effect: _plan.Effect) -> Any:
        if isinstance(effect, _plan.Unary):
            return getattr(self._stub, effect.rpc)(effect.request, timeout=self._timeout)
        if isinstance(effect, _plan.Open):
            return getattr(self._stub, effect.rpc)(effect.request, timeout=effect.timeout)
        if isinstance(effect, _plan.Receive):
            return next(effect.call, None)
        time.sleep(effect.seconds)  # _plan.Sleep, the last kind
        return None
