#!/usr/bin/env bash
# How the scheduler runs sluice's and NGINX's workers under wrk, run by run:
# p99 latency beside each worker thread's turns on a CPU (schedstat: time
# run, time waiting to run, number of turns; /proc/PID/task/TID/status:
# voluntary and involuntary switches), so that a run's p99 can be read
# against how long its workers ran at a time.
#
# Each round runs sluice (GET /v1/auth/bench, a gcra policy nobody reaches,
# one key) with server.cpu_affinity (`sluice`: each thread on a CPU,
# answering the connections whose client sends from it) and without
# (`sluice-any`, the default), and NGINX (limit_req on the same key
# in front of empty_gif), all with WORKERS workers, under wrk -t2 -c64 for
# DURATION seconds, alternately.
# One line per run: server, req/s, p50, p99, then per worker thread its mean
# turn (ms run per turn), the time it waited to run, and its voluntary /
# involuntary switches.
#
# Usage: bench/http/turns.sh [ROUNDS=8] [DURATION_S=4] [WORKERS=2]
# Loopback only; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/deps.sh
sluice_install_deps nginx-light wrk
ROUNDS=${1:-8}
DURATION=${2:-4}
WORKERS=${3:-2}

cmake --preset release >/dev/null
cmake --build build/release --target sluice >/dev/null
SLUICE="$PWD/build/release/sluice"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
source bench/lib.sh  # free_port, wait_port, work_dir_with_cleanup
work_dir_with_cleanup  # WORK; stops SERVER_PID at exit

PORT=$(free_port)
ADMIN=$(free_port)
for affinity in true false; do
  cat > "$WORK/sluice-$affinity.yaml" <<CONF
server: {listen: 127.0.0.1:$PORT, admin: 127.0.0.1:$ADMIN, threads: $WORKERS,
         cpu_affinity: $affinity, decision: {on_gateway_listener: true}}
policies:
  - name: bench
    key: ["header:X-Key"]
    limits: [{algorithm: gcra, rate: 1000000/s, burst: 1000000}]
CONF
done
cat > "$WORK/nginx.conf" <<CONF
worker_processes $WORKERS;
daemon off; pid $WORK/nginx.pid; error_log $WORK/error.log error;
events { worker_connections 4096; }
http { access_log off;
  limit_req_zone \$http_x_key zone=z:64m rate=1000000r/s;
  limit_req_status 429;
  server { listen 127.0.0.1:$PORT; keepalive_requests 100000000;
    location / { limit_req zone=z burst=1000000 nodelay; empty_gif; } } }
CONF

# Every worker thread: name, tid, voluntary, involuntary, run ns, wait ns, turns.
threads() {  # $@ pids
  for p in "$@"; do
    for t in /proc/"$p"/task/*; do
      printf '%s %s %s %s\n' "$(cat "$t/comm")" "${t##*/}" \
        "$(awk '/^voluntary_ctxt_switches/ {v=$2} /^nonvoluntary_ctxt_switches/ {n=$2} END {print v, n}' "$t/status")" \
        "$(cat "$t/schedstat")"
    done
  done
}

run() {  # $1 sluice|sluice-any|nginx
  if [[ $1 == sluice* ]]; then
    local affinity=true
    [[ $1 == sluice-any ]] && affinity=false
    "$SLUICE" serve --config "$WORK/sluice-$affinity.yaml" 2>"$WORK/sluice.log" &
    SERVER_PID=$!
    url="http://127.0.0.1:$PORT/v1/auth/bench"
  else
    "$NGINX" -c "$WORK/nginx.conf" -p "$WORK" &
    SERVER_PID=$!
    url="http://127.0.0.1:$PORT/decide"
  fi
  wait_port "$PORT"
  sleep 0.5
  local pids=("$SERVER_PID")
  [[ $1 == nginx ]] && mapfile -t -O 1 pids < <(pgrep -P "$SERVER_PID")
  threads "${pids[@]}" > "$WORK/before"
  timeout $((DURATION + 30)) wrk -t2 -c64 -d"${DURATION}s" --latency -H 'X-Key: k1' "$url" > "$WORK/wrk.txt" 2>&1
  threads "${pids[@]}" > "$WORK/after"
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""
  python3 - "$1" "$WORK" <<'PY'
import re, sys
who, work = sys.argv[1], sys.argv[2]
text = open(f"{work}/wrk.txt").read()
def ms(q):
    m = re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)\b", text)
    return float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
def read(name):
    return {l.split()[1]: l.split() for l in open(f"{work}/{name}") if l.strip()}
before, after = read("before"), read("after")
parts = []
for tid, a in after.items():
    b = before.get(tid)
    if b is None:
        continue
    vol, invol = int(a[2]) - int(b[2]), int(a[3]) - int(b[3])
    run_ns, wait_ns, turns = int(a[4]) - int(b[4]), int(a[5]) - int(b[5]), int(a[6]) - int(b[6])
    if turns < 100:  # not a worker of this load
        continue
    parts.append(f"turn {run_ns / turns / 1e6:.3f} ms, waited {wait_ns / 1e9:.2f} s, switches {vol}/{invol}")
print(f"{who:10} {rps:9.0f} req/s  p50 {ms(50):6.3f} ms  p99 {ms(99):6.3f} ms  | " + " | ".join(parts))
PY
}

echo "date: $(date -u '+%F %H:%M UTC'), $(nproc) cores, kernel $(uname -r); wrk -t2 -c64 -d${DURATION}s, $WORKERS workers"
for round in $(seq "$ROUNDS"); do
  run sluice
  run sluice-any
  run nginx
done
