"""The admin listener: /healthz /readyz /metrics /v1/config /v1/keys/{policy}/{key}
/v1/quota."""

import math
import re
import unittest
import urllib.parse

from harness import (SluiceTestCase, metric_value, parse_metrics, parse_raw_response,
                     raw_exchange, request, server_block, wait_for_window_room)

CONFIG = server_block() + """\
policies:
  - name: two
    limits:
      - {algorithm: fixed_window, rate: 2/h}
  - name: tb
    key: ["header:X-Api-Key"]
    limits:
      - {algorithm: token_bucket, rate: 1/min, burst: 3}
      - {algorithm: sliding_log, rate: 100/h}
    on_deny: {status: 503, retry_after_jitter: 2s}
  - name: shaped
    limits:
      - {algorithm: leaky_bucket, mode: shape, rate: 5/s, max_delay: 2s}
    shadow: true
"""


class AdminTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        self.start_sluice(CONFIG)

    def test_healthz_is_200(self):
        r = self.get("/healthz", admin=True)
        self.assertEqual(r.status, 200, r)

    def test_http_1_0_client_gets_answer_and_close(self):
        import time
        t0 = time.monotonic()
        got = raw_exchange(self.sluice.admin_port, b"GET /healthz HTTP/1.0\r\n\r\n", timeout=3)
        self.assertLess(time.monotonic() - t0, 2.0, "connection not closed after an HTTP/1.0 answer")
        r = parse_raw_response(got)
        self.assertEqual(r.status, 200, got)
        self.assertTrue(got.startswith(b"HTTP/1."), got)
        self.assertNotEqual((r.header("Connection") or "").lower(), "keep-alive", got)

    def test_readyz_is_200(self):
        r = self.get("/readyz", admin=True)
        self.assertEqual(r.status, 200, r)

    def test_admin_endpoints_are_not_on_the_main_listener(self):
        # The main listener has no routes: /metrics there is not the admin page.
        r = self.get("/metrics")
        self.assertNotEqual(r.status, 200, r)

    def test_unknown_admin_path_is_404(self):
        self.assert_problem(self.get("/nope", admin=True), 404)

    def test_quota_lists_no_bucket_without_the_quota_service(self):
        r = self.get("/v1/quota", admin=True)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"buckets": []})

    def test_metrics_text_format_parses(self):
        self.check("two", "m")
        r = self.get("/metrics", admin=True)
        self.assertEqual(r.status, 200)
        self.assertTrue((r.header("Content-Type") or "").startswith("text/plain"), r)
        text = r.body.decode()
        self.assertTrue(text.endswith("\n"))
        samples = parse_metrics(text)  # fails on any malformed line
        names = {n for n, _, _ in samples}
        for expected in ("sluice_decisions_total", "sluice_decision_duration_seconds_bucket",
                         "sluice_decision_duration_seconds_count",
                         "sluice_decision_duration_seconds_sum"):
            self.assertIn(expected, names)
        # Each metric family is declared once, before its samples.
        typed = {}
        for line in text.split("\n"):
            m = re.match(r"# TYPE (\S+) (counter|gauge|histogram|summary|untyped)$", line)
            if m:
                self.assertNotIn(m.group(1), typed, "TYPE declared twice for " + m.group(1))
                typed[m.group(1)] = m.group(2)
            elif line.startswith("# TYPE"):
                self.fail("malformed TYPE line %r" % line)
        for name in names:
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            self.assertTrue(name in typed or family in typed, "no TYPE for " + name)
        # Series are unique.
        seen = set()
        for n, labels, _ in samples:
            key = (n, tuple(sorted(labels.items())))
            self.assertNotIn(key, seen)
            seen.add(key)

    def test_decisions_total_counts_by_policy_and_outcome(self):
        # "two" is an hour's fixed window (GET /v1/config shows it): its three
        # requests must not straddle the hour, or the third is admitted.
        wait_for_window_room(3600, 5)
        before = self.metrics()
        statuses = [self.check("two", "d").status for _ in range(3)]
        self.assertEqual(statuses, [200, 200, 429])
        after = self.metrics()

        def delta(**labels):
            return (metric_value(after, "sluice_decisions_total", **labels) -
                    metric_value(before, "sluice_decisions_total", **labels))
        self.assertEqual(delta(policy="two", outcome="allowed"), 2)
        self.assertEqual(delta(policy="two", outcome="denied"), 1)
        self.assertEqual(delta(policy="tb", outcome="allowed"), 0)
        # A shadow denial has its own outcome and the answer stays "allowed".
        for _ in range(20):
            self.check("shaped", "s")
        final = self.metrics()
        shadow = metric_value(final, "sluice_decisions_total", policy="shaped", outcome="shadow_denied")
        allowed = metric_value(final, "sluice_decisions_total", policy="shaped", outcome="allowed")
        delayed = metric_value(final, "sluice_decisions_total", policy="shaped", outcome="delayed")
        self.assertEqual(shadow + allowed + delayed, 20)
        self.assertGreater(shadow, 0)
        # Admitted after a shaping delay: "delayed", not "allowed".
        self.assertGreater(delayed, 0)

    def test_decision_latency_histogram_is_cumulative_and_ends_with_inf_equal_count(self):
        for i in range(25):
            self.check("tb", "h%d" % i)
        samples = self.metrics()
        buckets = [(labels["le"], v) for n, labels, v in samples
                   if n == "sluice_decision_duration_seconds_bucket"]
        self.assertGreater(len(buckets), 2)
        bounds = [math.inf if le == "+Inf" else float(le) for le, _ in buckets]
        self.assertEqual(bounds[-1], math.inf, "the last bucket must be +Inf")
        self.assertEqual(bounds, sorted(bounds), "bucket bounds must increase")
        self.assertEqual(len(set(bounds)), len(bounds))
        counts = [v for _, v in buckets]
        self.assertEqual(counts, sorted(counts), "buckets must be cumulative")
        count = metric_value(samples, "sluice_decision_duration_seconds_count")
        self.assertEqual(counts[-1], count)
        self.assertGreaterEqual(count, 25)
        total = metric_value(samples, "sluice_decision_duration_seconds_sum")
        self.assertGreaterEqual(total, 0)
        self.assertLess(total, count)  # under a second each

    def test_responses_total_counts_statuses(self):
        before = metric_value(self.metrics(), "sluice_http_responses_total", listener="main", code="404")
        self.check("no-such-policy", "x")
        after = metric_value(self.metrics(), "sluice_http_responses_total", listener="main", code="404")
        self.assertEqual(after - before, 1)

    def test_config_lists_policies_with_their_limits(self):
        r = self.get("/v1/config", admin=True)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.content_type, "application/json")
        body = r.json()
        policies = {p["name"]: p for p in body["policies"]}
        self.assertEqual(list(policies), ["two", "tb", "shaped"])
        self.assertEqual(policies["two"]["limits"][0]["algorithm"], "fixed_window")
        self.assertEqual(policies["two"]["limits"][0]["rate"], "2/h")
        tb = policies["tb"]
        self.assertEqual([l["algorithm"] for l in tb["limits"]], ["token_bucket", "sliding_log"])
        self.assertEqual(tb["limits"][0]["rate"], "1/min")
        self.assertEqual(tb["limits"][0]["burst"], 3)
        self.assertEqual(tb["limits"][1]["rate"], "100/h")
        self.assertEqual(tb["on_deny"]["status"], 503)
        self.assertEqual(tb["key"], ["header:x-api-key"])
        shaped = policies["shaped"]["limits"][0]
        self.assertEqual(shaped["mode"], "shape")
        self.assertEqual(shaped["max_delay"], "2s")
        self.assertIs(policies["shaped"]["shadow"], True)
        self.assertIs(policies["two"]["shadow"], False)

    def test_key_state_shows_remaining_without_changing_it(self):
        self.assertEqual(self.check("tb", "user/7 x").json()["remaining"], 2)
        path = "/v1/keys/tb/" + urllib.parse.quote("user/7 x", safe="")
        first = self.get(path, admin=True)
        self.assertEqual(first.status, 200, first)
        second = self.get(path, admin=True)
        self.assertEqual(second.status, 200, second)
        a, b = first.json(), second.json()
        self.assertEqual(a["policy"], "tb")
        self.assertEqual(a["key"], "user/7 x")
        self.assertEqual(len(a["limits"]), 2)
        self.assertEqual(a["limits"][0]["algorithm"], "token_bucket")
        self.assertEqual(a["limits"][0]["limit"], 3)
        self.assertEqual(a["limits"][0]["remaining"], 2)
        self.assertIs(a["limits"][0]["next_request_allowed"], True)
        self.assertEqual(a["limits"][1]["remaining"], 99)
        self.assertEqual([l["remaining"] for l in b["limits"]], [2, 99])
        # The next request still sees the same quota: reading took nothing.
        self.assertEqual(self.check("tb", "user/7 x").json()["remaining"], 1)

    def test_key_state_of_an_exhausted_key_says_why(self):
        for _ in range(3):
            self.check("tb", "spent")
        r = self.get("/v1/keys/tb/spent", admin=True).json()
        lim = r["limits"][0]
        self.assertEqual(lim["remaining"], 0)
        self.assertIs(lim["next_request_allowed"], False)
        self.assertGreater(lim["next_request_retry_after_ms"], 50000)
        self.assertLessEqual(lim["next_request_retry_after_ms"], 60000)

    def test_key_state_of_an_unseen_key_is_full(self):
        r = self.get("/v1/keys/two/never-seen", admin=True)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["limits"][0]["remaining"], 2)

    def test_key_state_for_unknown_policy_is_404(self):
        r = self.get("/v1/keys/no-such-policy/k", admin=True)
        self.assert_problem(r, 404)

    def test_admin_answers_get_only(self):
        r = request(self.sluice.admin_port, "POST", "/v1/config", body="{}")
        self.assert_problem(r, 405)
        self.assert_healthy()


if __name__ == "__main__":
    unittest.main()
