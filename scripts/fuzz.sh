#!/usr/bin/env bash
# A long hostile-input run: each proptest target in integration-tests/tests/hostile_inputs.rs
# with CASES cases (default 100000), optimised. CI runs the same targets with 256 cases each.
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${CASES:-100000}
cargo test --release --locked -q -p gpu-attest-integration-tests --test hostile_inputs --no-run
for target in arbitrary_bytes_never_panic_the_decoders arbitrary_challenges_are_refused \
              arbitrary_commitments_are_rejected mutated_openings_never_verify; do
  start=$(date +%s)
  PROPTEST_CASES=$cases cargo test --release --locked -q -p gpu-attest-integration-tests \
    --test hostile_inputs "$target" -- --exact >/dev/null
  echo "$target: $cases cases, no failure, $(( $(date +%s) - start )) s"
done
