#!/usr/bin/env bash
# The Debian package under real systemd: a Debian bookworm root file system (made once from
# Debian's packages with mmdebstrap, kept under target/deploy/) is booted with systemd as PID 1
# (systemd-nspawn, a throwaway copy each run, sharing this host's network), and the operator's
# path in docs/guide.md ("The Debian package") is followed inside it:
#
#   install the .deb, make the TLS files with `validator tls-certs`, write both configs from the
#   examples, `systemctl enable --now` the validator, allow its key in the miner's config,
#   `systemctl enable --now` the miner, `validator miners add` it, and wait for the schedule's
#   PASS over mutual TLS.
#
# Then, under systemd: the miner killed with SIGKILL comes back by Restart= and the next
# scheduled attestation passes; the validator stopped while it attests drains and stores that
# verdict; each daemon's lines are in its journal; `systemd-analyze verify` passes both units and
# `systemd-analyze security` scores them (at most the scores below); a unit with its credential
# missing fails once with one line, not in a loop; and purge leaves nothing of the package.
#
#   scripts/deb-systemd.sh [DEB]     # default: the newest target/debian/gpu-attest_*.deb
#
# Needs root, mmdebstrap and systemd-nspawn (Debian: apt-get install mmdebstrap
# systemd-container). Where they are missing it fails, saying so, unless
# GPU_ATTEST_DEPLOY_FALLBACK=1, which runs scripts/deb-lifecycle.sh instead: the units' commands
# under their own users without systemd, which checks less and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

# The highest `systemd-analyze security` exposure each unit may have (lower is better). Every
# exposure left open is one the daemon needs; docs/guide.md ("Hardening") lists them.
max_exposure_miner=1.5
max_exposure_validator=1.1

started=$SECONDS
say() { echo "== [$((SECONDS - started)) s] $*" >&2; }
[ "$(id -u)" = 0 ] || { echo "deb-systemd.sh installs a package into a booted container: run it as root" >&2; exit 2; }
deb=${1:-$(ls -t target/debian/gpu-attest_*.deb 2>/dev/null | head -1)}
[ -f "$deb" ] || { echo "no package: build one with scripts/package-deb.sh, or name it" >&2; exit 2; }
deb=$(realpath "$deb")

for tool in mmdebstrap systemd-nspawn nsenter python3; do
    command -v "$tool" >/dev/null && continue
    if [ "${GPU_ATTEST_DEPLOY_FALLBACK:-}" = 1 ]; then
        echo "deb-systemd: $tool not found, and GPU_ATTEST_DEPLOY_FALLBACK=1: running the units' commands without systemd (scripts/deb-lifecycle.sh) instead" >&2
        exec scripts/deb-lifecycle.sh "$deb"
    fi
    echo "deb-systemd: cannot boot systemd: $tool not found (apt-get install mmdebstrap systemd-container; GPU_ATTEST_DEPLOY_FALLBACK=1 runs scripts/deb-lifecycle.sh without systemd instead)" >&2
    exit 1
done

# The root file system, made once: systemd as init, and what a minimal Debian host has besides
# (ca-certificates, procps, /etc/hosts naming localhost).
rootfs=target/deploy/bookworm-systemd
packages=systemd,systemd-sysv,dbus,libnss-systemd,ca-certificates,procps
if [ "$(cat "$rootfs.packages" 2>/dev/null)" != "$packages" ]; then
    say "making a Debian bookworm root file system with systemd (mmdebstrap, about a minute)"
    rm -rf "$rootfs" "$rootfs.packages" "$rootfs.partial"
    mkdir -p "$(dirname "$rootfs")"
    mmdebstrap --quiet --variant=apt --include="$packages" \
        --customize-hook='printf "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n" >"$1/etc/hosts"' \
        bookworm "$rootfs.partial"
    mv "$rootfs.partial" "$rootfs"
    echo "$packages" >"$rootfs.packages"
fi

