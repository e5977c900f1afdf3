#!/usr/bin/env bash
# The user-space instructions one HTTP decision costs sluice, and NGINX
# `limit_req` doing the same in the same run: each server under valgrind's
# callgrind answering N requests of one key (h2load --h1, 4 connections,
# `X-Key: k1`), and again answering none; the difference over N is the
# figure. Every thread is counted.
#
#   sluice: `sluice serve` (memory store, 2 threads, one gcra policy keyed on
#           X-Key that nobody reaches), `GET /v1/auth/bench`;
#   NGINX:  one worker (`master_process off`), `limit_req` keyed on
#           $http_x_key at a rate nobody reaches in front of `empty_gif`, as
#           bench/http/run.sh configures it, `GET /decide`.
#
# CASE=check counts `POST /v1/check` with `{"policy":"bench","key":"k1"}`
# instead of `/v1/auth` (NGINX as for auth: the request it answers the same
# way in every decision case of bench/http/run.sh).
#
# DENY=1 counts denials instead: the same policy and zone at one request
# an hour (NGINX: a minute, its least), so all but a server's first
# request or two are answered 429.
#
# CASE=gateway counts the gateway instead: sluice forwarding `GET /app`
# (the same policy, a route) and NGINX `limit_req` + `proxy_pass` over
# keep-alive connections (as bench/http/run.sh), both to one upstream NGINX
# answering `return 200` that runs outside callgrind and is not counted.
#
# Unlike requests a second, the count does not move with the machine's load,
# so two builds can be compared by it on a shared machine:
#
#   SLUICE=/path/to/other/sluice bench/http/instructions.sh
#
# The kernel's share (the socket calls: about one read and one write a
# request for both, strace -c) is not counted: callgrind sees only user
# space.
#
# Usage: bench/http/instructions.sh [N=10000]
# Variables: SLUICE (the binary; build/release/sluice, built when missing),
#   NGINX (0: sluice alone), CASE (auth, the default, check or gateway),
#   DENY (1: every request but the first denied),
#   KEEP (a folder: each run's callgrind output is kept there, as
#   callgrind.<server>.<requests>, for callgrind_annotate).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
N=${1:-10000}
CASE=${CASE:-auth}
[[ "$CASE" == auth || "$CASE" == check || "$CASE" == gateway ]] ||
  { echo "CASE is auth, check or gateway" >&2; exit 2; }

source scripts/deps.sh
sluice_install_deps valgrind nghttp2-client nginx-light
source bench/lib.sh  # release_binary, free_port, wait_port, work_dir_with_cleanup
SLUICE=$(release_binary "${SLUICE:-}" sluice sluice)

work_dir_with_cleanup  # WORK; stops SERVER_PID at exit
NGINX_BIN=$(command -v nginx || echo /usr/sbin/nginx)

# The gateway case's upstream, outside callgrind; stopped at exit by PID.
UPSTREAM_PORT=$(free_port) UPSTREAM_PID=""
if [[ "$CASE" == gateway ]]; then
  trap 'for pid in $SERVER_PID $UPSTREAM_PID; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT
  start_upstream_nginx "$NGINX_BIN" "$WORK/up" "$UPSTREAM_PORT"
  wait_port "$UPSTREAM_PORT"
fi

# The limit: one nobody reaches, or with DENY=1 one request an hour.
SLUICE_RATE=1000000/s BURST=1000000 NGINX_RATE=1000000r/s NGINX_BURST="burst=1000000"
if [[ "${DENY:-0}" == 1 ]]; then
  SLUICE_RATE=1/h BURST=1 NGINX_RATE=1r/m NGINX_BURST=""
fi
PORT=$(free_port) ADMIN=$(free_port)
cat > "$WORK/sluice.yaml" <<CONF
server: {listen: 127.0.0.1:$PORT, admin: 127.0.0.1:$ADMIN, threads: 2, decision: {on_gateway_listener: true}}
routes: [{name: up, match: {path_prefix: /app}, upstream: "http://127.0.0.1:$UPSTREAM_PORT"}]
policies:
  - name: bench
    match: {path_prefix: /}
    key: ["header:X-Key"]
    limits: [{algorithm: gcra, rate: $SLUICE_RATE, burst: $BURST}]
CONF

