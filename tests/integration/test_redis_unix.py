"""A Redis on a Unix socket (store.redis.url: unix:///path): decisions are
exact there and the state lands in that Redis; a restarted server is
reached again on its socket; a socket that is not there stops `sluice
serve` at start, named."""

import os
import unittest

from harness import server_block
from redis_harness import (FIVE_A_MINUTE, RedisFleetTestCase, fleet_statuses, redis_status,
                           redis_store_block, serve_until_exit, wait_until)


class RedisUnixSocketTest(RedisFleetTestCase):
    def start_socket_redis(self):
        """A redis-server with a Unix socket beside its TCP port (where
        the test itself reads). -> (server, socket path)."""
        path = os.path.join(self.tmpdir, "redis.sock")
        return self.start_redis("--unixsocket", path, "--unixsocketperm", "700"), path

    def test_decisions_over_a_unix_socket(self):
        redis, path = self.start_socket_redis()
        fleet = self.start_fleet(server_block() + redis_store_block(
            url="unix://%s" % path, timeout="1s") + FIVE_A_MINUTE, 2)
        user = self.unique_key("unix")
        statuses = fleet_statuses(fleet[0], user, 3) + fleet_statuses(fleet[1], user, 3)
        self.assertEqual(sorted(statuses), [200] * 5 + [429], statuses)
        status = redis_status(fleet[0])
        self.assertEqual((status["server"], status["tls"]), ("unix:%s" % path, False))
        self.assertTrue(any(user in k for k in redis.call("KEYS", "sluice:*")))
        # Every client of the server came by the socket (id=... addr=/path).
        clients = redis.call("CLIENT", "LIST")
        self.assertIn(path, clients)

        redis.kill()
        redis.start()  # the same port and socket
        after = self.unique_key("after")
        wait_until(lambda: fleet_statuses(fleet[0], after, 1) == [200], 10,
                   what="a decision on the restarted server")
        self.assertTrue(any(after in k for k in redis.call("KEYS", "sluice:*")))

    def test_a_socket_that_is_not_there_does_not_start(self):
        path = os.path.join(self.tmpdir, "nobody.sock")
        _, err, _ = serve_until_exit(self, self.tmpdir, server_block() + redis_store_block(
            url="unix://%s" % path) + FIVE_A_MINUTE)
        self.assertIn("redis unix:%s: connect: No such file or directory" % path, err)


if __name__ == "__main__":
    unittest.main()
