"""A gateway request whose body comes after its header, on a policy whose
limit is in Redis: decided on its header (the decision waits on Redis while
the body waits in the socket), its body read only once it is admitted, and
a denied one answered without its body."""

import unittest

from harness import ask_then_send, timed_exchange
from redis_harness import RedisFleetTestCase

POLICIES = """\
policies:
  - name: uploads
    match: {path_prefix: /upload}
    key: [global]
    limits:
      - {algorithm: fixed_window, rate: 1/h}
"""


class RedisBodyToComeTest(RedisFleetTestCase):
    def test_a_body_after_its_header_is_read_only_when_redis_admits_it(self):
        sluice, upstream, _ = self.start_gateway(POLICIES, read_timeout="30s")
        # Admitted: asked for its body after Redis' decision, which goes upstream.
        asked, r = ask_then_send(sluice.port,
                                 b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                 b"Expect: 100-continue\r\nConnection: close\r\n\r\n", b"hello")
        self.assertEqual(asked, b"HTTP/1.1 100 Continue\r\n\r\n")
        self.assertEqual(r.status, 200)
        self.assertEqual(upstream.hits("/upload")[0]["body"], "hello")
        # Denied by Redis: answered at once, its body never asked for.
        data, elapsed = timed_exchange(
            sluice.port, b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
            b"Expect: 100-continue\r\n\r\n")
        self.assertTrue(data.startswith(b"HTTP/1.1 429"), data[:200])
        self.assertLess(elapsed, 4.0)
        self.assertEqual(upstream.count("/upload"), 1)


if __name__ == "__main__":
    unittest.main()
