"""A real validator daemon and real CPU miners on loopback, for the client's tests.

The binaries come from GPU_ATTEST_BIN_DIR, else the workspace's target/debug (`cargo build -p
gpu-attest-miner -p gpu-attest-validator -p gpu-attest-integration-tests --bin miner --bin
validator --bin cheating-miner`). Missing binaries fail the tests: nothing here is mocked.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("GPU_ATTEST_BIN_DIR", REPO / "target" / "debug")).resolve()


def binary(name: str) -> str:
    path = BIN_DIR / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with cargo (see tests/conftest.py), or set GPU_ATTEST_BIN_DIR")
    return str(path)


class Daemon:
    """A daemon process; stopped (SIGTERM, then SIGKILL) when the test is done with it."""

    def __init__(self, args, workdir: Path, name: str):
        self.log = open(workdir / f"{name}.log", "wb")
        self.out_path = workdir / f"{name}.out"
        self.out = open(self.out_path, "wb")
        self.process = subprocess.Popen(args, stdout=self.out, stderr=self.log, cwd=workdir)
        self.address = self._line("listening on ")

    def _line(self, prefix: str) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in self.out_path.read_text().splitlines():
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.process.args[0]} exited: {Path(self.log.name).read_text()}")
            time.sleep(0.05)
        raise RuntimeError(f"{self.process.args[0]} did not start in 60 s")

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.out.close()
        self.log.close()


def keygen(tool: str, path: Path) -> str:
    subprocess.run([binary(tool), "keygen", "--key-file", str(path)], check=True, capture_output=True)
    return subprocess.run(
        [binary(tool), "public-key", "--key-file", str(path)], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gpu-attest")


@pytest.fixture(scope="module")
def validator_key(workdir) -> str:
    return keygen("validator", workdir / "validator.key")


@pytest.fixture(scope="module")
def validator(workdir, validator_key):
    config = workdir / "validator.toml"
    config.write_text(
        f"""
listen = "127.0.0.1:0"
key_file = "{workdir / 'validator.key'}"
database = "{workdir / 'validator.db'}"
cpu_threads = 1
[challenge]
target_seconds = 1.0
[schedule]
enabled = false
"""
    )
    daemon = Daemon([binary("validator"), "serve", "--config", str(config)], workdir, "validator")
    yield daemon
    daemon.stop()


def start_miner(
    workdir: Path, name: str, validator_key: str, cheat: str = "", config: str = "", memory_mib: int = 0
) -> Daemon:
    home = workdir / name
    home.mkdir()
    keygen("miner", home / "miner.key")
    if cheat:
        args = [binary("cheating-miner"), "--cheat", cheat]
        if memory_mib:
            args += ["--memory-mib", str(memory_mib)]
    else:
        args = [binary("miner"), "serve", "--backend", "cpu", "--cpu-threads", "1"]
        if config:
            (home / "miner.toml").write_text(config)
            args += ["--config", str(home / "miner.toml")]
    args += ["--listen", "127.0.0.1:0", "--key-file", str(home / "miner.key"), "--allow-validator", validator_key]
    return Daemon(args, home, name)


@pytest.fixture(scope="module")
def honest_miner(workdir, validator_key):
    # Claiming 1 MiB: version 4's pool is its first chains' states (15 of 64 KiB at n = 256),
    # which one core computes in seconds; the default 16 MiB takes 16 times that.
    daemon = start_miner(workdir, "honest", validator_key, config="cpu_memory_mib = 1\n")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def cheating_miner(workdir, validator_key):
    daemon = start_miner(workdir, "cheater", validator_key, cheat="wrong-global-checksum", memory_mib=1)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def v4_miner(workdir, validator_key):
    """A miner that says protocol version 4 (the default, spelled out), claiming 1 MiB so that its pool's
    chains (15 states of 64 KiB, 256 steps each) run in seconds on one core."""
    config = "cpu_memory_mib = 1\n[limits]\nprotocol_4 = true\n"
    daemon = start_miner(workdir, "v4", validator_key, config=config)
    yield daemon
    daemon.stop()