work=$(mktemp -d /tmp/gpu-attest-systemd.XXXXXX)
nspawn_pid=""
cleanup() {
    if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
        kill "$nspawn_pid" 2>/dev/null || true # the container powers off
        for _ in $(seq 40); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$nspawn_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

say "booting it with systemd as PID 1 (systemd-nspawn, a throwaway copy)"
# --register=no and --keep-unit: this host's own init need not be systemd (a CI container's is not).
systemd-nspawn --quiet --directory="$rootfs" --ephemeral --boot --register=no --keep-unit \
    --console=passive --machine=gpu-attest-test --bind-ro="$deb:/root/gpu-attest.deb" \
    >"$work/boot.log" 2>&1 &
nspawn_pid=$!
leader=""
for _ in $(seq 150); do
    leader=$(ps -o pid=,comm= --ppid "$nspawn_pid" 2>/dev/null | awk '$2 == "systemd" { print $1 }' || true)
    [ -n "$leader" ] && break
    kill -0 "$nspawn_pid" 2>/dev/null || break
    sleep 0.2
done
[ -n "$leader" ] || { echo "deb-systemd: systemd did not boot in the container:" >&2; cat "$work/boot.log" >&2; exit 1; }
# A command inside the container, as root there.
inside() { nsenter --target "$leader" --all -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
state=""
for _ in $(seq 120); do
    state=$(inside systemctl is-system-running 2>/dev/null || true)
    case "$state" in running | degraded | maintenance | stopping) break ;; esac
    sleep 0.5
done
case "$state" in
running) ;;
*) echo "deb-systemd: the container's systemd is '$state':" >&2; inside systemctl --failed --no-pager >&2 || true; exit 1 ;;
esac
say "systemd $(inside systemctl --version | awk 'NR == 1 { print $2 }') is running in the container"

# Four free ports: the container shares this host's network.
read -r validator_port miner_port validator_metrics miner_metrics < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')

say "the operator's steps (docs/guide.md): install, TLS files, configs, enable both units"
inside dpkg -i /root/gpu-attest.deb >/dev/null
installed=$(inside dpkg -L gpu-attest)
inside sh -ec "
mkdir -p /etc/gpu-attest/tls
gpu-attest-validator tls-certs --out /root/pki --validator-host localhost --miner-host localhost >/dev/null
cp /root/pki/ca.pem /root/pki/validator.pem /etc/gpu-attest/tls/
cp /root/pki/miner-localhost.pem /etc/gpu-attest/tls/miner.pem
install -m 600 /root/pki/validator.key /etc/gpu-attest/tls/validator.key
install -m 600 /root/pki/miner-localhost.key /etc/gpu-attest/tls/miner.key
examples=/usr/share/doc/gpu-attest/examples
# The examples' ports moved to free ones, and a 10 s schedule.
sed -e '0,/^listen = /s/^listen = .*/listen = \"127.0.0.1:$validator_port\"/' \
    -e '/^\[metrics\]/,\$ s/^listen = .*/listen = \"127.0.0.1:$validator_metrics\"/' \
    -e 's/^interval_secs = .*/interval_secs = 10/' \
    \$examples/validator.example.toml >/etc/gpu-attest/validator.toml
systemctl enable --now gpu-attest-validator 2>/dev/null
for _ in \$(seq 100); do [ -s /var/lib/gpu-attest-validator/validator.key ] && break; sleep 0.1; done
key=\$(gpu-attest-validator public-key --key-file /var/lib/gpu-attest-validator/validator.key)
sed -e '0,/^listen = /s/^listen = .*/listen = \"127.0.0.1:$miner_port\"/' \
    -e '/^\[metrics\]/,\$ s/^listen = .*/listen = \"127.0.0.1:$miner_metrics\"/' \
    -e \"s/^allowed_validators = .*/allowed_validators = [\\\"\$key\\\"]/\" \
    \$examples/miner.example.toml >/etc/gpu-attest/miner.toml
systemctl enable --now gpu-attest-miner 2>/dev/null
"

