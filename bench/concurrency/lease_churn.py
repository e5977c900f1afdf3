#!/usr/bin/env python3
"""What a caller looping /v1/acquire and /v1/release leaves behind
(docs/concurrency.md, "Each lease once"), for each sluice binary given, run
one after the other on the same machine: one `sluice serve` with a fleet
concurrency limit (Redis) and a local one (its memory), one keep-alive
connection doing --cycles acquire-release pairs on each policy, one key.

Prints, per binary and policy: the cycles a second, Redis' keys and used
memory before and after and redis-server's CPU time (user and system, from
/proc) per cycle (the fleet policy), and the process's resident memory
before and after (the local policy); then the status of one more release of
the first lease (given back already).

Usage: bench/concurrency/lease_churn.py [--cycles 20000] BINARY...
Starts redis-server from Debian and each binary on loopback; stops them by
PID at the end.
"""

import argparse
import http.client
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
os.environ.setdefault("SLUICE_SOURCE_DIR", ROOT)

import harness  # noqa: E402
from harness import HOST, cpu_seconds, rss_kib, server_block  # noqa: E402
from redis_harness import RedisServer, redis_store_block, start_fleet  # noqa: E402

sys.path.insert(0, HERE)
from fleet import stopping  # noqa: E402

POLICIES = """\
policies:
  - name: fleet
    limits:
      - {algorithm: concurrency, limit: 4, lease_ttl: 1h}
  - name: here
    limits:
      - {algorithm: concurrency, limit: 4, lease_ttl: 1h, scope: local}
"""


def churn(port, policy, cycles):
    """`cycles` acquire-release pairs on one connection: (seconds, first
    lease id, statuses seen other than 200)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    other = {}
    first = None

    def post(path, body):
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()

    start = time.monotonic()
    for _ in range(cycles):
        status, body = post("/v1/acquire", {"policy": policy, "key": "k"})
        if status != 200:
            other[status] = other.get(status, 0) + 1
            continue
        lease = json.loads(body)["lease"]["id"]
        first = first or lease
        status, _ = post("/v1/release", {"lease": lease})
        if status != 200:
            other[status] = other.get(status, 0) + 1
    seconds = time.monotonic() - start
    again, _ = post("/v1/release", {"lease": first}) if first else (None, None)
    conn.close()
    return seconds, again, other


def run(binary, cycles, tmp, cleanups):
    harness.BINARY = binary
    redis = RedisServer(tmp)
    cleanups.append(redis.kill)
    redis.start()
    config = server_block() + redis_store_block(url=redis.url, timeout="1s") + POLICIES
    s, = start_fleet(lambda f, *a: cleanups.append(lambda: f(*a)), config, 1, tmp)
    pid = s.proc.pid
    print("## %s" % binary)
    used = lambda: int(redis.call("INFO", "memory").split("used_memory:")[1].split()[0])  # noqa: E731
    keys0, mem0 = int(redis.call("DBSIZE")), used()
    cpu0 = cpu_seconds(redis.proc.pid)
    seconds, again, other = churn(s.port, "fleet", cycles)
    redis_us = (cpu_seconds(redis.proc.pid) - cpu0) * 1e6 / cycles
    print("fleet: %d cycles in %.1f s (%.0f/s); Redis keys %d -> %d, used_memory %d -> %d bytes,"
          " CPU %.1f us a cycle; the first lease released again: %s; other statuses %s" % (
              cycles, seconds, cycles / seconds, keys0, int(redis.call("DBSIZE")), mem0, used(),
              redis_us, again, other or "none"))
    rss0 = rss_kib(pid)
    seconds, again, other = churn(s.port, "here", cycles)
    print("here:  %d cycles in %.1f s (%.0f/s); resident memory %d -> %d KB;"
          " the first lease released again: %s; other statuses %s" % (
              cycles, seconds, cycles / seconds, rss0, rss_kib(pid), again, other or "none"))
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20000)
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()
    for binary in args.binaries:
        stopping(lambda tmp, cleanups: run(os.path.abspath(binary), args.cycles, tmp, cleanups))


if __name__ == "__main__":
    main()
