"""A client-chosen key longer than 1024 bytes on a policy whose limits are all
in Redis. Regression: the key was an error the Redis store reported, taken
for a store failure, and `on_store_error: allow` let every request through
(an `Authorization: Bearer <1100 bytes>` passed 5 of 5 on a 2/h policy)."""

import unittest

from harness import request
from redis_harness import RedisFleetTestCase, fleet_metric

POLICIES = """\
trusted_proxies: []
policies:
  - name: token
    match: {path_prefix: /}
    key: ["header:Authorization"]
    limits:
      - {algorithm: sliding_log, rate: 2/h}
    on_store_error: allow
"""


class RedisLongKeyTest(RedisFleetTestCase):
    def test_a_long_client_key_is_limited_in_redis_not_waved_through(self):
        sluice, upstream, redis = self.start_gateway(POLICIES, decision="{listen: 127.0.0.1:0}")
        bearer = {"Authorization": "Bearer " + "t" * 1100}
        codes = [request(sluice.port, "GET", "/api", headers=bearer).status for _ in range(5)]
        self.assertEqual(codes, [200, 200, 429, 429, 429])
        self.assertEqual(upstream.count("/api"), 2)
        # Through /v1/auth too: the same key, the same state.
        r = request(sluice.decision_port, "GET", "/v1/auth/token",
                    headers=dict(bearer, **{"X-Original-URI": "/api"}))
        self.assertEqual(r.status, 403, r)
        # Decided in Redis, under the key's SHA-256: no store error anywhere.
        self.assertEqual(fleet_metric([sluice], "sluice_store_errors_total"), 0)
        keys = redis.call("KEYS", "*sha256:*")
        self.assertEqual(len(keys), 1, keys)


if __name__ == "__main__":
    unittest.main()
