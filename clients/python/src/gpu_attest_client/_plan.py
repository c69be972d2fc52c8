"""How an API call, written once as a plan, asks its client for the wire and the clock.

A plan (the calls are in ``_calls``) is a generator. It yields an *effect* wherever it needs the
stub or a pause, and is sent back what the effect gave, or has thrown into it the client's
exception for the gRPC error the effect raised; it yields an :class:`Emit` for each value the
caller iterates. ``Client`` carries effects out by blocking and ``AsyncClient`` by awaiting; a
:class:`Run` keeps all the rest (what the plan is sent next, the mapping of gRPC's errors, the
streams to cancel), so that the two clients cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, List, Optional, TypeVar, Union

import grpc

from .errors import from_rpc_error

T = TypeVar("T")


@dataclass(frozen=True)
class Unary:
    """Call the stub's ``rpc`` with ``request``, bounded by the client's timeout; gives the
    response."""

    rpc: str
    request: Any


@dataclass(frozen=True)
class Open:
    """Open the stub's server stream ``rpc`` with ``request``; gives the call, to read with
    :class:`Receive`. ``timeout`` bounds the whole stream (None: as long as the server keeps
    it)."""

    rpc: str
    request: Any
    timeout: Optional[float]


@dataclass(frozen=True)
class Receive:
    """Gives the next message of a stream :class:`Open` gave, or None at its end."""

    call: Any


@dataclass(frozen=True)
class Sleep:
    """Pause for ``seconds``; gives None."""

    seconds: float


@dataclass(frozen=True)
class Emit:
    """Hand ``value`` to the caller iterating the call; gives None once the caller asks for
    the next value."""

    value: Any


#: What a client carries out for a plan; an :class:`Emit` it hands on instead.
Effect = Union[Unary, Open, Receive, Sleep]

#: Yields effects and emits, is sent what each gave, and returns the call's result (None for a
#: call the caller iterates: what it gives, it emits).
Plan = Generator[Union[Effect, Emit], Any, T]


class Run:
    """One plan being carried out. The client asks :meth:`next` for each effect (or emit) and
    reports what the effect gave (:meth:`gave`) or the gRPC error it raised (:meth:`failed`);
    when it is done with the call, early or not, it calls :meth:`close`."""

    def __init__(self, plan: Plan[Any], api: str):
        self._plan = plan
        self._api = api
        self._effect: Union[Effect, Emit, None] = None
        self._reply: Any = None
        self._error: Optional[BaseException] = None
        # Streams opened and not yet read to their end: cancelled on close, so that a caller
        # who stops iterating (or an attestation that returns at its verdict) leaves no call
        # running on the server.
        self._open: List[Any] = []
        #: The plan's return value, once :meth:`next` has given None.
        self.result: Any = None

    def next(self) -> Union[Effect, Emit, None]:
        """The plan's next effect or emit; None when it has returned. An exception the plan does
        not catch (the client's exception for a failed effect, or its own ValueError) propagates
        from here."""
        reply, error = self._reply, self._error
        self._reply = self._error = None
        try:
            self._effect = self._plan.send(reply) if error is None else self._plan.throw(error)
        except StopIteration as end:
            self._effect = None
            self.result = end.value
        return self._effect

    def gave(self, reply: Any) -> None:
        if isinstance(self._effect, Open):
            self._open.append(reply)
        elif isinstance(self._effect, Receive) and reply is None:
            self._forget(self._effect.call)
        self._reply = reply

    def failed(self, error: grpc.RpcError) -> None:
        """The effect raised gRPC's ``error``: the plan is thrown the client's exception for it."""
        if isinstance(self._effect, Receive):
            self._forget(self._effect.call)
        mapped = from_rpc_error(error, self._api)
        # As `raise ... from None` would: gRPC's own exception adds nothing to the message.
        mapped.__suppress_context__ = True
        self._error = mapped

    def close(self) -> None:
        self._plan.close()
        for call in self._open:
            call.cancel()
        self._open.clear()

    def _forget(self, call: Any) -> None:
        # A stream that ended, or failed, has nothing left to cancel; a follower that
        # reconnects for days must not keep every call it ever opened.
        self._open = [c for c in self._open if c is not call]
