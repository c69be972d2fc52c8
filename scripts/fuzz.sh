#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo fuzz, libFuzzer) of every hostile-input entry point in
# integration-tests/src/hostile.rs: wire messages, commitments, chain and walk openings,
# inventories, device evidence, key files, both config files and the rate file.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Each target runs for SECONDS_PER_TARGET (default 60), starting from the committed corpus
# fuzz/corpus/TARGET, which it only reads; what the run finds goes to a scratch corpus, kept
# under FUZZ_KEEP=DIR when set (to minimise into the committed corpus with `cargo fuzz cmin`).
# FUZZ_JOBS=N runs N targets at once (default 1). FUZZ_OPT_LEVEL=1 builds at opt-level 1 in
# place of 3, for CI's brief runs: 10.7 rather than 13.3 minutes of build on two cores, at a
# third to three quarters of the runs a second (an unoptimised build halves the build but ran
# some targets at 20 inputs a second, too few to read their corpus). A long run keeps the
# default. FUZZ_BUILD_ONLY=1 builds the targets and stops (CI builds them in the background while
# other steps wait on timers; the later run then finds them built). An input slower than 10 s, or
# one using more than 2 GiB, counts as a crash.
#
# A crash stops the script with the input under fuzz/artifacts/TARGET/. Copy it into
# fuzz/regressions/TARGET/, where `cargo test` replays it (integration-tests/tests/integration/fuzz_corpus.rs),
# and fix the cause. CI runs every target briefly; SECURITY.md records a long run.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^gpu-attest-fuzz$')
fi
jobs=${FUZZ_JOBS:-1}

# cargo fuzz itself, pinned, in the build directory: a fresh machine needs nothing else.
cargo_fuzz_version=0.13.2
tools="$PWD/target/tools"
if ! "$tools/bin/cargo-fuzz" --version 2>/dev/null | grep -q " $cargo_fuzz_version\$"; then
  echo "== installing cargo-fuzz $cargo_fuzz_version"
  cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked --root "$tools" --quiet
fi
export PATH="$tools/bin:$PATH"
# cargo fuzz passes rustc the sanitizer and coverage flags that only a nightly compiler takes
# unasked; the stable toolchain, the only one the project needs, takes them when told so.
export RUSTC_BOOTSTRAP=1

# Optimised, with debug assertions and overflow checks on, under AddressSanitizer: the shared
# crate's aligned buffers are unsafe code, and an overflow is a finding, not a wrap.
build_flags=(--release --debug-assertions --sanitizer address)
case "${FUZZ_OPT_LEVEL:-3}" in
1 | 2 | 3) export CARGO_PROFILE_RELEASE_OPT_LEVEL=${FUZZ_OPT_LEVEL:-3} ;;
*) echo "FUZZ_OPT_LEVEL must be 1, 2 or 3, not $FUZZ_OPT_LEVEL" >&2; exit 2 ;;
esac
# Built once, then run directly: `cargo fuzz run` would rebuild from the working tree before
# each target, so a long run would test whatever the tree held when each target started.
echo "== building the fuzz targets"
cargo fuzz build "${build_flags[@]}" 2>&1 | { grep -v '^ *Compiling ' || true; }
built="$PWD/fuzz/target/x86_64-unknown-linux-gnu/release"
for target in "${targets[@]}"; do
  [ -x "$built/$target" ] || {
    echo "fuzz target $target did not build" >&2
    exit 2
  }
done
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
  echo "== built: ${targets[*]}"
  exit 0
fi
# What cargo fuzz sets for ASan runs: the Rust runtime and libFuzzer define some globals twice.
export ASAN_OPTIONS="detect_odr_violation=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

scratch=${FUZZ_KEEP:-$(mktemp -d /tmp/gpu-attest-fuzz.XXXXXX)}
logs="$scratch/logs"
mkdir -p "$logs"

run_one() {
  local target=$1
  mkdir -p "$scratch/$target" "fuzz/corpus/$target" "fuzz/artifacts/$target"
  if "$built/$target" -artifact_prefix="fuzz/artifacts/$target/" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "$scratch/$target" "fuzz/corpus/$target" >"$logs/$target.log" 2>&1; then
    local reached execs edges
    # libFuzzer's last line, "#N<tab>DONE cov: C ft: F corp: K/S ...": edges covered, features,
    # corpus entries.
    reached=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$logs/$target.log" | tail -n 1 |
      grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' || echo "coverage not reported")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$target.log")
    # The edges instrumented in this target's binary, which "cov" counts against.
    edges=$(sed -n 's/.*(\([0-9]*\) inline 8-bit counters).*/\1/p' "$logs/$target.log" | head -n 1)
    echo "$target: ${seconds} s, ${execs:-?} runs, 0 crashes, $reached (of ${edges:-?} edges instrumented)"
  else
    echo "$target: CRASH (log: $logs/$target.log; input under fuzz/artifacts/$target/)" >&2
    tail -n 40 "$logs/$target.log" >&2
    return 1
  fi
}

echo "== fuzzing, $seconds s per target, $jobs at a time"
failed=0
running=0
for target in "${targets[@]}"; do
  run_one "$target" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
[ -n "${FUZZ_KEEP:-}" ] || rm -rf "$scratch"
exit "$failed"
