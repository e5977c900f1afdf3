"""SIGTERM while decisions wait on a stalled Redis. Regression: the event loops
were freed before the Redis client, whose pending calls then posted their
answers into freed memory (certain when store.redis.timeout is longer than
server.drain_timeout). Under the ASan build this test runs the ASan binary,
which reports such a write."""

import threading
import time
import unittest

from harness import request, server_block
from redis_harness import RedisFleetTestCase, redis_store_block


class RedisShutdownTest(RedisFleetTestCase):
    def test_shutdown_with_calls_pending_on_a_paused_redis_is_clean(self):
        redis = self.start_redis()
        config = (server_block(threads=2, drain_timeout="300ms")
                  + redis_store_block(url=redis.url, timeout="5s")
                  + "policies:\n  - name: p\n    limits: [{algorithm: gcra, rate: 100/s}]\n"
                  "    on_store_error: deny\n")
        sluice = self.start_fleet(config, 1)[0]
        self.assertEqual(request(sluice.port, "POST", "/v1/check",
                                 body={"policy": "p", "key": "warm"}).status, 200)
        redis.pause()
        self.addCleanup(redis.resume)
        answers = []

        def check(n):
            try:
                answers.append(request(sluice.port, "POST", "/v1/check", timeout=10,
                                       body={"policy": "p", "key": "k%d" % n}).status)
            except OSError as e:  # the connection closes at shutdown
                answers.append(type(e).__name__)

        threads = [threading.Thread(target=check, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # every check is now waiting on Redis
        start = time.monotonic()
        code = sluice.stop()
        took = time.monotonic() - start
        for t in threads:
            t.join(10)
        output = sluice.output()
        self.assertNotIn("AddressSanitizer", output)
        self.assertNotIn("runtime error", output)
        self.assertEqual(code, 0, output)
        # It waited drain_timeout, not the Redis timeout.
        self.assertLess(took, 3.0, output)
        self.assertEqual(len(answers), 8)


if __name__ == "__main__":
    unittest.main()
