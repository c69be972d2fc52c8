"""The API address and TLS files, read as `validator miners --api` reads them, and the channel
to it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Union
from urllib.parse import urlsplit

import grpc

PathLike = Union[str, Path]


@dataclass(frozen=True)
class Target:
    """Where the API is and how to reach it: ``host:port`` and, for https, the credentials."""

    address: str
    credentials: Optional[grpc.ChannelCredentials]


def target(api: str, ca: Optional[PathLike] = None, cert: Optional[PathLike] = None,
           key: Optional[PathLike] = None) -> Target:
    """``api`` is ``http://host:port`` (plaintext, for loopback) or ``https://host:port``; ``ca``
    checks the API's certificate (the system's roots when unset); ``cert`` and ``key`` are the
    client certificate an API with mutual TLS requires."""
    parts = urlsplit(api)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{api!r} is not an API address: give the scheme and port, e.g. http://127.0.0.1:7071 "
            "(https:// when `validator serve` has [tls])"
        )
    if parts.path not in ("", "/"):
        raise ValueError(f"{api!r}: an API address has no path")
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs its key, and a key its certificate: give both or neither")
    if parts.scheme == "http":
        if ca is not None or cert is not None:
            raise ValueError(f"{api!r} is plaintext: TLS files apply to an https:// address")
        return Target(parts.netloc, None)
    read = lambda p: Path(p).read_bytes() if p is not None else None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(ca), private_key=read(key), certificate_chain=read(cert)
    )
    return Target(parts.netloc, credentials)


def connect(grpc_module: ModuleType, api: str, ca: Optional[PathLike] = None,
            cert: Optional[PathLike] = None, key: Optional[PathLike] = None) -> Any:
    """A channel to ``api`` (as :func:`target` reads it) from ``grpc_module``: ``grpc`` for the
    blocking client, ``grpc.aio`` for the asyncio one, whose channel functions take the same
    arguments."""
    where = target(api, ca, cert, key)
    if where.credentials is None:
        return grpc_module.insecure_channel(where.address)
    return grpc_module.secure_channel(where.address, where.credentials)
