#!/usr/bin/env bash
# sluice's Redis store against two peers, side by side, on one redis-server
# this script starts (loopback, a free port, no persistence):
#
#   A: redis-benchmark sending the FCALL of one sluice decision, the same
#      arguments sluice sends (sluice_bench_redis --print-fcall-args), one
#      connection, pipelined DEPTH deep (-c 1 -P DEPTH), against
#      sluice_bench_redis keeping DEPTH decisions in flight on its one
#      connection; DEPTH in A_DEPTHS (1 16 64). Target: >= 0.8x.
#   B: rate-limiter-flexible's RateLimiterRedis (npm, over ioredis;
#      rlf_bench.js, fixed window: its only algorithm) with N consume() calls
#      in flight against sluice with N decisions in flight, for each of
#      ALGORITHMS; N in B_INFLIGHT (1 64). Targets: >= 3x at 1, >= 2x at 64,
#      and redis-server's CPU time per decision <= 0.5x the peer's.
#
# Each case runs for 1 key and for 100,000 random keys ("user-<12 digits>",
# the same spelling on every side), sluice and the peer alternately (A B A B
# ...), ROUNDS times, DURATION seconds each; it prints medians and ratios,
# the calls per decision that Redis counted (INFO commandstats: FCALL or
# EVALSHA + EVAL calls / decisions; below 1 when sluice coalesced several
# decisions into one call) and redis-server's own CPU time (user + system,
# /proc/PID/stat) over each run divided by the decisions. With 1 in B_INFLIGHT
# or A_DEPTHS it also measures the floor of one decision in flight: a bare
# PING, one at a time (redis-benchmark -c 1 -P 1 -t ping).
#
# Usage: bench/redis/run.sh              # ~5 minutes
#        QUICK=1 bench/redis/run.sh      # smoke run, ~20 s: 1 key, 1 round of 1 s
# Variables: DURATION (2), ROUNDS (3), KEYS ("1 100000"), A_DEPTHS ("1 16 64"),
#   B_INFLIGHT ("1 64"), MODE (pass: nothing denied; deny: all but each key's
#   first), ALGORITHM (sluice's side of A: fixed_window), ALGORITHMS (sluice's
#   side of B: "fixed_window gcra token_bucket sliding_window"),
#   SKIP_BUILD=1, SLUICE_BENCH_REDIS=<path to a built sluice_bench_redis>, OUT,
#   WINDOW_STATE (store.redis.window_state: text, the window algorithms'
#   states as text; integer, raised by INCRBY; unset: the default, integer),
#   RATE (sluice's limit, e.g. 100000/s; unset: the mode's, 1000000/s in
#   pass mode; a sliding window above about 5.9 million keeps text),
#   LEASE (sluice's limit in B leased, docs/distributed.md "Leased limits":
#   -1 slices of size auto, N slices of N; fixed_window, gcra, token_bucket:
#   most decisions are then made in the process, without a call).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."

if [[ -n "${QUICK:-}" ]]; then
  : "${DURATION:=1}" "${ROUNDS:=1}" "${KEYS:=1}"
fi
DURATION=${DURATION:-2}
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-1 100000}
A_DEPTHS=${A_DEPTHS:-1 16 64}
B_INFLIGHT=${B_INFLIGHT:-1 64}
MODE=${MODE:-pass}
ALGORITHM=${ALGORITHM:-fixed_window}
ALGORITHMS=${ALGORITHMS:-fixed_window gcra token_bucket sliding_window}

source scripts/deps.sh
sluice_install_deps redis-server redis-tools

BIN=${SLUICE_BENCH_REDIS:-build/release/bench/sluice_bench_redis}
if [[ -z "${SKIP_BUILD:-}" && -z "${SLUICE_BENCH_REDIS:-}" ]]; then
  timeout 900 cmake --preset release >/dev/null
  timeout 900 cmake --build build/release --target sluice_bench_redis >/dev/null
fi


STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-build/release/bench/redis-results/$STAMP}
mkdir -p "$OUT"
source bench/lib.sh  # start_bench_redis: PORT, REDIS_PID, WORK, RCLI; install_rlf_peer
install_rlf_peer     # PEER_VERSIONS
want=$PEER_VERSIONS
start_bench_redis

