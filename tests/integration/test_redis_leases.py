"""Leased limits (docs/distributed.md, "Leased limits") with `sluice serve`
processes on one Redis: each process takes a slice of the limit, counted in
Redis before it admits anything from it; a process stopped with SIGTERM gives
back what its slice has left; one killed with SIGKILL loses at most its
slice; the rest of the fleet admits exactly the rest of the limit."""

import signal
import unittest

from harness import request, server_block
from redis_harness import (RedisFleetTestCase, burst, fleet_metric, redis_store_block,
                           wait_clear_of_window_boundary, wait_until)

LIMIT = 800
SLICE = 50

POLICY = """\
policies:
  - name: leased
    limits:
      - {algorithm: fixed_window, rate: %d/1h, lease: {size: %d, ttl: 1h}}
""" % (LIMIT, SLICE)


class RedisLeaseTest(RedisFleetTestCase):
    def count(self, redis, key):
        """Redis' count for `key` in the current window (0 with no key)."""
        keys = redis.call("KEYS", "*%s*" % key)
        if not keys:
            return 0
        self.assertEqual(len(keys), 1, keys)
        state = redis.call("GET", keys[0])
        # "window count", or count * 256 + the window's tag (window_state).
        if " " in state:
            return int(state.split(" ")[1])
        return int(state) // 256

    def test_a_stopped_process_gives_its_slice_back_and_a_killed_one_loses_at_most_its_slice(self):
        redis = self.start_redis()
        config = (server_block(threads=2) + redis_store_block(url=redis.url, timeout="1s")
                  + POLICY)
        fleet = self.start_fleet(config, 4)
        stopped, killed, rest = fleet[0], fleet[1], fleet[2:]
        wait_clear_of_window_boundary(redis.port, period=3600, margin=30)
        key = self.unique_key("leased")
        for s in (stopped, killed):
            for _ in range(10):
                r = request(s.port, "POST", "/v1/check", body={"policy": "leased", "key": key})
                self.assertEqual(r.status, 200, r)
                self.assertEqual(r.json()["limit"], LIMIT)
        # Two slices of 50, counted in Redis before anything was admitted.
        self.assertEqual(self.count(redis, key), 2 * SLICE)
        # What a process holds, as /v1/keys shows it; Redis' state beside it.
        r = request(killed.admin_port, "GET", "/v1/keys/leased/%s" % key)
        self.assertEqual(r.status, 200, r)
        limit = r.json()["limits"][0]
        self.assertEqual(limit["lease"]["units"], SLICE - 10, limit)
        self.assertGreater(limit["lease"]["valid_for_ms"], 0, limit)
        self.assertEqual(limit["remaining"], LIMIT - 2 * SLICE, limit)
        self.assertGreaterEqual(fleet_metric([stopped, killed], "sluice_lease_slices_total"), 2)
        self.assertEqual(fleet_metric([stopped, killed], "sluice_lease_held_units"),
                         2 * (SLICE - 10))

        # SIGTERM: the 40 left in its slice go back.
        self.assertEqual(stopped.stop(), 0, stopped.output())
        wait_until(lambda: self.count(redis, key) == 2 * SLICE - 40, timeout=5,
                   what="the stopped process's 40 units back in Redis")
        # SIGKILL: its 40 stay counted until the window ends.
        killed.signal(signal.SIGKILL)
        killed.proc.wait(10)
        self.assertEqual(self.count(redis, key), 2 * SLICE - 40)

        # The rest of the fleet, with demand well over what is left: exactly
        # the limit less what was admitted (20) and the dead slice (40).
        result = burst(rest, "leased", key, 2000)
        self.assertEqual(result.errors, [], result.errors[:5])
        self.assertEqual(result.allowed, LIMIT - 20 - 40)
        self.assertEqual(self.count(redis, key), LIMIT)


if __name__ == "__main__":
    unittest.main()
