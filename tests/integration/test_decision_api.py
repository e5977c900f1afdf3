"""POST /v1/check: the decision API (single and batch), its headers, and its
answers to bad input."""

import http.client
import json
import math
import threading
import unittest

from harness import (HOST, SluiceTestCase, ratelimit_members, request,
                     server_block, wait_for_window_room)

CONFIG = server_block() + """\
policies:
  # 3 at once, then one every 10 s: exact, predictable waits.
  - name: tb
    limits:
      - {algorithm: token_bucket, rate: 1/10s, burst: 3}
    on_deny: {retry_after_jitter: 0s}
  # One an hour: the exact wait stays ~3600 s during the test, so the spread
  # of Retry-After is the jitter alone.
  - name: jit
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 1}
    on_deny: {retry_after_jitter: 4s}
  - name: strict
    long_keys: refuse
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 1}
  - name: fw
    limits:
      - {algorithm: fixed_window, rate: 3/min}
    on_deny: {status: 429, retry_after_jitter: 0s}
  - name: roomy
    limits:
      - {algorithm: token_bucket, rate: 1000/s, burst: 1000}
  # No retry_after_jitter: the default spread is a tenth of the period (360 s).
  - name: hourly
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 1}
  - name: shape
    limits:
      - {algorithm: leaky_bucket, mode: shape, rate: 10/s, max_delay: 500ms}
  - name: trial
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 1}
    shadow: true
  - name: race
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 50}
"""

JSON_HEADERS = {"Content-Type": "application/json"}


class DecisionApiTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        self.start_sluice(CONFIG)

    # ---- single checks ----

    def test_allowed_until_burst_then_denied_with_exact_numbers(self):
        answers = [self.check("tb", "user-1") for _ in range(4)]
        for i, r in enumerate(answers[:3]):
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.content_type, "application/json", r)
            body = r.json()
            self.assertIs(body["allowed"], True, body)
            self.assertEqual(body["policy"], "tb")
            self.assertEqual(body["limit"], 3)
            self.assertEqual(body["remaining"], 2 - i)
            self.assertEqual(body["retry_after_ms"], 0)
            self.assertEqual(body["delay_ms"], 0)
            # Until full again: one 10 s token per token spent (less the
            # little time the requests took).
            self.assertLessEqual(body["reset_after_ms"], 10000 * (i + 1))
            self.assertGreater(body["reset_after_ms"], 10000 * (i + 1) - 2000)
            self.assertIsNone(r.header("Retry-After"), r)
        denied = answers[3]
        self.assertEqual(denied.status, 429, denied)
        self.assertEqual(denied.content_type, "application/json", denied)
        body = denied.json()
        self.assertIs(body["allowed"], False, body)
        self.assertEqual(body["policy"], "tb")
        self.assertEqual(body["limit"], 3)
        self.assertEqual(body["remaining"], 0)
        self.assertEqual(body["delay_ms"], 0)
        self.assertLessEqual(body["retry_after_ms"], 10000)
        self.assertGreater(body["retry_after_ms"], 8000)
        self.assertLessEqual(body["reset_after_ms"], 30000)
        self.assertGreater(body["reset_after_ms"], 28000)

    def test_denied_request_does_not_consume_quota(self):
        for _ in range(3):
            self.assertEqual(self.check("tb", "user-2").status, 200)
        first = self.check("tb", "user-2").json()
        for _ in range(5):
            self.assertEqual(self.check("tb", "user-2").status, 429)
        last = self.check("tb", "user-2").json()
        # Denials do not push the time of the next token further away.
        self.assertLessEqual(last["retry_after_ms"], first["retry_after_ms"])

    def test_keys_are_independent(self):
        for _ in range(3):
            self.assertEqual(self.check("tb", "a").status, 200)
        self.assertEqual(self.check("tb", "a").status, 429)
        self.assertEqual(self.check("tb", "b").status, 200)

    def test_cost_zero_is_a_peek(self):
        self.assertEqual(self.check("tb", "peek").json()["remaining"], 2)
        for _ in range(3):
            r = self.check("tb", "peek", cost=0)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["remaining"], 2, r)
        self.assertEqual(self.check("tb", "peek").json()["remaining"], 1)

    def test_cost_above_burst_can_never_pass_and_gets_no_retry_after(self):
        r = self.check("tb", "big", cost=4)
        self.assertEqual(r.status, 429, r)
        body = r.json()
        self.assertIs(body["allowed"], False)
        self.assertIsNone(body["retry_after_ms"], body)
        self.assertIsNone(r.header("Retry-After"), r)
        # The request could never pass: the RateLimit field gives no t.
        members = ratelimit_members(r.header("RateLimit"))
        self.assertNotIn("t", members["tb"])
        # And it took nothing.
        self.assertEqual(self.check("tb", "big").json()["remaining"], 2)

    def test_fixed_window_counts_in_calendar_windows(self):
        # Not within 5 s of a minute's end: the 4 requests fall in one
        # window, and the 4th is denied until the boundary.
        wait_for_window_room(60, 5)
        bodies = [self.check("fw", "w").json() for _ in range(4)]
        self.assertEqual([b["remaining"] for b in bodies], [2, 1, 0, 0])
        self.assertEqual([b["limit"] for b in bodies], [3, 3, 3, 3])
        wait = bodies[3]["retry_after_ms"]
        self.assertGreater(wait, 0)
        self.assertLessEqual(wait, 60000)
        # Windows start at multiples of the period since the epoch: the wait is
        # the time to the next whole minute, the same as reset_after.
        self.assertLessEqual(abs(bodies[3]["reset_after_ms"] - wait), 1000, bodies[3])

    def test_shape_policy_reports_delay(self):
        bodies = [self.check("shape", "q").json() for _ in range(8)]
        allowed = [b for b in bodies if b["allowed"]]
        # Departures 100 ms apart, none held longer than max_delay 500 ms:
        # delays 0, 100, ..., 500 (less the time the requests took).
        # (A 7th fits only if the 8 requests took over 100 ms.)
        self.assertIn(len(allowed), (6, 7), bodies)
        for i, b in enumerate(allowed):
            self.assertLessEqual(b["delay_ms"], 100 * i, bodies)
            self.assertGreater(b["delay_ms"], 100 * i - 80, bodies)
            self.assertEqual(b["retry_after_ms"], 0)
        for b in bodies[len(allowed):]:
            self.assertIs(b["allowed"], False, bodies)
            self.assertEqual(b["delay_ms"], 0)
            self.assertGreater(b["retry_after_ms"], 0)
            self.assertLessEqual(b["retry_after_ms"], 100)

    def test_shadow_policy_answers_allowed_and_flags_the_denial(self):
        self.assertEqual(self.check("trial", "s").status, 200)
        r = self.check("trial", "s")
        self.assertEqual(r.status, 200, r)
        body = r.json()
        self.assertIs(body["allowed"], True, body)
        self.assertIs(body.get("shadow_denied"), True, body)
        self.assertIsNone(r.header("Retry-After"))

    def test_concurrent_checks_never_admit_more_than_the_burst(self):
        allowed = []
        lock = threading.Lock()

        def worker():
            conn = http.client.HTTPConnection(HOST, self.sluice.port, timeout=5)
            try:
                for _ in range(25):
                    if self.check("race", "shared", conn=conn).status == 200:
                        with lock:
                            allowed.append(1)
            finally:
                conn.close()

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        # 200 requests from 8 connections over the server's threads: exactly
        # the burst of 50 passes (the rate adds nothing in a second).
        self.assertEqual(len(allowed), 50)

    # ---- headers ----

    def test_ratelimit_headers_on_allowed_response(self):
        r = self.check("tb", "hdr")
        self.assertEqual(r.status, 200)
        policy = ratelimit_members(r.header("RateLimit-Policy"))
        self.assertEqual(list(policy), ["tb"])
        self.assertEqual(policy["tb"]["q"], 3)
        self.assertEqual(policy["tb"]["w"], 10)
        state = ratelimit_members(r.header("RateLimit"))
        self.assertEqual(list(state), ["tb"])
        self.assertEqual(state["tb"]["r"], 2)
        self.assertIsInstance(state["tb"]["t"], int)
        self.assertTrue(0 <= state["tb"]["t"] <= 10, state)

    def test_ratelimit_headers_and_retry_after_on_denied_response(self):
        for _ in range(3):
            self.check("tb", "hdr-deny")
        r = self.check("tb", "hdr-deny")
        self.assertEqual(r.status, 429)
        policy = ratelimit_members(r.header("RateLimit-Policy"))
        self.assertEqual(policy["tb"]["q"], 3)
        self.assertEqual(policy["tb"]["w"], 10)
        state = ratelimit_members(r.header("RateLimit"))
        self.assertEqual(state["tb"]["r"], 0)
        exact_ms = r.json()["retry_after_ms"]
        self.assertEqual(state["tb"]["t"], math.ceil(exact_ms / 1000))
        retry_after = r.header("Retry-After")
        self.assertRegex(retry_after, r"^[0-9]+$")
        # No jitter configured: exactly the exact wait, rounded up.
        self.assertEqual(int(retry_after), math.ceil(exact_ms / 1000))
        self.assertGreaterEqual(int(retry_after), state["tb"]["t"])

    def test_retry_after_jitter_is_uniform_and_never_early(self):
        conn = http.client.HTTPConnection(HOST, self.sluice.port, timeout=5)
        self.addCleanup(conn.close)
        self.assertEqual(self.check("jit", "j", conn=conn).status, 200)
        jitter = 4
        offsets = []
        for _ in range(200):
            r = self.check("jit", "j", conn=conn)
            self.assertEqual(r.status, 429, r)
            exact_ms = r.json()["retry_after_ms"]
            value = r.header("Retry-After")
            self.assertRegex(value, r"^[0-9]+$")
            seconds = int(value)
            # Never earlier than the exact time, never beyond exact + jitter.
            self.assertGreaterEqual(seconds * 1000, exact_ms)
            self.assertLessEqual(seconds * 1000, exact_ms + jitter * 1000 + 1000)
            t = ratelimit_members(r.header("RateLimit"))["jit"]["t"]
            self.assertGreaterEqual(seconds, t)
            offsets.append(seconds * 1000 - exact_ms)
        # Retry-After = ceil(exact + U(0, 4 s)); with d = ceil(exact) - exact in
        # [0, 1 s), the offset Retry-After - exact is d + k s where k = 1, 2, 3
        # each have probability 1/4 (k = 0 has d/4, k = 4 has (1-d)/4), and
        # the mean offset is 2.5 s whatever d is.
        self.assertLess(min(offsets), 2000, sorted(offsets)[:10])
        self.assertGreater(max(offsets), (jitter - 1) * 1000, sorted(offsets)[-10:])
        counts = {}
        for off in offsets:
            counts[off // 1000] = counts.get(off // 1000, 0) + 1
        for second in (1, 2, 3):  # expected 50 of 200 each
            self.assertGreaterEqual(counts.get(second, 0), 20, counts)
            self.assertLessEqual(counts.get(second, 0), 85, counts)
        mean = sum(offsets) / len(offsets) / 1000
        # Standard error of the mean is about 0.08 s: +-0.4 s is 5 sigma.
        self.assertTrue(2.1 <= mean <= 2.9, "mean offset %.2fs, counts %r" % (mean, counts))

    def test_default_jitter_is_a_tenth_of_the_period(self):
        self.assertEqual(self.check("hourly", "d").status, 200)
        offsets = []
        for _ in range(40):
            r = self.check("hourly", "d")
            exact_ms = r.json()["retry_after_ms"]
            seconds = int(r.header("Retry-After"))
            self.assertGreaterEqual(seconds * 1000, exact_ms)
            self.assertLessEqual(seconds * 1000, exact_ms + 360_000 + 1000)
            offsets.append(seconds * 1000 - exact_ms)
        # Spread over 360 s: 40 draws do not all land in the first minute.
        self.assertGreater(max(offsets) - min(offsets), 60_000, offsets)

    # ---- batch ----

    def test_batch_answers_each_check_in_order_with_200(self):
        for _ in range(3):
            self.check("tb", "batch-full")
        r = self.post("/v1/check", [
            {"policy": "tb", "key": "batch-new"},
            {"policy": "tb", "key": "batch-full"},
            {"policy": "fw", "key": "batch-new", "cost": 0},
        ], headers=JSON_HEADERS)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.content_type, "application/json")
        out = r.json()
        self.assertIsInstance(out, list)
        self.assertEqual(len(out), 3)
        self.assertEqual(out[0]["allowed"], True)
        self.assertEqual(out[0]["policy"], "tb")
        self.assertEqual(out[0]["remaining"], 2)
        self.assertEqual(out[1]["allowed"], False)
        self.assertGreater(out[1]["retry_after_ms"], 0)
        self.assertEqual(out[2]["policy"], "fw")
        self.assertEqual(out[2]["allowed"], True)
        # The batch took what the single form would have.
        self.assertEqual(self.check("tb", "batch-new").json()["remaining"], 1)

    def test_batch_reports_bad_items_in_place(self):
        r = self.post("/v1/check", [
            {"policy": "nope", "key": "k"},
            {"policy": "tb", "key": "ok"},
            {"policy": "tb"},
            "not an object",
        ], headers=JSON_HEADERS)
        self.assertEqual(r.status, 200, r)
        out = r.json()
        self.assertEqual(len(out), 4, out)
        self.assertEqual(out[0].get("status"), 404, out)
        self.assertEqual(out[1]["allowed"], True, out)
        self.assertEqual(out[2].get("status"), 400, out)
        self.assertEqual(out[3].get("status"), 400, out)

    def test_empty_batch(self):
        r = self.post("/v1/check", [], headers=JSON_HEADERS)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), [])

    def test_batch_of_more_than_1000_checks_is_400(self):
        r = self.post("/v1/check", [{"policy": "roomy", "key": "b"}] * 1001, headers=JSON_HEADERS)
        self.assert_problem(r, 400)
        # Nothing was decided.
        self.assertEqual(self.check("roomy", "b").json()["remaining"], 999)
        r = self.post("/v1/check", [{"policy": "roomy", "key": "c", "cost": 0}] * 1000,
                      headers=JSON_HEADERS)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(len(r.json()), 1000)

    # ---- bad input ----

    def assert_rejected(self, body, status, raw=False):
        data = body if raw else json.dumps(body)
        r = self.post("/v1/check", data, headers=JSON_HEADERS)
        problem = self.assert_problem(r, status)
        self.assertTrue(problem.get("detail"), problem)
        self.assert_healthy()
        # Still deciding correctly.
        self.assertEqual(self.check("roomy", "after-bad-input").status, 200)
        return problem

    def test_body_not_json_is_400(self):
        self.assert_rejected('{"policy": "tb", "key": ', 400, raw=True)

    def test_empty_body_is_400(self):
        self.assert_rejected("", 400, raw=True)

    def test_missing_policy_is_400(self):
        self.assert_rejected({"key": "k"}, 400)

    def test_missing_key_is_400(self):
        self.assert_rejected({"policy": "tb"}, 400)

    def test_unknown_policy_is_404(self):
        problem = self.assert_rejected({"policy": "no-such-policy", "key": "k"}, 404)
        self.assertIn("no-such-policy", problem["detail"])

    def test_key_not_a_string_is_400(self):
        self.assert_rejected({"policy": "tb", "key": 42}, 400)

    def test_negative_cost_is_400(self):
        self.assert_rejected({"policy": "tb", "key": "k", "cost": -1}, 400)

    def test_fractional_cost_is_400(self):
        self.assert_rejected({"policy": "tb", "key": "k", "cost": 1.5}, 400)

    def test_string_cost_is_400(self):
        self.assert_rejected({"policy": "tb", "key": "k", "cost": "3"}, 400)

    def test_huge_cost_is_400(self):
        self.assert_rejected({"policy": "tb", "key": "k", "cost": 10 ** 30}, 400)
        self.assert_rejected({"policy": "tb", "key": "k", "cost": 2 ** 63 - 1}, 400)

    def test_key_longer_than_1024_bytes_is_hashed_and_limited(self):
        # long_keys: hash (the default): decided under the key's SHA-256.
        for _ in range(3):
            self.assertEqual(self.check("tb", "k" * 1025).status, 200)
        self.assertEqual(self.check("tb", "k" * 1025).status, 429)
        self.assertEqual(self.check("tb", "k" * 1024 + "j").status, 200)  # its own state

    def test_key_longer_than_1024_bytes_is_400_with_long_keys_refuse(self):
        self.assert_rejected({"policy": "strict", "key": "k" * 1025}, 400)
        # Bytes, not characters: 513 two-byte characters are 1026 bytes.
        self.assert_rejected({"policy": "strict", "key": "\u00e9" * 513}, 400)
        # 1024 bytes is fine.
        self.assertEqual(self.check("strict", "k" * 1024).status, 200)

    def test_unknown_field_is_400(self):
        problem = self.assert_rejected({"policy": "tb", "key": "k", "weight": 1}, 400)
        self.assertIn("weight", problem["detail"])

    def test_a_field_named_twice_is_400(self):
        # RFC 8259 leaves which of the two counts to each reader: the caller
        # that wrote it and sluice could read different keys.
        for body in ('{"policy": "tb", "key": "twice-a", "key": "twice-b"}',
                     '{"policy": "tb", "k\\u0065y": "twice-a", "key": "twice-b"}',
                     '[{"policy": "tb", "key": "twice-a", "cost": 1, "cost": 0}]'):
            problem = self.assert_rejected(body, 400, raw=True)
            self.assertIn("twice", problem["detail"])
        for key in ("twice-a", "twice-b"):  # nothing was taken
            self.assertEqual(self.check("tb", key).json()["remaining"], 2)

    def test_body_not_an_object_is_400(self):
        self.assert_rejected("42", 400, raw=True)

    def test_deeply_nested_json_is_answered_without_a_crash(self):
        depth = 400_000  # 800 KB, under the 1 MiB body limit
        r = self.post("/v1/check", "[" * depth + "]" * depth, headers=JSON_HEADERS)
        self.assertTrue(200 <= r.status < 500, r)
        self.assertIsNone(self.sluice.proc.poll(), "sluice exited")
        self.assert_healthy()

    def test_get_is_405_with_allow(self):
        r = self.get("/v1/check")
        self.assert_problem(r, 405)
        self.assertIn("POST", r.header("Allow") or "", r)
        self.assert_healthy()

    def test_rejections_take_nothing(self):
        for body in ({"policy": "tb", "key": "rej", "cost": -1},
                     {"policy": "tb", "key": "rej", "cost": 1.5},
                     {"policy": "tb", "key": "rej", "extra": True}):
            self.assertEqual(self.post("/v1/check", body, headers=JSON_HEADERS).status, 400)
        self.assertEqual(self.check("tb", "rej").json()["remaining"], 2)

    def test_keep_alive_connection_serves_many_checks(self):
        conn = http.client.HTTPConnection(HOST, self.sluice.port, timeout=5)
        self.addCleanup(conn.close)
        statuses = [self.check("roomy", "ka", conn=conn).status for _ in range(50)]
        self.assertEqual(statuses, [200] * 50)
        # A bad request on the same connection does not break it.
        r = request(self.sluice.port, "POST", "/v1/check", body="nope", conn=conn)
        self.assertEqual(r.status, 400)
        self.assertEqual(self.check("roomy", "ka", conn=conn).status, 200)


