#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a GPU host that has no Rust toolchain: the release
# miner and validator, the GPU test binaries and the CPU kernels' oracle test, copied into one
# folder (default .device-bin/,
# git-ignored) together with gpu-check.sh itself.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.device-bin}
mkdir -p "$dest"

echo "== building release binaries" >&2
cargo build --release --locked -q -p gpu-attest-miner -p gpu-attest-validator
cp target/release/miner target/release/validator "$dest/"

echo "== building the GPU test binaries" >&2
cargo test --release --locked -q -p gpu-attest-kernels -p gpu-attest-shared --test cuda_backend --test cuda_fault_recovery \
  --test cuda_kernels_compile --test gemm_oracle \
  --no-run --message-format=json |
  python3 -c '
import json, shutil, sys
names = {"cuda_backend": "gpu-tests", "cuda_fault_recovery": "gpu-fault-tests",
         "cuda_kernels_compile": "kernel-compile-tests", "gemm_oracle": "cpu-oracle-tests"}
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] in names:
        shutil.copy(msg["executable"], sys.argv[1] + "/" + names[msg["target"]["name"]])
' "$dest"
cp scripts/gpu-check.sh scripts/gpu-spread.sh scripts/gpu-lease.sh scripts/miner_up.sh scripts/cpu_vs_onnxruntime.py scripts/cpu_amx_sweep.py \
  scripts/probes/locality_probe.cu "$dest/"
# Without debug info the folder is about 20 MiB instead of 160, small enough to copy to a GPU host.
if command -v strip >/dev/null; then
  strip "$dest/miner" "$dest/validator" "$dest/gpu-tests" "$dest/gpu-fault-tests" "$dest/kernel-compile-tests" \
    "$dest/cpu-oracle-tests"
else
  echo "strip not found: the binaries keep their debug info" >&2
fi
ls -l "$dest" >&2
