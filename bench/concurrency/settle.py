#!/usr/bin/env python3
"""Settled costs at the issue's scale (docs/settled-costs.md): one `sluice
serve` (memory store, then one Redis) in front of an upstream that answers
each request with a random X-Tokens-Used between 0 and 5x the estimate
(seeded); a policy reserving 50 per request on a gcra limit of 10,000
tokens a minute (burst 2,000), settled from that header. 50 client threads
send requests for --seconds (60). Prints the tokens the upstream really
served against the contract (10,000 a minute) and the stated bound, and the
same run with the estimate alone charged (no settle).

The bound (docs/settled-costs.md): over the run of T seconds, the true cost
admitted is at most r T + b + D + what the requests in flight at the end
owe, with D the debt left at the end; this script measures the run's total
and reports it against r T + b (D and the in-flight term are what it may
exceed that by).

Usage: bench/concurrency/settle.py [--seconds 60] [--clients 50]
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fleet import Upstream, bench_main, load, start_one  # noqa: E402
from harness import server_block  # noqa: E402
from redis_harness import RedisServer, redis_store_block  # noqa: E402

ESTIMATE = 50
PER_MINUTE = 10_000
BURST = 2_000
USER = {"X-Tenant": "t1"}


def config(upstream, settle, store=""):
    cost = ('{estimate: %d, settle: "response_header:X-Tokens-Used"}' % ESTIMATE if settle
            else "%d" % ESTIMATE)
    return server_block(threads=2) + store + """\
routes:
  - name: model
    match: {path_prefix: /}
    upstream: %s
policies:
  - name: tokens
    match: {path_prefix: /slow}
    key: ["header:X-Tenant"]
    cost: %s
    limits:
      - {algorithm: gcra, rate: %d/min, burst: %d}
""" % (upstream.url, cost, PER_MINUTE, BURST)


def run(name, tmp, settle, seconds, clients, store, cleanups):
    up = Upstream(0.0, tokens_max=5 * ESTIMATE, seed=7)
    cleanups.append(up.close)
    s = start_one(config(up, settle, store), tmp, "%s.yaml" % name.replace(" ", "-"), cleanups)
    counts = load([s.port], clients, seconds, path="/slow", headers=USER)
    minutes = seconds / 60
    budget = PER_MINUTE * minutes + BURST  # r T + b
    print("%s: upstream served %d requests, %d tokens in %.0f s: %.3f x r T + b (%d); "
          "beyond the burst, %.0f a minute (the limit: %d); denied %d, errors %d" % (
              name, up.served.value, up.tokens.value, seconds, up.tokens.value / budget, budget,
              (up.tokens.value - BURST) / minutes, PER_MINUTE, counts["denied"],
              counts["errors"]))


def settle(args, tmp, cleanups):
    run("settled, memory store", tmp, True, args.seconds, args.clients, "", cleanups)
    redis = RedisServer(tmp)
    cleanups.append(redis.kill)
    redis.start()
    run("settled, one Redis", tmp, True, args.seconds, args.clients,
        redis_store_block(url=redis.url, timeout="1s"), cleanups)
    run("estimate only, memory store", tmp, False, args.seconds, args.clients, "", cleanups)


if __name__ == "__main__":
    bench_main(__doc__, 60, 50, settle)
