#!/usr/bin/env bash
# Envoy's ShouldRateLimit against the HTTP check, the same work in the same
# run: one `sluice serve` (memory store, server.threads THREADS) with a gRPC
# listener and the decision API, one key under a rate nobody reaches (pass)
# or under 1/min (deny: every answer after the first is OVER_LIMIT / 429):
#
#   grpc: h2load (nghttp2-client) sending ShouldRateLimit, one descriptor
#         ({pass|deny: k0} in domain `bench`, an envoyproxy/ratelimit rule of
#         `unit: second, requests_per_unit: 1000000000` or `unit: minute,
#         requests_per_unit: 1`), 4 HTTP/2 connections x 16 streams;
#   http: wrk POSTing /v1/check ({"policy": "pass"|"deny", "key": "k0"}, a
#         fixed_window policy of the same rate), 64 connections;
#
# both 64 requests in flight from one client thread, alternately, ROUNDS
# times, DURATION seconds each. h2load is a C client as light as wrk (gRPC's
# own C++ client takes most of a 2-core machine: bench/README.md, "gRPC").
# It prints requests/s, p50 and p99 (h2load's per-request log; wrk's
# --latency), the gRPC answers sluice counted (sluice_rls_requests_total),
# and the ratio gRPC / HTTP per round.
#
# Usage: bench/grpc/vs_http.sh                     # ~1 minute
# Variables: DURATION (5), ROUNDS (3), THREADS (2), CPU_AFFINITY (true), SLUICE (the binary).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
CPU_AFFINITY=${CPU_AFFINITY:-true}  # server.cpu_affinity, as bench/http/run.sh sets it

source scripts/deps.sh
sluice_install_deps nghttp2-client wrk
source bench/lib.sh  # release_binary, free_port, wait_port, bench_envoy_rules, rls_request_bodies, work_dir_with_cleanup
SLUICE=$(release_binary "${SLUICE:-}" sluice sluice)

work_dir_with_cleanup  # WORK; stops SERVER_PID at exit

PORT=$(free_port) ADMIN=$(free_port) GRPC=$(free_port)
cat > "$WORK/sluice.yaml" <<CONF
server: {listen: 127.0.0.1:$PORT, admin: 127.0.0.1:$ADMIN, threads: $THREADS, cpu_affinity: $CPU_AFFINITY}
grpc: {listen: 127.0.0.1:$GRPC}
$(bench_envoy_rules)
policies:
  - name: pass
    limits: [{algorithm: fixed_window, rate: 1000000000/s}]
  - name: deny
    limits: [{algorithm: fixed_window, rate: 1/min}]
CONF
"$SLUICE" serve --config "$WORK/sluice.yaml" 2>"$WORK/sluice.log" &
SERVER_PID=$!
wait_port "$PORT" && wait_port "$GRPC"

rls_request_bodies "$WORK"  # pass.bin, deny.bin

rls_counts() {  # ok over_limit, from sluice's metrics
  timeout 10 python3 - "$ADMIN" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
get = lambda r: int(float(m.group(1))) if (m := re.search(r'sluice_rls_requests_total\{result="' + r + r'"\} (\S+)', text)) else 0
print(get("ok"), get("over_limit"))
PY
}

RESULTS="$WORK/results.jsonl"
for case in pass deny; do
  printf '%s\n' 'wrk.method = "POST"' 'wrk.headers["Content-Type"] = "application/json"' \
    "wrk.body = '{\"policy\":\"$case\",\"key\":\"k0\"}'" > "$WORK/$case.lua"
  for round in $(seq "$ROUNDS"); do
    read -r ok0 over0 < <(rls_counts)
    rm -f "$WORK/h2.log"
    timeout $((DURATION + 30)) h2load -D "$DURATION" --warm-up-time=1 -c 4 -m 16 -t 1 \
      -H 'content-type: application/grpc' -H 'te: trailers' -d "$WORK/$case.bin" \
      --log-file="$WORK/h2.log" \
      "http://127.0.0.1:$GRPC/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
      > "$WORK/h2.txt" 2>&1
    read -r ok1 over1 < <(rls_counts)
    timeout $((DURATION + 30)) wrk -t1 -c64 -d"${DURATION}s" --latency -s "$WORK/$case.lua" \
      "http://127.0.0.1:$PORT/v1/check" > "$WORK/wrk.txt" 2>&1
    timeout 30 python3 - "$case" "$round" "$DURATION" "$WORK" $((ok1 - ok0)) $((over1 - over0)) \
        <<'PY' >> "$RESULTS"
import json, re, sys
case, rnd, duration, work, ok, over = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
# h2load's log: start (us since the epoch), HTTP status, microseconds to the end of the response.
rows = [line.split("\t") for line in open(f"{work}/h2.log") if line.strip()]
lat = sorted(int(r[2]) for r in rows)
pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0
span_us = (max(int(r[0]) + int(r[2]) for r in rows) - min(int(r[0]) for r in rows)) if rows else 1
wrk = open(f"{work}/wrk.txt").read()
def wrk_us(q):
    m = re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)\b", wrk)
    return round(float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)])
print(json.dumps({
    "case": case, "round": rnd,
    "grpc_per_s": round(len(rows) / (span_us / 1e6)), "grpc_p50_us": pct(0.5), "grpc_p99_us": pct(0.99),
    "grpc_non_200": sum(1 for r in rows if r[1] != "200"), "rls_ok": ok, "rls_over_limit": over,
    "http_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", wrk).group(1)),
    "http_p50_us": wrk_us(50), "http_p99_us": wrk_us(99)}))
PY
  done
  echo "done $case" >&2
done

timeout 30 python3 - "$RESULTS" "$DURATION" "$ROUNDS" "$THREADS" <<'PY'
import json, statistics, subprocess, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"git {git}; {sys.argv[3]} rounds of {sys.argv[2]} s, alternating; sluice serve threads {sys.argv[4]}; "
      "64 in flight from one client thread each (h2load -c 4 -m 16; wrk -c 64)\n")
print("| case | gRPC ShouldRateLimit/s | p50 / p99 us | HTTP /v1/check req/s | p50 / p99 us | gRPC / HTTP (per round) | gRPC answers (ok, over_limit) |")
print("|---|---:|---|---:|---|---|---|")
for case in ("pass", "deny"):
    rs = [r for r in rows if r["case"] == case]
    med = lambda f: statistics.median(r[f] for r in rs)
    ratios = [r["grpc_per_s"] / r["http_per_s"] for r in rs]
    print(f"| {case} | {med('grpc_per_s'):,.0f} | {med('grpc_p50_us'):,.0f} / {med('grpc_p99_us'):,.0f} "
          f"| {med('http_per_s'):,.0f} | {med('http_p50_us'):,.0f} / {med('http_p99_us'):,.0f} "
          f"| **{statistics.median(ratios):.2f}** ({', '.join(f'{x:.2f}' for x in ratios)}) "
          f"| {sum(r['rls_ok'] for r in rs):,}, {sum(r['rls_over_limit'] for r in rs):,} |")
PY
