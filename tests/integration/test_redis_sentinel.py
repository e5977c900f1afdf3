"""Redis Sentinel (store.redis.sentinel): the fleet's server is the master a
sentinel names. Here a master, its replica and one sentinel (quorum 1) on
loopback: decisions land on the master; after a failover
(SENTINEL FAILOVER) they land on the promoted replica, exactly; a name the
sentinels do not monitor, and sentinels that cannot be reached, stop
`sluice serve` at start with a message naming them."""

import socket
import time
import unittest

from harness import DeadPort, server_block
from redis_harness import (FIVE_A_MINUTE, HOST, SENTINEL_MASTER as MASTER, RedisFleetTestCase,
                           Sentinel, fleet_statuses, redis_status, redis_store_block,
                           serve_until_exit, wait_until)




class RedisSentinelTest(RedisFleetTestCase):
    def start_sentinel(self, master_port):
        sentinel = Sentinel(self.tmpdir, master_port)
        self.addCleanup(sentinel.kill)
        return sentinel.start()

    def start_setup(self):
        """A master, its replica once in sync, and a sentinel that knows
        both. -> (master, replica, sentinel)."""
        master = self.start_redis()
        replica = self.start_redis("--replicaof", HOST, str(master.port))
        wait_until(lambda: replica.call("ROLE")[3] == "connected", 10,
                   what="the replica in sync with its master")
        sentinel = self.start_sentinel(master.port)

        def promotable():
            # Known, connected, and heard from lately (INFO): a replica the
            # sentinel may promote.
            for fields in sentinel.call("SENTINEL", "REPLICAS", MASTER):
                r = dict(zip(fields[::2], fields[1::2]))
                if (r.get("port") == str(replica.port) and r.get("flags") == "slave"
                        and int(r.get("info-refresh", "1000000")) < 5000):
                    return True
            return False
        wait_until(promotable, 15, what="the sentinel able to promote the replica")
        return master, replica, sentinel

    def store(self, sentinel_ports, master=MASTER):
        return redis_store_block(timeout="1s", connect_timeout="1s") + (
            "    sentinel:\n      master: %s\n      nodes: [%s]\n" % (
                master, ", ".join("%s:%d" % (HOST, p) for p in sentinel_ports)))

    @staticmethod
    def holds(redis, user):
        return any(user in k for k in redis.call("KEYS", "sluice:*"))

    def test_decisions_follow_the_master_through_a_failover(self):
        master, replica, sentinel = self.start_setup()
        # The first sentinel listed is down: the next one answers.
        dead = DeadPort()
        self.addCleanup(dead.close)
        fleet = self.start_fleet(server_block() + self.store([dead.port, sentinel.port]) +
                                 FIVE_A_MINUTE, 2)
        user = self.unique_key("before")
        statuses = fleet_statuses(fleet[0], user, 3) + fleet_statuses(fleet[1], user, 3)
        self.assertEqual(sorted(statuses), [200] * 5 + [429], statuses)
        self.assertTrue(self.holds(master, user))
        for s in fleet:
            self.assertEqual(redis_status(s)["server"], "%s:%d" % (HOST, master.port))

        sentinel.call("SENTINEL", "FAILOVER", MASTER)
        wait_until(lambda: sentinel.master_address() == (HOST, replica.port), 20,
                   what="the sentinel naming the replica")
        wait_until(lambda: replica.call("ROLE")[0] == "master", 20, what="the replica promoted")
        # The old master may take writes a while longer (the sentinel turns
        # it into a replica later): each instance asks the sentinels every
        # second, and moves.
        for s in fleet:
            def on_new_master():
                probe = self.unique_key("probe")
                return fleet_statuses(s, probe, 1) == [200] and self.holds(replica, probe)
            wait_until(on_new_master, 20, interval=0.1,
                       what="decisions on the new master after the failover")
        for s in fleet:
            self.assertEqual(redis_status(s)["server"], "%s:%d" % (HOST, replica.port))
        after = self.unique_key("after")
        statuses = fleet_statuses(fleet[0], after, 3) + fleet_statuses(fleet[1], after, 3)
        self.assertEqual(sorted(statuses), [200] * 5 + [429], statuses)
        self.assertTrue(self.holds(replica, after), "the new master holds no key of %s" % after)

    def test_a_silent_sentinel_delays_nothing(self):
        """The first sentinel listed takes the connection and never answers:
        sluice starts on the second one's answer, long before the first's
        connect timeout (3 s here)."""
        master = self.start_redis()
        sentinel = self.start_sentinel(master.port)
        silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(silent.close)
        silent.bind((HOST, 0))
        silent.listen(8)  # the kernel completes the connection; nobody reads
        config = server_block() + self.store(
            [silent.getsockname()[1], sentinel.port]).replace(
            "connect_timeout: 1s", "connect_timeout: 3s") + FIVE_A_MINUTE
        started = time.monotonic()
        fleet = self.start_fleet(config, 1)
        took = time.monotonic() - started
        self.assertLess(took, 2.0, "sluice waited for the silent sentinel")
        self.assertEqual(fleet_statuses(fleet[0], self.unique_key("silent"), 6),
                         [200] * 5 + [429])

    def test_a_master_the_sentinels_do_not_monitor_does_not_start(self):
        sentinel = self.start_sentinel(self.start_redis().port)
        _, err, _ = serve_until_exit(self, self.tmpdir, server_block() + self.store(
            [sentinel.port], master="no-such-master") + FIVE_A_MINUTE)
        self.assertIn("no sentinel named the master \"no-such-master\"", err)
        self.assertIn("sentinel %s:%d does not monitor" % (HOST, sentinel.port), err)

    def test_sentinels_that_want_a_password_get_theirs(self):
        """The sentinel's own password (sentinel.password), not the
        master's: a wrong one is refused at start, named; the right one
        decides."""
        master = self.start_redis("--requirepass", "master-secret")
        sentinel = Sentinel(self.tmpdir, master.port, password="sentinel-secret",
                            extra_conf=["sentinel auth-pass %s master-secret" % MASTER])
        self.addCleanup(sentinel.kill)
        sentinel.start()

        def config(sentinel_password):
            return server_block() + self.store([sentinel.port]).replace(
                "      nodes:", "      password: %s\n      nodes:" % sentinel_password) + (
                "    password: master-secret\n") + FIVE_A_MINUTE
        _, err, _ = serve_until_exit(self, self.tmpdir, config("wrong"))
        self.assertIn("redis sentinel %s:%d: AUTH" % (HOST, sentinel.port), err)
        self.assertNotIn("wrong", err.replace("WRONGPASS", ""), "the password leaked")
        fleet = self.start_fleet(config("sentinel-secret"), 1)
        self.assertEqual(fleet_statuses(fleet[0], self.unique_key("auth"), 6), [200] * 5 + [429])

    def test_sentinels_that_cannot_be_reached_do_not_start(self):
        dead = DeadPort()
        self.addCleanup(dead.close)
        _, err, _ = serve_until_exit(self, self.tmpdir, server_block() + self.store(
            [dead.port]) + FIVE_A_MINUTE)
        self.assertIn("redis sentinel %s:%d" % (HOST, dead.port), err)
        self.assertRegex(err, r"(?i)connect.*refused")


if __name__ == "__main__":
    unittest.main()