journal() { inside journalctl --unit "$1" --output cat --no-pager 2>/dev/null; }
# journal_says UNIT PATTERN [GREP FLAGS]: whether UNIT's journal has a line matching PATTERN,
# waiting up to 30 s for it. A daemon's last lines reach journald through a pipe after the
# daemon has exited (`systemctl stop` returns first), so one early read can miss them; and the
# journal is read whole before grep looks at it, since `journalctl | grep -q` under pipefail
# fails whenever grep stops reading early.
journal_says() {
    local text
    for _ in $(seq 150); do
        text=$(journal "$1")
        grep -q "${@:3}" -e "$2" <<<"$text" && return 0
        sleep 0.2
    done
    return 1
}
fail() {
    echo "deb-systemd: $*" >&2
    for unit in gpu-attest-validator gpu-attest-miner; do
        echo "--- journalctl -u $unit (last 30 lines)" >&2
        journal "$unit" | tail -30 >&2
    done
    exit 1
}
# Both daemons said they listen: in the journal, where systemd put their output.
for unit in gpu-attest-validator gpu-attest-miner; do
    journal_says "$unit" '^listening on ' || fail "$unit did not start"
done
# `validator miners` finds the API from /etc/gpu-attest/validator.toml, as the guide says.
inside gpu-attest-validator miners add "https://localhost:$miner_port" --name packaged >/dev/null \
    || fail "registering the miner over mutual TLS failed"

# Stored verdicts as "ID PASS|FAIL" lines, newest first, from the database (also while the
# validator is stopped).
verdicts() {
    inside gpu-attest-validator verdicts --database /var/lib/gpu-attest-validator/validator.db --json 2>/dev/null | python3 -c '
import json, sys
for v in json.load(sys.stdin):
    print(v["id"], "PASS" if v["passed"] else "FAIL")'
}
# awk reads to the end: `head -1` would close the pipe under the listing, whose write then
# fails (BrokenPipeError) and, under pipefail, stops the script without a word.
newest_id() { verdicts | awk 'NR == 1 { print $1 }'; }
# Waits up to $2 seconds for a verdict newer than id $1, and prints it.
next_verdict() {
    local after=$1 deadline=$((SECONDS + $2)) line
    while [ $SECONDS -lt $deadline ]; do
        line=$(verdicts | awk -v after="${after:-0}" '$1 > after' | tail -1)
        [ -n "$line" ] && { echo "$line"; return; }
        sleep 1
    done
}

say "waiting for the schedule's first verdict (up to 120 s)"
first=$(next_verdict 0 120)
[ "${first#* }" = PASS ] || fail "no scheduled PASS (got '${first:-nothing}')"
say "scheduled PASS over mutual TLS (verdict ${first% *})"
for unit in gpu-attest-validator gpu-attest-miner; do
    owner=$(inside stat -L -c %u "/var/lib/$unit")
    [ "$owner" != 0 ] || fail "$unit's state directory belongs to root: DynamicUser= did not apply"
done

say "systemctl kill -s KILL gpu-attest-miner, just after a verdict: Restart= must bring it back"
latest=$(next_verdict "${first% *}" 60)
[ -n "$latest" ] || fail "no second scheduled verdict within 60 s"
inside systemctl kill --signal=KILL gpu-attest-miner
restarts=0
for _ in $(seq 60); do
    restarts=$(inside systemctl show --property NRestarts --value gpu-attest-miner)
    [ "$restarts" -ge 1 ] && [ "$(inside systemctl is-active gpu-attest-miner)" = active ] && break
    sleep 0.5
done
[ "$restarts" -ge 1 ] || fail "the killed miner was not restarted (NRestarts=$restarts)"
after_restart=$(next_verdict "${latest% *}" 120)
[ "${after_restart#* }" = PASS ] || fail "the next scheduled verdict after the miner's restart is '${after_restart:-none}', not PASS"
say "restarted by systemd (NRestarts=$restarts); the next scheduled attestation passed (verdict ${after_restart% *})"

say "systemctl stop gpu-attest-validator while it attests: it must drain and store the verdict"
running() {
    python3 -c '
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(next((l.split()[1] for l in text.splitlines() if l.startswith("gpu_attest_validator_scheduler_running ")), "0"))' "$validator_metrics" 2>/dev/null || echo 0
}
for _ in $(seq 600); do [ "$(running)" -ge 1 ] && break; sleep 0.1; done
[ "$(running)" -ge 1 ] || fail "no scheduled attestation started within 60 s"
# Read once the attestation runs: with one miner, no other verdict can come before the stop.
before_stop=$(newest_id)
inside systemctl stop gpu-attest-validator
drained=$(verdicts | awk -v after="$before_stop" '$1 > after' | tail -1)
[ "${drained#* }" = PASS ] || fail "the attestation in flight at the stop left '${drained:-no verdict}', not a stored PASS"
journal_says gpu-attest-validator 'validator stopped' || fail "the validator's journal has no 'validator stopped' line"
inside systemctl start gpu-attest-validator
say "stopped mid-attestation: the verdict it was reaching is stored (${drained% *}), and the daemon said it stopped"

