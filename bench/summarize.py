#!/usr/bin/env python3
"""Summarizes a bench/run.sh result directory (stdlib only).

Reads micro_<i>.json (Google Benchmark JSON, one per run), memory_<i>.jsonl
(sluice_bench_memory) and machine.txt, and prints Markdown:
  - every benchmark as ns/op and as a ratio against BM_CasLoop measured in
    the same run (the median over runs of each, and the min..max of ns/op);
  - 2-thread / 1-thread throughput ratios, per run then the median;
  - bytes per key from RSS;
  - the BENCH.md targets these figures cover, met or not.

ns/op is, for one thread, Google Benchmark's CPU time per iteration (the
machine is shared: wall time would count the time other processes held the
CPU); for 2 threads (UseRealTime), wall time divided by the iterations of
both threads: the inverse of the aggregate throughput. 2-thread/1-thread
ratios use wall time on both sides, from clean runs only (busy >= 0.9).
"""
import glob
import json
import os
import re
import statistics
import sys

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def clean(name):
    name = re.sub(r"/min_time:[0-9.]+", "", name)
    return name.replace("/real_time", "")


CLEAN_BUSY = 0.9


def load_runs(out, pattern):
    runs = []
    for path in sorted(glob.glob(os.path.join(out, pattern)),
                       key=lambda p: int(re.findall(r"(\d+)\.json$", p)[0])):
        with open(path) as f:
            data = json.load(f)
        run = {}
        for b in data["benchmarks"]:
            if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
                continue
            scale = UNIT_NS[b.get("time_unit", "ns")]
            threads = b.get("threads", 1)
            run[clean(b["name"])] = {
                # 1 thread: CPU time per decision, which leaves out the time
                # the thread was preempted by other processes on a shared
                # machine. 2 threads: wall time / decisions of both threads.
                "ns": (b["cpu_time"] if threads == 1 else b["real_time"]) * scale,
                "real_ns": b["real_time"] * scale,
                "cpu_ns": b["cpu_time"] * scale,
                "threads": threads,
                "allowed": b.get("allowed"),
            }
        runs.append(run)
    return runs


def load_memory(out):
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "memory_*.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    rows.setdefault((r["algorithm"], r["keys"], r.get("on_full", "remember")),
                                    []).append(r)
    return rows


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(x, digits=1):
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def busy(run, name):
    b = run[name]
    return b["cpu_ns"] / b["real_ns"] / b["threads"]


def scaling_samples(all_runs, n1, n2):
    """(clean ratios, number of runs excluded) for a threads:1/threads:2 pair."""
    clean, excluded = [], 0
    for r in all_runs:
        if n1 in r and n2 in r:
            if busy(r, n1) >= CLEAN_BUSY and busy(r, n2) >= CLEAN_BUSY:
                clean.append(r[n1]["real_ns"] / r[n2]["real_ns"])
            else:
                excluded += 1
    return clean, excluded


def unclean_families(out, want):
    """Regex of the 2-thread families with fewer than `want` clean runs."""
    all_runs = load_runs(out, "micro_*.json")
    families = []
    names = {n for r in all_runs for n in r}
    for n in sorted(names):
        if n.endswith("/threads:1") and n[: -len("1")] + "2" in names:
            clean, _ = scaling_samples(all_runs, n, n[: -len("1")] + "2")
            if len(clean) < want:
                families.append("^" + n[: -len("threads:1")])
    return "|".join(families)


