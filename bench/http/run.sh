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
# ROUNDS times; it prints medians of req/s and p99 latency, the ratio of
# the medians, and each round's ratio.
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

# Prints "req_per_s p99_ms" for one wrk run.
run_wrk() {  # $1 port $2 expected status note
  wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/req.lua" "$SCHEME://127.0.0.1:$1" 2>&1 |
    python3 -c '
import re, sys
text = sys.stdin.read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", text)
p99 = float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
errs = re.search(r"Socket errors: (.*)", text)
print(f"{rps:.0f} {p99:.3f}" + (f" errors:{errs.group(1).replace(chr(32), chr(95))}" if errs else ""))'
}

RESULTS="$WORK/results.txt"
: > "$RESULTS"
case_run() {  # $1 name $2 keys $3 rate-sluice $4 rate-nginx $5 burst $6 sluice-method $7 sluice-path $8 nginx-path
  local name=$1 keys=$2
  # shellcheck disable=SC2053  # ONLY is a pattern
  [[ $name == ${ONLY:-*} ]] || return 0
  start_nginx "$4" "$5"; start_sluice "$3" "$5"
  for round in $(seq "$ROUNDS"); do
    write_lua "$keys" "$6" "$7"; echo "$name sluice $(run_wrk "$SLUICE_PORT")" >> "$RESULTS"
    write_lua "$keys" GET "$8";  echo "$name nginx $(run_wrk "$NGINX_PORT")" >> "$RESULTS"
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
    name, who, rps, p99 = parts[0], parts[1], float(parts[2]), float(parts[3])
    runs[name][who].append((rps, p99))
# The ratio of the medians, then each round's own (sluice's run over the
# NGINX run right after it): how far one round can move the verdict.
print(f"{'case':28} {'sluice req/s':>13} {'nginx req/s':>12} {'ratio':>6} {'sluice p99 ms':>14} {'nginx p99 ms':>13}  per round")
for name, sides in runs.items():
    s = sides["sluice"]; n = sides["nginx"]
    s_rps = statistics.median(r for r, _ in s); n_rps = statistics.median(r for r, _ in n)
    s_p99 = statistics.median(p for _, p in s); n_p99 = statistics.median(p for _, p in n)
    rounds = ", ".join(f"{a / b:.2f}" for (a, _), (b, _) in zip(s, n))
    print(f"{name:28} {s_rps:13.0f} {n_rps:12.0f} {s_rps / n_rps:6.2f} {s_p99:14.3f} {n_p99:13.3f}  {rounds}")
PY