say "systemd-analyze verify and security on both units"
inside systemd-analyze verify /lib/systemd/system/gpu-attest-miner.service /lib/systemd/system/gpu-attest-validator.service \
    || fail "systemd-analyze verify rejects a unit"
for unit in gpu-attest-miner gpu-attest-validator; do
    exposure=$(inside systemd-analyze security "$unit" --no-pager | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
    limit_var=max_exposure_${unit#gpu-attest-}
    echo "$unit: exposure $exposure (at most ${!limit_var}); open:" >&2
    inside systemd-analyze security "$unit" --no-pager | grep '✗' | awk '{print "    " $2}' >&2
    python3 -c 'import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]))' "$exposure" "${!limit_var}" \
        || fail "$unit's exposure $exposure is above ${!limit_var}: a hardening line was lost"
done

say "a unit whose credential is missing: one failure that says so, no restart loop"
inside mv /etc/gpu-attest/tls/miner.key /root/miner.key.away
inside systemctl restart gpu-attest-miner 2>/dev/null || true
sleep 7 # past RestartSec=, so that a loop would show
inside systemctl is-failed --quiet gpu-attest-miner || fail "the miner without its credential is not failed: $(inside systemctl is-active gpu-attest-miner)"
# (A manual restart sets the count back to 0.)
restarts_now=$(inside systemctl show --property NRestarts --value gpu-attest-miner)
[ "$restarts_now" -eq 0 ] || fail "the miner without its credential was restarted $restarts_now times"
journal_says gpu-attest-miner 'credential' -i || fail "the miner's journal does not name the missing credential"
inside mv /root/miner.key.away /etc/gpu-attest/tls/miner.key
journal gpu-attest-miner | grep -i 'credential' | tail -1 | sed 's/^/    /' >&2

say "a port in use: the validator fails once with one line that names it, no restart loop"
inside systemctl stop gpu-attest-validator
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(30)' "$validator_port" &
squatter=$!
sleep 0.5
inside systemctl start gpu-attest-validator 2>/dev/null || true
sleep 7
kill "$squatter" 2>/dev/null || true
inside systemctl is-failed --quiet gpu-attest-validator || fail "the validator on a port in use is not failed: $(inside systemctl is-active gpu-attest-validator)"
[ "$(inside systemctl show --property NRestarts --value gpu-attest-validator)" -eq 0 ] || fail "the validator on a port in use was restarted"
journal_says gpu-attest-validator "cannot listen on 127.0.0.1:$validator_port" || fail "the validator's journal does not name the port in use"
journal gpu-attest-validator | grep "cannot listen on 127.0.0.1:$validator_port" | tail -1 | sed 's/^/    /' >&2

say "purging the package: nothing of it may be left"
inside systemctl stop gpu-attest-validator gpu-attest-miner
inside dpkg --purge gpu-attest >/dev/null
left=$(echo "$installed" | while read -r path; do inside test -f "$path" && echo "$path"; done || true)
for unit in gpu-attest-miner gpu-attest-validator; do
    for path in /var/lib/$unit /var/lib/private/$unit /var/cache/$unit /var/cache/private/$unit \
        /etc/systemd/system/multi-user.target.wants/$unit.service /etc/systemd/system/$unit.service; do
        inside test -e "$path" -o -L "$path" && left+=" $path"
    done
done
[ -z "${left// /}" ] || fail "the purge left:$left"
if inside systemctl list-unit-files --no-legend 'gpu-attest-*' | grep -q .; then
    fail "systemd still has unit files after the purge: $(inside systemctl list-unit-files --no-legend 'gpu-attest-*')"
fi
say "deb-systemd: under systemd, PASS over mutual TLS, restart after SIGKILL, drain on stop, journal, verify and security, no restart loop, purged clean"
