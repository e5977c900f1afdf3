#!/usr/bin/env python3
"""Turns bench/redis/run.sh's results.jsonl into the tables of bench/README.md.

Per case: the median over the rounds of each side's decisions/s, p50 and p99
latency and round trips per decision; the ratio sluice / peer of the medians,
the range of the per-round ratios (round i's sluice run against round i's
peer run, which ran right after it), and the BENCH.md target, met or not.

Usage: summarize.py RESULT_DIR   (standard library only)
"""
import collections
import json
import pathlib
import statistics
import sys

# BENCH.md: sluice / redis-benchmark >= 0.8 at every depth; sluice /
# rate-limiter-flexible >= 3 at 1 in flight, >= 2 at 64 (and, in the CPU
# column, redis-server's CPU per decision <= 0.5x the peer's at 64).
def target(case):
    kind, depth = case.split("-")[:2]
    n = int(depth.removeprefix("depth").removeprefix("inflight"))
    if kind == "A":
        return 0.8
    return {1: 3.0, 64: 2.0}.get(n)


def main():
    out = pathlib.Path(sys.argv[1])
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    order = []
    for line in (out / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["case"] not in runs:
            order.append(r["case"])
        runs[r["case"]][r["side"]].append(r)
    print((out / "machine.txt").read_text().rstrip())
    print()
    print("| case | keys | depth | sluice decisions/s | peer | peer decisions/s | sluice / peer "
          "| per-round ratios | target | met | sluice p50 / p99 us | peer p50 / p99 us "
          "| calls per decision (sluice, peer) | Redis us in the call per decision (sluice, peer) "
          "| redis-server CPU us per decision (sluice, peer) | sluice / peer CPU "
          "| errors | load (1 min) |")
    print("|---|---:|---:|---:|---|---:|---:|---|---:|---|---|---|---|---|---|---:|---:|---:|")
    for case in order:
        sides = runs[case]
        sluice = sides["sluice"]
        peer_name = next(s for s in sides if s != "sluice")
        peer = sides[peer_name]

        def med(rs, field):
            return statistics.median(r[field] for r in rs)

        s_rate, p_rate = med(sluice, "decisions_per_s"), med(peer, "decisions_per_s")
        s_cpu = med(sluice, "redis_cpu_us_per_decision")
        p_cpu = med(peer, "redis_cpu_us_per_decision")
        ratio = s_rate / p_rate
        pairs = [s["decisions_per_s"] / p["decisions_per_s"] for s, p in zip(sluice, peer)]
        t = target(case)
        met = "-" if t is None else ("yes" if ratio >= t else "**no**")
        errors = sum(r.get("errors", 0) for r in sluice + peer)
        load = statistics.median(r["load1"] for r in sluice + peer)
        peer_label = "rate-limiter-flexible" if peer_name == "rlf" else peer_name
        print(f"| {case} | {sluice[0]['keys']:,} | {sluice[0]['depth']} | {s_rate:,.0f} "
              f"| {peer_label} | {p_rate:,.0f} | {ratio:.2f} "
              f"| {min(pairs):.2f}..{max(pairs):.2f} | {'-' if t is None else f'>= {t:g}'} "
              f"| {met} | {med(sluice, 'p50_us'):,.0f} / {med(sluice, 'p99_us'):,.0f} "
              f"| {med(peer, 'p50_us'):,.0f} / {med(peer, 'p99_us'):,.0f} "
              f"| {med(sluice, 'calls_per_decision'):.3f}, "
              f"{med(peer, 'calls_per_decision'):.3f} "
              f"| {med(sluice, 'redis_us_per_decision'):.1f}, "
              f"{med(peer, 'redis_us_per_decision'):.1f} "
              f"| {s_cpu:.1f}, {p_cpu:.1f} | {s_cpu / max(p_cpu, 1e-9):.2f} "
              f"| {errors} | {load:.1f} |")
    floor_file = out / "floor.jsonl"
    if floor_file.exists():
        pings = [json.loads(l)["decisions_per_s"] for l in floor_file.read_text().splitlines()]
        peers = [r["decisions_per_s"] for c in order if c.startswith("B-inflight1-")
                 for r in runs[c]["rlf"]]
        line = (f"\nThe floor at 1 in flight, same redis-server: a bare PING one at a time "
                f"(redis-benchmark -c 1 -P 1 -t ping), {statistics.median(pings):,.0f}/s "
                f"(median of {len(pings)}; {min(pings):,.0f}..{max(pings):,.0f})")
        if peers:
            peer = statistics.median(peers)
            line += (f"; rate-limiter-flexible at 1 in flight {peer:,.0f}/s: the floor is "
                     f"{statistics.median(pings) / peer:.2f}x the peer, so no client that makes "
                     f"one round trip per decision can be more than {statistics.median(pings) / peer:.2f}x the peer")
        print(line + ".")
    print()
    print(f"rounds: {max(len(s['sluice']) for s in runs.values())}; "
          "allowed fraction (sluice, median): " + ", ".join(
              f"{c} {statistics.median(r['allowed_fraction'] for r in runs[c]['sluice']):.3f}"
              for c in order))


if __name__ == "__main__":
    main()
