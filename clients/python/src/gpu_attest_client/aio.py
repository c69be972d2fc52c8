"""The asyncio client: the calls of ``_calls``, as :class:`gpu_attest_client.Client` makes them,
carried out by awaiting the stub."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, List, Optional, Union

import grpc
import grpc.aio

from gpu_attest.v1 import validator_pb2 as pb
from gpu_attest.v1 import validator_pb2_grpc as rpc

from . import _calls, _plan
from ._channel import PathLike, connect
from .types import AttestEvent, MinerRecord, RevokedKey, Verdict


class AsyncClient:
    """The validator API over one asyncio channel; use ``async with``."""

    def __init__(self, api: str = "http://127.0.0.1:7071", *, ca: Optional[PathLike] = None,
                 cert: Optional[PathLike] = None, key: Optional[PathLike] = None,
                 timeout: float = 30.0):
        self._api = api
        self._channel = connect(grpc.aio, api, ca, cert, key)
        self._stub = rpc.ValidatorStub(self._channel)
        self._timeout = timeout

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *_) -> None:
        await self.close()

    async def register_miner(self, url: str, name: str = "", *, replace_key: bool = False) -> MinerRecord:
        return await self._result(_calls.register_miner(url, name, replace_key))

    async def list_miners(self) -> List[MinerRecord]:
        return await self._result(_calls.list_miners())

    async def remove_miner(self, url: str) -> bool:
        return await self._result(_calls.remove_miner(url))

    async def revoke_miner_key(self, miner_key: Union[bytes, str], reason: str) -> bool:
        return await self._result(_calls.revoke_miner_key(miner_key, reason))

    async def list_revoked_keys(self) -> List[RevokedKey]:
        return await self._result(_calls.list_revoked_keys())

    async def list_rates(self) -> pb.ListRatesResponse:
        return await self._result(_calls.list_rates())

    async def transcript(self, verdict_id: int, timeout: Optional[float] = 60.0) -> bytes:
        return await self._result(_calls.transcript(verdict_id, timeout))

    async def save_transcript(self, verdict_id: int, path, timeout: Optional[float] = 60.0) -> int:
        return await self._result(_calls.save_transcript(verdict_id, path, timeout))

    # The calls a caller iterates return the async generator that carries them out, rather than
    # wrapping it in one of their own: `aclose()` on what the caller holds then cancels the
    # stream at once, not when a wrapped generator is collected.

    def attest_events(self, url: str, timeout: Optional[float] = None) -> AsyncIterator[AttestEvent]:
        return self._iterate(_calls.attest_events(url, timeout))

    async def attest(self, url: str, on_event: Optional[Callable[[AttestEvent], None]] = None,
                     timeout: Optional[float] = None) -> Verdict:
        return await self._result(_calls.attest(url, on_event, timeout))

    def list_verdicts(self, miner_url: str = "", *, passed: Optional[bool] = None,
                      since_unix_ms: int = 0, limit: Optional[int] = None,
                      page_size: int = 100) -> AsyncIterator[Verdict]:
        return self._iterate(_calls.list_verdicts(miner_url, passed, since_unix_ms, limit, page_size))

    def watch_verdicts(self, after_id: Optional[int] = None, miner_url: str = "") -> AsyncIterator[Verdict]:
        return self._iterate(_calls.watch_verdicts(after_id, miner_url))

    def follow_verdicts(self, after_id: Optional[int] = None, miner_url: str = "",
                        retry_seconds: float = 2.0) -> AsyncIterator[Verdict]:
        return self._iterate(_calls.follow_verdicts(after_id, miner_url, retry_seconds))

    # Carrying plans out: what Client does by blocking, done by awaiting.

    async def _result(self, plan: _plan.Plan[Any]) -> Any:
        run = _plan.Run(plan, self._api)
        async for _ in self._drive(run):
            pass  # a call with a result emits nothing
        return run.result

    def _iterate(self, plan: _plan.Plan[None]) -> AsyncIterator[Any]:
        return self._drive(_plan.Run(plan, self._api))

    async def _drive(self, run: _plan.Run) -> AsyncIterator[Any]:
        try:
            while (effect := run.next()) is not None:
                if isinstance(effect, _plan.Emit):
                    yield effect.value
                    continue
                try:
                    run.gave(await self._perform(effect))
                except grpc.aio.AioRpcError as e:
                    run.failed(e)
        finally:
            run.close()

    async def _perform(self, effect: _plan.Effect) -> Any:
        if isinstance(effect, _plan.Unary):
            return await getattr(self._stub, effect.rpc)(effect.request, timeout=self._timeout)
        if isinstance(effect, _plan.Open):
            return getattr(self._stub, effect.rpc)(effect.request, timeout=effect.timeout)
        if isinstance(effect, _plan.Receive):
            message = await effect.call.read()
            return None if message is grpc.aio.EOF else message
        await asyncio.sleep(effect.seconds)  # _plan.Sleep, the last kind
        return None
