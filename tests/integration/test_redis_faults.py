"""One Redis failing under a running `sluice serve`: killed, restarted on its
port, paused (a hung Redis), its scripts flushed. Sluice must answer every
request within the Redis timeout plus a margin, follow each policy's
on_store_error, never crash, report the outage on /readyz and in metrics,
and go back to Redis by itself."""

import sys
import time
import unittest

from harness import server_block
from redis_harness import (HttpClient, Load, RedisFleetTestCase, fleet_metric, readyz,
                           redis_store_block, wait_until)

TIMEOUT = 0.05          # store.redis.timeout below
# What a loaded 2-core machine may add to one answer on top of the Redis
# timeout (scheduling of sluice, Redis and this test's threads).
MARGIN = 0.3

POLICIES = """\
policies:
  - name: open
    limits:
      - {algorithm: token_bucket, rate: 1/1m, burst: 1}
    on_store_error: allow
  - name: closed
    limits:
      - {algorithm: token_bucket, rate: 3/1m, burst: 3}
    on_store_error: deny
    on_deny: {retry_after_jitter: 0s}
  - name: fallback
    limits:
      - {algorithm: token_bucket, rate: 3/1m, burst: 3}
    on_store_error: local
    on_deny: {retry_after_jitter: 0s}
  - name: load
    limits:
      - {algorithm: token_bucket, rate: 1000/1s, burst: 1000}
"""


