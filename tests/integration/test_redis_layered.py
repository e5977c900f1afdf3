"""A layered policy across a fleet: SPEC's `login` shape, a per-process
token_bucket (scope: local) in front of a fleet-wide sliding_window in
Redis (scope: global), on 3 `sluice serve` processes. A request passes only
if both pass; a request denied by one limit takes nothing from the other
(all-or-nothing), so no quota leaks either way.

The rates are scaled so that the test can count exactly: the local bucket
refills one unit every 15 s (nothing during a test) and 3 local buckets of
40 hold more than the global window of 100, so that either limit can be the
one that denies."""

import unittest

from harness import server_block
from redis_harness import (HttpClient, RedisFleetTestCase, burst, fleet_metric, key_state,
                           redis_store_block, wait_clear_of_window_boundary)

LOCAL = 40
GLOBAL = 100

POLICIES = """\
policies:
  - name: login
    limits:
      - {algorithm: token_bucket, rate: 40/10min, burst: 40, scope: local}
      - {algorithm: sliding_window, rate: 100/1min, scope: global}
    on_deny: {retry_after_jitter: 0s}
"""


class LayeredPolicyTest(RedisFleetTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.redis = cls.start_class_redis()
        cls.fleet = cls.start_class_fleet(
            server_block(threads=2) + redis_store_block(url=cls.redis.url, timeout="1s") +
            POLICIES, 3)

    def remaining(self, s, key):
        """(local remaining on process s, global remaining)."""
        local, fleet_wide = key_state(s, "login", key)
        self.assertEqual((local["algorithm"], fleet_wide["algorithm"]),
                         ("token_bucket", "sliding_window"))
        return local["remaining"], fleet_wide["remaining"]

    def test_each_limit_denies_without_taking_from_the_other(self):
        """Process 1 spends its local 40 (5 more are denied locally and take
        nothing from the global 100: 60 left), process 2 the same (20 left),
        process 3 gets the last 20 and is then denied by the global limit,
        which gives its local tokens back: 20 left locally."""
        wait_clear_of_window_boundary(self.redis.port, period=60, margin=5)
        key = self.unique_key("login")
        expected_global = GLOBAL
        for i, s in enumerate(self.fleet):
            client = HttpClient(s.port)
            self.addCleanup(client.close)
            answers = [client.check("login", key) for _ in range(LOCAL + 5)]
            allowed = sum(1 for a in answers if a[2]["allowed"])
            self.assertEqual(allowed, min(LOCAL, expected_global), (i, answers[-1]))
            # Denials come after the admissions, never in between.
            self.assertEqual([a[0] for a in answers],
                             [200] * allowed + [429] * (LOCAL + 5 - allowed))
            expected_global -= allowed
            self.assertEqual(self.remaining(s, key), (LOCAL - allowed, expected_global), i)
        self.assertEqual(expected_global, 0)
        # Everyone is denied now, and the denials took nothing anywhere.
        for s in self.fleet:
            client = HttpClient(s.port)
            self.addCleanup(client.close)
            before = self.remaining(s, key)
            self.assertEqual(client.check("login", key)[0], 429)
            self.assertEqual(self.remaining(s, key), before)

    def test_concurrent_burst_admits_exactly_the_global_limit(self):
        """600 concurrent requests, 200 on each process: exactly 100 pass
        fleet-wide, no process passes more than its local 40, and every
        process's local bucket lost exactly what it admitted (requests the
        global limit denied gave their local token back)."""
        wait_clear_of_window_boundary(self.redis.port, period=60, margin=5)
        key = self.unique_key("login-burst")
        result = burst(self.fleet, "login", key, 600, connections_per_process=8)
        self.assertEqual(result.errors, [])
        self.assertEqual(result.allowed, GLOBAL, "burst took %.3f s" % result.elapsed)
        for s in self.fleet:
            admitted = result.allowed_by_port[s.port]
            self.assertLessEqual(admitted, LOCAL)
            self.assertEqual(self.remaining(s, key), (LOCAL - admitted, 0), s.port)
        self.assertEqual(fleet_metric(self.fleet, "sluice_store_errors_total"), 0)


if __name__ == "__main__":
    unittest.main()
