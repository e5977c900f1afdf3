"""`sluice serve` on a Redis Cluster whose topology changes under it: a live
slot migration (ASK, then MOVED) and a master failover. Decisions must stay
correct (the count of a key goes on where it was), redirections are
followed and counted, and service comes back without restarting sluice."""

import sys
import time
import unittest

from harness import post_json, server_block
from redis_harness import (HttpClient, RedisFleetTestCase, fleet_metric, readyz,
                           redis_store_block, wait_until)

POLICIES = """\
policies:
  # 10 an hour: no refill during a test, so `remaining` counts exactly.
  # Fail closed with a 1 s Retry-After: a store error can never pass for a
  # decision made in Redis.
  - name: moving
    limits:
      - {algorithm: token_bucket, rate: 10/1h, burst: 10}
    on_store_error: deny
    on_deny: {retry_after_jitter: 0s}
  - name: failover
    limits:
      - {algorithm: sliding_log, rate: 10/1h}
    on_store_error: deny
    on_deny: {retry_after_jitter: 0s}
  - name: steady
    limits:
      - {algorithm: token_bucket, rate: 1000/1h, burst: 1000}
    on_store_error: deny
  - name: slots
    limits:
      - {algorithm: concurrency, limit: 2, lease_ttl: 1h}
    on_store_error: deny
"""

TIMEOUT = 0.05   # store.redis.timeout below
MARGIN = 0.3     # what a loaded machine may add to one answer


