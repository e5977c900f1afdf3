#!/usr/bin/env bash
# bench/run.sh: builds the release preset, runs the micro-benchmarks RUNS times
# (default 3), repeats the 2-thread families whose runs did not get both CPUs
# (at most EXTRA_SECONDS, default 90), runs the memory-per-key measurement
# MEM_RUNS times (default 1),
# then prints every result as ns/op and as a ratio against BM_CasLoop from the
# same run (medians over the runs), the 2-thread/1-thread throughput ratios,
# and each BENCH.md target this covers, met or not.
#
#   bench/run.sh                      # everything, 4-6 minutes on 2 cores
#   RUNS=1 bench/run.sh               # one pass
#   FILTER='Decide|CasLoop' bench/run.sh   # a subset (Google Benchmark regex)
#   SKIP_BUILD=1 SKIP_MEMORY=1 bench/run.sh
#
# Results (JSON per run, console logs, the summary) go to OUT (default
# build/release/bench/results/<UTC timestamp>/). Every step is bounded by
# `timeout`; nothing is left running.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

RUNS="${RUNS:-3}"
MEM_RUNS="${MEM_RUNS:-1}"
FILTER="${FILTER:-.}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${OUT:-build/release/bench/results/$STAMP}"
BIN=build/release/bench

if [[ -z "${SKIP_BUILD:-}" ]]; then
  timeout 900 cmake --preset release >/dev/null
  timeout 900 cmake --build build/release --target sluice_bench sluice_bench_memory
fi

mkdir -p "$OUT"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: bench/run.sh (RUNS=$RUNS MEM_RUNS=$MEM_RUNS FILTER=$FILTER)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "cpu family/model/stepping: $(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')/$(grep -m1 '^model\s*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')/$(grep -m1 '^stepping' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
  echo "kernel: $(uname -r); clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null || echo '?')"
  echo "transparent_hugepage: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo '?')"
  echo "compiler: $(c++ --version | head -1); benchmark: $(dpkg-query -W -f='${Version}' libbenchmark-dev 2>/dev/null || echo '?')"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src include 2>/dev/null || echo ' (src/include modified)')"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# The machine is shared: before each run, wait (at most QUIET_WAIT seconds,
# default 120) until other processes use less than 20% of the CPUs over one
# second, then run anyway, noting it. The summary's "busy" column shows
# what the runs actually got.
other_cpu_percent() {
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 k
  for k in 1 2 3 4 5 6 7 8; do total=$(( total + b[k] - a[k] )); done
  echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}
wait_quiet() {  # [max seconds]
  local waited=0 busy max="${1:-${QUIET_WAIT:-120}}"
  while busy=$(other_cpu_percent); (( busy >= 20 && waited < max )); do
    waited=$((waited + 1))
  done
  echo "other load before run: ${busy}% of CPUs (waited ${waited}s)" | tee -a "$OUT/load.txt" >&2
}

for ((i = 1; i <= RUNS; i++)); do
  echo "== sluice_bench run $i/$RUNS" >&2
  wait_quiet
  timeout 420 "$BIN/sluice_bench" --benchmark_filter="$FILTER" \
    --benchmark_out="$OUT/micro_$i.json" --benchmark_out_format=json \
    > "$OUT/micro_$i.log" 2>&1 || { echo "sluice_bench failed, see $OUT/micro_$i.log" >&2; exit 1; }
done

# 2-thread results need both CPUs: repeat the 1-/2-thread families that have
# fewer than RUNS clean runs (see summarize.py), for at most EXTRA_SECONDS.
deadline=$(( $(date +%s) + ${EXTRA_SECONDS:-90} ))
for ((k = 1; $(date +%s) < deadline; k++)); do
  families="$(python3 "$ROOT/bench/summarize.py" --unclean "$OUT" "$RUNS")"
  [[ -z "$families" ]] && break
  echo "== extra run $k for: $families" >&2
  wait_quiet 20
  timeout 300 "$BIN/sluice_bench" --benchmark_filter="^BM_CasLoop(/|\$)|$families" \
    --benchmark_out="$OUT/micro_extra_$k.json" --benchmark_out_format=json \
    > "$OUT/micro_extra_$k.log" 2>&1 || { echo "sluice_bench failed" >&2; exit 1; }
done

if [[ -z "${SKIP_MEMORY:-}" ]]; then
  for ((i = 1; i <= MEM_RUNS; i++)); do
    echo "== sluice_bench_memory run $i/$MEM_RUNS" >&2
    wait_quiet
    # 100k and 10M keys for the seven algorithms the memory store keeps per key
    # in a map; 7.5M (just after the per-shard tables doubled, the emptiest
    # they get) for the three algorithms BENCH.md sets 64 B/key for and the
    # sliding window (one word too where its limit packs, as 100/s does); each
    # with on_full remember (the default: the table of evicted keys too) and
    # evict (the keys alone).
    { timeout 600 "$BIN/sluice_bench_memory" --keys=100000,10000000 --on_full=remember,evict &&
      timeout 300 "$BIN/sluice_bench_memory" --keys=7500000 --on_full=remember,evict \
        --algorithms=gcra,token_bucket,fixed_window,sliding_window; } > "$OUT/memory_$i.jsonl" \
      || { echo "sluice_bench_memory failed" >&2; exit 1; }
  done
fi

python3 "$ROOT/bench/summarize.py" "$OUT" | tee "$OUT/summary.md"
echo "results: $OUT" >&2