# Load the library as redis-benchmark will call it, and check its name.
library=$(timeout 10 "$BIN" --print-library | "${RCLI[@]}" -x FUNCTION LOAD REPLACE)
mapfile -t ARGS1 < <(timeout 10 "$BIN" --url "redis://127.0.0.1:$PORT" --print-fcall-args \
                       --algorithm "$ALGORITHM" --mode "$MODE" --keys 1 \
                       ${WINDOW_STATE:+--window-state "$WINDOW_STATE"} ${RATE:+--rate "$RATE"})
mapfile -t ARGSN < <(timeout 10 "$BIN" --url "redis://127.0.0.1:$PORT" --print-fcall-args \
                       --algorithm "$ALGORITHM" --mode "$MODE" --keys 2 \
                       ${WINDOW_STATE:+--window-state "$WINDOW_STATE"} ${RATE:+--rate "$RATE"})
[[ "$library" == "${ARGS1[1]}" ]] || { echo "FUNCTION LOAD gave $library, sluice calls ${ARGS1[1]}" >&2; exit 1; }

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: DURATION=$DURATION ROUNDS=$ROUNDS KEYS='$KEYS' A_DEPTHS='$A_DEPTHS' B_INFLIGHT='$B_INFLIGHT' MODE=$MODE ALGORITHM=$ALGORITHM bench/redis/run.sh"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); kernel $(uname -r)"
  echo "redis: $(redis-server --version | cut -d' ' -f3); redis-benchmark from redis-tools $(dpkg-query -W -f='${Version}' redis-tools 2>/dev/null || echo '?'); node $(node --version); peer: rate-limiter-flexible ${want% *}, ioredis ${want#* }"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "function: $library; FCALL arguments: ${ARGS1[*]}"
} > "$OUT/machine.txt"

# Errors Redis answered, from INFO stats (redis-benchmark does not count them).
error_replies() { "${RCLI[@]}" INFO stats | tr -d '\r' | sed -n 's/^total_error_replies://p'; }
fcall_stat() {  # "calls usec"
  "${RCLI[@]}" INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_fcall:calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2/p'
}
# redis-server's CPU time so far, user + system, in microseconds.
redis_cpu_us() {
  awk -v hz="$(getconf CLK_TCK)" '{ print int(($14 + $15) * 1000000 / hz) }' "/proc/$REDIS_PID/stat"
}
loadavg() { cut -d' ' -f1 /proc/loadavg; }

RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
record() {  # $1 case, $2 JSON line from a side, $3 redis-server CPU us over it: appended with the case and the load
  python3 -c 'import json,sys; d=json.loads(sys.argv[2]); d["case"]=sys.argv[1]; d["load1"]=float(sys.argv[3]); d["redis_cpu_us_per_decision"]=round(float(sys.argv[4]) / max(d["decisions"], 1), 2); print(json.dumps(d))' \
    "$1" "$2" "$(loadavg)" "$3" | tee -a "$RESULTS"
}
# measured NAME COMMAND...: runs a side, records its line with redis-server's
# CPU time over it; prints the line.
# Every run starts on an empty keyspace: the keys the run before it left
# (the peer's live its 1 s window) would otherwise expire, and be counted,
# during this one.
measured() {
  local name=$1 cpu0 line
  shift
  "${RCLI[@]}" FLUSHALL >/dev/null
  cpu0=$(redis_cpu_us)
  line=$("$@")
  record "$name" "$line" "$(( $(redis_cpu_us) - cpu0 ))" >/dev/null
  echo "$line"
}

run_sluice() {  # $1 depth $2 keys $3 algorithm [$4 lease]
  timeout $((DURATION + 30)) "$BIN" --url "redis://127.0.0.1:$PORT" --depth "$1" --keys "$2" \
    --seconds "$DURATION" --algorithm "$3" --mode "$MODE" ${WINDOW_STATE:+--window-state "$WINDOW_STATE"} \
    ${RATE:+--rate "$RATE"} ${4:+--lease "$4"}
}

