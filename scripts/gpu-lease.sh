#!/usr/bin/env bash
# One short GPU lease, one command: what a lent GPU host must measure first (the open GPU issue's
# run 1 and as much of run 2 as fits), in about 9 minutes of device time, with the binaries that
# scripts/gpu-bundle.sh built beside this script.
#   1. the NVIDIA device nodes and their names in /proc/devices (the miner unit's DeviceAllow=
#      names them: char-nvidia, char-nvidia-uvm, char-nvidia-caps);
#   2. gpu-check.sh, the steps that decide the defaults: self-check, GPU tests (the new kernels
#      in processes of their own), kernel compile, bench with the version 4 walk over most of the
#      GPU's memory, the kernel choice, device evidence, one version 4 attestation on `auto`, one
#      with the locality walk on the GPUs (its transcript kept, exported and audited), and a
#      two-slot attestation (RUN1_SECONDS in all, default 360). Each TMA kernel's own
#      attestation (`attestation-kernels`, about 2 minutes) is left out: two leases measured it;
#   3. where the lease's clock allows, the locality probe (probes/locality_probe.cu, compiled
#      here by the host's nvcc): `t_l` and `Delta_host` over a 16 GiB buffer, then the local
#      walks over PROBE_BIG_GIB (default 128), the span of a pool's states, to see whether the
#      page walks cost the step;
#   4. gpu-spread.sh with protocol version 4 and its memory phase on (SPREAD_RUNS, default 20,
#      at TARGET_SECONDS_SPREAD, default 5), in what is left of the lease's own clock under
#      SPREAD_UNTIL seconds (default 560), where a minute or more is.
# Worst case: run 1 370 s, the probe 60 + 45 + 45 s only while the clock allows, the spread to
# 560 s plus 10 s to stop, then the bundle: under the device's 595 s.
# Every log is packed into $OUT/gpu-lease.tar.gz (a lease returns a few files, not folders), and
# the summaries are printed. Exit status: gpu-check's, or the spread's where it alone failed.
#   usage: gpu-lease.sh [BIN_DIR]      (default: the folder this script is in)
set -uo pipefail
bin=$(cd "${1:-$(dirname "$0")}" && pwd)
final=${OUT:-target/gpu-lease}
mkdir -p "$final"
final=$(cd "$final" && pwd)
logs=$(mktemp -d)

echo "== NVIDIA device nodes"
{ ls -l /dev/nvidia* 2>&1; grep -i nvidia /proc/devices; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,power.limit,driver_version --format=csv; } |
  tee "$logs/device-nodes.log"

echo "== gpu-check (run 1)"
OUT="$logs/check" STEP_TIMEOUT=${STEP_TIMEOUT:-120} BENCH_SECONDS=${BENCH_SECONDS:-1} \
  TARGET_SECONDS=${TARGET_SECONDS:-5} HOST_CPU_SWEEP_ROUNDS=0 FILL_WEIGHTS=0 \
  STEPS=${STEPS:-"selftest gpu-tests kernel-compile bench memory-walk device-evidence kernel-choice attestation-v4 attestation-locality attestation-two-slots"} \
  timeout --kill-after=10 "${RUN1_SECONDS:-360}" "$bin/gpu-check.sh" "$bin"
check_status=$?

echo "== locality probe (t_l and Delta_host; docs/design/locality.md)"
# Each part only where the lease's own clock leaves room for it and the log bundle after it.
if [ "$SECONDS" -lt 470 ] && command -v nvcc >/dev/null && [ -f "$bin/locality_probe.cu" ]; then
  mkdir -p "$logs/locality"
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
  if timeout 60 nvcc -O3 -arch="sm_${cc:-90}" -o "$logs/locality/locality-probe" "$bin/locality_probe.cu" \
       >"$logs/locality/build.log" 2>&1; then
    timeout --kill-after=5 40 "$logs/locality/locality-probe" 16 4 200000 2>&1 | tee "$logs/locality/probe.log"
    if [ "$SECONDS" -lt 500 ]; then
      echo "-- the same over ${PROBE_BIG_GIB:-128} GiB"
      timeout --kill-after=5 40 "$logs/locality/locality-probe" "${PROBE_BIG_GIB:-128}" 4 200000 2>&1 |
        tee "$logs/locality/probe-big.log"
    fi
  else
    echo "the probe did not build:"; cat "$logs/locality/build.log"
  fi
else
  echo "skipped: $SECONDS s used, or no nvcc on this host"
fi

echo "== gpu-spread, protocol version 4 with its memory phase (run 2)"
# The spread gets what is left under SPREAD_UNTIL, and none where under a minute is (one
# version 4 attestation takes about 26 s on an H200).
spread_seconds=$((${SPREAD_UNTIL:-560} - SECONDS))
if [ "$spread_seconds" -ge 60 ]; then
  OUT="$logs/spread" MEMORY=true TARGET_SECONDS=${TARGET_SECONDS_SPREAD:-5} \
    timeout --kill-after=10 "$spread_seconds" "$bin/gpu-spread.sh" "${SPREAD_RUNS:-20}" "$bin"
  spread_status=$?
else
  echo "skipped: $SECONDS s used"
  spread_status=0
fi
# A spread cut short by its time limit still reports what it measured.
if [ "$spread_status" -eq 124 ] && [ -s "$logs/spread/verdicts.json" ] && [ ! -s "$logs/spread/spread.txt" ]; then
  echo "(the spread ran out of time: its summary is computed by the host from verdicts.json)"
fi

tar -C "$logs" --exclude=kernel-cache -czf "$final/gpu-lease.tar.gz" .
cp "$logs/check/report.txt" "$final/report.txt" 2>/dev/null
rm -rf "$logs"
echo "== gpu-lease: check status $check_status, spread status $spread_status; logs in $final/gpu-lease.tar.gz"
[ "$check_status" -ne 0 ] && exit "$check_status"
exit "$spread_status"