class RedisFaultTest(RedisFleetTestCase):
    def setUp(self):
        super().setUp()
        self.redis = self.start_redis()
        config = server_block(threads=2) + redis_store_block(
            url=self.redis.url, timeout="50ms", connect_timeout="500ms") + POLICIES
        self.fleet = self.start_fleet(config, 1)
        self.sluice = self.fleet[0]
        self.client = HttpClient(self.sluice.port)
        self.addCleanup(self.client.close)

    # ---- helpers ----

    def decide(self, policy, key):
        """-> (status, headers, body); fails if it took longer than the
        Redis timeout plus the margin."""
        status, headers, body, took = self.client.check(policy, key)
        self.latencies.append(took)
        self.assertLess(took, TIMEOUT + MARGIN, "%s/%s took %.3f s" % (policy, key, took))
        return status, headers, body

    def assert_decided_in_redis(self, tag):
        """A fresh key of the fail-closed policy: allowed 3 times, then denied
        with the bucket's own wait (~20 s), not the 1 s of a store error."""
        key = self.unique_key(tag)
        errors = fleet_metric(self.fleet, "sluice_store_errors_total", policy="closed")
        answers = [self.client.check("closed", key) for _ in range(4)]
        self.assertEqual([a[0] for a in answers], [200, 200, 200, 429], answers)
        self.assertEqual([a[2]["remaining"] for a in answers], [2, 1, 0, 0], answers)
        self.assertGreater(answers[3][2]["retry_after_ms"], 15000, answers[3])
        self.assertEqual(fleet_metric(self.fleet, "sluice_store_errors_total", policy="closed"),
                         errors)
        # The state is in Redis.
        found = self.redis.call("SCAN", 0, "MATCH", "*%s*" % key, "COUNT", 1000)
        self.assertTrue(found[1], "no Redis key holds %s" % key)

    def wait_ready(self, expected_status, timeout):
        return wait_until(lambda: readyz(self.sluice)[0] == expected_status, timeout,
                          interval=0.01, what="/readyz %d" % expected_status)

    def report(self, what, values):
        values = sorted(values)
        sys.stderr.write("\n  %s: %d requests, median %.1f ms, max %.1f ms\n" % (
            what, len(values), 1000 * values[len(values) // 2], 1000 * values[-1]))

    # ---- tests ----

    def test_redis_killed_under_load_each_fail_mode_is_honoured(self):
        """With Redis dead (SIGKILL while 4 clients keep deciding), allow
        answers 200, deny answers 429 with Retry-After, local decides with an
        in-process bucket of the same shape; every answer comes within the
        timeout plus a margin, the load never sees a dropped connection, and
        /readyz says why it is not ready."""
        self.latencies = []
        self.assert_decided_in_redis("before")
        load = Load(self.fleet, "load", threads=4).start()
        self.addCleanup(load.stop)
        time.sleep(0.3)
        killed_at = time.monotonic()
        self.redis.kill()
        self.wait_ready(503, 2)
        status, body = readyz(self.sluice)
        self.assertEqual(status, 503)
        self.assertIn("store unavailable: redis, 0 of 1 masters connected", body)

        errors_before = {p: fleet_metric(self.fleet, "sluice_store_errors_total", policy=p)
                         for p in ("open", "closed", "fallback")}
        # allow: a burst of 1, yet every request passes.
        open_key = self.unique_key("open")
        for _ in range(5):
            status, _, body = self.decide("open", open_key)
            self.assertEqual(status, 200, body)
            self.assertIs(body["allowed"], True, body)
        # deny: every request refused, told to come back in 1 s.
        for _ in range(5):
            status, headers, body = self.decide("closed", self.unique_key("closed"))
            self.assertEqual(status, 429, body)
            self.assertIs(body["allowed"], False, body)
            self.assertEqual(headers.get("retry-after"), "1", headers)
        # local: an in-process token bucket 3/1m, burst 3: 3 pass, then the
        # 4th waits for its own refill (~20 s).
        local_key = self.unique_key("fallback")
        answers = [self.decide("fallback", local_key) for _ in range(5)]
        self.assertEqual([a[0] for a in answers], [200, 200, 200, 429, 429], answers)
        self.assertEqual([a[2]["remaining"] for a in answers[:3]], [2, 1, 0], answers)
        self.assertGreater(answers[3][2]["retry_after_ms"], 15000, answers[3])
        self.assertLessEqual(answers[3][2]["retry_after_ms"], 20000, answers[3])
        self.assertTrue(answers[3][1].get("retry-after"), answers[3])
        for p in ("open", "closed", "fallback"):
            self.assertEqual(fleet_metric(self.fleet, "sluice_store_errors_total", policy=p),
                             errors_before[p] + 5, p)

        time.sleep(0.3)
        load.stop()
        self.assertEqual(load.failures, [])
        dead = [took for _, _, took in load.between(killed_at, time.monotonic())]
        self.assertGreater(len(dead), 20)
        self.assertLess(max(dead), TIMEOUT + MARGIN, "a load request stalled")
        self.report("decisions while Redis is dead", self.latencies)
        self.report("load while Redis is killed and dead", dead)
        self.assertIsNone(self.sluice.proc.poll(), "sluice exited")
        self.assertGreaterEqual(fleet_metric(self.fleet, "sluice_redis_errors_total"), 15)
        self.assertEqual(fleet_metric(self.fleet, "sluice_redis_up"), 0)

    def test_redis_restarted_on_its_port_is_used_again_within_2s(self):
        """After Redis comes back on the same port, sluice reconnects by
        itself within 2 s (/readyz 200 again, a reconnect counted) and
        decisions are made in Redis again."""
        self.latencies = []
        reconnects = fleet_metric(self.fleet, "sluice_redis_reconnects_total")
        self.redis.kill()
        self.wait_ready(503, 2)
        # Dead long enough for the reconnect backoff to reach its ceiling.
        time.sleep(1.0)
        status, _, _ = self.decide("closed", self.unique_key("dead"))
        self.assertEqual(status, 429)
        self.redis.start()   # the same port
        back = time.monotonic()
        self.wait_ready(200, 2)
        recovery = time.monotonic() - back
        sys.stderr.write("\n  /readyz 200 again %.0f ms after Redis answered PING\n" % (
            1000 * recovery))
        self.assertLess(recovery, 2.0)
        self.assertGreater(fleet_metric(self.fleet, "sluice_redis_reconnects_total"), reconnects)
        self.assertEqual(fleet_metric(self.fleet, "sluice_redis_up"), 1)
        self.assert_decided_in_redis("after")

    def test_a_master_turned_replica_is_left_until_it_is_a_master_again(self):
        """The server becomes a replica (REPLICAOF, as a failover does to an
        old master): its first READONLY closes the connection, and a
        replica is not connected to again (ROLE), so calls fail as store
        errors (/readyz 503, on_store_error) instead of going on to a server
        that cannot write; promoted again, it is used again."""
        self.latencies = []
        other = self.start_redis()
        self.redis.call("REPLICAOF", "127.0.0.1", other.port)
        wait_until(lambda: self.redis.call("ROLE")[0] == "slave", 5, what="a replica")
        status, _, _ = self.decide("closed", self.unique_key("demoted"))
        self.assertEqual(status, 429)
        self.wait_ready(503, 2)
        self.redis.call("REPLICAOF", "NO", "ONE")
        self.wait_ready(200, 2)
        self.assert_decided_in_redis("promoted")

    def test_paused_redis_times_out_and_recovers(self):
        """A hung Redis (SIGSTOP) makes calls time out: every request is
        answered within the timeout plus a margin (allow: 200), the timeouts
        are counted, the breaker then answers at once, /readyz turns 503;
        after SIGCONT sluice is back on Redis by itself."""
        self.latencies = []
        self.assert_decided_in_redis("before")
        timeouts = fleet_metric(self.fleet, "sluice_redis_timeouts_total")
        errors = fleet_metric(self.fleet, "sluice_store_errors_total", policy="open")
        self.redis.pause()
        self.addCleanup(self.redis.resume)
        key = self.unique_key("paused")
        for _ in range(20):
            status, _, body = self.decide("open", key)
            self.assertEqual(status, 200, body)
            self.assertIs(body["allowed"], True, body)
        self.report("decisions while Redis is paused", self.latencies)
        # The first calls waited for the timeout: sluice sent them and got no
        # answer. After 3 missed in a row the connection is dropped and the
        # rest fail at once (the breaker) instead of each waiting again.
        self.assertGreaterEqual(max(self.latencies), TIMEOUT * 0.9, self.latencies)
        last = sorted(self.latencies[-10:])
        self.assertLess(last[5], TIMEOUT / 2, self.latencies)
        self.assertGreater(fleet_metric(self.fleet, "sluice_redis_timeouts_total"), timeouts)
        self.assertEqual(fleet_metric(self.fleet, "sluice_store_errors_total", policy="open"),
                         errors + 20)
        # Calls missed in a row close the connection: not ready.
        self.wait_ready(503, 2)
        self.redis.resume()
        resumed = time.monotonic()
        self.wait_ready(200, 3)
        sys.stderr.write("\n  /readyz 200 again %.0f ms after SIGCONT\n" % (
            1000 * (time.monotonic() - resumed)))
        self.assert_decided_in_redis("after")

    def test_function_flush_is_invisible_to_clients(self):
        """FUNCTION FLUSH makes the next FCALL fail with "Function not
        found"; sluice loads the library again, resends the call, and the
        decision stands: the count goes on where it was, no request fails or
        falls back to on_store_error."""
        key = self.unique_key("flush")
        loads_before = self.command_calls("function|load")
        first = [self.client.check("closed", key) for _ in range(2)]
        self.assertEqual([a[2]["remaining"] for a in first], [2, 1], first)
        self.assertEqual(self.redis.call("FUNCTION", "FLUSH"), "OK")
        rest = [self.client.check("closed", key) for _ in range(2)]
        self.assertEqual([a[0] for a in rest], [200, 429], rest)
        self.assertEqual(rest[0][2]["remaining"], 0, rest)
        # Denied by the bucket (wait ~20 s), not by a store error (1 s).
        self.assertGreater(rest[1][2]["retry_after_ms"], 15000, rest)
        self.assertEqual(fleet_metric(self.fleet, "sluice_store_errors_total"), 0)
        self.assertEqual(fleet_metric(self.fleet, "sluice_redis_errors_total"), 0)
        # The library came back by FUNCTION LOAD, and a call is one FCALL
        # again after it.
        self.assertGreater(self.command_calls("function|load"), loads_before)
        fcall = self.command_calls("fcall")
        self.assertEqual(self.client.check("closed", self.unique_key("again"))[0], 200)
        self.assertEqual(self.command_calls("fcall"), fcall + 1)

    def command_calls(self, command):
        """calls= of one command in INFO commandstats (0 if never called)."""
        for line in self.redis.call("INFO", "commandstats").split("\r\n"):
            if line.startswith("cmdstat_%s:" % command):
                fields = dict(f.split("=") for f in line.split(":", 1)[1].split(","))
                return int(fields["calls"])
        return 0


if __name__ == "__main__":
    unittest.main()