# redis-benchmark runs a request count, not a time: N from the last rate
# measured for this case (the peer's own once it has one), so each run lasts
# about DURATION seconds.
run_redis_benchmark() {  # $1 depth $2 keys $3 expected rate
  local n args errs0 calls0 csv
  # A multiple of the depth: redis-benchmark sends whole pipelines.
  n=$(python3 -c "d = $1; print(max(1000, int(float('$3') * $DURATION)) // d * d + d)")
  if [[ "$2" == 1 ]]; then args=("${ARGS1[@]}"); else args=(-r "$2" "${ARGSN[@]}"); fi
  errs0=$(error_replies); stat0=$(fcall_stat)
  csv=$(timeout $((DURATION * 10 + 30)) redis-benchmark -p "$PORT" -c 1 -P "$1" -n "$n" --csv \
          "${args[@]}" | tail -1)
  python3 - "$csv" "$1" "$2" "$n" "$(( $(error_replies) - errs0 ))" \
          "$stat0" "$(fcall_stat)" <<'PY'
import csv, json, sys
row = next(csv.reader([sys.argv[1]]))
depth, keys, n, errors = map(int, sys.argv[2:6])
(c0, u0), (c1, u1) = (map(int, a.split()) for a in sys.argv[6:8])
calls = c1 - c0
print(json.dumps({"side": "redis-benchmark", "depth": depth, "keys": keys, "decisions": n,
                  "decisions_per_s": float(row[1]), "p50_us": float(row[4]) * 1000,
                  "p99_us": float(row[6]) * 1000, "errors": errors,
                  "calls_per_decision": round(calls / n, 3),
                  "redis_us_per_decision": round((u1 - u0) / n, 2)}))
PY
}

run_rlf() {  # $1 in flight $2 keys
  timeout $((DURATION + 30)) node "$HERE/rlf_bench.js" --port "$PORT" --inflight "$1" \
    --keys "$2" --seconds "$DURATION" --mode "$MODE"
}

rate_of() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decisions_per_s"])' "$1"; }

for keys in $KEYS; do
  for depth in $A_DEPTHS; do
    name="A-depth$depth-keys$keys"
    expected=""
    for round in $(seq "$ROUNDS"); do
      line=$(measured "$name" run_sluice "$depth" "$keys" "$ALGORITHM")
      [[ -z "$expected" ]] && expected=$(rate_of "$line")
      line=$(measured "$name" run_redis_benchmark "$depth" "$keys" "$expected")
      expected=$(rate_of "$line")
    done
    echo "done $name" >&2
  done
  for inflight in $B_INFLIGHT; do
    for algorithm in $ALGORITHMS; do
      name="B-inflight$inflight-keys$keys-$algorithm"
      for round in $(seq "$ROUNDS"); do
        measured "$name" run_sluice "$inflight" "$keys" "$algorithm" "${LEASE:-}" >/dev/null
        measured "$name" run_rlf "$inflight" "$keys" >/dev/null
      done
      echo "done $name" >&2
    done
  done
done

# The floor of one decision in flight: a bare PING, one at a time, on the
# same redis-server (no script, no client library), ROUNDS times. No client
# making one round trip per decision can go faster.
if [[ " $B_INFLIGHT " == *" 1 "* || " $A_DEPTHS " == *" 1 "* ]]; then
  for round in $(seq "$ROUNDS"); do
    timeout $((DURATION * 10 + 30)) redis-benchmark -p "$PORT" -c 1 -P 1 -t ping \
      -n $((25000 * ${DURATION%.*})) --csv | tail -1 |
      python3 -c 'import csv, json, sys; r = next(csv.reader(sys.stdin)); print(json.dumps({"case": "floor-ping-depth1", "side": "redis-benchmark PING", "decisions_per_s": float(r[1])}))' \
      >> "$OUT/floor.jsonl"
  done
  echo "done floor-ping-depth1" >&2
fi

python3 "$HERE/summarize.py" "$OUT" | tee "$OUT/summary.md"
echo "results: $OUT" >&2
