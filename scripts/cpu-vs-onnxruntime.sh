#!/usr/bin/env bash
# The CPU engine against ONNX Runtime's exact int8 GEMM (MatMulInteger, MLAS), in one run.
#
# Installs ONNX Runtime from the Python package registry into a throwaway virtual environment
# (target/ort-venv), builds `miner` in release mode, then times ONNX Runtime's MatMulInteger and
# the engine's fused GEMM+mix step on the same n and thread count, interleaved round by round
# so that both see the same machine, and prints the ratios. Our s8 x s8 product maps onto
# MatMulInteger's u8 x s8 by biasing A by +128 with a zero point of 128, so both compute the same
# exact int32 product. On CPUs without VNNI, MLAS's u8 x s8 path adds pairs of products with the
# saturating vpmaddubsw and is not exact; the script checks, says so, and times the u8 x u8
# mapping (B biased too, zero point 128), which is.
#
#   scripts/cpu-vs-onnxruntime.sh [--sizes 256,1024,2048,4096] [--threads 2] [--rounds 5]
#                                 [--kernel auto|amx|avx512-vnni|avx-vnni|avx2|portable]
#
# Also printed: this CPU's limit, the register-only ceiling of the fastest kernel it runs
# (tdpbssd with AMX, vpdpbusd zmm with AVX-512 VNNI, ...), with each side's share of it; the AVX2
# kernel against the portable one; and the sampled verification of an n = 2048, 32-sample
# challenge.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/ort-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import onnxruntime, onnx, numpy' 2>/dev/null; then
  echo "== installing ONNX Runtime into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check onnxruntime onnx numpy
fi
echo "== building miner (release)" >&2
cargo build --release --locked -q -p gpu-attest-miner
exec "$venv/bin/python" scripts/cpu_vs_onnxruntime.py --miner target/release/miner "$@"
