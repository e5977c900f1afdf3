"""/v1/auth and /v1/auth/{policy}: the NGINX auth_request endpoint (2xx
allow, 403 deny with the headers so that `error_page 403 =429` yields 429)."""

import unittest

from harness import SluiceTestCase, ratelimit_members, server_block

CONFIG = server_block() + """\
trusted_proxies: [127.0.0.1/32]
real_ip_header: X-Real-IP
policies:
  - name: login
    match: {path: /login, method: POST}
    key: [client_ip]
    limits:
      - {algorithm: token_bucket, rate: 1/min, burst: 2}
    on_deny: {retry_after_jitter: 0s}
  - name: search
    match: {path_prefix: /search}
    key: [client_ip]
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 1}
  - name: hosted
    match: {host: api.example.com}
    key: [global]
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 1}
"""


def original(uri, method="GET", ip="198.51.100.7", **extra):
    h = {"X-Original-URI": uri, "X-Original-Method": method, "X-Real-IP": ip}
    h.update(extra)
    return h


class AuthRequestTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        self.start_sluice(CONFIG)

    def test_named_policy_allows_with_204_then_denies_with_403(self):
        h = original("/anything")
        for remaining in (1, 0):
            r = self.get("/v1/auth/login", headers=h)
            self.assertEqual(r.status, 204, r)
            self.assertEqual(r.body, b"")
            self.assertEqual(ratelimit_members(r.header("RateLimit"))["login"]["r"], remaining)
            self.assertEqual(ratelimit_members(r.header("RateLimit-Policy"))["login"]["q"], 2)
            self.assertIsNone(r.header("Retry-After"))
        r = self.get("/v1/auth/login", headers=h)
        self.assertEqual(r.status, 403, r)
        retry_after = int(r.header("Retry-After"))
        self.assertTrue(55 <= retry_after <= 60, retry_after)
        state = ratelimit_members(r.header("RateLimit"))
        self.assertEqual(state["login"]["r"], 0)
        self.assertLessEqual(state["login"]["t"], retry_after)
        self.assertEqual(r.content_type, "application/problem+json")
        body = r.json()
        self.assertIn("quota-exceeded", body["type"])
        self.assertEqual(body["violated-policies"], ["login"])

    def test_named_policy_keys_by_x_real_ip_from_trusted_peer(self):
        for _ in range(2):
            self.assertEqual(self.get("/v1/auth/login", headers=original("/", ip="192.0.2.1")).status, 204)
        self.assertEqual(self.get("/v1/auth/login", headers=original("/", ip="192.0.2.1")).status, 403)
        # Another client address has its own bucket.
        self.assertEqual(self.get("/v1/auth/login", headers=original("/", ip="192.0.2.2")).status, 204)
        key = self.get("/v1/keys/login/192.0.2.1", admin=True).json()
        self.assertEqual(key["limits"][0]["remaining"], 0)

    def test_matching_policies_by_original_uri_and_method(self):
        post_login = original("/login", method="POST", ip="192.0.2.10")
        self.assertEqual(self.get("/v1/auth", headers=post_login).status, 204)
        self.assertEqual(self.get("/v1/auth", headers=post_login).status, 204)
        r = self.get("/v1/auth", headers=post_login)
        self.assertEqual(r.status, 403, r)
        self.assertEqual(r.json()["violated-policies"], ["login"])
        self.assertIsNotNone(r.header("Retry-After"))
        # GET /login matches no policy: allowed, nothing to report.
        r = self.get("/v1/auth", headers=original("/login", method="GET", ip="192.0.2.10"))
        self.assertEqual(r.status, 204, r)
        self.assertIsNone(r.header("RateLimit"))

    def test_original_uri_query_is_not_part_of_the_path(self):
        h = original("/search?q=cats", ip="192.0.2.20")
        self.assertEqual(self.get("/v1/auth", headers=h).status, 204)
        h = original("/search?q=dogs", ip="192.0.2.20")
        r = self.get("/v1/auth", headers=h)
        self.assertEqual(r.status, 403, r)
        self.assertEqual(r.json()["violated-policies"], ["search"])

    def test_original_host_is_matched(self):
        h = original("/", ip="192.0.2.30", **{"X-Original-Host": "API.example.com:443"})
        self.assertEqual(self.get("/v1/auth", headers=h).status, 204)
        r = self.get("/v1/auth", headers=h)
        self.assertEqual(r.status, 403, r)
        self.assertEqual(r.json()["violated-policies"], ["hosted"])
        other = original("/", ip="192.0.2.30", **{"X-Original-Host": "www.example.com"})
        self.assertEqual(self.get("/v1/auth", headers=other).status, 204)

    def test_unknown_policy_is_404(self):
        r = self.get("/v1/auth/no-such-policy", headers=original("/"))
        body = self.assert_problem(r, 404)
        self.assertIn("no-such-policy", body["detail"])
        self.assert_healthy()


if __name__ == "__main__":
    unittest.main()
