"""The client over mutual TLS with the certificates `validator tls-certs` makes, and verdict
followers (sync and asyncio) that lose nothing: across a validator restart, and for a verdict
stored before the watch opened."""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import Daemon, binary
from gpu_attest_client import AsyncClient, Client, Unavailable, Unimplemented


def start_validator(workdir: Path, name: str, listen: str = "127.0.0.1:0", extra: str = "") -> Daemon:
    home = workdir / name
    home.mkdir(exist_ok=True)
    config = home / "validator.toml"
    config.write_text(
        f"""
listen = "{listen}"
key_file = "{workdir / 'validator.key'}"
database = "{home / 'validator.db'}"
cpu_threads = 1
[challenge]
target_seconds = 1.0
[schedule]
enabled = false
{extra}
"""
    )
    return Daemon([binary("validator"), "serve", "--config", str(config)], home, name)


def port(daemon: Daemon) -> str:
    return daemon.address.rsplit(":", 1)[1]


def test_a_tls_mismatch_or_a_miners_port_says_what_to_do(workdir, validator_key, honest_miner):
    """gRPC's own words ("Socket closed", a handshake error, UNIMPLEMENTED with no message) do
    not say what is wrong; the client's errors do."""
    pki = workdir / "mismatch-pki"
    subprocess.run(
        [binary("validator"), "tls-certs", "--out", str(pki), "--validator-host", "localhost"],
        check=True,
        capture_output=True,
    )
    tls = f'[tls]\ncert = "{pki / "validator.pem"}"\nkey = "{pki / "validator.key"}"\nca = "{pki / "ca.pem"}"\n'
    with_tls = start_validator(workdir, "mismatch-tls", extra=tls)
    without = start_validator(workdir, "mismatch-plain")
    try:
        with Client(f"http://{with_tls.address}", timeout=10) as client:
            with pytest.raises(Unavailable) as plain_to_tls:
                client.list_miners()
        assert "use https:// with ca=" in plain_to_tls.value.message, plain_to_tls.value.message
        with Client(f"https://localhost:{port(without)}", ca=pki / "ca.pem", timeout=10) as client:
            with pytest.raises(Unavailable) as tls_to_plain:
                client.list_miners()
        assert "TLS handshake" in tls_to_plain.value.message and "use http://" in tls_to_plain.value.message
    finally:
        with_tls.stop()
        without.stop()
    # A miner's port is not a validator's API.
    with Client(honest_miner.url, timeout=10) as client:
        with pytest.raises(Unimplemented) as not_a_validator:
            client.list_miners()
    assert "not a validator's API" in not_a_validator.value.message


def test_mutual_tls_with_the_certificates_tls_certs_makes(workdir, validator_key):
    pki = workdir / "pki"
    subprocess.run(
        [binary("validator"), "tls-certs", "--out", str(pki), "--validator-host", "localhost",
         "--miner-host", "localhost"],
        check=True,
        capture_output=True,
    )
    tls = f'[tls]\ncert = "{pki / "validator.pem"}"\nkey = "{pki / "validator.key"}"\nca = "{pki / "ca.pem"}"\n'
    daemon = start_validator(workdir, "tls-validator", extra=tls)
    try:
        api = f"https://localhost:{port(daemon)}"
        files = dict(ca=pki / "ca.pem", cert=pki / "operator.pem", key=pki / "operator.key")
        with Client(api, **files) as client:
            assert client.list_miners() == []

        async def listed():
            async with AsyncClient(api, **files) as client:
                return await client.list_miners()

        assert asyncio.run(listed()) == []
        # The API requires the operator's certificate: without it the handshake fails.
        with Client(api, ca=pki / "ca.pem", timeout=10) as client:
            with pytest.raises(Unavailable):
                client.list_miners()
        # An operator certificate of another CA's making is refused by the validator, though
        # the client trusts the validator's own certificate.
        other = workdir / "other-pki"
        subprocess.run(
            [binary("validator"), "tls-certs", "--out", str(other), "--validator-host", "localhost"],
            check=True,
            capture_output=True,
        )
        with Client(api, ca=pki / "ca.pem", cert=other / "operator.pem", key=other / "operator.key",
                    timeout=10) as client:
            with pytest.raises(Unavailable):
                client.list_miners()
    finally:
        daemon.stop()


def free_port_outside_the_ephemeral_range() -> int:
    """A port the restarted validator binds again: below Linux's ephemeral range (32768 and up),
    so that the follower's own redials can never be given it as their source port."""
    for candidate in random.sample(range(20000, 32000), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return candidate
    raise RuntimeError("no free port in 20000..32000")


def test_following_verdicts_loses_nothing_across_a_validator_restart(workdir, validator_key, honest_miner):
    address = f"127.0.0.1:{free_port_outside_the_ephemeral_range()}"
    first = start_validator(workdir, "restarting", listen=address)
    api = f"http://{address}"
    with Client(api) as client:
        before = client.attest(honest_miner.url)
    seen = []

    def follow():
        with Client(api) as client:
            for verdict in client.follow_verdicts(after_id=0, retry_seconds=0.2):
                seen.append(verdict.id)
                if len(seen) == 3:
                    return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    deadline = time.monotonic() + 30
    while seen != [before.id]:
        assert time.monotonic() < deadline, f"the stored verdict was not replayed: {seen}"
        time.sleep(0.05)
    first.stop()
    # The same database and address: the follower comes back by itself.
    second = start_validator(workdir, "restarting", listen=address)
    try:
        with Client(api) as client:
            later = [client.attest(honest_miner.url).id for _ in range(2)]
        follower.join(timeout=60)
        assert seen == [before.id] + later
    finally:
        second.stop()


def test_following_from_now_misses_nothing_stored_while_it_reconnects(workdir, validator_key, honest_miner):
    """Without after_id, the follower starts after the newest verdict when it is called: a
    restart before its first verdict, and a verdict stored while it reconnects, lose nothing."""
    address = f"127.0.0.1:{free_port_outside_the_ephemeral_range()}"
    first = start_validator(workdir, "from-now", listen=address)
    api = f"http://{address}"
    with Client(api) as client:
        old = client.attest(honest_miner.url).id
    seen = []
    started = threading.Event()

    def follow():
        with Client(api) as client:
            verdicts = client.follow_verdicts(retry_seconds=0.2)
            started.set()
            for verdict in verdicts:
                seen.append(verdict.id)
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert started.wait(30)
    time.sleep(1.0)  # the follower is watching, with no verdict yet
    first.stop()
    second = start_validator(workdir, "from-now", listen=address)
    try:
        # Stored while the follower may still be reconnecting.
        with Client(api) as client:
            new = client.attest(honest_miner.url).id
        follower.join(timeout=60)
        assert seen == [new], f"followed {seen}; stored {old} before and {new} after the restart"
    finally:
        second.stop()


def test_the_asyncio_follower_gets_a_verdict_stored_before_it_opened(validator, honest_miner):
    async def run():
        async with AsyncClient(validator.url) as client:
            newest = [v async for v in client.list_verdicts(limit=1)]
            after = newest[0].id if newest else 0
            verdict = await client.attest(honest_miner.url)
            followed = client.follow_verdicts(after_id=after)
            got = await asyncio.wait_for(followed.__anext__(), 60)
            await followed.aclose()
            return verdict.id, got.id

    stored, followed = asyncio.run(run())
    assert followed == stored
