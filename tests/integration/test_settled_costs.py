"""Settled costs through the gateway (docs/settled-costs.md): a policy
reserves `cost.estimate` per request and settles the true cost from a header
of the upstream's answer; a cost above what is left is debt that later
requests repay at the limit's rate."""

import unittest

from harness import SluiceTestCase, ratelimit_members, request, run_check, server_block
from redis_harness import RedisServer, redis_store_block


class SettledCostsTest(SluiceTestCase):
    store = ""  # the memory store; RedisSettledCostsTest: one Redis

    def start(self, policy_extra=""):
        self.up = self.start_upstream("main")
        return self.start_sluice(server_block() + self.store + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: %s
policies:
  - name: tokens
    match: {path_prefix: /llm}
    key: [global]
    cost: {estimate: 50, settle: "response_header:X-Tokens-Used"}
    limits:
      - {algorithm: gcra, rate: 600/h}
%s""" % (self.up.url, policy_extra))

    def remaining(self, r):
        return ratelimit_members(r.header("RateLimit"))["tokens"]["r"]

    def test_the_answer_settles_the_cost_and_debt_is_repaid_at_the_rate(self):
        self.start()
        # 600 tokens, one back every 6 s: slow enough that no token comes back
        # between these requests on a loaded machine. Each request reserves 50,
        # then costs what it says.
        r = self.get("/llm/a?tokens=500")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.remaining(r), 550)  # told before the answer: 50 reserved
        r = self.get("/llm/b?tokens=0")  # 500 in use, 50 reserved, 50 given back
        self.assertEqual(self.remaining(r), 50)
        r = self.get("/llm/c")  # no header: the estimate stays the cost
        self.assertEqual(self.remaining(r), 50)
        r = self.get("/llm/d?tokens=300")  # 600 in use + 250 more: 250 owed
        self.assertEqual(r.status, 200, r)
        denied = self.get("/llm/e")
        self.assert_problem(denied, 429)
        # 850 in use; 50 more fit at 550: 300 tokens at one per 6 s, 1,800 s
        # (plus up to a tenth of the hour of jitter).
        self.assertGreaterEqual(int(denied.header("Retry-After")), 1800 - 6)
        self.assertLessEqual(int(denied.header("Retry-After")), 1800 + 360)
        self.assertEqual(self.up.count("/llm/e"), 0)


class SettleConfigTest(SluiceTestCase):
    def test_a_settle_needs_limits_that_carry_debt(self):
        up = self.start_upstream("main")
        base = server_block() + """\
routes:
  - {name: app, match: {path_prefix: /}, upstream: "%s"}
policies:
  - name: tokens
    cost: {estimate: 50, settle: "%s"}
    limits:
      - %s
"""
        for settle, limit, message in [
                ("response_header:X-Tokens-Used", "{algorithm: sliding_log, rate: 600/min}",
                 "cannot carry debt"),
                ("header:X-Tokens-Used", "{algorithm: gcra, rate: 600/min}",
                 "expected response_header:NAME"),
        ]:
            code, out, err = run_check(base % (up.url, settle, limit), self.tmpdir)
            self.assertNotEqual(code, 0)
            self.assertIn(message, out + err)


class SettleApiTest(SluiceTestCase):
    """POST /v1/check with "settle", then /v1/settle."""

    def setUp(self):
        super().setUp()
        self.start_sluice(server_block() + """\
policies:
  - name: llm
    limits:
      - {algorithm: gcra, rate: 600/min}
  - name: log
    limits:
      - {algorithm: sliding_log, rate: 600/min}
""")

    def test_a_reservation_settles_once_at_its_true_cost(self):
        r = self.post_json("/v1/check", {"policy": "llm", "key": "t", "cost": 50, "settle": True})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["remaining"], 550)
        reservation = r.json()["reservation"]
        self.assertEqual(reservation["expires_in_ms"], 3600 * 1000)
        settled = self.post_json("/v1/settle", {"reservation": reservation["id"], "cost": 500})
        self.assertEqual(settled.status, 200, settled)
        self.assertEqual(settled.json(), {"settled": True})
        # 500 charged in all: the next 50 leave 50.
        r = self.post_json("/v1/check", {"policy": "llm", "key": "t", "cost": 50})
        self.assertEqual(r.json()["remaining"], 50)
        self.assertNotIn("reservation", r.json())
        # A reservation settles once: a replay (of a refund, say) changes nothing.
        again = self.post_json("/v1/settle", {"reservation": reservation["id"], "cost": 0})
        self.assert_problem(again, 409)
        r = self.post_json("/v1/check", {"policy": "llm", "key": "t", "cost": 0})
        self.assertEqual(r.json()["remaining"], 50)

    def test_a_debt_shows_as_remaining_below_zero(self):
        rid = self.post_json("/v1/check", {"policy": "llm", "key": "owes", "cost": 100,
                                           "settle": True}).json()["reservation"]["id"]
        # 850 of 600 in use: 250 owed, repaid at 10 a second.
        self.assertEqual(self.post_json("/v1/settle", {"reservation": rid, "cost": 850}).status, 200)
        r = self.post_json("/v1/check", {"policy": "llm", "key": "owes", "cost": 1})
        self.assertEqual(r.status, 429, r)
        self.assertLessEqual(r.json()["remaining"], -240)
        self.assertGreaterEqual(r.json()["remaining"], -250)
        # The RateLimit field's r is a non-negative integer: 0, with t the wait.
        self.assertEqual(ratelimit_members(r.header("RateLimit"))["llm"]["r"], 0)
        self.assertGreaterEqual(ratelimit_members(r.header("RateLimit"))["llm"]["t"], 25)
        state = request(self.sluice.admin_port, "GET", "/v1/keys/llm/owes").json()
        self.assertLess(state["limits"][0]["remaining"], -200)

    def test_bad_settles_are_refused(self):
        rid = self.post_json("/v1/check", {"policy": "llm", "key": "u", "cost": 5,
                                      "settle": True}).json()["reservation"]["id"]
        payload, mac = rid.split(".")
        for body in ({"reservation": "A" + payload[1:] + "." + mac, "cost": 1},
                     {"reservation": rid, "cost": -1}, {"reservation": rid, "cost": 1.5},
                     {"reservation": rid}, {"cost": 1}, {"reservation": rid, "cost": 1, "x": 1},
                     [rid]):
            self.assert_problem(self.post_json("/v1/settle", body), 400)
        # Limits that cannot carry debt give no reservation.
        r = self.post_json("/v1/check", {"policy": "log", "key": "u", "cost": 5, "settle": True})
        self.assert_problem(r, 400)
        self.assertIn("cannot carry debt", r.json()["detail"])
        self.assert_problem(self.post_json("/v1/check", {"policy": "llm", "key": "u",
                                                    "settle": "yes"}), 400)
        # The reservation is still open: the refused settles did not close it.
        self.assertEqual(self.post_json("/v1/settle", {"reservation": rid, "cost": 5}).status, 200)


class RedisSettledCostsTest(SettledCostsTest):
    """The same on one Redis: the limit global, settled by one call (op G)."""

    def setUp(self):
        super().setUp()
        redis = RedisServer(self.tmpdir)
        self.addCleanup(redis.kill)
        redis.start()
        self.store = redis_store_block(url=redis.url, timeout="1s")


if __name__ == "__main__":
    unittest.main()
