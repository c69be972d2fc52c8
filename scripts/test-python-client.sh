#!/usr/bin/env bash
# The Python client's tests (clients/python) against a real validator daemon and real CPU miners
# on loopback: builds the binaries, installs the client (its gRPC stubs generated from proto/ as
# it is built) with pytest into target/pyclient-venv, and runs pytest. Extra arguments go to
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== building the daemons the client is tested against (the test build)" >&2
# The README's test command's own build, which leaves the daemons and the cheating miner in
# target/debug: any narrower selection unifies features differently (the tests' tokio has
# test-util) and rebuilds every workspace crate a second time, minutes on two cores.
cargo test --workspace --locked --no-run -q

venv=target/pyclient-venv
fresh=false
[ -x "$venv/bin/python" ] || { python3 -m venv "$venv"; fresh=true; }
echo "== installing the client and pytest" >&2
# setuptools never removes a module from its build folder: one left from an older tree would be
# installed beside this tree's and could hide a missing module.
rm -rf clients/python/build
"$venv/bin/pip" install -q './clients/python[test]'
# A venv of an earlier run holds the same version number from an older tree: reinstalled, so
# that the tests see this tree (a fresh one has just installed it: each build of the package
# sets up its build tools again, most of this step's time).
$fresh || "$venv/bin/pip" install -q --force-reinstall --no-deps ./clients/python

export GPU_ATTEST_BIN_DIR="$PWD/target/debug"
status=0
"$venv/bin/python" -m pytest -q clients/python/tests -p no:cacheprovider "$@" || status=$?
# pytest's 5 is "no test ran": a run that tested nothing has failed.
[ "$status" -ne 5 ] || { echo "test-python-client.sh: pytest ran no test" >&2; exit 1; }
exit "$status"
