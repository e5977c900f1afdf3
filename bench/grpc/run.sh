#!/usr/bin/env bash
# ShouldRateLimit calls per second: bench/grpc_bench.cc (sluice_grpc_bench,
# gRPC's callback client, CONCURRENCY calls in flight over CHANNELS
# connections) against `sluice serve` on loopback.
#
# Without a config, it writes one for the memory store with a domain
# `bench` and runs three cases: one key that always passes, 100k random keys
# that pass, and one key over its limit (every call denied). With a config
# (e.g. the same rules on store.redis), it runs the cases against that
# config's rules: it must serve grpc.listen and have domain `bench` with
# the descriptor keys `pass` and `deny`, as the generated one does.
#
# Usage: bench/grpc/run.sh [CONFIG] [SECONDS=5] [CONCURRENCY=64] [CHANNELS=4] [THREADS=2]
#   STORE=redis: the generated config's rules are global, on a redis-server
#   this script starts (loopback, a free port, no persistence) and stops.
#   BUILD_DIR=build/release (must hold sluice and bench/sluice_grpc_bench; built if missing
#   targets are out of date, with the release preset when BUILD_DIR is the default)
#   SLUICE=<binary>: the server to measure instead of BUILD_DIR's (another
#   build's, to compare two versions)
# Loopback only; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${1:-}
SECONDS_=${2:-5}
CONCURRENCY=${3:-64}
CHANNELS=${4:-4}
THREADS=${5:-2}
BUILD_DIR=${BUILD_DIR:-build/release}

if [ "$BUILD_DIR" = build/release ]; then
  cmake --preset release >/dev/null
fi
cmake --build "$BUILD_DIR" --target sluice sluice_grpc_bench >/dev/null
SLUICE="${SLUICE:-$PWD/$BUILD_DIR/sluice}"
BENCH="$PWD/$BUILD_DIR/bench/sluice_grpc_bench"
WORK=$(mktemp -d)
SLUICE_PID=
REDIS_PID=
cleanup() {
  if [ -n "$SLUICE_PID" ]; then kill "$SLUICE_PID" 2>/dev/null || true; wait "$SLUICE_PID" 2>/dev/null || true; fi
  if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

source bench/lib.sh  # bench_envoy_rules
STORE_YAML="{memory: {max_keys: 2000000}}"
if [ "${STORE:-memory}" = redis ]; then
  # The same rules, global, on a redis-server of this script's own.
  REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >"$WORK/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
  STORE_YAML="{memory: {max_keys: 2000000}, redis: {url: \"redis://127.0.0.1:$REDIS_PORT\", timeout: 1s}}"
fi
ADMIN_PORT=
if [ -z "$CONFIG" ]; then
  CONFIG="$WORK/sluice.yaml"
  ADMIN_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat > "$CONFIG" <<CONF
server: {listen: 127.0.0.1:0, admin: 127.0.0.1:$ADMIN_PORT, threads: $THREADS}
store: $STORE_YAML
grpc: {listen: 127.0.0.1:0}
$(bench_envoy_rules)
CONF
fi

# Starts sluice and reads the gRPC port from its start line (port 0 works).
"$SLUICE" serve --config "$CONFIG" 2>"$WORK/sluice.log" & SLUICE_PID=$!
PORT=
for _ in $(seq 200); do
  PORT=$(sed -n 's/.*event=start listener=grpc listen=[^ ]*:\([0-9]*\).*/\1/p' "$WORK/sluice.log" | head -1)
  [ -n "$PORT" ] && break
  kill -0 "$SLUICE_PID" 2>/dev/null || { cat "$WORK/sluice.log" >&2; exit 1; }
  sleep 0.05
done
[ -n "$PORT" ] || { echo "no gRPC listener in the log" >&2; cat "$WORK/sluice.log" >&2; exit 1; }

echo "date: $(date -u '+%F %T') UTC; machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
echo "store: ${STORE:-memory}; config: $CONFIG; ${SECONDS_}s per case after 1s warm-up; $CONCURRENCY in flight over $CHANNELS connections"
# The sum of a counter in sluice's /metrics (STORE=redis, generated config).
counter() { curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v n="$1" '$1 == n {v += $2} END {print v + 0}'; }
run() {  # $1 case name, $2 key, $3 distinct values
  printf '%-22s ' "$1"
  local calls0 decisions0
  if [ "${STORE:-memory}" = redis ] && [ -n "$ADMIN_PORT" ]; then
    calls0=$(counter sluice_redis_calls_total); decisions0=$(counter sluice_redis_decisions_total)
  fi
  timeout $(( ${SECONDS_%.*} + 60 )) "$BENCH" --target "127.0.0.1:$PORT" --domain bench --key "$2" \
    --keys "$3" --concurrency "$CONCURRENCY" --channels "$CHANNELS" --seconds "$SECONDS_" --warmup 1
  if [ -n "${calls0:-}" ]; then
    # Over the warm-up and the run: Redis calls per decision sent to Redis.
    awk -v c=$(( $(counter sluice_redis_calls_total) - calls0 )) \
        -v d=$(( $(counter sluice_redis_decisions_total) - decisions0 )) \
        'BEGIN {printf "%-22s Redis calls per decision %.3f (%d calls, %d decisions)\n", "", d ? c / d : 0, c, d}'
  fi
}
run pass-1-key pass 1
run pass-100k-keys pass 100000
run deny-1-key deny 1
