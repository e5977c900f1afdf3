"""Who may ask: the decision API and the auth endpoint spend any key's quota,
so they are served only where the operator says (server.decision), and a
client of the gateway cannot choose the address it is limited by.

The attack these tests close: with a gateway policy keyed on client_ip, one
POST /v1/check naming a victim's address (cost 2 on a 2/min limit) locked the
victim out of its own first login."""

import http.client
import json
import os
import unittest

from harness import (HOST, SluiceTestCase, ask_then_send, metric_value, parse_raw_response,
                     request, server_block, timed_exchange)

TOKEN = "tok-0123456789abcdef"
OTHER_TOKEN = "tok-fedcba9876543210"

POLICIES = """\
trusted_proxies: [127.0.0.1/32]
policies:
  - name: login
    match: {path_prefix: /login}
    key: [client_ip]
    limits:
      - {algorithm: sliding_log, rate: 2/h}
"""

VICTIM = "127.0.0.50"   # a loopback address of its own, not a trusted proxy


def from_address(port, address, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection(HOST, port, timeout=5, source_address=(address, 0))
    try:
        return request(port, method, path, body=body, headers=headers, conn=conn)
    finally:
        conn.close()


def attack(port):
    return request(port, "POST", "/v1/check",
                   body={"policy": "login", "key": VICTIM, "cost": 2},
                   headers={"Content-Type": "application/json"})


class GatewayListenerTest(SluiceTestCase):
    def test_the_gateway_does_not_serve_the_decision_api_by_default(self):
        upstream = self.start_upstream()
        self.start_sluice(server_block() + POLICIES + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:%d
""" % upstream.port)
        self.assertIn("decision=off", self.sluice.output())
        r = attack(self.sluice.port)
        # Not answered by sluice: it is a request like any other, for the app.
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["path"], "/v1/check")
        self.assertEqual(upstream.count("/v1/check"), 1)
        self.assertEqual(request(self.sluice.port, "GET", "/v1/auth/login").json()["path"],
                         "/v1/auth/login")
        # The victim's quota is untouched.
        for _ in range(2):
            self.assertEqual(from_address(self.sluice.port, VICTIM, "POST", "/login").status, 200)
        self.assertEqual(from_address(self.sluice.port, VICTIM, "POST", "/login").status, 429)

    def test_a_decision_listener_of_its_own(self):
        upstream = self.start_upstream()
        self.start_sluice(server_block(decision="{listen: 127.0.0.1:0}") + POLICIES + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:%d
""" % upstream.port)
        port = self.sluice.decision_port
        self.assertIsNotNone(port, self.sluice.output())
        self.assertNotIn(port, (self.sluice.port, self.sluice.admin_port))
        # The gateway forwards /v1/check like any path; the decision listener decides.
        self.assertEqual(attack(self.sluice.port).json()["path"], "/v1/check")
        r = request(port, "POST", "/v1/check", body={"policy": "login", "key": "k"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["remaining"], 1)
        # ...and nothing else: it is no second gateway.
        r = request(port, "GET", "/login")
        self.assertEqual(r.status, 404, r)
        self.assertEqual(upstream.count("/login"), 0)
        samples = self.metrics()
        self.assertEqual(metric_value(samples, "sluice_http_responses_total",
                                      listener="decision", code="200"), 1)

    def test_on_gateway_listener_is_the_operators_explicit_choice(self):
        upstream = self.start_upstream()
        self.start_sluice(server_block(decision="{on_gateway_listener: true}") + POLICIES + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:%d
""" % upstream.port)
        r = attack(self.sluice.port)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.json()["allowed"])
        self.assertEqual(upstream.count("/v1/check"), 0)

    def test_a_decision_service_without_routes_serves_on_its_listener(self):
        # No routes: the one listener is a decision service, as before.
        self.start_sluice(server_block() + POLICIES)
        self.assertIn("decision=listen", self.sluice.output())
        self.assertEqual(request(self.sluice.port, "POST", "/v1/check",
                                 body={"policy": "login", "key": "k"}).status, 200)


class TokenTest(SluiceTestCase):
    def start_with_tokens(self):
        os.environ["SLUICE_IT_DECISION_TOKEN"] = OTHER_TOKEN
        self.addCleanup(os.environ.pop, "SLUICE_IT_DECISION_TOKEN", None)
        return self.start_sluice(
            server_block(decision="{tokens: [%s], token_env: SLUICE_IT_DECISION_TOKEN}" % TOKEN)
            + POLICIES)

    def test_calls_without_a_valid_token_are_refused(self):
        self.start_with_tokens()
        self.assertIn("decision_tokens=2", self.sluice.output())
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                        {"Authorization": "Basic " + TOKEN}, {"Authorization": "Bearer"}):
            r = request(self.sluice.port, "POST", "/v1/check",
                        body={"policy": "login", "key": VICTIM, "cost": 2}, headers=headers)
            self.assertEqual(r.status, 401, (headers, r))
            self.assertEqual(r.header("WWW-Authenticate"), 'Bearer realm="sluice"')
            self.assertEqual(r.content_type, "application/problem+json")
            r = request(self.sluice.port, "GET", "/v1/auth/login", headers=headers)
            self.assertEqual(r.status, 401, (headers, r))
        # Nothing was spent.
        state = request(self.sluice.admin_port, "GET", "/v1/keys/login/" + VICTIM).json()
        self.assertEqual(state["limits"][0]["remaining"], 2)

    def test_a_call_without_a_token_is_refused_before_its_body_comes(self):
        # Regression: a call without a valid token was read whole (up to
        # server.max_body_bytes, within read_timeout) before it was refused,
        # so anyone could make sluice read and hold bodies it then refused.
        self.start_with_tokens()
        data, elapsed = timed_exchange(
            self.sluice.port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n"
            b"Expect: 100-continue\r\n\r\n{\"policy\":")
        self.assertTrue(data.startswith(b"HTTP/1.1 401"), data[:200])
        self.assertEqual(parse_raw_response(data).header("Connection"), "close")
        self.assertLess(elapsed, 4.0)
        # With the token, the body is asked for, read and decided on.
        body = json.dumps({"policy": "login", "key": "k"}).encode()
        asked, r = ask_then_send(
            self.sluice.port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
            b"Authorization: Bearer %s\r\nExpect: 100-continue\r\n"
            b"Connection: close\r\n\r\n" % (len(body), TOKEN.encode()), body)
        self.assertEqual(asked, b"HTTP/1.1 100 Continue\r\n\r\n")
        self.assertEqual(r.status, 200)

    def test_either_token_is_accepted(self):
        self.start_with_tokens()
        for token in (TOKEN, OTHER_TOKEN):
            r = request(self.sluice.port, "POST", "/v1/check",
                        body={"policy": "login", "key": "k"},
                        headers={"Authorization": "Bearer " + token})
            self.assertEqual(r.status, 200, r)
        r = request(self.sluice.port, "GET", "/v1/auth/login",
                    headers={"Authorization": "bearer " + TOKEN})
        self.assertEqual(r.status, 204, r)
        samples = self.metrics()
        self.assertEqual(metric_value(samples, "sluice_http_responses_total", code="401"), 0)


class ClientAddressTest(SluiceTestCase):
    """The gateway behind a trusted proxy: forwarding fields are read from the
    right, only across trusted hops, and only the one header configured."""

    def start_gateway(self, extra=""):
        upstream = self.start_upstream()
        self.start_sluice(server_block() + POLICIES + extra + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:%d
""" % upstream.port)
        return upstream

    def test_an_untrusted_client_is_limited_by_its_own_address(self):
        self.start_gateway()
        for n in range(3):
            r = from_address(self.sluice.port, VICTIM, "POST", "/login", headers={
                "X-Forwarded-For": "198.51.100.%d" % n, "Forwarded": "for=198.51.100.%d" % n,
                "X-Real-IP": "198.51.100.%d" % n})
            self.assertEqual(r.status, 200 if n < 2 else 429, r)

    def test_behind_a_trusted_proxy_the_right_most_untrusted_hop_counts(self):
        self.start_gateway()
        # 127.0.0.1 is the trusted proxy; it appended the address it saw
        # (203.0.113.7) after whatever the client sent.
        for n in range(3):
            r = request(self.sluice.port, "POST", "/login", headers={
                "X-Forwarded-For": "198.51.100.%d, 203.0.113.7" % n,
                "Forwarded": "for=198.51.100.%d" % n})
            self.assertEqual(r.status, 200 if n < 2 else 429, r)
        state = request(self.sluice.admin_port, "GET", "/v1/keys/login/203.0.113.7").json()
        self.assertEqual(state["limits"][0]["remaining"], 0)

    def test_real_ip_header_names_the_one_header_believed(self):
        self.start_gateway("real_ip_header: X-Real-IP\n")
        for n in range(3):
            r = request(self.sluice.port, "POST", "/login", headers={
                "X-Real-IP": "203.0.113.8", "X-Forwarded-For": "198.51.100.%d" % n})
            self.assertEqual(r.status, 200 if n < 2 else 429, r)


if __name__ == "__main__":
    unittest.main()
