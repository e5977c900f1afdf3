"""Concurrency limits (docs/concurrency.md): at most N requests of a key in
flight through the gateway, in one process on the memory store and across
3 processes on one Redis; the slots of a process killed while it holds them
come back when their lease ends."""

import concurrent.futures
import signal
import time
import unittest

from harness import (SluiceTestCase, Upstream, ratelimit_members, request, run_check,
                     server_block)
from redis_harness import RedisFleetTestCase, redis_store_block

HOLD = 0.6  # seconds the upstream holds each /slow request


def gateway_config(upstream, limit, lease_ttl, store="", **server):
    return (server_block(**server) + store + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: %s
policies:
  - name: upstream
    match: {path_prefix: /slow}
    key: ["header:X-User"]
    limits:
      - {algorithm: concurrency, limit: %d, lease_ttl: %s}
""" % (upstream.url, limit, lease_ttl))


def wave(ports, count, user, path="/slow/x"):
    """`count` requests at once, spread over `ports`; their responses."""
    def one(i):
        return request(ports[i % len(ports)], "GET", path, headers={"X-User": user}, timeout=10)
    with concurrent.futures.ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


class MemoryConcurrencyTest(SluiceTestCase):
    def test_at_most_limit_in_flight_and_slots_return_with_the_response(self):
        up = self.start_upstream("main", slow_seconds=HOLD)
        s = self.start_sluice(gateway_config(up, 3, "10s", upstream_timeout="5s"))
        answers = wave([s.port], 12, "alice")
        statuses = sorted(r.status for r in answers)
        # All 12 arrive within the first request's hold: exactly 3 pass.
        self.assertEqual(statuses.count(200), 3, statuses)
        self.assertEqual(statuses.count(429), 9, statuses)
        self.assertLessEqual(up.max_in_flight, 3)
        denied = next(r for r in answers if r.status == 429)
        policy = ratelimit_members(denied.header("RateLimit-Policy"))["upstream"]
        self.assertEqual(policy["q"], 3)
        self.assertEqual(policy["qu"], "concurrent-requests")
        self.assertNotIn("w", policy)
        self.assertIsNotNone(denied.header("Retry-After"))
        # Every slot came back with its response: another wave passes 3, and
        # the hold the first wave measured (~HOLD) caps Retry-After, not the
        # 10 s lease.
        answers = wave([s.port], 6, "alice")
        self.assertEqual(sorted(r.status for r in answers).count(200), 3)
        denied = next(r for r in answers if r.status == 429)
        self.assertLessEqual(int(denied.header("Retry-After")), 2)
        # Keys are apart; paths the policy does not match are not limited.
        self.assertEqual([r.status for r in wave([s.port], 3, "bob")], [200] * 3)
        self.assertEqual(request(s.port, "GET", "/fast", headers={"X-User": "alice"}).status, 200)
        self.assertLessEqual(up.max_in_flight, 6)

    def test_lease_ttl_must_outlast_the_upstream_timeout(self):
        up = self.start_upstream("main")
        code, out, err = run_check(gateway_config(up, 3, "5s", upstream_timeout="30s"),
                                   self.tmpdir)
        self.assertNotEqual(code, 0)
        self.assertIn("lease_ttl 5s must be longer than server.upstream_timeout", out + err)


class RedisConcurrencyTest(RedisFleetTestCase):
    def test_three_processes_never_exceed_the_limit_and_a_killed_holder_frees_its_slots(self):
        redis = self.start_redis()
        up = Upstream("main", slow_seconds=HOLD)
        self.addCleanup(up.close)
        config = gateway_config(up, 4, "3s", store=redis_store_block(url=redis.url, timeout="1s"),
                                upstream_timeout="2s")
        fleet = self.start_fleet(config, 3)
        ports = [s.port for s in fleet]
        answers = wave(ports, 24, "carol")
        statuses = sorted(r.status for r in answers)
        self.assertEqual(statuses.count(200), 4, statuses)
        self.assertEqual(statuses.count(429), 20, statuses)
        self.assertLessEqual(up.max_in_flight, 4)

        # Process 0 takes every slot with requests the upstream holds 2.5 s,
        # and is killed while it holds them: nobody releases them, and they
        # come back when their 3 s lease ends.
        up.slow_seconds = 2.5
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            held = [pool.submit(request, fleet[0].port, "GET", "/slow/held",
                                headers={"X-User": "dave"}, timeout=10) for _ in range(4)]
            deadline = time.monotonic() + 5
            while up.count("/slow/held") < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(up.count("/slow/held"), 4)
            taken = time.monotonic()
            fleet[0].proc.send_signal(signal.SIGKILL)
            fleet[0].proc.wait(5)
            up.slow_seconds = 0.0
            self.assertEqual(request(fleet[1].port, "GET", "/slow/after",
                                     headers={"X-User": "dave"}).status, 429)
            for f in held:
                try:
                    f.result()
                except OSError:
                    pass  # the killed process' clients lose their connections
        # Free again within the lease (3 s from when they were taken), with a
        # margin for a loaded machine, and not long before it.
        freed = None
        while time.monotonic() < taken + 3 + 3:
            if request(fleet[1].port, "GET", "/slow/after", headers={"X-User": "dave"}).status == 200:
                freed = time.monotonic() - taken
                break
            time.sleep(0.05)
        self.assertIsNotNone(freed, "the killed process' slots never came back")
        self.assertGreater(freed, 2.0)


if __name__ == "__main__":
    unittest.main()
