#!/usr/bin/env bash
# One attestation on this machine: builds the binaries, starts a miner on a free loopback port
# (CPU backend when there is no GPU), attests it with a one-shot validator, prints the verdict.
# Exit code: the validator's (0 pass, 1 fail, 2 could not attest).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${PROFILE:-release}
flag=$([ "$profile" = release ] && echo --release || true)
# Cargo's own progress, not -q: a first build takes several minutes on two cores, and a silent
# one looks hung.
echo "== building miner and validator ($profile; the first build takes minutes)" >&2
cargo build $flag --locked -p gpu-attest-miner -p gpu-attest-validator
# Cargo's dev profile builds into target/debug.
bin=target/$([ "$profile" = dev ] && echo debug || echo "$profile")

# Keys and the verdict database persist here between runs: `validator verdicts --database
# target/demo/validator.db` lists every demo verdict.
work=target/demo
mkdir -p "$work"
miner_pid=
cleanup() {
  if [ -n "$miner_pid" ]; then kill "$miner_pid" 2>/dev/null; wait "$miner_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

[ -f "$work/miner.key" ] || "$bin/miner" keygen --key-file "$work/miner.key" >/dev/null
[ -f "$work/validator.key" ] || "$bin/validator" keygen --key-file "$work/validator.key" >/dev/null
validator_key=$("$bin/validator" public-key --key-file "$work/validator.key")

# The miner says protocol version 4 (PROTOCOL.md 20), as every miner does by default: its memory
# proof keeps the chains' own final states as the pool, so the verdict states the memory proven
# under version 4 (on a CPU: none, and it says why). A GPU miner says 4 once its version 4 walk
# has passed the self-check it runs at start.
cat >"$work/miner.toml" <<'TOML'
# Written by scripts/demo.sh: claim 4 MiB (61 states of 64 KiB whose chains run 256 steps
# each), which a CPU proves in seconds.
cpu_memory_mib = 4
TOML

echo "== starting miner" >&2
"$bin/miner" serve --config "$work/miner.toml" --listen 127.0.0.1:0 --key-file "$work/miner.key" \
  --allow-validator "$validator_key" >"$work/miner.out" 2>"$work/miner.log" &
miner_pid=$!
for _ in $(seq 100); do
  address=$(sed -n 's/^listening on //p' "$work/miner.out")
  [ -n "$address" ] && break
  kill -0 "$miner_pid" 2>/dev/null || { cat "$work/miner.log" >&2; exit 2; }
  sleep 0.1
done
[ -n "$address" ] || { echo "miner did not start" >&2; cat "$work/miner.log" >&2; exit 2; }

# The validator learns each hardware class's rate from passing verdicts, by default only from
# registered miners and only once three distinct ones have passed. The demo has one miner,
# attested without registering it, so it lets that one calibrate:
# the first run is timed by the shipped table (first contact, a wide slack), every later run by
# the rate the earlier runs proved (the tight slack).
cat >"$work/validator.toml" <<'TOML'
# Written by scripts/demo.sh: one unregistered miner may calibrate its class (the defaults ask
# for 3 registered ones).
[calibration]
min_miners = 1
registered_only = false
TOML

echo "== attesting miner at $address" >&2
status=0
"$bin/validator" attest --miner "http://$address" --config "$work/validator.toml" \
  --key-file "$work/validator.key" --database "$work/validator.db" \
  --target-seconds "${TARGET_SECONDS:-5}" "$@" || status=$?
echo "== run it again: the deadline then comes from the rate this run proved (calibrated)" >&2
exit $status
