#!/usr/bin/env bash
# The soak: two validators with their schedulers, one on SQLite and one on PostgreSQL, attest the
# same 20 CPU miners on loopback for MINUTES (60 by default), then stop everything and report.
#
#   scripts/soak.sh [MINUTES]        # PROFILE=dev to use the test build; SOAK_DIR: where it works
#
# The miners (each computes on one thread, so that two attestations at once fit two cores):
# - 12 honest miners, the real `miner` binary;
# - 1 honest miner that is stopped and started again every RESTART_SECS (180 by default);
# - 7 cheaters (the `cheating-miner` binary): half the chains skipped, a wrong global checksum,
#   checkpoints changed after committing, another miner's key, forged opening signatures, a
#   commitment naming hardware it does not have, and one that states two cores while computing
#   on one (half the compute it claims).
#
# Every SAMPLE_SECS (30 by default) it samples the RSS and open descriptors of every daemon, both
# databases' size and their verdict counts. At the end `soak_report.py` writes the totals
# (report.txt) and the curves (soak.png) and checks what must hold: no growth past warm-up, one
# verdict for every attestation the validators ran, no cheater stored as PASS, no honest miner
# stored as FAIL. Exit code: 0 when all of it holds, 1 when any does not, 2 when it could not run.
#
# Everything listens on 127.0.0.1 only, and everything stops by itself after MINUTES.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${1:-60}
case "$minutes" in '' | *[!0-9]*) echo "usage: soak.sh [MINUTES]" >&2; exit 2 ;; esac
[ "$minutes" -ge 1 ] || { echo "soak.sh: at least 1 minute" >&2; exit 2; }
sample_secs=${SAMPLE_SECS:-30}
restart_secs=${RESTART_SECS:-180}
profile=${PROFILE:-release}
work=${SOAK_DIR:-target/soak}

echo "== building the daemons and the cheating miner ($profile)" >&2
if [ "$profile" = dev ]; then
    # The test build (scripts/test-python-client.sh says why): in CI, already built.
    cargo test --workspace --locked --no-run -q
else
    cargo build --profile "$profile" --locked -q -p gpu-attest-miner -p gpu-attest-validator \
        -p gpu-attest-integration-tests --bin miner --bin validator --bin cheating-miner
fi
bin=target/$([ "$profile" = dev ] && echo debug || echo "$profile")

rm -rf "$work"
mkdir -p "$work/miners" "$work/validators"
work=$(cd "$work" && pwd)

pids=()
postgres_dir=
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -n "$postgres_dir" ]; then scripts/test-postgres.sh stop "$postgres_dir" || true; fi
}
trap cleanup EXIT
trap 'exit 2' INT TERM

# Waits for a daemon's `listening on` line and prints the address.
address_of() {
    local out=$1 pid=$2
    for _ in $(seq 300); do
        local address
        address=$(sed -n 's/^listening on //p' "$out" | head -n 1)
        if [ -n "$address" ]; then echo "$address"; return; fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "soak.sh: a daemon did not start ($out):" >&2
    cat "${out%.out}.log" >&2 || true
    exit 2
}

echo "== PostgreSQL (throwaway, loopback)" >&2
postgres_dir="$work/postgres"
admin_url=$(GPU_ATTEST_TEST_POSTGRES_PORT=${SOAK_POSTGRES_PORT:-55442} scripts/test-postgres.sh start "$postgres_dir")
psql -q "$admin_url" -c "CREATE DATABASE soak"
postgres_url="${admin_url%/*}/soak"

# Two validators, each with its own key and database.
validator_keys=()
for db in sqlite postgres; do
    "$bin/validator" keygen --key-file "$work/validators/$db.key" >/dev/null
    validator_keys+=("$("$bin/validator" public-key --key-file "$work/validators/$db.key")")
done
allow=()
for key in "${validator_keys[@]}"; do allow+=(--allow-validator "$key"); done

# name -> how it runs; `restarting` is the honest miner that restarts.
declare -A kind
for i in $(seq -w 1 12); do kind[honest-$i]=honest; done
kind[restarting]=honest
for cheat in skip-chains wrong-global-checksum leaf-changed-after-commit foreign-key \
    bad-opening-signatures commits-other-hardware; do
    kind[cheat-$cheat]="--cheat $cheat"
