#!/usr/bin/env python3
"""The flood attack on the memory store (docs/configuration.md, "When the
memory store is full"), against a real `sluice serve`, several runs per
case, for each store.memory.on_full:

  1. reset: max_keys 100,000; a gcra 1/h limit, burst 1. A victim key
     exhausts its limit, then 400,000 new keys go through the decision
     API's batch form (1,000 checks a request), each taking its one token,
     so that no key is fresh and the victim's is evicted.
  2. fresher: max_keys 500,000; the victim on a 1/day limit, then 2,000,000
     new keys on a 1/h limit (each fresher than the victim: "closest to
     fresh first" should keep the victim, if its sampling does not err).

After the flood: the victim's next check (and whether its Retry-After
(retry_after_ms, without the header's jitter) is its true reset), the
server's RSS (from /proc) against its RSS before
the flood, and the false restrictions: of 100,000 keys never seen, how many
are denied their first request.

Uses the binary in build/release (SLUICE_BINARY to override).

Usage: bench/eviction/attack.py [--runs 10] [--cases reset,fresher]
                                 [--modes remember,evict,deny_new]
"""

import argparse
import http.client
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
os.environ.setdefault("SLUICE_BINARY", os.path.join(ROOT, "build", "release", "sluice"))
from harness import HOST, Sluice, request, rss_kib, server_block  # noqa: E402

CASES = {
    # name: (max_keys, flood, victim rate, flood rate)
    "reset": (100_000, 400_000, "1/h", "1/h"),
    "fresher": (500_000, 2_000_000, "1/day", "1/h"),
}
INNOCENT = 100_000
BATCH = 1_000


def config(max_keys, on_full, victim_rate, flood_rate):
    return server_block(threads=2) + """\
store:
  memory: {max_keys: %d, on_full: %s}
policies:
  - name: victim
    limits:
      - {algorithm: gcra, rate: %s, burst: 1}
  - name: flood
    limits:
      - {algorithm: gcra, rate: %s, burst: 1}
""" % (max_keys, on_full, victim_rate, flood_rate)


class Client:
    def __init__(self, port):
        self.conn = http.client.HTTPConnection(HOST, port, timeout=60)

    def post(self, body):
        self.conn.request("POST", "/v1/check", body=json.dumps(body),
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        return r.status, r.getheader("Retry-After"), json.loads(r.read())

    def batch(self, policy, keys):
        """How many of the keys' checks were denied."""
        _, _, answers = self.post([{"policy": policy, "key": k} for k in keys])
        return sum(1 for a in answers if not a.get("allowed"))


def one_run(case, mode, run, tmp):
    max_keys, flood, victim_rate, flood_rate = CASES[case]
    s = Sluice(config(max_keys, mode, victim_rate, flood_rate), tmp, name="%s-%s-%d.yaml" % (case, mode, run))
    s.start()
    try:
        while True:
            try:
                if request(s.admin_port, "GET", "/healthz", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        c = Client(s.port)
        victim = "victim-%d" % run
        first, _, _ = c.post({"policy": "victim", "key": victim})
        second, _, _ = c.post({"policy": "victim", "key": victim})
        assert (first, second) == (200, 429), (first, second)
        t_exhausted = time.time()
        rss_before = rss_kib(s.proc.pid)
        t0 = time.monotonic()
        flood_denied = 0
        for start in range(0, flood, BATCH):
            flood_denied += c.batch("flood", ["f%d-%d-%d" % (run, start, i) for i in range(BATCH)])
        flood_s = time.monotonic() - t0
        status, _, body = c.post({"policy": "victim", "key": victim})
        true_reset = {"1/h": 3600, "1/day": 86400}[victim_rate] - (time.time() - t_exhausted)
        innocent_denied = 0
        for start in range(0, INNOCENT, BATCH):
            innocent_denied += c.batch("flood", ["i%d-%d-%d" % (run, start, i) for i in range(BATCH)])
        rss_after = rss_kib(s.proc.pid)
        status_json = request(s.admin_port, "GET", "/v1/status").json()["store"]["memory"]
        return {
            "victim": status,
            "retry_after": round(body["retry_after_ms"] / 1000) if status == 429 else None,
            "true_reset_s": round(true_reset), "flood_s": round(flood_s, 1),
            "flood_denied": flood_denied, "innocent_denied": innocent_denied,
            "rss_before_mib": round(rss_before / 1024), "rss_after_mib": round(rss_after / 1024),
            "forced": status_json["forced_evictions"], "remembered": status_json.get("remembered"),
            "remembered_mib": round(status_json.get("remembered_bytes", 0) / 2**20, 1),
        }
    finally:
        s.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--cases", default="reset,fresher")
    p.add_argument("--modes", default="remember,evict,deny_new")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        for case in args.cases.split(","):
            for mode in args.modes.split(","):
                results = [one_run(case, mode, r, tmp) for r in range(args.runs)]
                denied = sum(1 for r in results if r["victim"] == 429)
                exact = sum(1 for r in results if r["retry_after"] is not None and
                            abs(r["retry_after"] - r["true_reset_s"]) <= 2)
                worst_false = max(r["innocent_denied"] for r in results)
                print("%s, on_full %s: victim denied in %d of %d runs (Retry-After its true reset "
                      "within 2 s in %d); innocent new keys denied: worst %d of %d (%.3f%%); "
                      "flood keys denied: worst %d" % (
                          case, mode, denied, len(results), exact, worst_false, INNOCENT,
                          100.0 * worst_false / INNOCENT,
                          max(r["flood_denied"] for r in results)))
                for r in results:
                    print("   ", json.dumps(r))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
