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
#   build/release/sluice, built, unless another build's binary is named).
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

# CPU time (user + system, in clock ticks) of process $1 and its children
# (NGINX's workers): fields 14 and 15 of /proc/PID/stat.
cpu_ticks() {
  local total=0 pid fields
  for pid in "$1" $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    fields=$(sed 's/.*) //' /proc/"$pid"/stat 2>/dev/null) || continue
    read -r -a f <<< "$fields"
    total=$((total + f[11] + f[12]))  # utime, stime (fields 14, 15; f[0] is field 3)
  done
  echo "$total"
}

# Prints "req_per_s p99_ms cpu_us_per_request" for one wrk run against the
# server on port $1 whose process (with its children) is $2.
run_wrk() {
  local before after
  before=$(cpu_ticks "$2")
  wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/req.lua" "$SCHEME://127.0.0.1:$1" \
    > "$WORK/wrk.out" 2>&1
  after=$(cpu_ticks "$2")
  CPU_S=$(python3 -c "import os, sys; print(($after - $before) / os.sysconf('SC_CLK_TCK'))") \
    python3 -c '
import os, re, sys
text = sys.stdin.read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
requests = int(re.search(r"(\d+) requests in", text).group(1))
m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", text)
p99 = float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
cpu_us = float(os.environ["CPU_S"]) * 1e6 / max(requests, 1)
errs = re.search(r"Socket errors: (.*)", text)
print(f"{rps:.0f} {p99:.3f} {cpu_us:.2f}" + (f" errors:{errs.group(1).replace(chr(32), chr(95))}" if errs else ""))' < "$WORK/wrk.out"
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
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    parts = line.split()
    name, who = parts[0], parts[1]
    runs[name][who].append((float(parts[2]), float(parts[3]), float(parts[4])))
# The ratio of the medians, then each round's own (sluice's run over the
# NGINX run right after it): how far one round can move the verdict. CPU:
# each server's own CPU time (its process and children) a request, the
# client's and the shared upstream's left out; its ratio is sluice's over
# NGINX's (below 1: sluice spends less).
print(f"{'case':28} {'sluice req/s':>13} {'nginx req/s':>12} {'ratio':>6} {'sluice p99 ms':>14} {'nginx p99 ms':>13}"
      f" {'sluice CPU us':>14} {'nginx CPU us':>13} {'CPU ratio':>9}  per round")
for name, sides in runs.items():
    s = sides["sluice"]; n = sides["nginx"]
    s_rps, s_p99, s_cpu = (statistics.median(x[i] for x in s) for i in range(3))
    n_rps, n_p99, n_cpu = (statistics.median(x[i] for x in n) for i in range(3))
    rounds = ", ".join(f"{a[0] / b[0]:.2f}" for a, b in zip(s, n))
    print(f"{name:28} {s_rps:13.0f} {n_rps:12.0f} {s_rps / n_rps:6.2f} {s_p99:14.3f} {n_p99:13.3f}"
          f" {s_cpu:14.2f} {n_cpu:13.2f} {s_cpu / n_cpu:9.2f}  {rounds}")
PY