done
# Claims three cores and computes on one. (A miner claiming two, at half its claim, sits 12%
# under the calibrated CPU slack's floor of 1 / 1.75 = 0.57: on two cores shared by 20 miners and
# two validators, the noise of a 2-minute soak passed it once. The slack's precision is what
# integration-tests/benches/deadline_slack.rs measures; the soak asks that a clear shortfall never
# passes, hour after hour.)
kind[cheat-third-compute]="--claim-cores 3"

declare -A miner_pid miner_address
start_miner() {
    local name=$1 listen=${2:-127.0.0.1:0} dir="$work/miners/$1"
    mkdir -p "$dir"
    # Every miner claims 4 MiB: version 4's pool is its first chains' states (61 of 64 KiB at
    # n = 256), as much work as version 3's fill of the default 16 MiB was.
    if [ "${kind[$name]}" = honest ]; then
        [ -f "$dir/miner.key" ] || "$bin/miner" keygen --key-file "$dir/miner.key" >/dev/null
        printf 'cpu_memory_mib = 4\n' >"$dir/miner.toml"
        "$bin/miner" serve --config "$dir/miner.toml" --backend cpu --cpu-threads 1 --listen "$listen" \
            --key-file "$dir/miner.key" "${allow[@]}" >>"$dir/miner.out" 2>>"$dir/miner.log" &
    else
        [ -f "$dir/miner.key" ] || "$bin/miner" keygen --key-file "$dir/miner.key" >/dev/null
        # shellcheck disable=SC2086 # the kind is the cheat's flags
        "$bin/cheating-miner" ${kind[$name]} --threads 1 --memory-mib 4 --listen "$listen" \
            --key-file "$dir/miner.key" "${allow[@]}" >>"$dir/miner.out" 2>>"$dir/miner.log" &
    fi
    miner_pid[$name]=$!
    pids+=($!)
}

echo "== 20 miners" >&2
names=$(printf '%s\n' "${!kind[@]}" | sort)
for name in $names; do start_miner "$name"; done
for name in $names; do
    miner_address[$name]=$(address_of "$work/miners/$name/miner.out" "${miner_pid[$name]}")
    echo "$name ${miner_address[$name]} $([ "${kind[$name]}" = honest ] && echo honest || echo cheat)"
done >"$work/miners.txt"

echo "== two validators" >&2
declare -A validator_pid validator_api validator_metrics
for db in sqlite postgres; do
    database="$work/validators/validator.db"
    [ "$db" = postgres ] && database=$postgres_url
    cat >"$work/validators/$db.toml" <<TOML
# Written by scripts/soak.sh.
listen = "127.0.0.1:0"
key_file = "$work/validators/$db.key"
database = "$database"
# Verification on one thread: two validators and two one-thread miners fill the two cores.
cpu_threads = 1

# Short challenges, so that an hour holds many attestations of every miner.
[challenge]
target_seconds = 3.0

[schedule]
interval_secs = 120
concurrency = 1
backoff_initial_secs = 10
backoff_max_secs = 60

# Two validators, each verifying on a core, and the miners they attest share two cores: an
# honest walk can run at a third of the rate its class learned while the other validator
# verifies, and a calibrated walk slack of 1.5 then stores an honest miner as late-walk (a CI
# run saw it once). The soak judges stability, not timing: the walk gets room for the sharing,
# at first contact as once calibrated (a calibrated slack may not exceed the first-contact one).
[memory]
slack = 3.0
cpu_slack = 3.0
first_contact_slack = 3.0

[metrics]
listen = "127.0.0.1:0"
TOML
    "$bin/validator" serve --config "$work/validators/$db.toml" \
        >"$work/validators/$db.out" 2>"$work/validators/$db.log" &
    validator_pid[$db]=$!
    pids+=($!)
    validator_api[$db]=$(address_of "$work/validators/$db.out" "${validator_pid[$db]}")
    for _ in $(seq 100); do
        validator_metrics[$db]=$(sed -n 's/^metrics on //p' "$work/validators/$db.out" | head -n 1)
        [ -n "${validator_metrics[$db]}" ] && break
        sleep 0.1
    done
    for name in $names; do
        "$bin/validator" miners --api "http://${validator_api[$db]}" add "http://${miner_address[$name]}" \
            --name "$name" >/dev/null
    done
