#!/usr/bin/env bash
# The Redis store over each way to reach a server: sluice_bench_redis
# against one redis-server this script starts with a TCP port, a TLS port
# and a Unix socket (loopback; certificates made here by the openssl
# command), the same limit over redis://, rediss:// and unix:// in turn,
# ROUNDS times, DURATION seconds each, for DEPTHS decisions in flight on
# KEYS random keys. Prints, per depth, the medians of decisions a second,
# p99 latency and redis-server's own CPU time (user + system,
# /proc/PID/stat) per decision on each, and each over TCP's.
#
# Usage: bench/redis/transports.sh          # ~1.5 minutes
# Variables: DURATION (3), ROUNDS (3), DEPTHS ("1 64"), KEYS (100000),
#   ALGORITHM (gcra), SKIP_BUILD=1, SLUICE_BENCH_REDIS=<a built sluice_bench_redis>.
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."

DURATION=${DURATION:-3}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-1 64}
KEYS=${KEYS:-100000}
ALGORITHM=${ALGORITHM:-gcra}

source scripts/deps.sh
sluice_install_deps redis-server redis-tools openssl

BIN=${SLUICE_BENCH_REDIS:-build/release/bench/sluice_bench_redis}
if [[ -z "${SKIP_BUILD:-}" && -z "${SLUICE_BENCH_REDIS:-}" ]]; then
  timeout 900 cmake --preset release >/dev/null
  timeout 900 cmake --build build/release --target sluice_bench_redis >/dev/null
fi

source bench/lib.sh  # free_port, start_bench_redis: PORT, REDIS_PID, WORK
WORK=$(mktemp -d)
ssl() { timeout 30 openssl "$@" >/dev/null 2>&1; }
ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -keyout "$WORK/ca.key" -out "$WORK/ca.pem" -subj "/CN=sluice bench ca"
ssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$WORK/server.key" -out "$WORK/server.csr" -subj "/CN=127.0.0.1"
echo "subjectAltName=IP:127.0.0.1" >"$WORK/server.ext"
ssl x509 -req -in "$WORK/server.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
  -CAcreateserial -days 2 -extfile "$WORK/server.ext" -out "$WORK/server.pem"
TLS_PORT=$(free_port)
start_bench_redis --tls-port "$TLS_PORT" --tls-cert-file "$WORK/server.pem" \
  --tls-key-file "$WORK/server.key" --tls-ca-cert-file "$WORK/ca.pem" --tls-auth-clients no \
  --unixsocket "$WORK/redis.sock" --unixsocketperm 700

cpu_ticks() { awk '{print $14 + $15}' "/proc/$REDIS_PID/stat"; }
results="$WORK/results.jsonl"
for depth in $DEPTHS; do
  for round in $(seq "$ROUNDS"); do
    for side in tcp tls unix; do
      case $side in
        tcp) url="redis://127.0.0.1:$PORT" ;;
        tls) url="rediss://127.0.0.1:$TLS_PORT" ;;
        unix) url="unix://$WORK/redis.sock" ;;
      esac
      before=$(cpu_ticks)
      line=$(timeout $((DURATION * 3 + 30)) "$BIN" --url "$url" --ca-file "$WORK/ca.pem" \
               --info-url "redis://127.0.0.1:$PORT" --algorithm "$ALGORITHM" --mode pass \
               --depth "$depth" --keys "$KEYS" --seconds "$DURATION")
      after=$(cpu_ticks)
      echo "{\"transport\":\"$side\",\"round\":$round,\"cpu_ticks\":$((after - before)),\"run\":$line}" >>"$results"
    done
  done
done

python3 - "$results" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tick = 1e6 / int(sys.argv[2])
print("depth  way   decisions/s (median)  p99 us (median)  redis CPU us/decision (median)")
for depth in sorted({r["run"]["depth"] for r in rows}):
    med = {}
    for side in ("tcp", "tls", "unix"):
        rs = [r for r in rows if r["run"]["depth"] == depth and r["transport"] == side]
        rate = statistics.median(r["run"]["decisions_per_s"] for r in rs)
        p99 = statistics.median(r["run"]["p99_us"] for r in rs)
        cpu = statistics.median(r["cpu_ticks"] * tick / max(r["run"]["decisions"], 1) for r in rs)
        med[side] = (rate, p99, cpu)
        print("%5d  %-4s  %20.0f  %15.0f  %30.2f" % (depth, side, rate, p99, cpu))
    for side in ("tls", "unix"):
        print("%5d  %s/tcp: decisions/s %.2f, p99 %.2f, redis CPU %.2f" % (
            depth, side, med[side][0] / med["tcp"][0], med[side][1] / med["tcp"][1],
            med[side][2] / med["tcp"][2]))
PY
