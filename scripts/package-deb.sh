#!/usr/bin/env bash
# Builds the gpu-attest Debian package with cargo-deb (installed pinned into target/tools): both
# daemons, stripped, as /usr/bin/gpu-attest-miner and /usr/bin/gpu-attest-validator, their systemd units (not enabled), the example configs, the Grafana
# dashboard and the alert rules (miner/Cargo.toml, [package.metadata.deb]).
#
#   scripts/package-deb.sh            # target/debian/gpu-attest_VERSION_ARCH.deb, release build
#   scripts/package-deb.sh --check    # then install it with dpkg, run both binaries from the
#                                     # installed paths, and remove it again (needs root)
#
# PROFILE=dev packages the test build instead (CI does, to check the packaging without a
# release build; such a package is for checking, not for hosts).
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
case "${1:-}" in
"") ;;
--check) check=true ;;
*) echo "usage: package-deb.sh [--check]" >&2; exit 2 ;;
esac
profile=${PROFILE:-release}

cargo_deb_version=3.8.0
tools=target/tools
if ! "$tools/bin/cargo-deb" --version 2>/dev/null | grep -q "$cargo_deb_version"; then
    echo "== installing cargo-deb $cargo_deb_version" >&2
    # A tool, not the project: built without the lint wrapper CI may have exported.
    env -u RUSTC_WORKSPACE_WRAPPER cargo install cargo-deb --version "$cargo_deb_version" --locked --root "$tools"
fi

# Cargo's own progress, not -q: a first release build takes many minutes on two cores.
echo "== building both daemons ($profile; the first build takes minutes)" >&2
if [ "$profile" = dev ]; then
    # The test build itself (scripts/test-python-client.sh says why): in CI, already built.
    cargo test --workspace --locked --no-run
else
    cargo build --locked --profile "$profile" -p gpu-attest-miner -p gpu-attest-validator --bin miner --bin validator
fi
echo "== packaging" >&2
deb=$("$tools/bin/cargo-deb" -p gpu-attest-miner --no-build --profile "$profile" --strip --quiet)
# cargo-deb writes no md5sums: add them, so that `dpkg --verify` can tell a changed file.
unpacked=$(mktemp -d)
dpkg-deb -R "$deb" "$unpacked"
(cd "$unpacked" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum >DEBIAN/md5sums)
dpkg-deb --root-owner-group -b "$unpacked" "$deb" >/dev/null
rm -rf "$unpacked"
echo "$deb"

if $check; then
    [ "$(id -u)" = 0 ] || { echo "package-deb.sh --check installs the package: run it as root" >&2; exit 2; }
    echo "== installing $deb with dpkg" >&2
    # Removed again however the check ends, a half-done install included.
    trap 'dpkg -r gpu-attest >/dev/null 2>&1 || true' EXIT
    dpkg -i "$deb"
    dpkg -L gpu-attest | grep -E '^/(usr/bin/gpu-attest-(miner|validator)|(usr/)?lib/systemd/system/gpu-attest-(miner|validator)\.service|usr/share/doc/gpu-attest/examples/(miner|validator)\.example\.toml|usr/share/gpu-attest/grafana/(gpu-attest\.json|alerts\.yml))$' \
        | sort >target/debian/installed.txt
    [ "$(wc -l <target/debian/installed.txt)" -eq 8 ] \
        || { echo "the package lacks files:" >&2; dpkg -L gpu-attest >&2; exit 1; }
    /usr/bin/gpu-attest-miner --version
    /usr/bin/gpu-attest-validator --version
    # Stripped, and every installed file as its md5sums say.
    for bin in /usr/bin/gpu-attest-miner /usr/bin/gpu-attest-validator; do
        file "$bin" | grep -q ', stripped' || { echo "$bin is not stripped" >&2; exit 1; }
    done
    dpkg --verify gpu-attest || { echo "dpkg --verify found files that differ from md5sums" >&2; exit 1; }
    [ -s /var/lib/dpkg/info/gpu-attest.md5sums ] || { echo "the package has no md5sums" >&2; exit 1; }
    # The installed units as systemd reads them (their binaries, credentials and hardening
    # lines). Starting them needs systemd running as PID 1, which a CI container lacks.
    if command -v systemd-analyze >/dev/null; then
        units=$(dpkg -L gpu-attest | grep -E 'systemd/system/gpu-attest-(miner|validator)\.service$')
        # shellcheck disable=SC2086
        systemd-analyze verify $units
        echo "== systemd-analyze verify: both units pass" >&2
    else
        echo "== systemd-analyze not found: the installed units were not verified" >&2
    fi
    echo "== installed and ran from /usr/bin; removing it again" >&2
fi
