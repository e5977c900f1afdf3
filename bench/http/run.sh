#!/usr/bin/env bash
# sluice's HTTP paths against NGINX, side by side, on this machine:
#
#   decision: wrk on sluice's GET /v1/auth/bench (key from X-Key; the same
#             request shape NGINX sees) and POST /v1/check (JSON), against
#             NGINX limit_req keyed on $http_x_key in front of empty_gif
#             (limit_req does not run in front of `return`);
#   gateway:  wrk through sluice (gcra policy, route to an upstream) against
#             NGINX proxy_pass + limit_req to the same upstream (a third,
#             separate NGINX answering `return 200`).
#
# Each case runs with 1 key and with 100k random keys, passing (a rate nobody
# reaches) and rejecting (1/min), sluice and NGINX alternately (A B A B ...),
# ROUNDS times; it prints medians of req/s, p99 latency and each server's
# own CPU time a request (user + system, /proc, NGINX's workers included;
# on a machine the client and the upstream share, the one figure of the
# server alone), the ratios of the medians, and each round's ratio.
# A second table says where a request's time went, medians again: the
# server's user and system CPU, the whole machine's busy CPU (client,
# server, upstream and the kernel's interrupts: on a machine that wrk keeps
# busy, req/s is about its cores over this), the TCP segments sent on
# loopback and (SYSCALLS=1, perf) the server's system calls; and, for
# sluice, the CPU a request it could spend and still make 1.1x NGINX's
# req/s, the rest of the machine's work as it was in sluice's runs.
# Both sides get WORKERS workers (NGINX worker_processes, sluice threads).
#
# sluice runs with server.cpu_affinity (CPU_AFFINITY=false to turn it off):
# wrk is a client on the same host, the case that option is for.
#
# TLS=1: both over HTTPS (sluice's server.tls, NGINX's `listen ... ssl`),
# with one certificate made for the run (EC P-256, by the openssl command);
# wrk keeps its connections, so this is the cost of the records.
# NEW_CONNECTIONS=1: every request asks "Connection: close", so every one
# is a new connection (with TLS=1, a new handshake; wrk resumes no session).
# UPSTREAM_TLS=1: the shared upstream speaks TLS, and both gateways reach
# it over kept-alive TLS connections, verifying its certificate (sluice's
# route `https://` with upstream_ca_file; NGINX's proxy_pass https:// with
# proxy_ssl_verify on); the gateway cases only make sense then.
#
# Usage: bench/http/run.sh [DURATION_S=5] [ROUNDS=3] [WORKERS=2] [CONNECTIONS=64]
# Variables: ONLY (a bash pattern: only the cases whose name it matches,
#   e.g. ONLY='gateway-pass-keys1'), CPU_AFFINITY, SLUICE (the binary:
#   build/release/sluice, built, unless another build's binary is named),
#   SYSCALLS=1 (count each server's system calls with perf stat; perf's
#   tracepoint costs a little CPU in both).
# Loopback only; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/deps.sh
sluice_install_deps nginx-light wrk openssl
DURATION=${1:-5}
ROUNDS=${2:-3}
WORKERS=${3:-2}
CONNS=${4:-64}
CPU_AFFINITY=${CPU_AFFINITY:-true}
TLS=${TLS:-0}
NEW_CONNECTIONS=${NEW_CONNECTIONS:-0}
UPSTREAM_TLS=${UPSTREAM_TLS:-0}
SYSCALLS=${SYSCALLS:-0}
[[ $SYSCALLS == 1 ]] && sluice_install_deps linux-perf

if [[ -z "${SLUICE:-}" ]]; then
  cmake --preset release >/dev/null
  cmake --build build/release --target sluice >/dev/null
  SLUICE="$PWD/build/release/sluice"
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

source bench/lib.sh  # free_port, wait_port

