#!/usr/bin/env bash
# sluice serve with its Redis store, end to end over HTTP: wrk POSTs
# /v1/check ({"policy": ..., "key": ...}) to one `sluice serve` (THREADS)
# whose policies are global, in one redis-server this script starts
# (loopback, a free port, no persistence):
#
#   fleet: for each of ALGORITHMS, one sluice process with one policy named
#          after the algorithm, a rate nobody reaches (nothing is denied),
#          keys "user-<n>" drawn uniformly among KEYS. Reported: requests/s,
#          p50 / p99 latency, non-2xx answers, Redis calls per decision (below
#          1 when sluice coalesced the decisions in flight into one call) and
#          redis-server's CPU time (user + system, /proc/PID/stat) per
#          decision sent to Redis; results.jsonl also holds the commands
#          the function ran per decision (commands_per_decision, from INFO
#          commandstats). After each of these runs, on the same
#          redis-server, rate-limiter-flexible's RateLimiterRedis (its fixed
#          window) three times: in process (rlf_bench.js, CONNECTIONS consume() calls in
#          flight over the same KEYS), once as fast as it goes and once at
#          the requests a second sluice's run reached (--rate: Redis as
#          busy as under sluice; a Redis mostly idle spends more CPU on the
#          same work), and behind HTTP (rlf_serve.js: a Node
#          server answering the same POST /v1/check from the same wrk
#          script), each with its redis-server CPU per consume(); the table
#          gives sluice's CPU per decision over each (the target: at most
#          0.5). Every run starts on an empty keyspace.
#   abuse: one key hammered by CONNECTIONS connections, under a limit of 100/10s
#          (fixed_window and gcra). Reported: requests/s, how many were denied
#          (429), the Redis calls they cost, per second and per 10-second
#          retry period, and the denials sluice answered without a call
#          (Redis had denied that key, and the wait it named had not passed:
#          until the window ends for fixed_window; for gcra, which lets one
#          more through every 100 ms, 100 ms at a time).
#
# Counts come from sluice's own /metrics (admin listener), as deltas over
# each wrk run: sluice_redis_calls_total, sluice_redis_decisions_total,
# sluice_redis_single_calls_total (the share of calls that carried one
# decision), sluice_redis_denials_answered_total,
# sluice_http_responses_total{code}.
# Every run is repeated ROUNDS times; the tables show medians.
#
# Usage: bench/redis/serve.sh                           # ~4 minutes
#        DURATION=2 ROUNDS=1 bench/redis/serve.sh       # smoke run, ~1.5 minutes
# Variables: DURATION (5, seconds per wrk run), ROUNDS (2), KEYS (100000),
#   CONNECTIONS (64: wrk's connections, 2 threads, or 1 for 1 connection;
#   the peer in process keeps as many consume() calls in flight), THREADS
#   (sluice serve's server.threads; 0, its default: one per CPU it may run
#   on, so 1 with REDIS_CPU on 2 cores, where wrk shares that one CPU),
#   ALGORITHMS ("fixed_window gcra token_bucket sliding_window"),
#   ABUSE_ALGORITHMS ("fixed_window gcra"), OUT (the results folder),
#   SLUICE (the binary: build/release/sluice, built when missing; another
#   build's binary compares two versions), LINGER (store.redis.linger; unset:
#   the default), CALLS_IN_FLIGHT (store.redis.calls_in_flight; unset: the
#   default), WINDOW_STATE (store.redis.window_state: text or integer;
#   unset: the default), RATE (the fleet's limit, 1000000/s; a
#   sliding_window above about 5.9 million keeps text), REDIS_CPU (a CPU number: redis-server runs on that CPU
#   alone and everything else, sluice, the peer, wrk, on the others, as a
#   Redis with a core of its own; unset: nothing is pinned), REDIS_CPU_SHARE
#   (a percentage of one CPU: redis-server gets no more, through the
#   kernel's CPU bandwidth control in 10 ms periods, so that it is busy to
#   its ceiling, as under a fleet, where on this machine alone it would
#   mostly wait; needs a writable cpu cgroup, v2 or v1; unset: no limit).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-2}
KEYS=${KEYS:-100000}
ALGORITHMS=${ALGORITHMS:-fixed_window gcra token_bucket sliding_window}
ABUSE_ALGORITHMS=${ABUSE_ALGORITHMS:-fixed_window gcra}
RATE=${RATE:-1000000/s}                # the fleet's limit: a rate nobody reaches
ABUSE_RATE=100/10s ABUSE_PERIOD_S=10   # the abuse case's limit, and its period
CONNECTIONS=${CONNECTIONS:-64}         # wrk's connections, and the peer's consume() calls in flight
WRK_THREADS=$((CONNECTIONS < 2 ? 1 : 2))
THREADS=${THREADS:-0}                  # sluice serve's server.threads (0, its default: one per CPU it may run on)

