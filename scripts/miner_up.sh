# Sourced by gpu-check.sh and gpu-spread.sh: a miner daemon on a loopback port, started and
# stopped. Both expect $bin (the binaries), $work (holding miner.key) and $validator_key.
#
# `miner_up LOG ARGS...`: `miner serve ARGS...` with the key and the validator allowed, its
# stderr in LOG; its address in $address ("" if it did not start), its pid in $miner_pid.
miner_up() {
  local log=$1
  shift
  "$bin/miner" serve "$@" --listen 127.0.0.1:0 --key-file "$work/miner.key" \
    --allow-validator "$validator_key" >"$work/miner.out" 2>"$log" &
  miner_pid=$!
  address=
  for _ in $(seq 600); do
    address=$(sed -n 's/^listening on //p' "$work/miner.out")
    [ -n "$address" ] && break
    kill -0 "$miner_pid" 2>/dev/null || break
    sleep 0.1
  done
}

# `miner_down`: drains the miner for at most 30 s (it drains for 25 s after SIGTERM), then stops
# it outright, so a miner hung on its GPU cannot hang the script.
miner_down() {
  kill "$miner_pid" 2>/dev/null
  for _ in $(seq 300); do kill -0 "$miner_pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$miner_pid" 2>/dev/null
  wait "$miner_pid" 2>/dev/null
}
