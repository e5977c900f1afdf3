#!/usr/bin/env bash
# The user-space instructions one Envoy ShouldRateLimit call costs `sluice
# serve`: the server under valgrind's callgrind answering N calls of one
# case (h2load, 4 HTTP/2 connections x 16 streams, the body of
# bench/grpc/vs_http.sh), and again answering none; the difference over N is
# the figure. Every thread is counted, gRPC's own among them (about two
# thirds of a call).
#
#   pass: one descriptor {pass: k0} in domain `bench`, under a rate nobody
#         reaches (every answer OK);
#   deny: {deny: k0} under 1/min (every answer after the first OVER_LIMIT,
#         with its RateLimit headers and problem body).
#
# Unlike calls a second, the count does not move with the machine's load,
# so two builds can be compared by it on a shared machine:
#
#   SLUICE=/path/to/other/sluice bench/grpc/instructions.sh
#
# Usage: bench/grpc/instructions.sh [N=5000]
# Variables: SLUICE (the binary; build/release/sluice, built when missing),
#   CASES ("pass deny"), KEEP (a folder: each run's callgrind output is kept there,
#   callgrind.<case>.<calls>, for callgrind_annotate).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
N=${1:-5000}
CASES=${CASES:-pass deny}

source scripts/deps.sh
sluice_install_deps valgrind nghttp2-client
source bench/lib.sh  # release_binary, free_port, wait_port, bench_envoy_rules, rls_request_bodies, work_dir_with_cleanup
SLUICE=$(release_binary "${SLUICE:-}" sluice sluice)

work_dir_with_cleanup  # WORK; stops SERVER_PID at exit

PORT=$(free_port) ADMIN=$(free_port) GRPC=$(free_port)
cat > "$WORK/sluice.yaml" <<CONF
server: {listen: 127.0.0.1:$PORT, admin: 127.0.0.1:$ADMIN, threads: 2}
grpc: {listen: 127.0.0.1:$GRPC}
$(bench_envoy_rules)
CONF
rls_request_bodies "$WORK"  # pass.bin, deny.bin

# Prints the instructions callgrind counted in a server that answered $1
# calls of case $2.
count() {
  local n=$1 case=$2
  rm -f "$WORK"/callgrind.out.*
  valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out.%p" \
    "$SLUICE" serve --config "$WORK/sluice.yaml" 2>"$WORK/server.log" &
  SERVER_PID=$!
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$GRPC") 2>/dev/null && break
    sleep 0.1
  done
  if [[ "$n" -gt 0 ]]; then
    timeout 600 h2load -n "$n" -c 4 -m 16 -t 1 -H 'content-type: application/grpc' \
      -H 'te: trailers' -d "$WORK/$case.bin" \
      "http://127.0.0.1:$GRPC/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
      > "$WORK/h2load.txt"
    grep -q "^status codes: $n 2xx" "$WORK/h2load.txt" || { cat "$WORK/h2load.txt" >&2; exit 1; }
  fi
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  if [[ -n "${KEEP:-}" ]]; then mkdir -p "$KEEP" && cat "$WORK"/callgrind.out.* > "$KEEP/callgrind.$case.$n"; fi
  awk '/^(summary|totals):/ {print $2; exit}' "$WORK"/callgrind.out.*
}

echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $SLUICE; $N calls a case"
idle=$(count 0 pass)
echo "sluice: $idle instructions answering nothing"
for case in $CASES; do
  busy=$(count "$N" "$case")
  [[ -n "$busy" ]] || { echo "sluice was not measured" >&2; exit 1; }
  echo "$case: $busy instructions answering $N calls; per call: $(( (busy - idle) / N ))"
done
