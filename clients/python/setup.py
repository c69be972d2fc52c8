"""Generates the gRPC stubs from the repository's proto/ at build time.

The stubs are never edited or committed: `gpu_attest/v1/*_pb2*.py` are written into the build
directory from `../../proto` (the same files the daemons are built from), so the client always
speaks the protocol of the source tree it was built from.
"""

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTOS = ["gpu_attest/v1/common.proto", "gpu_attest/v1/miner.proto", "gpu_attest/v1/validator.proto"]


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        self.generate(Path(self.build_lib))

    def generate(self, out: Path):
        from grpc_tools import protoc

        missing = [p for p in PROTOS if not (PROTO_ROOT / p).is_file()]
        if missing:
            raise SystemExit(
                f"gpu-attest-client is built from the gpu-attest source tree: {missing} not found "
                f"under {PROTO_ROOT}"
            )
        include = Path(protoc.__file__).resolve().parent / "_proto"
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *PROTOS,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc could not generate the gRPC stubs")
        for package in (out / "gpu_attest", out / "gpu_attest" / "v1"):
            (package / "__init__.py").touch()
        (out / "gpu_attest" / "py.typed").touch()


setup(cmdclass={"build_py": BuildWithStubs})
