"""Concurrency limits (docs/concurrency.md): at most N requests of a key in
flight through the gateway, in one process on the memory store and across
3 processes on one Redis; the slots of a process killed while it holds them
come back when their lease ends."""

import base64
import concurrent.futures
import hashlib
import hmac
import os
import signal
import time
import unittest

from harness import (SluiceTestCase, Upstream, post_json, ratelimit_members, request, run_check,
                     server_block)
from redis_harness import RedisFleetTestCase, redis_store_block, wait_until

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

    def test_a_shaped_request_holds_no_slot_while_it_waits(self):
        up = self.start_upstream("main", slow_seconds=1.5)
        self.start_sluice(server_block(upstream_timeout="5s") + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: %s
policies:
  - name: inflight
    match: {path_prefix: /}
    key: [global]
    limits:
      - {algorithm: concurrency, limit: 1, lease_ttl: 10s}
  - name: paced
    match: {path_prefix: /shaped}
    key: [global]
    limits:
      - {algorithm: leaky_bucket, mode: shape, rate: 2/s, max_delay: 5s}
""" % up.url)
        port = self.sluice.port
        self.assertEqual(request(port, "GET", "/shaped/a").status, 200)  # first: no delay
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            # b waits ~500 ms for its departure slot, holding no concurrency
            # slot meanwhile: c, sent during the wait, passes.
            b = pool.submit(request, port, "GET", "/shaped/b", timeout=10)
            time.sleep(0.15)
            c = request(port, "GET", "/plain/c")
            self.assertEqual(c.status, 200, c)
            self.assertEqual(b.result().status, 200)
            # d waits too; e takes the slot and keeps it 1.5 s: when d's wait
            # ends there is no slot for it.
            d = pool.submit(request, port, "GET", "/shaped/d", timeout=10)
            time.sleep(0.15)
            e = pool.submit(request, port, "GET", "/slow/e", timeout=10)
            denied = d.result()
            self.assert_problem(denied, 429)
            self.assertIn("no concurrency slot was free once the shaping delay had passed",
                          denied.json()["detail"])
            self.assertEqual(e.result().status, 200)
        self.assertEqual(up.count("/shaped/d"), 0)

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

    def start_fleet_sharing_a_secret(self, policies):
        """Two processes on one Redis with one lease secret, and `policies`."""
        redis = self.shared_redis = self.start_redis()
        os.environ["SLUICE_TEST_LEASE_SECRET"] = "a-secret-the-fleet-shares"
        self.addCleanup(os.environ.pop, "SLUICE_TEST_LEASE_SECRET", None)
        config = (server_block(decision="{lease_secret_env: SLUICE_TEST_LEASE_SECRET}") +
                  redis_store_block(url=redis.url, timeout="1s") + "policies:\n" + policies)
        return self.start_fleet(config, 2)

    def test_leases_renew_and_release_through_any_process_with_a_shared_secret(self):
        a, b = self.start_fleet_sharing_a_secret("""\
  - name: jobs
    limits:
      - {algorithm: concurrency, limit: 2, lease_ttl: 1s}
""")

        def acquire(s):
            return post_json(s.port, "/v1/acquire", {"policy": "jobs", "key": "k"})

        first, second = acquire(a), acquire(a)
        self.assertEqual((first.status, second.status), (200, 200))
        self.assertEqual(acquire(b).status, 429)
        released = post_json(b.port, "/v1/release", {"lease": first.json()["lease"]["id"]})
        self.assertEqual(released.status, 200)
        third = acquire(b)
        self.assertEqual(third.status, 200)
        time.sleep(0.6)
        r = post_json(b.port, "/v1/renew", {"lease": second.json()["lease"]["id"]})
        self.assertEqual(r.status, 200, r)
        time.sleep(0.6)  # the third lease has ended, the renewed second has not
        self.assertEqual(acquire(a).status, 200)
        self.assertEqual(acquire(b).status, 429)

    def test_a_lease_is_given_back_once_across_the_fleet(self):
        # A release sent again, to any instance, must not give back the slot
        # another request holds: slots are named, and a lease gives back its
        # own or nothing. Nothing is recorded per release either.
        a, b = self.start_fleet_sharing_a_secret("""\
  - name: jobs
    limits:
      - {algorithm: concurrency, limit: 2, lease_ttl: 30s}
  - name: here
    limits:
      - {algorithm: concurrency, limit: 2, lease_ttl: 30s, scope: local}
""")

        def call(s, path, body):
            return post_json(s.port, path, body)

        def acquire(s, policy="jobs", key="k"):
            return call(s, "/v1/acquire", {"policy": policy, "key": key})

        first, second = acquire(a), acquire(a)
        self.assertEqual((first.status, second.status), (200, 200))
        lease = {"lease": first.json()["lease"]["id"]}
        self.assertEqual(call(b, "/v1/release", lease).status, 200)
        for s in (a, b):
            r = call(s, "/v1/release", lease)
            self.assertEqual((r.status, r.json()), (200, {"released": True}), r)
            r = call(s, "/v1/renew", lease)
            self.assertEqual(r.status, 409, r)
            self.assertEqual(r.json()["title"], "lease lost")
        self.assertEqual(acquire(b).status, 200)
        self.assertEqual(acquire(a).status, 429)  # the second lease still holds its slot
        # A renewed lease keeps its name: either of its ids gives it back, once.
        old = {"lease": second.json()["lease"]["id"]}
        renewed = call(a, "/v1/renew", old)
        self.assertEqual(renewed.status, 200, renewed)
        self.assertEqual(call(b, "/v1/release", old).status, 200)
        self.assertEqual(call(a, "/v1/release", {"lease": renewed.json()["lease"]["id"]}).status,
                         200)
        self.assertEqual(acquire(b).status, 200)
        self.assertEqual(acquire(a).status, 429)
        # Leases taken and given back leave nothing behind in Redis.
        keys = int(self.shared_redis.call("DBSIZE"))
        for _ in range(40):
            # b's release of the lease before goes to Redis without waiting
            # (Limiter::Release), on b's connection: a's acquire may get
            # there first, and then finds the slot still held for a moment.
            taken = wait_until(lambda: (lambda r: r if r.status == 200 else None)(
                acquire(a, key="loop")), 5, what="a slot of key loop")
            self.assertEqual(call(b, "/v1/release", {"lease": taken.json()["lease"]["id"]}).status,
                             200)
        self.assertLessEqual(int(self.shared_redis.call("DBSIZE")), keys + 1)
        # A lease id of the versions whose slots were counted (no name in
        # it), signed with the fleet's secret, is not read.
        payload = ("l 1 %d %d 0 0 4 jobsk" % ((time.time_ns() // 1000,) * 2)).encode()
        mac = hmac.new(b"a-secret-the-fleet-shares", payload, hashlib.sha256).digest()
        old_id = ".".join(base64.urlsafe_b64encode(x).rstrip(b"=").decode() for x in (payload, mac))
        for path in ("/v1/release", "/v1/renew"):
            r = call(a, path, {"lease": old_id})
            self.assertEqual(r.status, 400, r)
            self.assertIn("malformed", r.json()["detail"])
        # Slots held in one instance's memory are given back there alone.
        here = acquire(a, "here")
        self.assertEqual(here.status, 200)
        r = call(b, "/v1/release", {"lease": here.json()["lease"]["id"]})
        self.assertEqual(r.status, 400, r)
        self.assertIn("not a lease or reservation this server gave", r.json()["detail"])
        self.assertEqual(call(a, "/v1/release", {"lease": here.json()["lease"]["id"]}).status, 200)


    def test_a_lease_taken_while_redis_is_down_is_given_back_here_once(self):
        redis = self.start_redis()
        config = (server_block() + redis_store_block(url=redis.url, timeout="100ms") + """\
policies:
  - name: jobs
    limits:
      - {algorithm: concurrency, limit: 1, lease_ttl: 30s}
    on_store_error: local
""")
        s, = self.start_fleet(config, 1)
        redis.kill()

        def acquire():
            return post_json(s.port, "/v1/acquire", {"policy": "jobs", "key": "k"})

        held = acquire()  # decided by the local fallback
        self.assertEqual(held.status, 200, held)
        self.assertEqual(acquire().status, 429)
        lease = {"lease": held.json()["lease"]["id"]}
        self.assertEqual(post_json(s.port, "/v1/release", lease).status, 200)
        self.assertEqual(acquire().status, 200)
        self.assertEqual(post_json(s.port, "/v1/release", lease).status, 200)  # nothing, again
        self.assertEqual(acquire().status, 429)


class LeaseApiTest(SluiceTestCase):
    """POST /v1/acquire, /v1/renew, /v1/release on the decision API."""

    def setUp(self):
        super().setUp()
        self.start_sluice(server_block() + """\
policies:
  - name: jobs
    limits:
      - {algorithm: concurrency, limit: 2, lease_ttl: 1s}
      - {algorithm: fixed_window, rate: 100/h}
  - name: long
    limits:
      - {algorithm: concurrency, limit: 2, lease_ttl: 1h}
  - name: plain
    limits:
      - {algorithm: gcra, rate: 10/s}
""")

    def acquire(self, key="k", policy="jobs"):
        return self.post_json("/v1/acquire", {"policy": policy, "key": key})

    def test_acquire_holds_until_release_and_renew_keeps_the_slot(self):
        a, b = self.acquire(), self.acquire()
        self.assertEqual((a.status, b.status), (200, 200), (a, b))
        lease = a.json()["lease"]
        self.assertEqual(lease["expires_in_ms"], 1000)
        self.assertEqual(ratelimit_members(a.header("RateLimit-Policy"))["jobs"]["qu"],
                         "concurrent-requests")
        denied = self.acquire()
        self.assertEqual(denied.status, 429, denied)
        self.assertNotIn("lease", denied.json())
        # A release frees the slot at once.
        r = self.post_json("/v1/release", {"lease": lease["id"]})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"released": True})
        c = self.acquire()
        self.assertEqual(c.status, 200, c)
        # Renewed past its first lease, b's slot is still held: a and c's
        # slot are gone with their leases, b's is not.
        time.sleep(0.6)
        r = self.post_json("/v1/renew", {"lease": b.json()["lease"]["id"]})
        self.assertEqual(r.status, 200, r)
        renewed = r.json()["lease"]["id"]
        time.sleep(0.6)  # c's lease has ended, b's renewed one has not
        self.assertEqual(self.acquire().status, 200)
        self.assertEqual(self.acquire().status, 429)
        self.assertEqual(self.post_json("/v1/release", {"lease": renewed}).status, 200)
        self.assertEqual(self.acquire().status, 200)

    def test_a_lease_is_given_back_once(self):
        # A release sent twice must not give back the slot another request
        # holds: slots are named, and a lease gives back its own or nothing.
        # (Leases of an hour: none ends while a loaded machine runs this.)
        a, b = self.acquire(policy="long"), self.acquire(policy="long")
        lease = {"lease": a.json()["lease"]["id"]}
        self.assertEqual(self.post_json("/v1/release", lease).status, 200)
        self.assertEqual(self.acquire(policy="long").status, 200)
        for path in ("/v1/release", "/v1/renew", "/v1/release"):
            r = self.post_json(path, lease)
            if path == "/v1/renew":
                self.assert_problem(r, 409)
                self.assertEqual(r.json()["title"], "lease lost")
            else:
                self.assertEqual((r.status, r.json()), (200, {"released": True}), r)
        self.assertEqual(self.acquire(policy="long").status, 429)
        # A renewed lease keeps its name: either of its ids gives it back, once.
        old = {"lease": b.json()["lease"]["id"]}
        renewed = self.post_json("/v1/renew", old)
        self.assertEqual(renewed.status, 200, renewed)
        self.assertEqual(self.acquire(policy="long").status, 429)
        new = {"lease": renewed.json()["lease"]["id"]}
        self.assertEqual(self.post_json("/v1/release", new).status, 200)
        self.assertEqual(self.post_json("/v1/release", old).status, 200)
        self.assertEqual(self.acquire(policy="long").status, 200)
        self.assertEqual(self.acquire(policy="long").status, 429)
        # Leases given back leave no record: a caller looping acquire and
        # release is answered as the first time (before, a record of spent
        # leases filled, and then every release was refused).
        for _ in range(90):
            taken = self.acquire("loop", "long")
            self.assertEqual(taken.status, 200, taken)
            r = self.post_json("/v1/release", {"lease": taken.json()["lease"]["id"]})
            self.assertEqual(r.status, 200, r)

    def test_a_release_sent_again_is_not_a_new_hold(self):
        # The policy's average hold caps a denial's wait: a release given
        # again gives back nothing and is no new sample of it.
        a = self.acquire(policy="long")
        lease = {"lease": a.json()["lease"]["id"]}
        self.assertEqual(self.post_json("/v1/release", lease).status, 200)  # held a moment
        for _ in range(2):
            self.assertEqual(self.acquire(policy="long").status, 200)
        time.sleep(1.0)
        for _ in range(30):
            self.assertEqual(self.post_json("/v1/release", lease).status, 200)
        denied = self.acquire(policy="long")
        self.assertEqual(denied.status, 429, denied)
        # The first hold's moment, not the second the repeats would say.
        self.assertLess(denied.json()["retry_after_ms"], 500, denied)

    def test_a_lease_that_ran_out_and_lost_its_slot_is_not_renewed(self):
        a = self.acquire()
        time.sleep(1.1)
        self.assertEqual(self.acquire().status, 200)
        self.assertEqual(self.acquire().status, 200)
        r = self.post_json("/v1/renew", {"lease": a.json()["lease"]["id"]})
        self.assert_problem(r, 409)

    def test_leases_cannot_be_forged_or_misused(self):
        lease = self.acquire().json()["lease"]["id"]
        payload, mac = lease.split(".")
        # Another cost or key under the same signature is refused.
        forged = "A" + payload[1:] + "." + mac
        for body in ({"lease": forged}, {"lease": lease + "x"}, {"lease": "nope"}, {"lease": 7},
                     {}, {"lease": lease, "extra": 1}, [lease]):
            for path in ("/v1/release", "/v1/renew"):
                self.assert_problem(self.post_json(path, body), 400)
        # A policy without a concurrency limit has no slot to hold.
        r = self.post_json("/v1/acquire", {"policy": "plain", "key": "k"})
        self.assert_problem(r, 400)
        self.assert_problem(self.post_json("/v1/acquire", {"policy": "nope", "key": "k"}), 404)
        self.assert_problem(self.post_json("/v1/acquire", [{"policy": "jobs", "key": "k"}]), 400)
        r = request(self.sluice.port, "GET", "/v1/acquire")
        self.assert_problem(r, 405)
        # The check endpoint holds nothing: it only says whether a slot is free.
        for _ in range(5):
            r = self.post_json("/v1/check", {"policy": "jobs", "key": "c"})
            self.assertEqual(r.status, 200, r)
        self.assertEqual(self.acquire("c").status, 200)


if __name__ == "__main__":
    unittest.main()
