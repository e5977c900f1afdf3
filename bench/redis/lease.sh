#!/usr/bin/env bash
# Leased limits against the plain Redis path (docs/distributed.md, "Leased
# limits"), in one run on one redis-server this script starts (loopback, a
# free port, no persistence): PROCESSES sluice_bench_redis processes at
# once on ONE hot key of an ALGORITHM limit, DEPTH decisions in flight
# each, first without a lease and then with `--lease -1` (slices of size
# auto), alternately, ROUNDS times.
#
#   pass: a limit nobody reaches (10^9 per hour; a bucket: 10^8 per
#         second, its burst as much): decisions/s of the
#         processes together, and Redis calls per decision (FCALLs counted by
#         Redis over the run / decisions). Targets: >= 10x the plain path's
#         decisions/s, <= 1/100 calls per decision.
#   over: a limit the demand exceeds (LIMIT per hour, default 200000; a
#         bucket's burst is LIMIT too): what the processes admitted
#         together, against the limit (never more: a bucket may add what
#         refills meanwhile, LIMIT/3600 a second; less by at most the slices
#         outstanding when demand stopped).
#         Each round uses a fresh key space (FLUSHALL) and starts clear of an
#         hour boundary.
#
# Usage: bench/redis/lease.sh     # about 1 minute
# Variables: ALGORITHM (fixed_window; gcra, token_bucket), PROCESSES (3),
#   DEPTH (64), DURATION (3), ROUNDS (2), LIMIT (200000), SLUICE_BENCH_REDIS (a built sluice_bench_redis), SKIP_BUILD=1.
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."

ALGORITHM=${ALGORITHM:-fixed_window}
PROCESSES=${PROCESSES:-3}
DEPTH=${DEPTH:-64}
DURATION=${DURATION:-3}
ROUNDS=${ROUNDS:-2}
LIMIT=${LIMIT:-200000}
PASS_RATE=1000000000/1h
if [[ "$ALGORITHM" != fixed_window ]]; then PASS_RATE=100000000/1s; fi

source scripts/deps.sh
sluice_install_deps redis-server redis-tools

BIN=${SLUICE_BENCH_REDIS:-build/release/bench/sluice_bench_redis}
if [[ -z "${SKIP_BUILD:-}" && -z "${SLUICE_BENCH_REDIS:-}" ]]; then
  timeout 900 cmake --preset release >/dev/null
  timeout 900 cmake --build build/release --target sluice_bench_redis >/dev/null
fi

source bench/lib.sh  # start_bench_redis: PORT, REDIS_PID, WORK, RCLI
start_bench_redis

fcalls() {
  "${RCLI[@]}" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_fcall:calls=\([0-9]*\),.*/\1/p' |
    grep . || echo 0
}

# run CASE RATE LEASE: PROCESSES benchmarks at once; one JSON line per process
# in $WORK/CASE.jsonl, and a summary line on stdout.
run() {
  local name=$1 rate=$2 lease=$3 pids=() calls0 calls1
  "${RCLI[@]}" FLUSHALL >/dev/null
  if [[ "$rate" != "$PASS_RATE" ]]; then
    # Clear of an hour boundary (Redis' clock is this machine's).
    local left=$(( 3600 - $(date +%s) % 3600 ))
    if (( left < DURATION + 10 )); then sleep $((left + 1)); fi
  fi
  calls0=$(fcalls)
  for p in $(seq "$PROCESSES"); do
    timeout $((DURATION + 60)) "$BIN" --url "redis://127.0.0.1:$PORT" --depth "$DEPTH" --keys 1 \
      --seconds "$DURATION" --algorithm "$ALGORITHM" --rate "$rate" --lease "$lease" \
      --timeout-ms 5000 > "$WORK/$name.$p.json" &
    pids+=($!)
  done
  # A side that saw errors exits 1; its line (errors > 0) says so.
  for pid in "${pids[@]}"; do wait "$pid" || true; done
  calls1=$(fcalls)
  cat "$WORK/$name".*.json >> "$WORK/$name.jsonl"
  python3 - "$name" "$lease" "$rate" "$((calls1 - calls0))" "$WORK/$name".*.json <<'PY'
import json, sys
name, lease, rate, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rows = [json.loads(open(f).read()) for f in sys.argv[5:]]
decisions = sum(r["decisions"] for r in rows)
per_s = sum(r["decisions_per_s"] for r in rows)
allowed = sum(r["allowed"] for r in rows)
errors = sum(r["errors"] for r in rows)
print(json.dumps({"case": name, "lease": lease, "rate": rate, "decisions": decisions,
                  "decisions_per_s": round(per_s), "allowed": allowed, "errors": errors,
                  "redis_calls": calls, "calls_per_decision": round(calls / max(decisions, 1), 6),
                  "p99_us": max(r["p99_us"] for r in rows)}))
PY
}

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "$ALGORITHM: processes $PROCESSES, depth $DEPTH each, $DURATION s, one key; redis $(redis-server --version | cut -d' ' -f3)"
  for round in $(seq "$ROUNDS"); do
    run "pass-plain" "$PASS_RATE" 0
    run "pass-leased" "$PASS_RATE" -1
  done
  for round in $(seq "$ROUNDS"); do
    run "over-leased" "$LIMIT/1h" -1
  done
} | tee "$WORK/summary.txt"
python3 - "$WORK/summary.txt" "$LIMIT" "$ALGORITHM" "$DURATION" <<'PY'
import json, math, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
limit, algorithm, duration = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
# A bucket refills while the processes run (DURATION, plus 2 s for their
# start and stop): LIMIT per hour more.
most = limit if algorithm == "fixed_window" else limit + math.ceil(limit * (duration + 2) / 3600)
def med(case, field):
    vals = [l[field] for l in lines if l["case"] == case]
    return statistics.median(vals) if vals else float("nan")
plain, leased = med("pass-plain", "decisions_per_s"), med("pass-leased", "decisions_per_s")
print("\n| case | decisions/s (median) | Redis calls per decision |")
print("|---|---:|---:|")
print("| plain | %s | %.4f |" % (f"{plain:,.0f}", med("pass-plain", "calls_per_decision")))
print("| leased | %s | %.6f |" % (f"{leased:,.0f}", med("pass-leased", "calls_per_decision")))
print("\nleased / plain decisions/s: %.1fx (target >= 10x)" % (leased / plain))
for l in lines:
    if l["case"] == "over-leased":
        print("over the limit: %d admitted of %d requests, at most %d (%s), %d Redis calls" % (
            l["allowed"], l["decisions"], most,
            "over the limit!" if l["allowed"] > most else "short by %d" % (most - l["allowed"]),
            l["redis_calls"]))
PY
