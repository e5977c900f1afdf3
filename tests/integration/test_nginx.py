"""NGINX auth_request end to end: Debian's nginx runs examples/nginx.conf (its
ports replaced by free ones) in front of an upstream, asking sluice before
each request. Allowed requests reach the upstream; denied ones come back to
the client as 429 with Retry-After and the RateLimit fields."""

import http.client
import os
import re
import unittest

from harness import (HOST, SOURCE_DIR, SluiceTestCase, free_port, ratelimit_members, request,
                     server_block, start_nginx)

CONFIG = server_block() + """\
trusted_proxies: [127.0.0.1/32]
policies:
  - name: login
    key: [client_ip]
    limits:
      - {algorithm: sliding_log, rate: 3/h}
    on_deny: {retry_after_jitter: 0s}
"""

# A client on another loopback address than NGINX's own (127.0.0.1, the one
# trusted proxy), so that it is not itself trusted.
CLIENT_ADDRESS = "127.0.0.50"


class NginxAuthRequestTest(SluiceTestCase):
    config = CONFIG

    def setUp(self):
        super().setUp()
        self.upstream = self.start_upstream()
        self.start_sluice(self.config)
        self.port = free_port()
        with open(os.path.join(SOURCE_DIR, "examples", "nginx.conf")) as f:
            conf = f.read()
        conf = conf.replace("127.0.0.1:8080", "%s:%d" % (HOST, self.sluice.port))
        conf = conf.replace("127.0.0.1:3000", "%s:%d" % (HOST, self.upstream.port))
        conf = conf.replace("listen 127.0.0.1:8000", "listen %s:%d" % (HOST, self.port))
        conf = re.sub(r"pid [^;]+;", "pid %s;" % os.path.join(self.tmpdir, "nginx.pid"), conf)
        self.assertIn(str(self.sluice.port), conf)
        start_nginx(self, conf, self.port)

    def test_allowed_requests_reach_the_upstream_denied_ones_get_429(self):
        for remaining in (2, 1, 0):
            r = request(self.port, "GET", "/page")
            self.assertEqual(r.status, 200, r)
            self.assertEqual(ratelimit_members(r.header("RateLimit"))["login"]["r"], remaining)
            self.assertEqual(ratelimit_members(r.header("RateLimit-Policy"))["login"]["q"], 3)
        self.assertEqual(self.upstream.count("/page"), 3)
        r = request(self.port, "GET", "/page")
        self.assertEqual(r.status, 429, r)
        retry_after = int(r.header("Retry-After"))
        # The first request leaves the hour-long log about an hour from now.
        self.assertGreaterEqual(retry_after, 3590)
        self.assertLessEqual(retry_after, 3600)
        state = ratelimit_members(r.header("RateLimit"))["login"]
        self.assertEqual(state["r"], 0)
        self.assertLessEqual(state["t"], retry_after)
        self.assertIn("quota-exceeded", r.json()["type"])
        self.assertEqual(self.upstream.count("/page"), 3)  # the denied one never arrived

    def test_the_client_address_comes_from_x_real_ip(self):
        # NGINX is the peer; sluice trusts it and counts by the address NGINX
        # saw. Every request here comes from 127.0.0.1 through NGINX, so they
        # share one bucket, and sluice's own view agrees.
        for _ in range(3):
            self.assertEqual(request(self.port, "GET", "/a").status, 200)
        state = request(self.sluice.admin_port, "GET", "/v1/keys/login/127.0.0.1").json()
        self.assertEqual(state["limits"][0]["remaining"], 0)

    def test_a_client_cannot_pick_its_address_with_forwarding_fields(self):
        # Regression: the subrequest carried the client's own X-Forwarded-For,
        # which won over NGINX's X-Real-IP, so each request with a new value
        # got a fresh bucket. Every request here claims another address in
        # every field a client could try; all are counted against the
        # client's real one.
        def spoofed(n):
            conn = http.client.HTTPConnection(HOST, self.port, timeout=5,
                                              source_address=(CLIENT_ADDRESS, 0))
            try:
                return request(self.port, "GET", "/spoof", conn=conn, headers={
                    "X-Forwarded-For": "198.51.100.%d" % n,
                    "Forwarded": "for=198.51.100.%d" % n,
                    "X-Real-IP": "198.51.100.%d" % n,
                })
            finally:
                conn.close()
        for n in range(3):
            self.assertEqual(spoofed(n).status, 200)
        r = spoofed(3)
        self.assertEqual(r.status, 429, r)
        self.assertEqual(self.upstream.count("/spoof"), 3)
        state = request(self.sluice.admin_port, "GET",
                        "/v1/keys/login/" + CLIENT_ADDRESS).json()
        self.assertEqual(state["limits"][0]["remaining"], 0)
        fresh = request(self.sluice.admin_port, "GET", "/v1/keys/login/198.51.100.1").json()
        self.assertEqual(fresh["limits"][0]["remaining"], 3)


class NginxRealIpHeaderTest(NginxAuthRequestTest):
    """The same, with sluice told to believe X-Real-IP only."""
    config = CONFIG.replace("trusted_proxies: [127.0.0.1/32]\n",
                            "trusted_proxies: [127.0.0.1/32]\nreal_ip_header: X-Real-IP\n")

    def test_the_config_names_x_real_ip(self):
        self.assertIn("real_ip_header: X-Real-IP", self.config)


if __name__ == "__main__":
    unittest.main()
