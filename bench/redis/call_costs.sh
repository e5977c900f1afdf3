#!/usr/bin/env bash
# What a call and a command cost Redis inside a function: redis-server under
# valgrind's callgrind, counting only inside `fcallCommand`, while
# redis-benchmark sends N calls of each kind below, one at a time (the
# counters zeroed before each kind and dumped after it):
#
#   sluice, 1 decision    sluice's function, one gcra decision on a new key
#   sluice, 10 decisions  the same, a run of ten (what a call costs whatever
#                         it carries is about 1-decision - (10 - 1) / 9)
#   empty function        a function that returns 1: Redis' own FCALL
#   TIME                  a function that calls TIME
#   GET, SET ... NX GET (found), SET ... PXAT, SET ... KEEPTTL, INCRBY,
#   PEXPIREAT             a function that runs the command on each of ten
#                         keys holding a state (less the empty function's
#                         cost, over ten: what the command costs through
#                         redis.call, its arguments and reply converted)
#   sluice, 1 decision, after LIMITS limits
#                         the first kind again, once the function has
#                         parsed and kept LIMITS distinct limits (a small
#                         table each)
#   sluice, 1 decision, after a hot text key
#                         the first kind again, after FILL text-form
#                         fixed_window decisions on one key (windows of
#                         30 s, its counts up to FILL), whose counts' texts
#                         the function keeps (what they cost every call is
#                         Redis' garbage collection, stepped every 50 calls)
#
# Instructions per call (per command for the last five). Like
# instructions.sh, the counts do not move with the machine's load.
#
# Usage: bench/redis/call_costs.sh
# Variables: N (calls of each kind, 2000), LIMITS (1000), FILL (12000),
#   BENCH (sluice_bench_redis, for
#   the function and its arguments; build/release/bench/sluice_bench_redis,
#   built when missing).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
N=${N:-2000}
FILL=${FILL:-12000}
LIMITS=${LIMITS:-1000}

source scripts/deps.sh
sluice_install_deps valgrind redis-server redis-tools
source bench/lib.sh  # release_binary, work_dir_with_cleanup, start_callgrind_redis
BENCH=$(release_binary "${BENCH:-}" sluice_bench_redis bench/sluice_bench_redis)

work_dir_with_cleanup  # WORK; stops SERVER_PID at exit
start_callgrind_redis  # PORT, SERVER_PID
CLI=(timeout 20 redis-cli -p "$PORT")

# sluice's function (loaded by the benchmark binary) and one decision's arguments.
timeout 60 "$BENCH" --url "redis://127.0.0.1:$PORT" --print-fcall-args --algorithm gcra \
  >"$WORK/args"
mapfile -t ARGS <"$WORK/args"  # FCALL, name, 1, key, d, cost, limit
FN=${ARGS[1]} COST=${ARGS[5]} LIMIT=${ARGS[6]}
KEY='sluice:{bench:user-__rand_int__}:gcra'
KEYS10=() HELD=()
for i in $(seq 10); do KEYS10+=("$KEY:$i"); HELD+=("call-costs:$i"); done

"${CLI[@]}" FUNCTION LOAD "#!lua name=call_costs
local function each(f) return function(keys) for i = 1, #keys do f(keys[i]) end return 1 end end
redis.register_function('cc_empty', function() return 1 end)
redis.register_function('cc_time', function() redis.call('TIME') return 1 end)
redis.register_function('cc_none', each(function(k) end))
redis.register_function('cc_get', each(function(k) redis.call('GET', k) end))
redis.register_function('cc_setnx', each(function(k)
  redis.call('SET', k, '12345', 'PXAT', '99999999999999', 'NX', 'GET') end))
redis.register_function('cc_setpxat', each(function(k)
  redis.call('SET', k, '12345', 'PXAT', '99999999999999') end))
redis.register_function('cc_keepttl', each(function(k) redis.call('SET', k, '12345', 'KEEPTTL') end))
redis.register_function('cc_incrby', each(function(k) redis.call('INCRBY', k, '256') end))
redis.register_function('cc_pexpireat', each(function(k)
  redis.call('PEXPIREAT', k, '99999999999999') end))" >/dev/null
for k in "${HELD[@]}"; do "${CLI[@]}" SET "$k" 1000 PXAT 99999999999999 >/dev/null; done

# Runs N calls of "$@" and prints the instructions per call inside
# fcallCommand (callgrind numbers its dumps: the last is the run's).
per_call() {
  timeout 60 callgrind_control -z "$SERVER_PID" >/dev/null 2>&1
  timeout 600 redis-benchmark -p "$PORT" -c 1 -n "$N" -r 100000000 "$@" >/dev/null
  timeout 60 callgrind_control -d "$SERVER_PID" >/dev/null 2>&1
  local dumps total
  dumps=$(find "$WORK" -name "callgrind.out.$SERVER_PID.*" | wc -l)
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$WORK/callgrind.out.$SERVER_PID.$dumps")
  echo $((total / N))
}

one=$(per_call FCALL "$FN" 1 "$KEY" d "$COST" "$LIMIT")
ten=$(per_call FCALL "$FN" 10 "${KEYS10[@]}" '*' 10 d "$COST" "$LIMIT")
empty=$(per_call FCALL cc_empty 0)
time_call=$(per_call FCALL cc_time 0)
none=$(per_call FCALL cc_none 10 "${HELD[@]}")
echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $(redis-server --version | cut -d' ' -f3); $N calls each"
echo "| call | instructions |"
echo "|---|---:|"
echo "| sluice, 1 decision (gcra, new key) | $one |"
echo "| sluice, 10 decisions | $ten |"
echo "| sluice, what a call costs whatever it carries | $(((10 * one - ten) / 9)) |"
echo "| sluice, a decision more | $(((ten - one) / 9)) |"
echo "| empty function | $empty |"
echo "| TIME (function) | $time_call |"
echo "| command | instructions through redis.call |"
echo "|---|---:|"
for kind in get:GET "setnx:SET ... NX GET (found)" "setpxat:SET ... PXAT" \
  "keepttl:SET ... KEEPTTL" incrby:INCRBY "pexpireat:PEXPIREAT (an expiry kept)"; do
  total=$(per_call FCALL "cc_${kind%%:*}" 10 "${HELD[@]}")
  echo "| ${kind#*:} | $(((total - none) / 10)) |"
done

heap() { "${CLI[@]}" INFO memory | tr -d '\r' | awk -F: '/^used_memory_vm_functions:/ {print $2}'; }
echo "| call, after what the function has kept | instructions | Lua heap of the functions, bytes |"
echo "|---|---:|---:|"
# LIMITS distinct limits, one decision each.
for i in $(seq "$LIMITS"); do
  printf 'FCALL %s 1 limits:%d d 1 "fw %d 1000000"\n' "$FN" "$i" $((1000 + i))
done | timeout 600 redis-cli -p "$PORT" >/dev/null
echo "| sluice, 1 decision, after $LIMITS limits | $(per_call FCALL "$FN" 1 "$KEY" d "$COST" "$LIMIT") | $(heap) |"
# A hot text-form key: one fixed_window key counted up to FILL in a window of 30 s.
timeout 600 redis-benchmark -p "$PORT" -c 1 -n "$FILL" -P 16 FCALL "$FN" 1 \
  'sluice:{bench:hot}:fixed_window' d 1 'fw 1000000000 30000000' >/dev/null
echo "| sluice, 1 decision, after $FILL decisions on one text-form key | $(per_call FCALL "$FN" 1 "$KEY" d "$COST" "$LIMIT") | $(heap) |"
