#!/usr/bin/env bash
# The operator's path from the Debian package to a verdict, on this machine: install the .deb,
# make the TLS files with `validator tls-certs`, start both daemons from the installed units as
# those units start them (their own unprivileged user, the TLS key handed over as a credential,
# their state directories), let the validator's schedule attest the miner over mutual TLS, then
# purge the package and check that nothing it installed is left. Needs root.
#
#   scripts/deb-lifecycle.sh [DEB]     # default: the newest target/debian/gpu-attest_*.deb
#
# The fallback of scripts/deb-systemd.sh, which boots systemd in a container and is what CI
# runs: this one needs neither, and runs on the host itself. With systemd as PID 1 the units are
# started with systemctl. Without it (a container, most CI machines) this script starts each
# unit's ExecStartPre and ExecStart itself, under a user of its own with the unit's
# StateDirectory, CacheDirectory, Environment and LoadCredential, and says so: that checks the
# files, the binaries, the users' access and the credentials, not systemd's own handling of the
# units (their hardening, Restart=, the journal), which only scripts/deb-systemd.sh shows.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "deb-lifecycle.sh installs a package and starts services: run it as root" >&2; exit 2; }
deb=${1:-$(ls -t target/debian/gpu-attest_*.deb 2>/dev/null | head -1)}
[ -f "$deb" ] || { echo "no package: build one with scripts/package-deb.sh, or name it" >&2; exit 2; }
units_dir=/lib/systemd/system
work=$(mktemp -d /tmp/gpu-attest-lifecycle.XXXXXX)
pids=()
cleanup() {
    if [ -d /run/systemd/system ]; then systemctl stop gpu-attest-miner gpu-attest-validator 2>/dev/null || true; fi
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    dpkg --purge gpu-attest >/dev/null 2>&1 || true
    rm -rf /etc/gpu-attest /run/credentials/gpu-attest-miner.service /run/credentials/gpu-attest-validator.service \
        /var/lib/gpu-attest-miner /var/lib/gpu-attest-validator /var/cache/gpu-attest-miner /var/cache/gpu-attest-validator
    # The daemons' logs were printed where a step failed; the keys must not outlive the run.
    rm -rf "$work"
}
trap cleanup EXIT

echo "== installing $deb" >&2
dpkg -i "$deb" >/dev/null
installed=$(dpkg -L gpu-attest)

echo "== TLS files from validator tls-certs, as the example configs name them" >&2
mkdir -p /etc/gpu-attest/tls
gpu-attest-validator tls-certs --out "$work/pki" --validator-host localhost --miner-host localhost >/dev/null
cp "$work/pki/ca.pem" /etc/gpu-attest/tls/ca.pem
cp "$work/pki/validator.pem" /etc/gpu-attest/tls/validator.pem
cp "$work/pki/miner-localhost.pem" /etc/gpu-attest/tls/miner.pem
install -m 600 "$work/pki/validator.key" /etc/gpu-attest/tls/validator.key
install -m 600 "$work/pki/miner-localhost.key" /etc/gpu-attest/tls/miner.key

echo "== the example configs, with a 20 s schedule and free ports" >&2
examples=/usr/share/doc/gpu-attest/examples
# Each listener on a port the kernel picks (a CI machine may have the default ones in use); the
# address comes from the daemon's first line, as a supervisor would read it.
free_ports=(-e 's/^listen = "\(.*\):[0-9]*"/listen = "127.0.0.1:0"/')
sed "${free_ports[@]}" -e 's/^interval_secs = .*/interval_secs = 20/' \
    "$examples/validator.example.toml" >/etc/gpu-attest/validator.toml

# One unit's value of `key` (the first), from the installed unit file.
unit_value() { sed -n "s/^$2=//p" "$units_dir/$1.service" | head -1; }

