#!/bin/sh
# gpu-attest-entrypoint DAEMON [COMMAND ARGS...]: the first process of the gpu-attest images.
#
# Any command but `serve` runs as it is (`keygen`, `public-key`, `tls-certs`, `health`, ...).
# For `serve` it does what the systemd units do:
# - creates the signing key on first start (in the state volume; never overwrites one);
# - passes SIGTERM and SIGINT on to the daemon, which drains (a miner settles its challenge in
#   flight, a validator stores the verdicts it is reaching), and SIGHUP, which reloads (the
#   miner's allow-list);
# - restarts the daemon 5 s after it ends by a device fault (status 75: only a fresh process
#   gets a faulted GPU back) or by a signal it did not ask for, as Restart=on-failure does;
# - does not restart after status 2, the daemon's "could not do what was asked" (a bad config,
#   an unreadable secret, a port in use): the daemon's last line says what to fix, and the
#   container stays up but unhealthy, so that no restart policy turns that line into a loop.
#   Fix it, then recreate the container.
set -u
daemon=$1
shift
[ "${1:-serve}" = serve ] || exec "$daemon" "$@"

stopping=false
child=""
# SIGTERM and SIGINT stop the daemon (which drains); SIGHUP reloads it (the miner's allow-list).
forward() {
    [ "$1" = HUP ] || stopping=true
    [ -n "$child" ] && kill -s "$1" "$child" 2>/dev/null
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward HUP' HUP

# Up, unhealthy (the health probe is not served) and not restarting, until stopped.
park() {
    echo "gpu-attest-entrypoint: $daemon stopped on the error above (status 2); not restarting: fix it, then recreate the container" >&2
    while ! $stopping; do
        sleep 3600 &
        wait $! 2>/dev/null
    done
    exit 2
}

key_file=$(env | sed -n 's/^GPU_ATTEST_[A-Z]*_KEY_FILE=//p' | head -1)
if [ -n "$key_file" ] && [ ! -e "$key_file" ]; then
    # An unwritable state volume is an operator's error like any other: said once, no loop.
    "$daemon" keygen --key-file "$key_file" || park
fi

while ! $stopping; do
    "$daemon" "$@" &
    child=$!
    # A stop that came while the daemon was starting reaches it now.
    $stopping && kill -s TERM "$child" 2>/dev/null
    # `wait` returns early when a trapped signal arrives: wait again for the daemon's own end.
    status=0
    wait "$child" || status=$?
    while kill -0 "$child" 2>/dev/null; do
        status=0
        wait "$child" || status=$?
    done
    child=""
    $stopping && exit "$status"
    case "$status" in
    0) exit 0 ;;
    2) park ;;
    *)
        echo "gpu-attest-entrypoint: $daemon ended with status $status; restarting it in 5 s" >&2
        sleep 5 &
        wait $! 2>/dev/null
        ;;
    esac
done
# Stopped between two runs of the daemon: nothing was running to fail.
exit 0