source scripts/deps.sh
sluice_install_deps redis-server redis-tools wrk

# REDIS_CPU: redis-server on that CPU, the rest (LOAD) on the others.
REDIS_PIN=() LOAD=()
if [[ -n "${REDIS_CPU:-}" ]]; then
  others=$(seq 0 $(($(nproc) - 1)) | grep -vx "$REDIS_CPU" | paste -sd,)
  REDIS_PIN=(taskset -c "$REDIS_CPU") LOAD=(taskset -c "$others")
fi

SLUICE="${SLUICE:-$PWD/build/release/sluice}"
if [[ ! -x "$SLUICE" ]]; then
  timeout 900 cmake --preset release >/dev/null
  timeout 900 cmake --build build/release --target sluice >/dev/null
fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-build/release/bench/redis-serve-results/$STAMP}
mkdir -p "$OUT"
WORK=$(mktemp -d)
REDIS_PID="" SLUICE_PID=""
REDIS_CGROUP=""
cleanup() {
  for pid in $SLUICE_PID $REDIS_PID; do kill "$pid" 2>/dev/null || true; done
  for pid in $SLUICE_PID $REDIS_PID; do wait "$pid" 2>/dev/null || true; done
  [[ -z "$REDIS_CGROUP" ]] || rmdir "$REDIS_CGROUP" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

source bench/lib.sh  # free_port, wait_port, install_rlf_peer
install_rlf_peer     # PEER_VERSIONS

# --- one redis-server for every run; persistence off: no fork mid-run ---
REDIS_PORT=$(free_port)
"${REDIS_PIN[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --dir "$WORK" --logfile "$WORK/redis.log" &
REDIS_PID=$!
wait_port "$REDIS_PORT"
# REDIS_CPU_SHARE: a cgroup of its own for redis-server, at that share of
# one CPU a 10 ms period.
if [[ -n "${REDIS_CPU_SHARE:-}" ]]; then
  quota=$((REDIS_CPU_SHARE * 100))
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    REDIS_CGROUP=/sys/fs/cgroup/sluice-bench-redis-$$
    mkdir "$REDIS_CGROUP" && echo "$quota 10000" > "$REDIS_CGROUP/cpu.max"
  elif [[ -d /sys/fs/cgroup/cpu ]]; then
    REDIS_CGROUP=/sys/fs/cgroup/cpu/sluice-bench-redis-$$
    mkdir "$REDIS_CGROUP" && echo 10000 > "$REDIS_CGROUP/cpu.cfs_period_us" &&
      echo "$quota" > "$REDIS_CGROUP/cpu.cfs_quota_us"
  else
    echo "REDIS_CPU_SHARE: no cpu cgroup to limit redis-server with" >&2
    exit 2
  fi
  echo "$REDIS_PID" > "$REDIS_CGROUP/cgroup.procs"
fi
RCLI=(timeout 10 redis-cli -p "$REDIS_PORT")

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: DURATION=$DURATION ROUNDS=$ROUNDS KEYS=$KEYS RATE=$RATE ALGORITHMS='$ALGORITHMS' ABUSE_ALGORITHMS='$ABUSE_ALGORITHMS'${LINGER:+ LINGER=$LINGER}${CALLS_IN_FLIGHT:+ CALLS_IN_FLIGHT=$CALLS_IN_FLIGHT}${WINDOW_STATE:+ WINDOW_STATE=$WINDOW_STATE}${REDIS_CPU_SHARE:+ REDIS_CPU_SHARE=$REDIS_CPU_SHARE} bench/redis/serve.sh"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); kernel $(uname -r)"
  echo "redis: $(redis-server --version | cut -d' ' -f3); $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2); sluice serve threads $THREADS (0: one per CPU it may run on); wrk -t$WRK_THREADS -c$CONNECTIONS -d${DURATION}s"
  echo "peer: rate-limiter-flexible ${PEER_VERSIONS% *}, ioredis ${PEER_VERSIONS#* }, node $(node --version), $CONNECTIONS in flight"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  if [[ -n "${REDIS_CPU:-}" ]]; then
    echo "pinned: redis-server on CPU $REDIS_CPU, sluice, the peer and wrk on CPU ${LOAD[2]}"
  else
    echo "pinned: no"
  fi
  [[ -z "${REDIS_CPU_SHARE:-}" ]] || echo "redis-server limited to ${REDIS_CPU_SHARE}% of one CPU"
} > "$OUT/machine.txt"