class ClusterTopologyTest(RedisFleetTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cluster = cls.start_class_cluster()

    def setUp(self):
        super().setUp()
        # Sluice is given one node and discovers the others.
        config = server_block(threads=2) + redis_store_block(
            cluster=self.cluster.seeds[:1], timeout="50ms", connect_timeout="500ms") + POLICIES
        self.fleet = self.start_fleet(config, 2)
        self.clients = [HttpClient(s.port) for s in self.fleet]
        for c in self.clients:
            self.addCleanup(c.close)

    # ---- helpers ----

    def redis_key(self, user_key):
        """The Redis key sluice keeps `user_key` under, found by SCAN on the
        masters."""
        for port, _ in self.cluster.masters():
            found = self.cluster.server_on(port).call("SCAN", 0, "MATCH", "*%s*" % user_key,
                                                      "COUNT", 10000)
            if found[1]:
                self.assertEqual(len(found[1]), 1, found)
                return found[1][0]
        self.fail("no Redis key holds %s" % user_key)

    def node_id(self, port):
        return self.cluster.server_on(port).call("CLUSTER", "MYID")

    def decide(self, policy, key, client=0):
        """-> (status, headers, body, seconds) from sluice process `client`."""
        return self.clients[client].check(policy, key)

    def key_on_other_master(self, policy, avoid_port):
        """A fresh key whose slot a master other than `avoid_port` serves
        (one decision made on it to create it)."""
        for i in range(50):
            key = self.unique_key("other-%d" % i)
            status, _, body, _ = self.decide(policy, key)
            self.assertEqual(status, 200, body)
            rkey = self.redis_key(key)
            if self.cluster.master_of_slot(self.cluster.keyslot(rkey)) != avoid_port:
                return key
        self.fail("every key landed on one master")

    # ---- tests ----

    def test_a_stalled_slot_refresh_holds_no_other_call_past_its_timeout(self):
        """Regression: calls were timed out in queue order, so a CLUSTER
        SLOTS waiting on a stalled master (it waits up to connect_timeout)
        held every call queued behind it: a call with `timeout: 50ms` was
        answered after ~connect_timeout. Here one sluice process is given
        master X as its only seed (the refresh goes to its first connected
        node: X). Every node but another master A is paused; sluice's
        connection to A is killed, which makes sluice refresh the slot map
        from X, where the refresh stalls. A decision on a key of X must
        still be refused within its own timeout."""
        masters = [port for port, _ in self.cluster.masters()]
        x, a = masters[0], masters[1]
        config = server_block(threads=2) + redis_store_block(
            cluster=[self.cluster.server_on(x).address], timeout="50ms",
            connect_timeout="800ms") + POLICIES
        s = self.start_fleet(config, 1)[0]
        client = HttpClient(s.port)
        self.addCleanup(client.close)
        key = None
        for i in range(100):
            candidate = self.unique_key("stalled-%d" % i)
            status, _, body, _ = client.check("steady", candidate)
            self.assertEqual(status, 200, body)
            if self.cluster.master_of_slot(self.cluster.keyslot(self.redis_key(candidate))) == x:
                key = candidate
                break
        self.assertIsNotNone(key, "no key landed on master %d" % x)

        paused = [n for n in self.cluster.live() if n.port != a]
        for n in paused:
            n.pause()
        try:
            # Kills sluice's connections to A (not this one).
            self.cluster.server_on(a).call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            time.sleep(0.05)  # sluice sees the close and sends CLUSTER SLOTS to X
            status, _, body, took = client.check("steady", key)
        finally:
            for n in paused:
                n.resume()
        self.assertEqual(status, 429, body)
        self.assertEqual(body["retry_after_ms"], 1000, body)  # a store error, fail closed
        self.assertLess(took, TIMEOUT + MARGIN)
        # The paused time stayed under cluster-node-timeout (1 s): no failover.
        self.cluster.wait_healthy(10)

    def test_named_slots_are_held_fleet_wide_and_given_back_once(self):
        """A concurrency limit on the cluster: its slots are held for both
        processes, and a lease released twice gives back its own slot and
        nothing more."""
        key = self.unique_key("slots")
        ports = [s.port for s in self.fleet]

        def acquire(i):
            return post_json(ports[i], "/v1/acquire", {"policy": "slots", "key": key})

        first, second = acquire(0), acquire(1)
        self.assertEqual((first.status, second.status), (200, 200), (first, second))
        self.assertEqual(acquire(0).status, 429)
        self.assertTrue(self.redis_key(key).endswith(":named"))
        lease = {"lease": first.json()["lease"]["id"]}  # this process's own secret
        for _ in range(2):
            r = post_json(ports[0], "/v1/release", lease)
            self.assertEqual((r.status, r.json()), (200, {"released": True}), r)

        def free():  # a release is sent without waiting: read what Redis holds
            r = post_json(ports[1], "/v1/check", {"policy": "slots", "key": key, "cost": 0})
            return r.json()["remaining"]

        wait_until(lambda: free() >= 1, 5, what="the released slot")
        time.sleep(0.2)  # a second release, wrongly taking the other slot, would land by now
        self.assertEqual(free(), 1)  # the second lease still holds its slot
        self.assertEqual(acquire(1).status, 200)
        self.assertEqual(acquire(0).status, 429)

    def test_live_slot_migration_ask_then_moved_keeps_the_count(self):
        """The slot of a key sluice uses is migrated between masters while
        two sluice processes keep deciding on it: after MIGRATE the old
        owner answers ASK, after SETSLOT NODE it answers MOVED. Every
        decision is made in Redis, the count goes on (10, 9, ... down to a
        denial at the 11th) and both redirections are counted."""
        key = self.unique_key("moving")
        remaining = []

        def step(client):
            status, _, body, _ = self.decide("moving", key, client)
            self.assertEqual(status, 200, body)
            remaining.append(body["remaining"])

        step(0)
        step(1)
        rkey = self.redis_key(key)
        slot = self.cluster.keyslot(rkey)
        source = self.cluster.master_of_slot(slot)
        target = next(p for p, _ in self.cluster.masters() if p != source)
        src, dst = self.cluster.server_on(source), self.cluster.server_on(target)
        redirects = fleet_metric(self.fleet, "sluice_redis_redirects_total")

        # Migration starts; the key is still on the source: no redirection.
        self.assertEqual(dst.call("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source)),
                         "OK")
        self.assertEqual(src.call("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target)),
                         "OK")
        step(0)
        # The key moves; the source now answers ASK for it.
        self.assertEqual(src.call("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", rkey),
                         "OK")
        self.assertEqual(dst.call("CLUSTER", "COUNTKEYSINSLOT", slot), 1)
        step(0)
        step(1)
        after_ask = fleet_metric(self.fleet, "sluice_redis_redirects_total")
        self.assertGreaterEqual(after_ask - redirects, 2, "each process followed an ASK")
        # The slot is handed over; the source now answers MOVED.
        for port in [target, source] + [p for p, _ in self.cluster.masters()
                                        if p not in (source, target)]:
            self.assertEqual(self.cluster.server_on(port).call(
                "CLUSTER", "SETSLOT", slot, "NODE", self.node_id(target)), "OK")
        step(0)
        step(1)
        after_moved = fleet_metric(self.fleet, "sluice_redis_redirects_total")
        self.assertGreaterEqual(after_moved - after_ask, 2, "each process followed a MOVED")
        # The slot map is updated: no more redirections.
        step(0)
        step(1)
        self.assertEqual(fleet_metric(self.fleet, "sluice_redis_redirects_total"), after_moved)
        self.assertEqual(remaining, [9, 8, 7, 6, 5, 4, 3, 2, 1])
        step(0)
        status, headers, body, _ = self.decide("moving", key, 1)
        self.assertEqual(status, 429, body)
        # Denied by the bucket (an hour's wait), not by a store error (1 s).
        self.assertGreater(body["retry_after_ms"], 60000, body)
        self.assertEqual(fleet_metric(self.fleet, "sluice_store_errors_total"), 0)
        self.assertEqual(src.call("CLUSTER", "COUNTKEYSINSLOT", slot), 0)
        sys.stderr.write("\n  slot %d moved %d -> %d: %d redirections followed\n" % (
            slot, source, target, after_moved - redirects))

    def test_master_killed_replica_takes_over_without_restarting_sluice(self):
        """A master is killed (SIGKILL). Keys of its slots are refused fast
        (on_store_error deny, within the timeout plus a margin) while keys of
        other masters are still decided in Redis; once its replica is
        promoted (cluster-node-timeout 1 s) the same sluice processes decide
        those keys in Redis again, the count carried over by replication, and
        /readyz is 200 again."""
        key = self.unique_key("failover")
        for i in range(3):
            status, _, body, _ = self.decide("failover", key, i % 2)
            self.assertEqual(status, 200, body)
        rkey = self.redis_key(key)
        slot = self.cluster.keyslot(rkey)
        victim_port = self.cluster.master_of_slot(slot)
        replica_port = self.cluster.replica_of(victim_port)
        self.assertIsNotNone(replica_port, "the master has no replica")
        other_key = self.key_on_other_master("steady", victim_port)
        other_master = self.cluster.server_on(self.cluster.master_of_slot(
            self.cluster.keyslot(self.redis_key(other_key))))
        victim, replica = self.cluster.server_on(victim_port), self.cluster.server_on(replica_port)
        # The replica has every write of the master (the count carries over).
        wait_until(lambda: self._offset(victim, "master_repl_offset") ==
                   self._offset(replica, "slave_repl_offset"), 5, what="replica in sync")
        for s in self.fleet:
            self.assertEqual(readyz(s)[0], 200)

        victim.kill()
        killed = time.monotonic()
        refused_latencies, other_answers, readiness = [], [], []
        recovered_at = None
        deadline = killed + 20
        while time.monotonic() < deadline:
            status, headers, body, took = self.decide("failover", key)
            if status == 200:
                recovered_at = time.monotonic()
                self.assertEqual(body["remaining"], 6, body)
                break
            self.assertEqual(status, 429, body)
            self.assertEqual(body["retry_after_ms"], 1000, body)
            self.assertEqual(headers.get("retry-after"), "1", headers)
            refused_latencies.append(took)
            readiness.append(readyz(self.fleet[0]))
            before = self.cluster_state(other_master)
            o_status, _, o_body, _ = self.decide("steady", other_key, 1)
            other_answers.append((o_status, o_body, before, self.cluster_state(other_master)))
            time.sleep(0.05)
        self.assertIsNotNone(recovered_at, "keys of the killed master's slots never came back")
        self.assertTrue(refused_latencies, "no decision was refused while the master was down")
        self.assertLess(max(refused_latencies), TIMEOUT + MARGIN)
        # Meanwhile /readyz said why it was not ready.
        self.assertIn((503, "store unavailable: redis, 2 of 3 masters connected\n"), readiness)
        # Keys of the other masters are decided in Redis, except while Redis
        # itself refuses every slot (cluster_state:fail, from when the
        # master is marked failed until its replica is promoted): then the
        # fail-closed policy answers.
        for o_status, o_body, before, after in other_answers:
            if o_status != 200:
                self.assertEqual((o_status, o_body["retry_after_ms"]), (429, 1000), o_body)
                self.assertIn("fail", (before, after), other_answers)
        self.assertEqual(other_answers[0][0], 200, "refused before Redis noticed the failure")
        promoted = self.cluster.master_of_slot(slot)
        self.assertEqual(promoted, replica_port)
        for s in self.fleet:
            wait_until(lambda: readyz(s)[0] == 200, 5, what="/readyz 200 after the failover")
        ready_at = time.monotonic()
        sys.stderr.write(
            "\n  master %d killed: its keys decided in Redis again after %.2f s, /readyz 200 "
            "after %.2f s; %d refused meanwhile, max %.1f ms; keys of other masters refused %d "
            "of %d times (cluster_state:fail)\n" % (
                victim_port, recovered_at - killed, ready_at - killed, len(refused_latencies),
                1000 * max(refused_latencies), sum(1 for a in other_answers if a[0] != 200),
                len(other_answers)))
        # The other process follows the new master too; the count goes on.
        status, _, body, _ = self.decide("failover", key, 1)
        self.assertEqual((status, body["remaining"]), (200, 5), body)
        self.assertEqual(fleet_metric(self.fleet, "sluice_redis_up"), len(self.fleet))
        self.assertTrue(all(s.proc.poll() is None for s in self.fleet))

    @staticmethod
    def cluster_state(server):
        """"ok" or "fail", as CLUSTER INFO on that node says."""
        for line in server.call("CLUSTER", "INFO").split("\r\n"):
            if line.startswith("cluster_state:"):
                return line.split(":")[1]
        return None

    @staticmethod
    def _offset(server, field):
        for line in server.call("INFO", "replication").split("\r\n"):
            if line.startswith(field + ":"):
                return int(line.split(":")[1])
        return None


if __name__ == "__main__":
    unittest.main()
