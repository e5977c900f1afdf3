"""The admin listener's live views, which the dashboard draws: /v1/series
(decisions per second), /v1/top (the keys denied most), /v1/status (the
process, its config's history, the stores) and the simulator
(/v1/sim/scenarios, POST /v1/sim)."""

import json
import signal
import time
import unittest

from harness import SluiceTestCase, request, server_block

CONFIG = server_block() + """\
policies:
  - name: two
    limits:
      - {algorithm: token_bucket, rate: 2/h, burst: 2}
  - name: one.b
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 1}
  - name: shaped
    limits:
      - {algorithm: leaky_bucket, mode: shape, rate: 20/s, max_delay: 2s}
"""


class AdminLiveTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        self.start_sluice(CONFIG)

    def admin(self, path, method="GET", body=None):
        return request(self.sluice.admin_port, method, path, body=body)

    def wait_for(self, what, predicate, timeout=5.0):
        deadline = time.monotonic() + timeout
        while True:
            got = what()
            if predicate(got):
                return got
            if time.monotonic() > deadline:
                self.fail("never came: %r" % (got,))
            time.sleep(0.1)

    def test_series_counts_each_outcome_per_second(self):
        statuses = [self.check("two", "a").status for _ in range(5)]
        self.assertEqual(statuses, [200, 200, 429, 429, 429])
        for _ in range(6):
            self.check("shaped", "s")

        def totals():
            body = self.admin("/v1/series").json()
            return body, {p: {o: sum(v) for o, v in outcomes.items()}
                          for p, outcomes in body["policies"].items()}
        # The series holds whole seconds: decisions of the second still
        # running come with it once it ends (six decisions may span two).
        body, sums = self.wait_for(
            totals, lambda got: got[1].get("two", {}).get("denied") == 3 and
            got[1]["shaped"]["delayed"] > 0 and
            got[1]["shaped"]["allowed"] + got[1]["shaped"]["delayed"] >= 6)
        self.assertEqual(sums["two"], {"allowed": 2, "delayed": 0, "denied": 3, "shadow_denied": 0})
        self.assertEqual(sums["shaped"]["allowed"] + sums["shaped"]["delayed"], 6)
        self.assertEqual(body["interval_ms"], 1000)
        self.assertEqual(body["end_ms"] % 1000, 0)
        self.assertLess(abs(body["end_ms"] / 1000 - time.time()), 5)
        lengths = {len(v) for outcomes in body["policies"].values() for v in outcomes.values()}
        self.assertEqual(len(lengths), 1, body)
        self.assertLessEqual(lengths.pop(), 300)
        # ?seconds= keeps the newest samples only.
        short = self.admin("/v1/series?seconds=2").json()
        for outcomes in short["policies"].values():
            for v in outcomes.values():
                self.assertLessEqual(len(v), 2)

    def test_top_names_the_key_denied_most(self):
        for _ in range(6):
            self.check("two", "abuser")
        for i in range(3):
            self.check("two", "k%d" % i)
        self.check("one.b", "x")
        self.check("one.b", "x")
        body = self.admin("/v1/top/two?n=2").json()
        self.assertEqual(body["policy"], "two")
        self.assertEqual(body["window_s"], 300)
        self.assertEqual(body["keys"], [{"key": "abuser", "denied": 4, "error": 0}])
        # A policy's name percent-encoded, and every policy at once.
        odd = self.admin("/v1/top/one%2Eb").json()
        self.assertEqual(odd["keys"], [{"key": "x", "denied": 1, "error": 0}])
        everything = self.admin("/v1/top").json()
        self.assertEqual(sorted(everything["policies"]), ["one.b", "shaped", "two"])
        self.assertEqual(everything["policies"]["shaped"], [])
        self.assert_problem(self.admin("/v1/top/nope"), 404)

    def test_status_tells_the_config_history_and_the_store(self):
        before = self.admin("/v1/status").json()
        self.assertRegex(before["version"], r"^\d+\.\d+\.\d+")
        self.assertLessEqual(before["started_at_ms"], time.time() * 1000)
        self.assertTrue(before["config"]["source"].endswith("config.yaml"))
        self.assertIsNone(before["config"]["last_reload_error"])
        self.assertIsNone(before["store"]["redis"])
        self.check("two", "status-key")
        self.assertGreaterEqual(self.admin("/v1/status").json()["store"]["memory"]["keys"], 1)
        # A broken file: the error is shown, the config in force stays.
        self.sluice.write_config(CONFIG.replace("rate: 2/h", "rate: often"))
        self.sluice.signal(signal.SIGHUP)
        broken = self.wait_for(lambda: self.admin("/v1/status").json(),
                               lambda s: s["config"]["last_reload_error"] is not None)
        self.assertIn("often", broken["config"]["last_reload_error"]["message"])
        self.assertEqual(broken["config"]["loaded_at_ms"], before["config"]["loaded_at_ms"])
        # Fixed: the error is gone and the load time moves.
        self.sluice.write_config(CONFIG.replace("rate: 2/h", "rate: 3/h"))
        self.sluice.signal(signal.SIGHUP)
        fixed = self.wait_for(lambda: self.admin("/v1/status").json(),
                              lambda s: s["config"]["last_reload_error"] is None)
        self.assertGreater(fixed["config"]["loaded_at_ms"], before["config"]["loaded_at_ms"])
        self.assertEqual(before["config"]["reloads"], {"ok": 0, "failed": 0})
        self.assertEqual(fixed["config"]["reloads"], {"ok": 1, "failed": 1})

    def test_simulator_runs_a_builtin_scenario_like_the_command(self):
        scenarios = self.admin("/v1/sim/scenarios").json()["scenarios"]
        names = [s["name"] for s in scenarios]
        self.assertIn("login-storm", names)
        self.assertIn("limiters:", scenarios[0]["yaml"])
        r = self.admin("/v1/sim", "POST",
                       json.dumps({"scenario": "login-storm", "limiters": ["fixed_window 40/min"]}))
        self.assertEqual(r.status, 200, r)
        body = r.json()
        self.assertEqual([run["name"] for run in body["runs"]], ["fixed_window 40/min"])
        run = body["runs"][0]
        # The seed's numbers: 40 of the 400 pass in the first second.
        self.assertEqual(run["metrics"]["requests"], 400)
        self.assertEqual(run["series"]["admitted"][0], 40)
        self.assertEqual(run["series"]["rejected"][0], 360)

    def test_simulator_runs_a_posted_scenario_and_says_what_is_wrong(self):
        yaml = "\n".join([
            "name: mine",
            "duration: 10s",
            "clients:",
            "  - {name: c, count: 10, key: global, retry: never, traffic: [{burst: 10, at: 0s}]}",
            "limiters:",
            "  - {name: five, algorithm: fixed_window, rate: 5/min}",
        ])
        r = self.admin("/v1/sim", "POST", json.dumps({"yaml": yaml}))
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["runs"][0]["metrics"]["admitted"], 5)
        bad = self.admin("/v1/sim", "POST", json.dumps({"yaml": yaml.replace("5/min", "lots")}))
        self.assert_problem(bad, 400)
        self.assertIn("scenario:6", bad.json()["detail"])
        self.assert_problem(self.admin("/v1/sim", "POST", "not json"), 400)
        deep = self.admin("/v1/sim", "POST", "[" * 20000 + "]" * 20000)
        self.assert_problem(deep, 400)
        self.assertIn("deeper than", deep.json()["detail"])
        self.assert_problem(self.admin("/v1/sim", "POST", json.dumps({"scenario": "nope"})), 400)
        self.assert_problem(self.admin("/v1/sim", "POST", json.dumps({"yaml": yaml, "x": 1})), 400)
        self.assert_problem(self.admin("/v1/sim"), 405)
        # Bounded: more clients than the admin listener simulates.
        big = yaml.replace("count: 10,", "count: 1000000,")
        self.assert_problem(self.admin("/v1/sim", "POST", json.dumps({"yaml": big})), 422)
        # Bounded: more requests than it simulates (a rate for an hour).
        heavy = yaml.replace("duration: 10s", "duration: 1h").replace(
            "traffic: [{burst: 10, at: 0s}]", "traffic: [{constant: 1000/s}]")
        r = self.admin("/v1/sim", "POST", json.dumps({"yaml": heavy}))
        self.assert_problem(r, 422)
        self.assertIn("1000000", r.json()["detail"])
        self.assert_healthy()


if __name__ == "__main__":
    unittest.main()
