#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster on loopback for the tests, and prints its admin URL for
# GPU_ATTEST_TEST_POSTGRES. Installs the server from the Debian packages if it is missing.
#
#   url=$(scripts/test-postgres.sh start DIR)   # DIR: where the cluster lives (created)
#   scripts/test-postgres.sh stop DIR
#
# The cluster trusts loopback connections and does not fsync: it holds nothing but test data.
set -euo pipefail

action=${1:?usage: test-postgres.sh start|stop DIR}
dir=${2:?usage: test-postgres.sh start|stop DIR}
port=${GPU_ATTEST_TEST_POSTGRES_PORT:-55432}

pg_bin() {
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

# PostgreSQL refuses to run as root: as root, the cluster belongs to the `postgres` user.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

case "$action" in
start)
    if [ -z "$(pg_bin)" ]; then
        echo "installing PostgreSQL from the Debian packages" >&2
        if [ "$(id -u)" = 0 ]; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2
        else
            sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2
        fi
    fi
    bin=$(pg_bin)
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
    as_owner "$bin/initdb" -D "$dir/data" -A trust -U postgres >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >&2 \
        || { cat "$dir/server.log" >&2; exit 1; }
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    bin=$(pg_bin)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate stop >&2 || true
    rm -rf "$dir"
    ;;
*)
    echo "usage: test-postgres.sh start|stop DIR" >&2
    exit 2
    ;;
esac
