"""Exceptions for the validator's gRPC statuses: each carries the status code and the message.

The validator gives every error a precise status and a message a person can act on; these keep
both, so that a caller can branch on the class (or on ``code``) and show ``message``.
"""

from __future__ import annotations

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
}


def from_rpc_error(error: grpc.RpcError) -> GpuAttestError:
    """The exception for a failed call (sync ``grpc.RpcError`` or ``grpc.aio.AioRpcError``)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return _BY_CODE.get(code, GpuAttestError)(code, details or "")
