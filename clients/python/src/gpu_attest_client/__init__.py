"""A Python client for the gpu-attest validator API.

``Client`` (blocking) and ``AsyncClient`` (asyncio) register, list, remove and revoke miners,
attest a miner with progress events, list stored verdicts and watch new ones as they are stored.
Errors are :class:`GpuAttestError` subclasses carrying the gRPC status and the validator's
message. The raw generated stubs are in ``gpu_attest.v1``.
"""

from .aio import AsyncClient
from .client import Client
from .errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    GpuAttestError,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from .types import (
    AttestEvent,
    FailReason,
    MinerRecord,
    Phase,
    Progress,
    RateSource,
    ReasonCode,
    RevokedKey,
    Verdict,
)

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "AttestEvent",
    "Client",
    "DeadlineExceeded",
    "FailReason",
    "FailedPrecondition",
    "GpuAttestError",
    "Internal",
    "InvalidArgument",
    "MinerRecord",
    "NotFound",
    "OutOfRange",
    "Phase",
    "PermissionDenied",
    "Progress",
    "RateSource",
    "ReasonCode",
    "ResourceExhausted",
    "RevokedKey",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Verdict",
]
