"""Bad Redis settings are caught before sluice serves anything: `sluice serve`
exits non-zero within about the connect timeout, with one line on stderr
that names the node and the problem; `--check` reports a malformed URL at
its file and line."""

import unittest

from harness import DeadPort, request, run_check, server_block
from redis_harness import RedisFleetTestCase, redis_call, redis_store_block, serve_until_exit

POLICIES = """\
policies:
  - name: a
    limits:
      - {algorithm: token_bucket, rate: 10/s}
"""

CONNECT_TIMEOUT = 1.0   # connect_timeout below
# Start-up, the connect timeout and exit, on a loaded machine.
QUICKLY = CONNECT_TIMEOUT + 3.0


class RedisStartupTest(RedisFleetTestCase):
    def serve(self, store_block):
        """Runs `sluice serve` on a config with that store; it must exit by
        itself. -> (exit code, stderr, seconds it ran)."""
        return serve_until_exit(self, self.tmpdir, server_block() + store_block + POLICIES,
                                QUICKLY)

    def test_unreachable_url_names_the_node(self):
        """Nothing listens on the port: the message names host:port and
        says the connection was refused."""
        dead = DeadPort()
        self.addCleanup(dead.close)
        _, err, _ = self.serve(redis_store_block(url="redis://127.0.0.1:%d" % dead.port,
                                                 connect_timeout="1s"))
        self.assertIn("store.redis", err)
        self.assertIn("127.0.0.1:%d" % dead.port, err)
        self.assertRegex(err, r"(?i)connect.*refused")

    def test_unreachable_cluster_seed_names_the_node(self):
        dead = DeadPort()
        self.addCleanup(dead.close)
        _, err, _ = self.serve(redis_store_block(cluster=["127.0.0.1:%d" % dead.port],
                                                 connect_timeout="1s"))
        self.assertIn("127.0.0.1:%d" % dead.port, err)
        self.assertRegex(err, r"(?i)connect.*refused")

    def input_bytes(self, redis):
        """What redis-server has read from its clients so far."""
        info = redis_call(redis.port, "INFO", "stats", password=redis.password)
        for line in info.splitlines():
            if line.startswith("total_net_input_bytes:"):
                return int(line.split(":", 1)[1])
        self.fail("no total_net_input_bytes in INFO stats")

    def serve_refused(self, redis, store_block):
        """serve() against a server that refuses the password; the function
        library (tens of KiB) must not have been sent before the refusal was
        read: Redis drops a client that sends a large argument before it is
        authenticated, and sluice then reported the dropped connection, not
        the refusal."""
        before = self.input_bytes(redis)
        result = self.serve(store_block)
        self.assertLess(self.input_bytes(redis) - before, 4096,
                        "more than the handshake's first step reached Redis")
        return result

    def test_wrong_password_names_the_node_and_the_refusal(self):
        """A redis-server with --requirepass and a config with another
        password: Redis' refusal (WRONGPASS) is reported for that node."""
        redis = self.start_redis("--requirepass", "right-password")
        _, err, _ = self.serve_refused(redis, redis_store_block(
            url=redis.url, password="wrong-password", connect_timeout="1s"))
        self.assertIn("redis 127.0.0.1:%d" % redis.port, err)
        self.assertIn("AUTH", err)
        self.assertIn("WRONGPASS", err)
        self.assertNotIn("wrong-password", err, "the password leaked into the log")

    def test_password_in_url_is_checked_too(self):
        redis = self.start_redis("--requirepass", "right-password")
        _, err, _ = self.serve_refused(redis, redis_store_block(
            url="redis://:wrong-password@127.0.0.1:%d" % redis.port, connect_timeout="1s"))
        self.assertIn("redis 127.0.0.1:%d" % redis.port, err)
        self.assertIn("WRONGPASS", err)
        self.assertNotIn("wrong-password", err, "the password leaked into the log")

    def test_missing_password_names_the_node_and_authentication(self):
        """The server wants a password and none is configured."""
        redis = self.start_redis("--requirepass", "right-password")
        _, err, _ = self.serve_refused(redis, redis_store_block(url=redis.url,
                                                                connect_timeout="1s"))
        self.assertIn("redis 127.0.0.1:%d" % redis.port, err)
        self.assertRegex(err, r"(?i)auth")

    def test_right_password_starts(self):
        """The same server with the right password: sluice serves (the
        failures above are the password's, not the server's)."""
        redis = self.start_redis("--requirepass", "right-password")
        fleet = self.start_fleet(server_block() + redis_store_block(
            url=redis.url, password="right-password") + POLICIES, 1)
        r = request(fleet[0].port, "POST", "/v1/check", body={"policy": "a", "key": "k"},
                    headers={"Content-Type": "application/json"})
        self.assertEqual(r.status, 200, r)

    def test_a_replica_given_as_the_url_does_not_start(self):
        """Every decision writes: a replica named by the URL is refused at
        start, named, and said to be one (ROLE; before, FUNCTION LOAD's
        READONLY refused it)."""
        master = self.start_redis()
        replica = self.start_redis("--replicaof", "127.0.0.1", str(master.port))
        _, err, _ = self.serve(redis_store_block(url=replica.url, connect_timeout="1s"))
        self.assertIn("redis 127.0.0.1:%d: a replica, not a master (ROLE)" % replica.port, err)

    def test_non_cluster_node_given_as_cluster(self):
        """A plain redis-server listed under `cluster:`: the message names it
        and says it is not a Cluster node."""
        redis = self.start_redis()
        _, err, _ = self.serve(redis_store_block(cluster=[redis.address], connect_timeout="1s"))
        self.assertIn("127.0.0.1:%d" % redis.port, err)
        self.assertRegex(err, r"(?i)not a cluster node")

    def test_check_validates_without_connecting(self):
        """`--check` reads the file only: a well-formed URL to a port
        nobody listens on passes."""
        dead = DeadPort()
        self.addCleanup(dead.close)
        code, out, err = run_check(server_block() + redis_store_block(
            url="redis://127.0.0.1:%d" % dead.port) + POLICIES, self.tmpdir)
        self.assertEqual(code, 0, (out, err))

    def test_check_reports_a_malformed_url_at_its_line(self):
        """A malformed URL: exit 2 and one line naming file, line, key and
        what is wrong with it."""
        for url, problem in (("http://127.0.0.1:6379", r"redis://"),
                             ("redis://127.0.0.1:notaport", r"(?i)port"),
                             ("redis://127.0.0.1:6379/x", r"(?i)database")):
            with self.subTest(url=url):
                text = server_block() + redis_store_block(url=url) + POLICIES
                line = text.split("\n").index("    url: %s" % url) + 1
                code, out, err = run_check(text, self.tmpdir, name="bad-url.yaml")
                self.assertEqual(code, 2, (out, err))
                self.assertRegex(err, r"bad-url\.yaml:%d: store\.redis\.url: " % line)
                self.assertRegex(err, problem)
                self.assertEqual(len(err.strip().split("\n")), 1, err)


if __name__ == "__main__":
    unittest.main()