# Starts unit $1 as systemd would: systemctl where systemd runs, else by hand as described above.
start_unit() {
    local unit=$1 uid=$2
    if [ -d /run/systemd/system ]; then
        systemctl start "$unit"
        return
    fi
    local state cache credential name source env
    state=/var/lib/$(unit_value "$unit" StateDirectory)
    cache=/var/cache/$(unit_value "$unit" CacheDirectory)
    install -d -m 700 -o "$uid" -g "$uid" "$state" "$cache"
    credential=$(unit_value "$unit" LoadCredential)
    name=${credential%%:*} source=${credential#*:}
    install -d -m 500 -o "$uid" -g "$uid" "/run/credentials/$unit.service"
    install -m 400 -o "$uid" -g "$uid" "$source" "/run/credentials/$unit.service/$name"
    env=()
    while read -r line; do env+=("$line"); done < <(sed -n 's/^Environment=//p' "$units_dir/$unit.service")
    local as_unit=(env "${env[@]}" setpriv --reuid="$uid" --regid="$uid" --clear-groups --)
    local pre exec
    pre=$(unit_value "$unit" ExecStartPre)
    exec=$(unit_value "$unit" ExecStart)
    # shellcheck disable=SC2086
    (cd "$state" && "${as_unit[@]}" ${pre#-}) >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    (cd "$state" && exec "${as_unit[@]}" $exec) >"$work/$unit.log" 2>&1 &
    pids+=($!)
}

if [ -d /run/systemd/system ]; then
    echo "== systemd runs here: starting the units with systemctl" >&2
else
    echo "== no systemd as PID 1 here: starting each unit's commands under a user of its own, as the unit would (not systemd itself)" >&2
fi
start_unit gpu-attest-validator 61801
for _ in $(seq 100); do [ -s /var/lib/gpu-attest-validator/validator.key ] && break; sleep 0.1; done
validator_key=$(gpu-attest-validator public-key --key-file /var/lib/gpu-attest-validator/validator.key)
sed "${free_ports[@]}" -e "s/^allowed_validators = .*/allowed_validators = [\"$validator_key\"]/" \
    "$examples/miner.example.toml" >/etc/gpu-attest/miner.toml
start_unit gpu-attest-miner 61802

# A unit's output: its log file here, or the journal where systemd started it.
output_of() {
    if [ -d /run/systemd/system ]; then
        journalctl -u "$1" -o cat --no-pager 2>/dev/null
    else
        cat "$work/$1.log" 2>/dev/null
    fi
}

# The address a daemon printed first: `listening on ADDRESS`.
listening() {
    for _ in $(seq 150); do
        local line
        line=$(output_of "$1" | sed -n 's/^listening on //p' | head -1)
        [ -n "$line" ] && { echo "$line"; return; }
        sleep 0.2
    done
    echo "$1 did not start:" >&2; output_of "$1" >&2; exit 1
}
api=(gpu-attest-validator miners --api "http://$(listening gpu-attest-validator)")
miner_url="https://localhost:$(listening gpu-attest-miner | sed 's/.*://')"
echo "== registering the miner at $miner_url over mutual TLS" >&2
"${api[@]}" add "$miner_url" --name packaged >/dev/null || {
    echo "registration failed; validator log:" >&2; output_of gpu-attest-validator >&2
    echo "miner log:" >&2; output_of gpu-attest-miner >&2; exit 1; }

echo "== waiting for the schedule's verdict (up to 120 s)" >&2
verdict=""
for _ in $(seq 120); do
    verdict=$("${api[@]}" verdicts --json 2>/dev/null | python3 -c 'import json,sys; v=json.load(sys.stdin); print("PASS" if v and v[0]["passed"] else ("FAIL" if v else ""))')
    [ -n "$verdict" ] && break
    sleep 1
done
"${api[@]}" verdicts
[ "$verdict" = PASS ] || { echo "no scheduled PASS (got '${verdict:-nothing}'); validator log:" >&2; output_of gpu-attest-validator >&2; exit 1; }
# The daemons ran as their own users, not as root.
for unit in gpu-attest-validator gpu-attest-miner; do
    owner=$(stat -L -c %u "/var/lib/$unit")
    [ "$owner" != 0 ] || { echo "$unit's state belongs to root" >&2; exit 1; }
done

echo "== stopping and purging" >&2
if [ -d /run/systemd/system ]; then systemctl stop gpu-attest-miner gpu-attest-validator; fi
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()
dpkg --purge gpu-attest >/dev/null
left=$(echo "$installed" | while read -r path; do
    [ -f "$path" ] && echo "$path"
done || true)
[ -z "$left" ] || { echo "the purge left files: $left" >&2; exit 1; }
echo "deb-lifecycle: installed, PASS from the schedule over mutual TLS, purged with nothing of the package left"