# redis-server's CPU time so far, user + system, in microseconds.
redis_cpu_us() {
  awk -v hz="$(getconf CLK_TCK)" '{ print int(($14 + $15) * 1000000 / hz) }' "/proc/$REDIS_PID/stat"
}
# ... of which in the kernel (system time).
redis_sys_us() {
  awk -v hz="$(getconf CLK_TCK)" '{ print int($15 * 1000000 / hz) }' "/proc/$REDIS_PID/stat"
}
# Redis' own time inside FCALL so far (INFO commandstats), in microseconds.
fcall_us() {
  "${RCLI[@]}" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_fcall:.*,usec=\([0-9]*\),.*/\1/p' | grep . || echo 0
}
# Calls of every command so far (INFO commandstats, which counts the
# commands a function runs too), as one JSON object.
command_calls() {
  "${RCLI[@]}" INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_\([a-z|]*\):calls=\([0-9]*\),.*/"\1": \2/p' | paste -sd, | sed 's/^/{/; s/$/}/'
}
# sluice's counters now, as one JSON object: sums over labels, and the main
# listener's responses by code (the admin listener counts these fetches).
metrics() {  # $1 admin port
  timeout 10 python3 - "$1" <<'PY'
import json, re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
m = {}
for line in text.splitlines():
    if line.strip() and not line.startswith("#"):
        name, value = line.rsplit(" ", 1)
        code = re.search(r'listener="main",code="(\d+)"', name)
        key = f"http_{code.group(1)}" if code else name.split("{")[0]
        m[key] = m.get(key, 0) + float(value)
print(json.dumps(m))
PY
}

# start_sluice ALGORITHM LIMIT: one sluice serve with one global policy named
# ALGORITHM, LIMIT its YAML limit map. The policy's `key` parts are for the
# gateway and auth_request; /v1/check takes the key from the body.
start_sluice() {
  SLUICE_PORT=$(free_port); SLUICE_ADMIN=$(free_port)
  cat > "$WORK/sluice.yaml" <<CONF
server: {listen: 127.0.0.1:$SLUICE_PORT, admin: 127.0.0.1:$SLUICE_ADMIN, threads: $THREADS}
store:
  redis: {url: "redis://127.0.0.1:$REDIS_PORT", timeout: 50ms${LINGER:+, linger: $LINGER}${CALLS_IN_FLIGHT:+, calls_in_flight: $CALLS_IN_FLIGHT}${WINDOW_STATE:+, window_state: $WINDOW_STATE}}
policies:
  - name: $1
    limits: [$2]
CONF
  timeout 10 "$SLUICE" serve --config "$WORK/sluice.yaml" --check >/dev/null
  "${LOAD[@]}" "$SLUICE" serve --config "$WORK/sluice.yaml" 2>>"$OUT/sluice.log" &
  SLUICE_PID=$!
  wait_port "$SLUICE_PORT" && wait_port "$SLUICE_ADMIN"
}
stop_sluice() {
  kill "$SLUICE_PID"
  timeout 30 tail --pid="$SLUICE_PID" -f /dev/null
  wait "$SLUICE_PID" 2>/dev/null || true
  SLUICE_PID=""
}

# wrk scripts. fleet: a key drawn uniformly among KEYS, each wrk thread with
# its own seed. abuse: every request the same, for the same key.
write_lua() {  # $1 case, $2 policy
  printf '%s\n' 'wrk.method = "POST"' 'wrk.headers["Content-Type"] = "application/json"' > "$WORK/req.lua"
  if [[ "$1" == fleet ]]; then
    cat >> "$WORK/req.lua" <<LUA
local threads = 0
function setup(thread) thread:set("seed", threads); threads = threads + 1 end
function init(args) math.randomseed(42 + seed) end
function request()
  return wrk.format(nil, nil, nil, '{"policy":"$2","key":"user-' .. math.random($KEYS) .. '"}')
end
LUA
  else
    echo "wrk.body = '{\"policy\":\"$2\",\"key\":\"abuser\"}'" >> "$WORK/req.lua"
  fi
}

RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
# measure CASE ALGORITHM ROUND: one wrk run against the running sluice; its
# line (wrk's numbers, the metric deltas, redis-server's CPU) to results.jsonl.
measure() {
  local m0 m1 cpu0 cpu1 f0 f1 sys0 sys1 c0 c1
  m0=$(metrics "$SLUICE_ADMIN"); c0=$(command_calls); f0=$(fcall_us); cpu0=$(redis_cpu_us); sys0=$(redis_sys_us)
  "${LOAD[@]}" timeout $((DURATION + 30)) wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$WORK/req.lua" \
    "http://127.0.0.1:$SLUICE_PORT/v1/check" > "$WORK/wrk.txt" 2>&1
  cpu1=$(redis_cpu_us); sys1=$(redis_sys_us); f1=$(fcall_us); c1=$(command_calls); m1=$(metrics "$SLUICE_ADMIN")
  # non_2xx: wrk's count; http_codes: sluice's own, which also counts the
  # answers still in flight when wrk stopped.
  timeout 10 python3 - "$1" "$2" "$3" "$WORK/wrk.txt" "$m0" "$m1" $((cpu1 - cpu0)) \
      "$DURATION" "$ABUSE_PERIOD_S" "$KEYS" $((f1 - f0)) $((sys1 - sys0)) "$c0" "$c1" <<'PY' >> "$RESULTS"
import json, re, sys
case, alg, rnd, wrk_file, m0, m1, cpu, duration, period, keys, fcall, system, c0, c1 = sys.argv[1:]
c0, c1 = json.loads(c0), json.loads(c1)
text = open(wrk_file).read()
m0, m1, cpu, duration, period = json.loads(m0), json.loads(m1), int(cpu), float(duration), float(period)
d = lambda k: int(m1.get(k, 0) - m0.get(k, 0))
def latency_us(q):
    m = re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)\b", text)
    return round(float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)], 1)
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errs = re.search(r"Socket errors: (.*)", text)
codes = {k[5:]: d(k) for k in set(m0) | set(m1) if k.startswith("http_") and d(k)}
calls, decisions = d("sluice_redis_calls_total"), d("sluice_redis_decisions_total")
r = {"case": case, "algorithm": alg, "round": int(rnd), "seconds": duration,
     "keys": 1 if case == "abuse" else int(keys),
     "requests": int(re.search(r"(\d+) requests in", text).group(1)),
     "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),
     "p50_us": latency_us(50), "p99_us": latency_us(99),
     "non_2xx": int(non2xx.group(1)) if non2xx else 0,
     "socket_errors": errs.group(1) if errs else "", "http_codes": codes,
     "redis_calls": calls, "redis_decisions": decisions,
     "denials_answered": d("sluice_redis_denials_answered_total"),
     "redis_errors": d("sluice_redis_errors_total") + d("sluice_redis_timeouts_total"),
     "store_errors": d("sluice_store_errors_total"),
     "calls_per_decision": round(calls / max(decisions, 1), 4),
     "single_call_share": round(d("sluice_redis_single_calls_total") / max(calls, 1), 3),
     "redis_calls_per_s": round(calls / duration, 1),
     "redis_calls_per_period": round(calls / duration * period, 1),
     "redis_cpu_us": cpu, "redis_cpu_us_per_decision": round(cpu / max(decisions, 1), 3),
     "redis_system_us_per_decision": round(int(system) / max(decisions, 1), 3),
     "fcall_us_per_decision": round(int(fcall) / max(decisions, 1), 3),
     # Each command's calls per decision, those a function runs included.
     "commands_per_decision": {k: round((c1[k] - c0.get(k, 0)) / max(decisions, 1), 3)
                               for k in sorted(c1) if k not in ("info", "fcall") and c1[k] > c0.get(k, 0)}}
print(json.dumps(r))
PY
}

