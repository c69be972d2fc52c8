#!/usr/bin/env bash
# Compile-checks the CUDA kernels without a GPU: installs NVRTC and ptxas (CUDA 13.0, the line
# the supported drivers ship) from the Python package registry into target/cuda-tools, then
# compiles every kernel for sm_75..sm_90 with NVRTC, assembles each with ptxas and fails on
# errors or register spills, and the same for the modules beside them (the memory walk). Then it
# disassembles each GEMM kernel (nvdisasm, from the same registry) and prints its main loop's
# instructions per iteration, MMA against the rest, and the walk's instructions per step
# (scripts/sass_main_loop.py). Run from anywhere.
#
#   scripts/kernel-check.sh              # all of it
#   scripts/kernel-check.sh --install    # only the tools
#   scripts/kernel-check.sh --sass       # only the SASS counts, of cubins already kept
#
# CI installs the tools first, has the workspace tests (which run the same compile test, with
# GPU_ATTEST_CUBIN_DIR set) keep the cubins, and counts them after: one compile, not two.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
case "$mode" in
all | --install | --sass) ;;
*) echo "usage: scripts/kernel-check.sh [--install | --sass]" >&2; exit 2 ;;
esac

tools=target/cuda-tools
cuda=$(echo "$tools"/lib/python3*/site-packages/nvidia/cu13)
if [ ! -x "$tools/bin/python" ] || [ ! -x "$cuda/bin/nvdisasm" ] || ! "$tools/bin/python" -c 'import nvidia' 2>/dev/null; then
  echo "== installing NVRTC, ptxas (CUDA 13.0) and nvdisasm into $tools" >&2
  python3 -m venv "$tools"
  # nvdisasm is not published for 13.0; any 13.x reads sm_75..sm_90a code.
  "$tools/bin/pip" install --quiet --disable-pip-version-check \
    "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-nvdisasm==13.*"
  cuda=$(echo "$tools"/lib/python3*/site-packages/nvidia/cu13)
fi
[ -e "$cuda/lib/libnvrtc.so.13" ] || { echo "libnvrtc.so.13 missing under $cuda" >&2; exit 1; }
[ -x "$cuda/bin/ptxas" ] || { echo "ptxas missing under $cuda" >&2; exit 1; }
[ "$mode" = --install ] && exit 0
cubins=target/kernel-check/cubins
if [ "$mode" = --sass ]; then
  [ -n "$(ls -A "$cubins" 2>/dev/null)" ] || {
    echo "no cubins under $cubins: run the compile test with GPU_ATTEST_CUBIN_DIR=$PWD/$cubins first" >&2
    exit 1
  }
  echo "== GEMM main loops and the walk's step: SASS instructions per iteration" >&2
  exec python3 scripts/sass_main_loop.py "$cuda/bin/nvdisasm" "$cubins"
fi

echo "== compiling the kernels with NVRTC and ptxas" >&2
rm -rf "$cubins"
LD_LIBRARY_PATH="$PWD/$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
GPU_ATTEST_PTXAS="$PWD/$cuda/bin/ptxas" GPU_ATTEST_REQUIRE_NVRTC=1 GPU_ATTEST_CUBIN_DIR="$PWD/$cubins" \
  cargo test --locked -p gpu-attest-kernels --test cuda_kernels_compile -- --nocapture

echo "== GEMM main loops and the walk's step: SASS instructions per iteration" >&2
python3 scripts/sass_main_loop.py "$cuda/bin/nvdisasm" "$cubins"
