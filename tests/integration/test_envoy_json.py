"""envoyproxy/ratelimit's POST /json on the decision API: a RateLimitRequest
in protobuf's JSON form, decided by the envoy rules as ShouldRateLimit
decides it, answered with the RateLimitResponse in JSON (200, or 429 when
OVER_LIMIT). In this process, and with the rules' state in Redis (the
answer then comes from the store's thread), where two instances share it."""

import json
import unittest

from harness import SluiceTestCase, request, server_block
from redis_harness import RedisFleetTestCase, redis_store_block

RULES = """\
grpc: {listen: 127.0.0.1:0}
envoy:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 2}
"""


def ask(port, body, method="POST", headers=None):
    r = request(port, method, "/json", body=body if isinstance(body, bytes) else body.encode(),
                headers=dict({"Content-Type": "application/json"}, **(headers or {})))
    return r.status, r.json() if r.body else None


def descriptor(address, hits=None, snake=False):
    d = {"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address",
                                                          "value": address}]}]}
    if hits is not None:
        d["hits_addend" if snake else "hitsAddend"] = hits
    return json.dumps(d)


class EnvoyJsonTest(SluiceTestCase):
    def test_json_decides_as_should_rate_limit(self):
        s = self.start_sluice(server_block() + RULES)
        status, r = ask(s.port, descriptor("10.0.0.1"))
        self.assertEqual(status, 200)
        self.assertEqual(r["overallCode"], "OK")
        self.assertEqual(r["statuses"][0]["currentLimit"],
                         {"requestsPerUnit": 2, "unit": "HOUR"})
        self.assertEqual(r["statuses"][0]["limitRemaining"], 1)
        self.assertTrue(r["statuses"][0]["durationUntilReset"].endswith("s"))
        headers = {h["key"]: h["value"] for h in r["responseHeadersToAdd"]}
        self.assertEqual(headers["RateLimit-Policy"], '"edge.remote_address";q=2;w=3600')
        # hits_addend, as written in the proto or in lowerCamelCase.
        status, r = ask(s.port, descriptor("10.0.0.1", hits=1, snake=True))
        self.assertEqual((status, r["overallCode"]), (200, "OK"))
        status, r = ask(s.port, descriptor("10.0.0.1"))
        self.assertEqual((status, r["overallCode"]), (429, "OVER_LIMIT"))
        self.assertEqual(r["statuses"][0]["code"], "OVER_LIMIT")
        status, r = ask(s.port, descriptor("10.0.0.2", hits=3))
        self.assertEqual((status, r["overallCode"]), (429, "OVER_LIMIT"))
        self.assertEqual(ask(s.port, descriptor("10.0.0.2", hits=2))[0], 200)
        # Not a request: 400 saying why; another method: 405.
        for body, why in (("{", "not a RateLimitRequest"),
                          ('{"domain": "edge", "bogus": 1}', "bogus"),
                          ('{"domain": 5}', "domain"),
                          ('{"domain": "edge"}', "descriptors must not be empty")):
            status, r = ask(s.port, body)
            self.assertEqual(status, 400, body)
            self.assertIn(why, r["detail"])
        self.assertEqual(ask(s.port, b"", method="GET")[0], 405)

    def test_json_needs_the_grpc_rules_and_the_decision_token(self):
        s = self.start_sluice(server_block() + "policies:\n  - name: p\n"
                              "    limits: [{algorithm: gcra, rate: 1/s}]\n")
        status, r = ask(s.port, descriptor("10.0.0.1"))
        self.assertEqual(status, 404)
        self.assertIn("grpc.listen", r["detail"])
        token = "t" * 24
        s = self.start_sluice(server_block(decision="{tokens: [%s]}" % token) + RULES)
        self.assertEqual(ask(s.port, descriptor("10.0.0.1"))[0], 401)
        self.assertEqual(ask(s.port, descriptor("10.0.0.1"),
                             headers={"Authorization": "Bearer " + token})[0], 200)


class EnvoyJsonRedisTest(RedisFleetTestCase):
    def test_two_instances_share_the_limit_in_redis(self):
        redis = self.start_redis()
        fleet = self.start_fleet(server_block(threads=2) + redis_store_block(url=redis.url,
                                                                              timeout="1s")
                                 + RULES, 2)
        answers = [ask(s.port, descriptor("10.0.0.9"))[0] for s in fleet + fleet]
        self.assertEqual(answers, [200, 200, 429, 429])


if __name__ == "__main__":
    unittest.main()
