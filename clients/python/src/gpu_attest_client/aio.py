"""The asyncio client: the same calls as :class:`gpu_attest_client.Client`, awaited."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, List, Optional, Union

import grpc
import grpc.aio

from gpu_attest.v1 import validator_pb2 as pb
from gpu_attest.v1 import validator_pb2_grpc as rpc

from . import _requests
from ._channel import PathLike, target
from .errors import GpuAttestError, Unavailable, from_rpc_error
from .types import AttestEvent, MinerRecord, RevokedKey, Verdict, event_from_proto


class AsyncClient:
    """The validator API over one asyncio channel; use ``async with``."""

    def __init__(self, api: str = "http://127.0.0.1:7071", *, ca: Optional[PathLike] = None,
                 cert: Optional[PathLike] = None, key: Optional[PathLike] = None,
                 timeout: float = 30.0):
        self._api = api
        where = target(api, ca, cert, key)
        if where.credentials is None:
            self._channel = grpc.aio.insecure_channel(where.address)
        else:
            self._channel = grpc.aio.secure_channel(where.address, where.credentials)
        self._stub = rpc.ValidatorStub(self._channel)
        self._timeout = timeout

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *_) -> None:
        await self.close()

    async def _call(self, method, request):
        try:
            return await method(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, self._api) from None

    async def register_miner(self, url: str, name: str = "", *, replace_key: bool = False) -> MinerRecord:
        request = pb.RegisterMinerRequest(url=url, name=name, replace_key=replace_key)
        return MinerRecord.from_proto(await self._call(self._stub.RegisterMiner, request))

    async def list_miners(self) -> List[MinerRecord]:
        response = await self._call(self._stub.ListMiners, pb.ListMinersRequest())
        return [MinerRecord.from_proto(m) for m in response.miners]

    async def remove_miner(self, url: str) -> bool:
        return (await self._call(self._stub.RemoveMiner, pb.RemoveMinerRequest(url=url))).removed

    async def revoke_miner_key(self, miner_key: Union[bytes, str], reason: str) -> bool:
        request = pb.RevokeMinerKeyRequest(miner_key=_requests.miner_key(miner_key), reason=reason)
        return (await self._call(self._stub.RevokeMinerKey, request)).newly_revoked

    async def list_revoked_keys(self) -> List[RevokedKey]:
        response = await self._call(self._stub.ListRevokedKeys, pb.ListRevokedKeysRequest())
        return [RevokedKey.from_proto(k) for k in response.keys]

    async def list_rates(self) -> pb.ListRatesResponse:
        return await self._call(self._stub.ListRates, pb.ListRatesRequest())

    async def attest_events(self, url: str, timeout: Optional[float] = None) -> AsyncIterator[AttestEvent]:
        try:
            async for event in self._stub.AttestMiner(pb.AttestMinerRequest(url=url), timeout=timeout):
                converted = event_from_proto(event)
                if converted is not None:
                    yield converted
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, self._api) from None

    async def attest(self, url: str, on_event: Optional[Callable[[AttestEvent], None]] = None,
                     timeout: Optional[float] = None) -> Verdict:
        async for event in self.attest_events(url, timeout):
            if isinstance(event, Verdict):
                return event
            if on_event is not None:
                on_event(event)
        raise GpuAttestError(grpc.StatusCode.UNKNOWN, f"the attestation of {url} ended without a verdict")

    async def list_verdicts(self, miner_url: str = "", *, passed: Optional[bool] = None,
                            since_unix_ms: int = 0, limit: Optional[int] = None,
                            page_size: int = 100) -> AsyncIterator[Verdict]:
        token, seen = "", 0
        while True:
            request = _requests.list_verdicts(miner_url, passed, since_unix_ms, page_size, token)
            response = await self._call(self._stub.ListVerdicts, request)
            for v in response.verdicts:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield Verdict.from_proto(v)
            token = response.next_page_token
            if not token:
                return

    async def watch_verdicts(self, after_id: Optional[int] = None, miner_url: str = "") -> AsyncIterator[Verdict]:
        try:
            async for v in self._stub.WatchVerdicts(_requests.watch_verdicts(after_id, miner_url)):
                yield Verdict.from_proto(v)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, self._api) from None

    async def follow_verdicts(self, after_id: Optional[int] = None, miner_url: str = "",
                              retry_seconds: float = 2.0) -> AsyncIterator[Verdict]:
        last = after_id
        while True:
            try:
                if last is None:
                    # As Client.follow_verdicts: the starting point is fixed before the first
                    # watch, so a reconnect before the first verdict misses none.
                    newest_id = 0
                    async for newest in self.list_verdicts(limit=1, page_size=1):
                        newest_id = newest.id
                    last = newest_id
                async for verdict in self.watch_verdicts(last, miner_url):
                    last = verdict.id
                    yield verdict
            except Unavailable:
                await asyncio.sleep(retry_seconds)
