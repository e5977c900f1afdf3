#!/usr/bin/env bash
# The instructions one decision costs Redis inside sluice's function:
# redis-server under valgrind's callgrind, counting only inside
# `fcallCommand` (the function, the commands it calls, their replies; not
# the reading of calls nor the writing of answers), while
# `sluice_bench_redis` decides for DURATION seconds with 64 in flight (one
# limit at a rate nobody reaches, keys "user-<n>" uniform among KEYS).
# Prints, per algorithm, the instructions, the calls and the commands the
# function ran (INFO commandstats) per decision.
#
# Unlike CPU time, the count does not move with the machine's load, so two
# builds of the function can be compared by it on a shared machine:
#
#   BENCH=/path/to/other/sluice_bench_redis bench/redis/instructions.sh
#
# With KEYS=100000 most keys are new or from an earlier window at each
# decision (under callgrind Redis decides a few thousand a second); with
# KEYS=1000 most are raised within their window.
#
# Usage: bench/redis/instructions.sh [ALGORITHM...]   (default: fixed_window
#          sliding_window gcra token_bucket)
# Variables: KEYS (100000), DURATION (4), WINDOW_STATE (text or integer:
#   store.redis.window_state; unset: the default), RATE (the limit, e.g.
#   100000/s; unset: 1000000/s; a sliding window above about 5.9 million
#   keeps text), BENCH (the benchmark binary;
#   build/release/bench/sluice_bench_redis, built when missing), KEEP (a
#   folder: each run's callgrind output is kept there, callgrind.<algorithm>,
#   for callgrind_annotate).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
KEYS=${KEYS:-100000}
DURATION=${DURATION:-4}
ALGORITHMS=("$@")
[[ ${#ALGORITHMS[@]} -eq 0 ]] && ALGORITHMS=(fixed_window sliding_window gcra token_bucket)

source scripts/deps.sh
sluice_install_deps valgrind redis-server
source bench/lib.sh  # release_binary, work_dir_with_cleanup, start_callgrind_redis
BENCH=$(release_binary "${BENCH:-}" sluice_bench_redis bench/sluice_bench_redis)

work_dir_with_cleanup  # WORK; stops SERVER_PID at exit

echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $BENCH; keys $KEYS, 64 in flight"
echo "| algorithm | decisions | calls per decision | instructions per decision | commands per decision |"
echo "|---|---:|---:|---:|---|"
for algorithm in "${ALGORITHMS[@]}"; do
  start_callgrind_redis  # PORT, SERVER_PID
  timeout $((DURATION + 120)) "$BENCH" --url "redis://127.0.0.1:$PORT" --depth 64 \
    --keys "$KEYS" --seconds "$DURATION" --algorithm "$algorithm" \
    ${WINDOW_STATE:+--window-state "$WINDOW_STATE"} ${RATE:+--rate "$RATE"} > "$WORK/bench.json"
  # The commands the function ran, per decision (INFO commandstats counts them).
  timeout 30 redis-cli -p "$PORT" INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_\([a-z]*\):calls=\([0-9]*\),.*/\1 \2/p' > "$WORK/commands.txt"
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  if [[ -n "${KEEP:-}" ]]; then mkdir -p "$KEEP" && cat "$WORK"/callgrind.out.* > "$KEEP/callgrind.$algorithm"; fi
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$WORK"/callgrind.out.*)
  python3 - "$algorithm" "$total" "$WORK/bench.json" "$WORK/commands.txt" <<'PY'
import json, sys
algorithm, total, path, commands = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
run = json.load(open(path))
d = run["decisions"]
ran = [line.split() for line in open(commands)]
ran = ", ".join(f"{name.upper()} {int(n) / d:.2f}" for name, n in ran
                if name not in ("fcall", "function", "info", "ping", "time", "hello", "client"))
print(f"| {algorithm} | {d} | {run['calls_per_decision']} | {total / d:,.0f} | {ran} |")
PY
done