def main():
    if sys.argv[1] == "--unclean":
        print(unclean_families(sys.argv[2], int(sys.argv[3])))
        return
    out = sys.argv[1]
    runs = load_runs(out, "micro_[0-9]*.json")
    extra_runs = load_runs(out, "micro_extra_*.json")
    memory = load_memory(out)
    if not runs:
        sys.exit(f"no micro_*.json in {out}")
    names = []
    for run in runs:
        for n in run:
            if n not in names:
                names.append(n)

    def per_run(name, key="ns"):
        return [run[name][key] for run in runs if name in run]

    def ratio_runs(name):
        # ratio against BM_CasLoop of the same run
        return [run[name]["ns"] / run["BM_CasLoop"]["ns"]
                for run in runs if name in run and "BM_CasLoop" in run]

    summary = {}
    for n in names:
        ns = per_run(n)
        summary[n] = {
            "ns": med(ns), "min": min(ns), "max": max(ns),
            "ratio": med(ratio_runs(n)),
            "busy": med([busy(r, n) for r in runs if n in r]),
            "allowed": med(per_run(n, "allowed")),
            "n": len(ns),
        }

    for extra in ("machine.txt", "load.txt"):
        if os.path.exists(os.path.join(out, extra)):
            print("```")
            print(open(os.path.join(out, extra)).read().rstrip())
            print("```\n")
    print(f"## Micro-benchmarks ({len(runs)} runs; medians)\n")
    print("ns/op: 1 thread: CPU time per decision (leaves out time the thread was preempted "
          "by other processes); 2 threads: wall time / decisions of both threads (the inverse "
          "of the aggregate throughput). x CAS: ns/op divided by BM_CasLoop's ns/op of the "
          "same run, median over runs. busy: cpu time / (real time x threads); well below 1 "
          "means the benchmark did not have its CPUs (other processes, steal). allowed: "
          "fraction of decisions that passed.\n")
    print("| benchmark | ns/op | min..max | x CAS | busy | allowed |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in names:
        s = summary[n]
        allowed = "-" if s["allowed"] is None else f"{s['allowed']:.3g}"
        print(f"| {n} | {fmt(s['ns'])} | {fmt(s['min'])}..{fmt(s['max'])} | "
              f"{fmt(s['ratio'], 2)} | {s['busy']:.2f} | {allowed} |")

    # 2-thread / 1-thread throughput: t1 ns/op over t2 ns/op, per run, from
    # clean runs only (both threads had a CPU: busy >= CLEAN_BUSY for both).
    print("\n## 2 threads vs 1 thread (aggregate throughput ratio, per clean run, then median)\n")
    print(f"A run counts only if both its 1-thread and 2-thread results have busy >= {CLEAN_BUSY}: "
          "otherwise another process had one of the two CPUs and the ratio measures the "
          "machine, not the store. run.sh repeats the families that lack clean runs "
          f"(micro_extra_*.json). Main runs: {len(runs)}, extra runs: {len(extra_runs)}.\n")
    print("| benchmark | clean runs | excluded | median |")
    print("|---|---|---:|---:|")
    scaling = {}
    for n in names:
        if not n.endswith("/threads:1"):
            continue
        n2 = n[: -len("threads:1")] + "threads:2"
        if n2 not in summary:
            continue
        ratios, excluded = scaling_samples(runs + extra_runs, n, n2)
        base = n[: -len("/threads:1")]
        scaling[base] = med(ratios)
        shown = ", ".join(f"{x:.2f}" for x in ratios) or "none"
        print(f"| {base} | {shown} | {excluded} | {fmt(scaling[base], 2)} |")

    if memory:
        print("\n## Memory per key (RSS after - before filling N keys, / N)\n")
        print("on_full: remember (the default) also commits the table of evicted keys as the "
              "store nears full (about 48 bytes per slot of max_keys); evict: the keys alone.\n")
        print("| algorithm | keys | on_full | bytes/key | RSS growth MiB | insert ns/key |")
        print("|---|---:|---|---:|---:|---:|")
        for (alg, keys, on_full), rows in sorted(memory.items(),
                                                 key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            bpk = med([r["bytes_per_key"] for r in rows])
            growth = med([(r["rss_after_kb"] - r["rss_before_kb"]) / 1024 for r in rows])
            ins = med([r["insert_ns"] for r in rows])
            print(f"| {alg} | {keys:,} | {on_full} | {bpk:.1f} | {growth:,.0f} | {fmt(ins)} |")

    # ---- targets
    print("\n## BENCH.md targets covered by these benchmarks\n")
    # The x CAS targets need BM_CasLoop in the same runs (a FILTER may leave it out).
    cas = "BM_CasLoop" in summary
    if not cas:
        print("BM_CasLoop was not run: the targets set in x CAS are not shown.\n")
    print("| target | measured (medians) | verdict |")
    print("|---|---|---|")

    def row(target, measured, ok):
        verdict = "n/a" if ok is None else ("met" if ok else "NOT met")
        print(f"| {target} | {measured} | {verdict} |")

    def get(n, key="ratio"):
        return summary.get(n, {}).get(key)

    for n in names:
        if n.startswith("BM_Decide/") and cas:
            limit = 4.0 if n.endswith("sliding_log") else 2.0
            r = get(n)
            row(f"`{n}` within {limit:g}x CAS", f"{fmt(get(n, 'ns'))} ns = {r:.2f}x", r <= limit)
    key_algs = ["gcra", "token_bucket", "fixed_window"]
    for alg in key_algs + ["leaky_bucket_police", "leaky_bucket_shape", "sliding_window",
                           "sliding_log"]:
        n = f"BM_StoreHotKey/{alg}/threads:1"
        if n in summary and cas:
            r = get(n)
            row(f"hot key, 1 thread, clock read included, {alg}: within 4x CAS",
                f"{fmt(get(n, 'ns'))} ns = {r:.2f}x", r <= 4.0)
    n = "BM_LimiterHotKey/gcra/threads:1"
    if n in summary and cas:
        row("(Limiter::Acquire, hot key, 1 thread: within 4x CAS, informative)",
            f"{fmt(get(n, 'ns'))} ns = {get(n):.2f}x", get(n) <= 4.0)
    for alg in key_algs:
        for fam, label in (("BM_StoreRandom100k/{}/threads:1", "clock read per decision"),
                           ("BM_StoreRandom100k/{}/coarse_clock", "coarse clock read per decision"),
                           ("BM_StoreRandom100kTimeIn/{}", "time passed in")):
            n = fam.format(alg)
            if n in summary and cas:
                row(f"100k random keys, 1 thread, {alg} ({label}): within 6x CAS",
                    f"{fmt(get(n, 'ns'))} ns = {get(n):.2f}x", get(n) <= 6.0)
    def scaling_row(target, base, at_least):
        if base not in scaling:
            return
        s = scaling[base]
        if s is None:
            row(target, "no clean run", None)
        else:
            row(target, f"{s:.2f}x", s >= at_least)

    for alg in key_algs:
        scaling_row(f"2 threads, distinct keys (1,000 per thread, every decision passes), {alg}: "
                    ">= 1.8x 1-thread throughput", f"BM_StoreDistinctKeys/{alg}", 1.8)
    for alg in key_algs:
        scaling_row(f"(2 threads, distinct keys, nearly every decision denied, {alg}: "
                    ">= 1.8x, informative)", f"BM_StoreDistinctKeysDenied/{alg}", 1.8)
    for alg in key_algs:
        scaling_row(f"(2 threads, distinct keys, every decision passes, shards shared before the "
                    f"1-thread run too, {alg}: >= 1.8x, informative)",
                    f"BM_StoreDistinctKeysShared/{alg}", 1.8)
    scaling_row("(2 threads, one key per thread in different shards, gcra: nothing shared, "
                "the machine's ceiling for the row above, informative)", "BM_StoreOwnKey/gcra", 1.8)
    for alg in key_algs + ["leaky_bucket_police", "leaky_bucket_shape", "sliding_window",
                           "sliding_log"]:
        scaling_row(f"2 threads, one hot key, {alg}: >= 0.9x 1-thread throughput",
                    f"BM_StoreHotKey/{alg}", 0.9)
    for alg in key_algs:
        scaling_row(f"(2 threads, one hot key whose every decision passes, {alg}: throughput "
                    "ratio, informative)", f"BM_StoreHotKeyPassing/{alg}", 0.0)
    scaling_row("(Limiter::Acquire, 2 threads, one hot key: >= 0.9x, informative)",
                "BM_LimiterHotKey/gcra", 0.9)
    for alg in key_algs:
        scaling_row(f"(2 threads, 100k random keys, {alg}: throughput ratio, informative; "
                    "no BENCH.md target)", f"BM_StoreRandom100k/{alg}", 0.0)
    for alg in key_algs:
        for fam, label in (("BM_StoreRandom10M/{}/threads:1", "1 thread, clock read per decision"),
                           ("BM_StoreRandom10M/{}/threads:2", "2 threads, aggregate, clock read"),
                           ("BM_StoreRandom10MTimeIn/{}", "1 thread, time passed in")):
            n = fam.format(alg)
            if n in summary:
                ns = get(n, "ns")
                row(f"10M random keys, {alg} ({label}): <= 150 ns per decision",
                    f"{fmt(ns)} ns", ns <= 150)
    for alg in key_algs:
        for keys, on_full in sorted({(k, o) for (_, k, o) in memory}):
            rows = memory.get((alg, keys, on_full))
            if rows and keys >= 1_000_000:
                bpk = med([r["bytes_per_key"] for r in rows])
                row(f"{alg}, {keys:,} keys of <= 15 bytes, on_full {on_full}: <= 64 bytes/key (RSS)",
                    f"{bpk:.1f} B/key", bpk <= 64)

    # Context rows: same-run floors for the key-count targets (the bare map,
    # and the map with the atomic steps a store that threads share takes).
    # The floors decide a token bucket: the token_bucket column is the same
    # decision, the gcra column the store's cheapest.
    floors = [(f, size, timing) for f, size, timing in (
        ("BM_MapFloor100k/clock", "100k", "/{alg}/threads:1"),
        ("BM_MapFloor100k/time_in", "100k", "TimeIn/{alg}"),
        ("BM_MapFloor100k/time_in", "100k", "/{alg}/coarse_clock"),
        ("BM_MapFloor100k/time_in_atomics", "100k", "TimeIn/{alg}"),
        ("BM_MapFloor10M/clock", "10M", "/{alg}/threads:1"),
        ("BM_MapFloor10M/time_in", "10M", "TimeIn/{alg}"),
        ("BM_MapFloor10M/time_in_atomics", "10M", "TimeIn/{alg}")) if f in summary]
    if floors:
        print("\n## Same-run floors for the key-count benchmarks\n")
        print("| floor | ns/op | store ns/op (token_bucket, gcra) | store / floor (token_bucket, gcra) |")
        print("|---|---:|---:|---:|")
    for floor, size, timing in floors:
        cells, ratios = [], []
        for alg in ("token_bucket", "gcra"):
            store = f"BM_StoreRandom{size}" + timing.format(alg=alg)
            if store not in summary:
                cells.append("-"); ratios.append("-")
                continue
            cells.append(fmt(get(store, "ns")))
            per_run = [r[store]["ns"] / r[floor]["ns"] for r in runs if store in r and floor in r]
            ratios.append(f"{med(per_run):.2f}")
        against = f"BM_StoreRandom{size}" + timing.format(alg="*")
        print(f"| {floor} (store: {against}) | {fmt(get(floor, 'ns'))} | {', '.join(cells)} "
              f"| {', '.join(ratios)} |")
    if "BM_MemoryChase" in summary:
        print(f"\nOne dependent random load over 512 MiB (BM_MemoryChase): "
              f"{fmt(get('BM_MemoryChase', 'ns'))} ns.")


if __name__ == "__main__":
    main()