# measure_peer ALGORITHM ROUND [RATE]: the peer with CONNECTIONS consume() calls in
# flight for DURATION over KEYS keys, on an empty keyspace; its line
# (rlf_bench.js's JSON and redis-server's CPU) to results.jsonl, as the case
# "peer" of the sluice run it follows; with RATE, its calls started no
# faster than RATE a second (the requests a second sluice's run reached),
# as the case "peer_paced".
measure_peer() {
  local line cpu0 cpu1 sys0 sys1 case=peer
  [[ -n "${3:-}" ]] && case=peer_paced
  "${RCLI[@]}" FLUSHALL >/dev/null
  cpu0=$(redis_cpu_us); sys0=$(redis_sys_us)
  line=$("${LOAD[@]}" timeout $((DURATION + 30)) node bench/redis/rlf_bench.js --port "$REDIS_PORT" \
           --inflight "$CONNECTIONS" --keys "$KEYS" --seconds "$DURATION" --mode pass --rate "${3:-0}")
  cpu1=$(redis_cpu_us); sys1=$(redis_sys_us)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(case=sys.argv[6], algorithm=sys.argv[2], round=int(sys.argv[3])); n=max(d["decisions"], 1); d["redis_cpu_us_per_decision"]=round(int(sys.argv[4]) / n, 3); d["redis_system_us_per_decision"]=round(int(sys.argv[5]) / n, 3); print(json.dumps(d))' \
    "$line" "$1" "$2" $((cpu1 - cpu0)) $((sys1 - sys0)) "$case" >> "$RESULTS"
}

# measure_peer_http ALGORITHM ROUND: the peer behind HTTP (rlf_serve.js),
# driven by the same wrk script as sluice, on an empty keyspace; its line to
# results.jsonl as the case "peer_http".
measure_peer_http() {
  local out="$WORK/rlf_serve.out" pid port cpu0 cpu1
  : > "$out"
  "${LOAD[@]}" node bench/redis/rlf_serve.js --redis-port "$REDIS_PORT" --port 0 > "$out" 2>>"$OUT/rlf_serve.log" &
  pid=$!
  for _ in $(seq 200); do [[ -s "$out" ]] && break; sleep 0.05; done
  port=$(head -1 "$out")
  wait_port "$port"
  "${RCLI[@]}" FLUSHALL >/dev/null
  cpu0=$(redis_cpu_us)
  "${LOAD[@]}" timeout $((DURATION + 30)) wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$WORK/req.lua" \
    "http://127.0.0.1:$port/v1/check" > "$WORK/wrk_peer.txt" 2>&1
  cpu1=$(redis_cpu_us)
  kill -TERM "$pid"
  timeout 30 tail --pid="$pid" -f /dev/null
  wait "$pid" 2>/dev/null || true
  timeout 10 python3 - "$1" "$2" "$WORK/wrk_peer.txt" "$(tail -1 "$out")" $((cpu1 - cpu0)) <<'PY' >> "$RESULTS"
import json, re, sys
alg, rnd, wrk_file, served, cpu = sys.argv[1:]
text = open(wrk_file).read()
decisions = json.loads(served)["decisions"]
print(json.dumps({"case": "peer_http", "algorithm": alg, "round": int(rnd),
                  "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),
                  "decisions": decisions,
                  "redis_cpu_us_per_decision": round(int(cpu) / max(decisions, 1), 3)}))
PY
}

# --- fleet: many keys, nothing denied, one sluice per algorithm ---
for alg in $ALGORITHMS; do
  case $alg in
    token_bucket|gcra|leaky_bucket) limit="{algorithm: $alg, rate: $RATE, burst: ${RATE%%/*}}" ;;
    *) limit="{algorithm: $alg, rate: $RATE}" ;;
  esac
  start_sluice "$alg" "$limit"
  write_lua fleet "$alg"
  for round in $(seq "$ROUNDS"); do
    "${RCLI[@]}" FLUSHALL >/dev/null
    measure fleet "$alg" "$round"
    rate=$(tail -1 "$RESULTS" | python3 -c 'import json, sys; print(round(json.load(sys.stdin)["requests_per_s"]))')
    measure_peer "$alg" "$round"
    measure_peer "$alg" "$round" "$rate"
    measure_peer_http "$alg" "$round"
  done
  stop_sluice
  echo "done fleet $alg" >&2
done

