#!/usr/bin/env bash
# A long hostile-input run: each proptest target in integration-tests/tests/integration/hostile_inputs.rs
# with CASES cases (default 100000), optimised. Random inputs, not coverage-guided: the
# coverage-guided fuzz targets are scripts/fuzz.sh. CI runs the same targets with 256 cases each.
# The test binary is built once and run directly, so editing sources meanwhile changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${CASES:-100000}
binary=$(cargo test --release --locked -p gpu-attest-integration-tests --test integration --no-run 2>&1 |
  sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
[ -x "$binary" ] || { echo "could not build the integration test binary" >&2; exit 2; }
for target in arbitrary_bytes_never_panic_the_decoders arbitrary_challenges_are_refused \
              arbitrary_commitments_are_rejected mutated_openings_never_verify \
              arbitrary_walk_openings_are_rejected; do
  start=$(date +%s)
  # A name that matches nothing runs nothing and still exits 0: insist on the one test.
  PROPTEST_CASES=$cases "$binary" --exact "hostile_inputs::$target" -q | grep -q " 1 passed" ||
    { echo "$target: did not run and pass" >&2; exit 1; }
  echo "$target: $cases cases, no failure, $(( $(date +%s) - start )) s"
done