mkdir -p "$WORK/nginx"
NGINX_PORT=$(free_port)
cat > "$WORK/nginx/nginx.conf" <<CONF
worker_processes 1; master_process off;
daemon off; pid $WORK/nginx/nginx.pid; error_log $WORK/nginx/error.log error;
events { worker_connections 4096; }
http { access_log off;
  limit_req_zone \$http_x_key zone=z:64m rate=$NGINX_RATE;
  limit_req_status 429;
  upstream up { server 127.0.0.1:$UPSTREAM_PORT; keepalive 64; }
  server { listen 127.0.0.1:$NGINX_PORT; keepalive_requests 100000000;
    location /decide { limit_req zone=z $NGINX_BURST nodelay; empty_gif; }
    location /app { limit_req zone=z $NGINX_BURST nodelay; proxy_pass http://up;
                    proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF

# Prints the instructions callgrind counted in a server that answered $1
# requests: $2 its port, $3 the path, the rest its command.
count() {
  local n=$1 port=$2 path=$3
  shift 3
  rm -f "$WORK"/callgrind.out.*
  valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out.%p" "$@" \
    2>"$WORK/server.log" &
  SERVER_PID=$!
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  if [[ "$n" -gt 0 ]]; then
    local fields=(-H 'X-Key: k1')
    if [[ "$path" == /v1/check ]]; then  # the key in the body, as bench/http/run.sh sends it
      printf '{"policy":"bench","key":"k1"}' > "$WORK/check.json"
      fields=(-d "$WORK/check.json" -H 'Content-Type: application/json')
    fi
    timeout 600 h2load --h1 -n "$n" -c 4 "${fields[@]}" \
      "http://127.0.0.1:$port$path" > "$WORK/h2load.txt"
    # Every request answered: all 2xx, or with DENY=1 all 4xx but two at most.
    # ("status codes: A 2xx, B 3xx, C 4xx, D 5xx"). On failure the server
    # is stopped here: this runs in a subshell, which the EXIT trap is not.
    awk -v n="$n" -v deny="${DENY:-0}" '/^status codes:/ {
        ok = deny == 1 ? ($3 <= 2 && $3 + $7 == n) : $3 == n; found = 1 }
      END { exit !(found && ok) }' "$WORK/h2load.txt" ||
      { cat "$WORK/h2load.txt" >&2; kill "$SERVER_PID"; exit 1; }
  fi
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  if [[ -n "${KEEP:-}" ]]; then
    mkdir -p "$KEEP" && cat "$WORK"/callgrind.out.* > "$KEEP/callgrind.$(basename "$1").$n"
  fi
  awk '/^(summary|totals):/ {print $2; exit}' "$WORK"/callgrind.out.*
}

# Prints "idle busy per-request" for one server.
measure() {
  local idle busy
  idle=$(count 0 "$@")
  busy=$(count "$N" "$@")
  echo "$idle $busy $(( (busy - idle) / N ))"
}

SLUICE_PATH=/v1/auth/bench NGINX_PATH=/decide
[[ "$CASE" == gateway ]] && SLUICE_PATH=/app NGINX_PATH=/app
[[ "$CASE" == check ]] && SLUICE_PATH=/v1/check
echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $SLUICE; $N requests; case $CASE${DENY:+, DENY=$DENY}"
read -r idle busy sluice < <(measure "$PORT" "$SLUICE_PATH" "$SLUICE" serve --config "$WORK/sluice.yaml")
echo "sluice: $idle instructions answering nothing, $busy answering $N requests"
[[ -n "${sluice:-}" ]] || { echo "sluice was not measured" >&2; exit 1; }
echo "sluice per request: $sluice"
if [[ "${NGINX:-1}" != 0 ]]; then
  read -r idle busy nginx < <(measure "$NGINX_PORT" "$NGINX_PATH" \
    "$NGINX_BIN" -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx")
  echo "nginx: $idle instructions answering nothing, $busy answering $N requests"
  [[ -n "${nginx:-}" ]] || { echo "nginx was not measured" >&2; exit 1; }
  echo "nginx per request: $nginx"
  python3 -c "import sys; print(f'sluice / nginx: {int(sys.argv[1]) / int(sys.argv[2]):.2f}')" "$sluice" "$nginx"
fi