# --- abuse: one key, a small limit; denials Redis made are answered locally ---
"${RCLI[@]}" FLUSHALL >/dev/null
for alg in $ABUSE_ALGORITHMS; do
  start_sluice "$alg" "{algorithm: $alg, rate: $ABUSE_RATE}"
  write_lua abuse "$alg"
  for round in $(seq "$ROUNDS"); do measure abuse "$alg" "$round"; done
  stop_sluice
  echo "done abuse $alg" >&2
done

# --- the tables: medians over the rounds ---
timeout 30 python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import collections, json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
runs = collections.defaultdict(list)
for line in (out / "results.jsonl").read_text().splitlines():
    r = json.loads(line)
    runs[(r["case"], r["algorithm"])].append(r)
med = lambda rs, f: statistics.median(r[f] for r in rs)
print((out / "machine.txt").read_text().rstrip())
print("\n## fleet: uniform keys, nothing denied (medians of", max(len(v) for v in runs.values()), "rounds)\n")
print("| algorithm | keys | requests/s | p50 us | p99 us | non-2xx | Redis calls per decision "
      "| calls of one decision (share of calls) | redis-server CPU us per decision | of which in the kernel | of which inside FCALL | peer in process: CPU us per consume() | CPU sluice / peer in process "
      "| peer in process at sluice's rate: requests/s | its CPU us per consume() | CPU sluice / it "
      "| peer behind HTTP: requests/s | peer behind HTTP: CPU us per consume() | CPU sluice / peer behind HTTP "
      "| Redis errors |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---|---:|")

def against(rs, peer):
    """The peer's median CPU per consume(), and sluice's CPU over it: median (per round)."""
    if not peer:
        return "- | -"
    by_round = {r["round"]: r for r in peer}
    ratios = [r["redis_cpu_us_per_decision"] / by_round[r["round"]]["redis_cpu_us_per_decision"]
              for r in rs if r["round"] in by_round]
    return (f"{med(peer, 'redis_cpu_us_per_decision'):.2f} | **{statistics.median(ratios):.2f}** "
            f"({', '.join(f'{x:.2f}' for x in ratios)})")

for (case, alg), rs in runs.items():
    if case == "fleet":
        http = runs.get(("peer_http", alg), [])
        http_rate = f"{med(http, 'requests_per_s'):.0f}" if http else "-"
        paced = runs.get(("peer_paced", alg), [])
        paced_rate = f"{med(paced, 'decisions_per_s'):.0f}" if paced else "-"
        print(f"| {alg} | {rs[0]['keys']} | {med(rs, 'requests_per_s'):.0f} | {med(rs, 'p50_us'):.0f} "
              f"| {med(rs, 'p99_us'):.0f} | {med(rs, 'non_2xx'):.0f} | {med(rs, 'calls_per_decision'):.3f} "
              f"| {med(rs, 'single_call_share'):.2f} | {med(rs, 'redis_cpu_us_per_decision'):.2f} | {med(rs, 'redis_system_us_per_decision'):.2f} "
              f"| {med(rs, 'fcall_us_per_decision'):.2f} "
              f"| {against(rs, runs.get(('peer', alg), []))} "
              f"| {paced_rate} | {against(rs, paced)} "
              f"| {http_rate} | {against(rs, http)} | {med(rs, 'redis_errors'):.0f} |")
print("\n## abuse: one key, limit 100/10s\n")
print("| algorithm | requests/s | requests | denied (429) | allowed (200) | Redis calls "
      "| decisions sent to Redis | denials answered locally | Redis calls/s "
      "| Redis calls per 10 s (the limit's period) | Redis errors |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (case, alg), rs in runs.items():
    if case == "abuse":
        code = lambda c: statistics.median(r["http_codes"].get(c, 0) for r in rs)
        print(f"| {alg} | {med(rs, 'requests_per_s'):.0f} | {med(rs, 'requests'):.0f} | {code('429'):.0f} "
              f"| {code('200'):.0f} | {med(rs, 'redis_calls'):.0f} | {med(rs, 'redis_decisions'):.0f} "
              f"| {med(rs, 'denials_answered'):.0f} | {med(rs, 'redis_calls_per_s'):.1f} "
              f"| {med(rs, 'redis_calls_per_period'):.1f} | {med(rs, 'redis_errors'):.0f} |")
PY
echo "results: $OUT" >&2
