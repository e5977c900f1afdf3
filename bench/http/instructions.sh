#!/usr/bin/env bash
# The user-space instructions one HTTP decision costs sluice: `sluice serve`
# (memory store, 2 threads, one gcra policy keyed on X-Key that nobody
# reaches) under valgrind's callgrind, answering N requests of
# `GET /v1/auth/bench` (h2load --h1, 4 connections, one key), and again
# answering none; the difference over N is the figure. Every thread is
# counted. Unlike requests a second, the count does not move with the
# machine's load, so two builds can be compared by it on a shared machine:
#
#   SLUICE=/path/to/other/sluice bench/http/instructions.sh
#
# The kernel's share (the socket calls) is not counted: callgrind sees only
# user space.
#
# Usage: bench/http/instructions.sh [N=10000]
# Variables: SLUICE (the binary; build/release/sluice, built when missing).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
N=${1:-10000}

source scripts/deps.sh
sluice_install_deps valgrind nghttp2-client
SLUICE="${SLUICE:-$PWD/build/release/sluice}"
if [[ ! -x "$SLUICE" ]]; then
  timeout 900 cmake --preset release >/dev/null
  timeout 900 cmake --build build/release --target sluice >/dev/null
fi
source bench/lib.sh  # free_port, wait_port, work_dir_with_cleanup

work_dir_with_cleanup  # WORK; stops SERVER_PID at exit

PORT=$(free_port) ADMIN=$(free_port)
cat > "$WORK/sluice.yaml" <<CONF
server: {listen: 127.0.0.1:$PORT, admin: 127.0.0.1:$ADMIN, threads: 2}
policies:
  - name: bench
    match: {path_prefix: /}
    key: ["header:X-Key"]
    limits: [{algorithm: gcra, rate: 1000000/s, burst: 1000000}]
CONF

# Prints the instructions callgrind counted in a sluice that answered $1 requests.
count() {
  rm -f "$WORK"/callgrind.out.*
  valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out.%p" \
    "$SLUICE" serve --config "$WORK/sluice.yaml" 2>"$WORK/sluice.log" &
  SERVER_PID=$!
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
  done
  if [[ "$1" -gt 0 ]]; then
    timeout 600 h2load --h1 -n "$1" -c 4 -H 'X-Key: k1' "http://127.0.0.1:$PORT/v1/auth/bench" \
      > "$WORK/h2load.txt"
    grep -q "^status codes: $1 2xx" "$WORK/h2load.txt" || { cat "$WORK/h2load.txt" >&2; exit 1; }
  fi
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  awk '/^(summary|totals):/ {print $2; exit}' "$WORK"/callgrind.out.*
}

idle=$(count 0)
busy=$(count "$N")
echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $SLUICE"
echo "instructions: $idle answering nothing, $busy answering $N requests"
echo "per request: $(( (busy - idle) / N ))"
