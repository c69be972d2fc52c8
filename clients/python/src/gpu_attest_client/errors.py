"""Exceptions for the validator's gRPC statuses: each carries the status code and the message.

The validator gives every error a precise status and a message a person can act on; these keep
both, so that a caller can branch on the class (or on ``code``) and show ``message``.
"""

from __future__ import annotations

from typing import Optional

import grpc


class GpuAttestError(Exception):
    """An error the validator API returned (or the channel gave: UNAVAILABLE)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidArgument(GpuAttestError):
    """The request is malformed: a URL without a scheme, a key of the wrong length..."""


class NotFound(GpuAttestError):
    """No such miner is registered."""


class AlreadyExists(GpuAttestError):
    """The miner key is registered at another URL, or the URL presents another key."""


class PermissionDenied(GpuAttestError):
    """The miner refuses this validator, or its key is revoked."""


class FailedPrecondition(GpuAttestError):
    """The request cannot be served in this state (for example a miner that cannot be planned)."""


class ResourceExhausted(GpuAttestError):
    """Too many requests or streams from this client, or a miner busy with another challenge."""


class OutOfRange(GpuAttestError):
    """A verdict id beyond the newest stored one."""


class Unavailable(GpuAttestError):
    """The validator (or the miner it calls) cannot be reached, or it is stopping."""


class DeadlineExceeded(GpuAttestError):
    """The call took longer than its timeout."""


class Unauthenticated(GpuAttestError):
    """The API requires a client certificate this client did not present."""


class Internal(GpuAttestError):
    """The validator failed (its database, for example)."""


class Unimplemented(GpuAttestError):
    """The server does not offer the call: not a validator's API, or an older validator."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}

_TLS_TROUBLE = ("Tls handshake failed", "TSI_", "SSL_ERROR", "WRONG_VERSION_NUMBER")


def _hint(code: grpc.StatusCode, details: str, api: Optional[str]) -> str:
    """What to do, for the failures whose gRPC words do not say it."""
    where = f"the server at {api}" if api else "the server"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return (f"{where} does not offer this call: it is not a validator's API (a miner's port?), "
                "or its validator is older than this client (`validator --version` on that host)")
    if code != grpc.StatusCode.UNAVAILABLE or not api:
        return ""
    if api.startswith("https://") and any(t in details for t in _TLS_TROUBLE):
        return (f"the TLS handshake with {api} failed: if that API is served without TLS, use "
                "http://; if with TLS, check that ca= names the CA that signed its certificate")
    if api.startswith("http://") and ("Socket closed" in details or "TSI_DATA_CORRUPTED" in details):
        return (f"{api} closed the connection: if that API is served with TLS, use https:// with ca= "
                "(and cert=, key= where it requires client certificates)")
    # gRPC's own words when this client could not connect: a validator that could not reach a
    # miner also says "Connection refused", but in its own message, and the hint would send the
    # caller to the wrong host.
    if "failed to connect to all addresses" in details and "onnection refused" in details:
        return f"nothing listens at {api}: is `validator serve` running there?"
    return ""



def from_rpc_error(error: grpc.RpcError, api: Optional[str] = None) -> GpuAttestError:
    """The exception for a failed call (sync ``grpc.RpcError`` or ``grpc.aio.AioRpcError``) to
    the API at ``api``: the validator's message, or gRPC's with what to do where its words do
    not say it (a TLS mismatch, a server that is not a validator)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else str(error)) or ""
    hint = _hint(code, details, api)
    message = f"{details}; {hint}" if details and hint else (details or hint)
    return _BY_CODE.get(code, GpuAttestError)(code, message)
