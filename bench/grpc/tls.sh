#!/usr/bin/env bash
# Envoy's ShouldRateLimit over TLS (grpc.tls) against plaintext, the same
# work in the same run: two `sluice serve` (memory store, server.threads
# THREADS), the same rules, one with grpc.tls (a certificate made for the
# run, EC P-256, by the openssl command), one without; h2load
# (nghttp2-client) sends ShouldRateLimit with one descriptor ({pass|deny:
# k0} in domain `bench`, as bench/grpc/vs_http.sh), 4 HTTP/2 connections x
# 16 streams from one client thread, to each in turn, ROUNDS times,
# DURATION seconds each. Only one of the two is loaded at a time. It prints
# calls a second, p50 and p99 (h2load's per-request log) and the ratio
# TLS / plaintext per round.
#
# With NEW_CONNECTIONS=1, each of h2load's connections makes 1 call and
# closes (h2load -n = -c = 64 per batch, batches for DURATION seconds): the
# handshake's cost, TLS against plaintext.
#
# Usage: bench/grpc/tls.sh                     # ~1 minute
# Variables: DURATION (5), ROUNDS (3), THREADS (2), NEW_CONNECTIONS (0), SLUICE (the binary).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
NEW_CONNECTIONS=${NEW_CONNECTIONS:-0}

source scripts/deps.sh
sluice_install_deps nghttp2-client openssl
source bench/lib.sh  # release_binary, free_port, wait_port, bench_envoy_rules, rls_request_bodies
SLUICE=$(release_binary "${SLUICE:-}" sluice sluice)

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

timeout 30 openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
  -keyout "$WORK/tls.key" -out "$WORK/tls.pem" 2>/dev/null

declare -A GRPC
for mode in plain tls; do
  GRPC[$mode]=$(free_port)
  tls=""
  [[ $mode == tls ]] && tls=", tls: {cert_file: tls.pem, key_file: tls.key}"
  cat > "$WORK/$mode.yaml" <<CONF
server: {listen: 127.0.0.1:$(free_port), admin: 127.0.0.1:$(free_port), threads: $THREADS}
grpc: {listen: 127.0.0.1:${GRPC[$mode]}$tls}
$(bench_envoy_rules)
CONF
  "$SLUICE" serve --config "$WORK/$mode.yaml" 2>"$WORK/$mode.log" &
  PIDS+=($!)
  wait_port "${GRPC[$mode]}"
done

rls_request_bodies "$WORK"  # pass.bin, deny.bin

RESULTS="$WORK/results.jsonl"
for case in pass deny; do
  for round in $(seq "$ROUNDS"); do
    for mode in plain tls; do
      scheme=http
      [[ $mode == tls ]] && scheme=https
      url="$scheme://127.0.0.1:${GRPC[$mode]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
      rm -f "$WORK/h2.log"
      if [[ $NEW_CONNECTIONS == 1 ]]; then
        end=$((SECONDS + DURATION))
        while ((SECONDS < end)); do
          timeout 30 h2load -n 64 -c 64 -m 1 -t 1 -H 'content-type: application/grpc' \
            -H 'te: trailers' -d "$WORK/$case.bin" "$url" > "$WORK/h2.txt" 2>&1
          grep -h "^requests:" "$WORK/h2.txt" >> "$WORK/h2.batches"
          sed -n 's/^finished in \([0-9.]*\)\(m\?s\).*/\1 \2/p' "$WORK/h2.txt" >> "$WORK/h2.times"
        done
      else
        timeout $((DURATION + 30)) h2load -D "$DURATION" --warm-up-time=1 -c 4 -m 16 -t 1 \
          -H 'content-type: application/grpc' -H 'te: trailers' -d "$WORK/$case.bin" \
          --log-file="$WORK/h2.log" "$url" > "$WORK/h2.txt" 2>&1
      fi
      timeout 30 python3 - "$case" "$round" "$mode" "$WORK" "$NEW_CONNECTIONS" <<'PY' >> "$RESULTS"
import json, os, re, sys
case, rnd, mode, work, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
if new:
    # Calls that succeeded over the batches' own time (h2load's "finished in").
    done = sum(int(re.search(r"(\d+) succeeded", l).group(1)) for l in open(f"{work}/h2.batches"))
    secs = sum(float(v) / (1000 if u == "ms" else 1) for v, u in (l.split() for l in open(f"{work}/h2.times")))
    os.remove(f"{work}/h2.batches"); os.remove(f"{work}/h2.times")
    print(json.dumps({"case": case, "round": rnd, "mode": mode, "per_s": round(done / secs),
                      "p50_us": 0, "p99_us": 0, "non_200": 0}))
    sys.exit()
# h2load's log: start (us since the epoch), HTTP status, microseconds to the end of the response.
rows = [line.split("\t") for line in open(f"{work}/h2.log") if line.strip()]
lat = sorted(int(r[2]) for r in rows)
pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0
span_us = (max(int(r[0]) + int(r[2]) for r in rows) - min(int(r[0]) for r in rows)) if rows else 1
print(json.dumps({"case": case, "round": rnd, "mode": mode,
                  "per_s": round(len(rows) / (span_us / 1e6)), "p50_us": pct(0.5), "p99_us": pct(0.99),
                  "non_200": sum(1 for r in rows if r[1] != "200")}))
PY
    done
  done
  echo "done $case" >&2
done

timeout 30 python3 - "$RESULTS" "$DURATION" "$ROUNDS" "$THREADS" "$NEW_CONNECTIONS" <<'PY'
import json, statistics, subprocess, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
new = sys.argv[5] == "1"
git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
how = ("a new connection a call, 64 at once (h2load -n 64 -c 64 -m 1)" if new
       else "64 in flight from one client thread (h2load -c 4 -m 16)")
print(f"git {git}; {sys.argv[3]} rounds of {sys.argv[2]} s, alternating; sluice serve threads {sys.argv[4]}; {how}\n")
print("| case | plaintext calls/s | p50 / p99 us | TLS calls/s | p50 / p99 us | TLS / plaintext (per round) | non-200 |")
print("|---|---:|---|---:|---|---|---:|")
for case in ("pass", "deny"):
    by = {m: [r for r in rows if r["case"] == case and r["mode"] == m] for m in ("plain", "tls")}
    med = lambda m, f: statistics.median(r[f] for r in by[m])
    ratios = [t["per_s"] / p["per_s"] for p, t in zip(by["plain"], by["tls"])]
    print(f"| {case} | {med('plain', 'per_s'):,.0f} | {med('plain', 'p50_us'):,.0f} / {med('plain', 'p99_us'):,.0f} "
          f"| {med('tls', 'per_s'):,.0f} | {med('tls', 'p50_us'):,.0f} / {med('tls', 'p99_us'):,.0f} "
          f"| **{statistics.median(ratios):.2f}** ({', '.join(f'{x:.2f}' for x in ratios)}) "
          f"| {sum(r['non_200'] for r in by['plain'] + by['tls'])} |")
PY