class LegacyHeadersTest(SluiceTestCase):
    def test_legacy_x_ratelimit_trio_when_switched_on(self):
        self.start_sluice(server_block(legacy_headers="true") + """\
policies:
  - name: tb
    limits:
      - {algorithm: token_bucket, rate: 1/10s, burst: 2}
""")
        r = self.check("tb", "l")
        self.assertEqual(r.header("X-RateLimit-Limit"), "2")
        self.assertEqual(r.header("X-RateLimit-Remaining"), "1")
        self.assertRegex(r.header("X-RateLimit-Reset"), r"^[0-9]+$")
        self.check("tb", "l")
        r = self.check("tb", "l")
        self.assertEqual(r.status, 429)
        self.assertEqual(r.header("X-RateLimit-Remaining"), "0")
        self.assertLessEqual(int(r.header("X-RateLimit-Reset")), int(r.header("Retry-After")))
        # The draft-10 fields are there too.
        self.assertIn("tb", ratelimit_members(r.header("RateLimit")))

    def test_legacy_headers_are_off_by_default(self):
        self.start_sluice(server_block() + """\
policies:
  - name: tb
    limits:
      - {algorithm: token_bucket, rate: 1/10s, burst: 2}
""")
        r = self.check("tb", "l")
        self.assertIsNone(r.header("X-RateLimit-Limit"))
        self.assertIsNone(r.header("X-RateLimit-Remaining"))


if __name__ == "__main__":
    unittest.main()