done

echo "== soaking for $minutes minutes (samples every ${sample_secs}s in $work/samples.csv)" >&2
# One row per daemon per sample: seconds since start, daemon, role, RSS in KiB, descriptors, and
# the anonymous part of the RSS in KiB (what the daemon allocated, without its own code paged in).
# One row per database: seconds, database, "db", its size in bytes, verdicts stored.
echo "seconds,daemon,role,rss_kib,fds,rss_anon_kib" >"$work/samples.csv"
echo "seconds,database,bytes,verdicts" >"$work/databases.csv"
# Sampling never stops the soak: a figure that cannot be read is written as 0.
# "RSS,descriptors,anonymous RSS" of one process, in KiB.
memory_and_fds() {
    local pid=$1 rss anon
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    anon=$(awk '/^RssAnon/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    echo "${rss:-0},$(ls "/proc/$pid/fd" 2>/dev/null | wc -l),${anon:-0}"
}
sample() {
    local t=$1 name pid
    for db in sqlite postgres; do
        pid=${validator_pid[$db]}
        echo "$t,validator-$db,validator,$(memory_and_fds "$pid")"
    done >>"$work/samples.csv"
    for name in $names; do
        pid=${miner_pid[$name]}
        echo "$t,$name,miner,$(memory_and_fds "$pid")"
    done >>"$work/samples.csv"
    local sqlite_bytes=0 postgres_bytes
    for file in "$work/validators/validator.db" "$work/validators/validator.db-wal"; do
        if [ -f "$file" ]; then sqlite_bytes=$((sqlite_bytes + $(stat -c %s "$file" 2>/dev/null || echo 0))); fi
    done
    postgres_bytes=$(psql -tA "$admin_url" -c "SELECT pg_database_size('soak')" 2>/dev/null || echo 0)
    echo "$t,sqlite,$sqlite_bytes,$(verdicts_counted sqlite)" >>"$work/databases.csv"
    echo "$t,postgres,$postgres_bytes,$(verdicts_counted postgres)" >>"$work/databases.csv"
}
verdicts_counted() {
    { curl -sf "${validator_metrics[$1]}" || true; } \
        | awk '/^gpu_attest_validator_attestations_total\{/ && /outcome="(pass|fail)"/ {n += $NF} END {print n + 0}'
}

start=$(date +%s)
end=$((start + minutes * 60))
next_restart=$((start + restart_secs))
restarts=0
while :; do
    now=$(date +%s)
    [ "$now" -lt "$end" ] || break
    sample $((now - start))
    if [ "$now" -ge "$next_restart" ]; then
        kill "${miner_pid[restarting]}" 2>/dev/null || true
        wait "${miner_pid[restarting]}" 2>/dev/null || true
        start_miner restarting "${miner_address[restarting]}"
        restarts=$((restarts + 1))
        next_restart=$((now + restart_secs))
    fi
    for db in sqlite postgres; do
        kill -0 "${validator_pid[$db]}" 2>/dev/null || { echo "soak.sh: the $db validator died" >&2; tail -n 20 "$work/validators/$db.log" >&2; exit 1; }
    done
    sleep $(( sample_secs < end - now ? sample_secs : (end - now > 0 ? end - now : 1) ))
done
sample $(( $(date +%s) - start ))

echo "== stopping; the validators' counters first" >&2
for db in sqlite postgres; do
    curl -sf "${validator_metrics[$db]}" >"$work/validators/$db.metrics" || true
done
for db in sqlite postgres; do kill "${validator_pid[$db]}" 2>/dev/null || true; done
for db in sqlite postgres; do wait "${validator_pid[$db]}" 2>/dev/null || true; done
for db in sqlite postgres; do
    database="$work/validators/validator.db"
    [ "$db" = postgres ] && database=$postgres_url
    "$bin/validator" verdicts --database "$database" --json --limit 1000000 >"$work/validators/$db.verdicts.json"
done
echo "$restarts" >"$work/restarts.txt"

echo "== report" >&2
venv=target/soak-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'matplotlib>=3.7,<4'
fi
"$venv/bin/python" scripts/soak_report.py "$work" "$minutes"