SCHEME=http NGINX_TLS="" SLUICE_TLS="" UP_SCHEME=http UP_LISTEN="" UP_SLUICE="" UP_NGINX=""
if [[ $TLS == 1 || $UPSTREAM_TLS == 1 ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
    -keyout "$WORK/tls.key" -out "$WORK/tls.pem" 2>/dev/null
fi
if [[ $UPSTREAM_TLS == 1 ]]; then
  UP_SCHEME=https
  UP_LISTEN="ssl; ssl_certificate $WORK/tls.pem; ssl_certificate_key $WORK/tls.key; ssl_protocols TLSv1.2 TLSv1.3"
  UP_SLUICE=", upstream_ca_file: $WORK/tls.pem"
  UP_NGINX="proxy_ssl_verify on; proxy_ssl_trusted_certificate $WORK/tls.pem; proxy_ssl_name 127.0.0.1;"
fi
if [[ $TLS == 1 ]]; then
  SCHEME=https
  NGINX_TLS="ssl; ssl_certificate $WORK/tls.pem; ssl_certificate_key $WORK/tls.key; ssl_protocols TLSv1.2 TLSv1.3"
  SLUICE_TLS="tls: {cert_file: $WORK/tls.pem, key_file: $WORK/tls.key},"
fi

UPSTREAM_PORT=$(free_port)
NGINX_PORT=$(free_port)
SLUICE_PORT=$(free_port)
SLUICE_ADMIN=$(free_port)

# --- the shared upstream: NGINX answering 200 with a small body ---
start_upstream_nginx "$NGINX" "$WORK/up" "$UPSTREAM_PORT" "$UP_LISTEN"
PIDS+=("$UPSTREAM_PID")
wait_port "$UPSTREAM_PORT"

start_nginx() {  # $1 rate (e.g. 1000000r/s) $2 burst
  mkdir -p "$WORK/ng"
  cat > "$WORK/ng/nginx.conf" <<CONF
worker_processes $WORKERS;
daemon off; pid $WORK/ng/nginx.pid; error_log $WORK/ng/error.log error;
events { worker_connections 4096; }
http { access_log off;
  limit_req_zone \$http_x_key zone=z:64m rate=$1;
  limit_req_status 429;
  upstream up { server 127.0.0.1:$UPSTREAM_PORT; keepalive 64; }
  server { listen 127.0.0.1:$NGINX_PORT $NGINX_TLS; keepalive_requests 100000000;
    location /decide { limit_req zone=z burst=$2 nodelay; empty_gif; }
    location / { limit_req zone=z burst=$2 nodelay; proxy_pass $UP_SCHEME://up; $UP_NGINX
                 proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
  "$NGINX" -c "$WORK/ng/nginx.conf" -p "$WORK/ng" & NGINX_PID=$!
  wait_port "$NGINX_PORT"
}

start_sluice() {  # $1 rate (e.g. 1000000/s) $2 burst
  cat > "$WORK/sluice.yaml" <<CONF
server: {listen: 127.0.0.1:$SLUICE_PORT, admin: 127.0.0.1:$SLUICE_ADMIN, threads: $WORKERS,
         cpu_affinity: $CPU_AFFINITY, $SLUICE_TLS
         max_connections: 100000, decision: {on_gateway_listener: true}}
store: {memory: {max_keys: 2000000}}
routes: [{name: up, match: {path_prefix: /}, upstream: "$UP_SCHEME://127.0.0.1:$UPSTREAM_PORT"$UP_SLUICE}]
policies:
  - name: bench
    match: {path_prefix: /}
    key: ["header:X-Key"]
    limits: [{algorithm: gcra, rate: $1, burst: $2}]
CONF
  "$SLUICE" serve --config "$WORK/sluice.yaml" 2>"$WORK/sluice.log" & SLUICE_PID=$!
  wait_port "$SLUICE_PORT"
}

write_lua() {  # $1 keys $2 method $3 path
  cat > "$WORK/req.lua" <<LUA
local keys, method, path, close = $1, "$2", "$3", $NEW_CONNECTIONS == 1
math.randomseed(42)
request = function()
  local key = "k" .. (keys == 1 and 1 or math.random(1, keys))
  local headers = method == "POST" and {["Content-Type"] = "application/json"} or {["X-Key"] = key}
  if close then headers["Connection"] = "close" end
  if method == "POST" then
    return wrk.format("POST", path, headers, '{"policy":"bench","key":"' .. key .. '"}')
  end
  return wrk.format("GET", path, headers)
end
LUA
}

# CPU time (user and system, in clock ticks) of process $1 and its
# children (NGINX's workers): fields 14 and 15 of /proc/PID/stat.
cpu_ticks() {
  local user=0 sys=0 pid fields
  for pid in "$1" $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    fields=$(sed 's/.*) //' /proc/"$pid"/stat 2>/dev/null) || continue
    read -r -a f <<< "$fields"
    user=$((user + f[11])) sys=$((sys + f[12]))  # utime, stime (f[0] is field 3)
  done
  echo "$user $sys"
}

# The whole machine's busy time (every CPU's, in clock ticks: user, nice,
# system, irq and softirq, /proc/stat; not the time the hypervisor stole) and the TCP segments sent (TcpOutSegs: on this
# loopback-only run, every segment of the client, the server and the
# upstream).
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat; }
tcp_segments() { awk '/^Tcp:/ {if (!h) {for (i = 1; i <= NF; i++) if ($i == "OutSegs") c = i; h = 1} else print $c}' /proc/net/snmp; }

# The system calls (perf's raw_syscalls:sys_enter) of process $1 and its
# children, counted in the background while wrk runs (SYSCALLS=1);
# syscalls_done waits for the count and sets CALLS (-1: not counted).
syscalls_start() {
  SYSCALL_PID=""
  [[ $SYSCALLS == 1 ]] || return 0
  local pids
  pids=$(echo "$1" $(cat /proc/"$1"/task/*/children 2>/dev/null) | tr ' ' ',')
  perf stat -x, -e raw_syscalls:sys_enter -p "$pids" -o "$WORK/perf.out" \
    -- sleep $((DURATION + 1)) 2>/dev/null &
  SYSCALL_PID=$!
}
syscalls_done() {
  CALLS=-1
  [[ -n $SYSCALL_PID ]] || return 0
  wait "$SYSCALL_PID" || true
  CALLS=$(awk -F, '/raw_syscalls/ {n = $1} END {print (n ~ /^[0-9]+$/ ? n : -1)}' "$WORK/perf.out")
}

# Prints, for one wrk run against the server on port $1 whose process (with
# its children) is $2: req/s, p99 ms, then a request's server CPU us (user +
# system), its user and its system us, the machine's busy us (every process
# and the kernel's interrupts: client, server, upstream), TCP segments and
# the server's system calls (-1 without SYSCALLS=1).
run_wrk() {
  local before after m_before m_after seg_before seg_after
  before=$(cpu_ticks "$2") m_before=$(machine_ticks) seg_before=$(tcp_segments)
  syscalls_start "$2"
  wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/req.lua" "$SCHEME://127.0.0.1:$1" \
    > "$WORK/wrk.out" 2>&1
  after=$(cpu_ticks "$2") m_after=$(machine_ticks) seg_after=$(tcp_segments)
  syscalls_done
  TICKS="$before $after $m_before $m_after $seg_before $seg_after $CALLS" python3 -c '
import os, re, sys
text = sys.stdin.read()
u0, s0, u1, s1, m0, m1, g0, g1, calls = (int(x) for x in os.environ["TICKS"].split())
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
requests = max(int(re.search(r"(\d+) requests in", text).group(1)), 1)
m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", text)
p99 = float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
us = 1e6 / os.sysconf("SC_CLK_TCK") / requests  # microseconds a request per tick
user, system = (u1 - u0) * us, (s1 - s0) * us
calls = calls / requests if calls >= 0 else -1
errs = re.search(r"Socket errors: (.*)", text)
print(f"{rps:.0f} {p99:.3f} {user + system:.2f} {user:.2f} {system:.2f} {(m1 - m0) * us:.2f}"
      f" {(g1 - g0) / requests:.2f} {calls:.2f}"
      + (f" errors:{errs.group(1).replace(chr(32), chr(95))}" if errs else ""))' < "$WORK/wrk.out"
}

RESULTS="$WORK/results.txt"
: > "$RESULTS"
case_run() {  # $1 name $2 keys $3 rate-sluice $4 rate-nginx $5 burst $6 sluice-method $7 sluice-path $8 nginx-path
  local name=$1 keys=$2
  # shellcheck disable=SC2053  # ONLY is a pattern
  [[ $name == ${ONLY:-*} ]] || return 0
  start_nginx "$4" "$5"; start_sluice "$3" "$5"
  for round in $(seq "$ROUNDS"); do
    write_lua "$keys" "$6" "$7"; echo "$name sluice $(run_wrk "$SLUICE_PORT" "$SLUICE_PID")" >> "$RESULTS"
    write_lua "$keys" GET "$8";  echo "$name nginx $(run_wrk "$NGINX_PORT" "$NGINX_PID")" >> "$RESULTS"
  done
  kill "$NGINX_PID" "$SLUICE_PID"; wait "$NGINX_PID" "$SLUICE_PID" 2>/dev/null || true
}

PASS_S="1000000/s"; PASS_N="1000000r/s"; PASS_B=1000000
DENY_S="1/min"; DENY_N="1r/m"; DENY_B=1
for keys in 1 100000; do
  case_run "auth-pass-keys$keys"   $keys $PASS_S $PASS_N $PASS_B GET /v1/auth/bench /decide
  case_run "auth-reject-keys$keys" $keys $DENY_S $DENY_N $DENY_B GET /v1/auth/bench /decide
  case_run "check-pass-keys$keys"  $keys $PASS_S $PASS_N $PASS_B POST /v1/check /decide
  case_run "check-reject-keys$keys" $keys $DENY_S $DENY_N $DENY_B POST /v1/check /decide
  case_run "gateway-pass-keys$keys" $keys $PASS_S $PASS_N $PASS_B GET /app /app
done

echo
echo "date: $(date -u +%F) machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "wrk -t2 -c$CONNS -d${DURATION}s, $ROUNDS rounds alternating, $WORKERS workers each" \
  "$([[ $TLS == 1 ]] && echo ", HTTPS")$([[ $NEW_CONNECTIONS == 1 ]] && echo ", a connection a request")$([[ $UPSTREAM_TLS == 1 ]] && echo ", TLS to the upstream")"
python3 - "$RESULTS" <<'PY'
import statistics, sys, collections
FIELDS = ("rps", "p99", "cpu", "user", "system", "busy", "segments", "calls")
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    parts = line.split()
    runs[parts[0]][parts[1]].append(dict(zip(FIELDS, map(float, parts[2:10]))))
def median(side, field):
    return statistics.median(run[field] for run in side)
# The ratio of the medians, then each round's own (sluice's run over the
# NGINX run right after it): how far one round can move the verdict. CPU:
# each server's own CPU time (its process and children) a request, the
# client's and the shared upstream's left out; its ratio is sluice's over
# NGINX's (below 1: sluice spends less).
print(f"{'case':28} {'sluice req/s':>13} {'nginx req/s':>12} {'ratio':>6} {'sluice p99 ms':>14} {'nginx p99 ms':>13}"
      f" {'sluice CPU us':>14} {'nginx CPU us':>13} {'CPU ratio':>9}  per round")
for name, sides in runs.items():
    s = sides["sluice"]; n = sides["nginx"]
    rounds = ", ".join(f"{a['rps'] / b['rps']:.2f}" for a, b in zip(s, n))
    print(f"{name:28} {median(s, 'rps'):13.0f} {median(n, 'rps'):12.0f} {median(s, 'rps') / median(n, 'rps'):6.2f}"
          f" {median(s, 'p99'):14.3f} {median(n, 'p99'):13.3f} {median(s, 'cpu'):14.2f} {median(n, 'cpu'):13.2f}"
          f" {median(s, 'cpu') / median(n, 'cpu'):9.2f}  {rounds}")
# Where a request's time went (us a request, medians). "for 1.1x": the
# server CPU a request sluice could spend for 1.1x NGINX's req/s when the
# machine is the limit: NGINX's busy time over 1.1, less what the rest of
# the machine (client, upstream, interrupts) spent in sluice's runs.
print()
print(f"{'case':28} {'server':>7} {'user us':>8} {'system us':>10} {'machine us':>11} {'segments':>9} {'syscalls':>9}"
      f" {'for 1.1x':>9}")
for name, sides in runs.items():
    for who in ("sluice", "nginx"):
        side = sides[who]
        calls = median(side, "calls")
        need = ""
        if who == "sluice":
            rest = median(side, "busy") - median(side, "cpu")
            need = f"{median(sides['nginx'], 'busy') / 1.1 - rest:9.2f}"
        print(f"{name:28} {who:>7} {median(side, 'user'):8.2f} {median(side, 'system'):10.2f}"
              f" {median(side, 'busy'):11.2f} {median(side, 'segments'):9.2f}"
              f" {calls if calls >= 0 else float('nan'):9.2f} {need:>9}")
PY
