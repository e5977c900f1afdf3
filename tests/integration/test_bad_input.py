"""Malformed and oversized HTTP, slow clients and too many connections:
each answered or cut off cleanly, and the server stays healthy."""

import http.client
import json
import socket
import time
import unittest

from harness import (HOST, SluiceTestCase, metric_value, parse_raw_response, raw_exchange,
                     read_until_close, request, server_block)

CONFIG = server_block(
    max_header_bytes=4096,
    max_body_bytes=1024,
    read_timeout="1s",
    idle_timeout="2s",
    max_connections=5,
) + """\
policies:
  - name: p
    limits:
      - {algorithm: token_bucket, rate: 1000/s}
"""

CHECK = b'{"policy": "p", "key": "k"}'


class BadInputTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        self.start_sluice(CONFIG)

    def tearDown(self):
        # Whatever the test did, the server still serves (connections a test
        # just closed may take a moment to leave the connection count).
        deadline = time.monotonic() + 3
        while True:
            try:
                self.assert_healthy()
                self.assertEqual(self.check("p", "after").status, 200)
                return
            except (AssertionError, OSError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def hold_served_connections(self, n):
        """n open connections the server has accepted and served once.
        Connections closed just before (the start-up probe) may still be
        counted for a moment: a refused attempt is retried."""
        held = []
        deadline = time.monotonic() + 3
        while len(held) < n:
            c = socket.create_connection((HOST, self.sluice.port), timeout=5)
            try:
                c.sendall(b"GET /v1/check HTTP/1.1\r\nHost: x\r\n\r\n")
                ok = c.recv(65536).startswith(b"HTTP/1.1 405")
            except OSError:
                ok = False
            if ok:
                held.append(c)
                self.addCleanup(c.close)
                continue
            c.close()
            if time.monotonic() > deadline:
                for h in held:
                    h.close()
                self.fail("could not open %d served connections" % n)
            time.sleep(0.05)
        return held

    def raw_problem(self, data, status, **kwargs):
        got = raw_exchange(self.sluice.port, data, **kwargs)
        self.assertTrue(got, "no answer at all to %r" % data[:80])
        r = parse_raw_response(got)
        self.assert_problem(r, status)
        return r

    # ---- malformed ----

    def test_garbage_request_line_is_400(self):
        self.raw_problem(b"GARBAGE\r\n\r\n", 400)

    def test_binary_garbage_is_400(self):
        self.raw_problem(b"\x00\x01\x02\xff\xfe\r\n\r\n", 400)

    def test_bad_http_version_is_400(self):
        self.raw_problem(b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 400)

    def test_header_without_colon_is_400(self):
        self.raw_problem(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", 400)

    def test_bad_content_length_is_400(self):
        self.raw_problem(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400)

    def test_conflicting_content_lengths_are_400(self):
        self.raw_problem(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                         b"Content-Length: 6\r\n\r\nhello!", 400)

    def test_bad_chunked_encoding_is_400(self):
        self.raw_problem(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"zz\r\nhello\r\n0\r\n\r\n", 400)

    def test_http_1_1_request_without_host_is_400(self):
        # Regression (was a bug): an HTTP/1.1 request without a Host field is served (observed:
        # 405 for GET /v1/check, and through a gateway route it is forwarded
        # upstream with no Host at all). RFC 9112 3.2: a server MUST answer
        # 400 to an HTTP/1.1 request that lacks Host.
        self.raw_problem(b"GET /v1/check HTTP/1.1\r\n\r\n", 400)

    def test_error_response_closes_the_connection(self):
        r = self.raw_problem(b"GARBAGE\r\n\r\n", 400)
        self.assertEqual((r.header("Connection") or "").lower(), "close")

    # ---- oversized ----

    def test_header_larger_than_max_header_bytes_is_431(self):
        big = b"a" * 8000
        self.raw_problem(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + big + b"\r\n\r\n", 431)

    def test_many_headers_over_the_limit_are_431(self):
        headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 50) for i in range(200))
        self.raw_problem(b"GET / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n", 431)

    def test_body_larger_than_max_body_bytes_is_413(self):
        # Content-Length over the limit: answered from the header alone.
        head = (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 5000\r\n\r\n")
        self.raw_problem(head + b"x" * 100, 413)

    def test_chunked_body_larger_than_max_body_bytes_is_413(self):
        chunk = b"400\r\n" + b"x" * 0x400 + b"\r\n"
        data = (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                chunk + chunk)
        self.raw_problem(data, 413)

    def test_body_at_the_limit_is_accepted(self):
        body = json.dumps({"policy": "p", "key": "k" * 900}).encode()
        body += b" " * (1024 - len(body))
        self.assertEqual(len(body), 1024)
        r = request(self.sluice.port, "POST", "/v1/check", body=body)
        self.assertEqual(r.status, 200, r)

    # ---- slow clients ----

    def test_slow_client_is_cut_off_after_read_timeout_while_others_are_served(self):
        slow = socket.create_connection((HOST, self.sluice.port), timeout=5)
        self.addCleanup(slow.close)
        t0 = time.monotonic()
        slow.sendall(b"POST /v1/ch")
        # Meanwhile other clients are served, on both listeners.
        for _ in range(5):
            self.assertEqual(self.check("p", "other").status, 200)
            self.assert_healthy()
        got = read_until_close(slow, 5)
        elapsed = time.monotonic() - t0
        self.assertLess(elapsed, 2.5, "not closed after read_timeout 1s")
        self.assertGreater(elapsed, 0.8, "closed before read_timeout 1s")
        # No response is promised to a client that never finished (a 408 is fine).
        if got:
            self.assertEqual(parse_raw_response(got).status, 408, got)

    def test_drip_fed_request_is_cut_off_after_read_timeout(self):
        # read_timeout bounds the whole request, not the gap between bytes.
        s = socket.create_connection((HOST, self.sluice.port), timeout=5)
        self.addCleanup(s.close)
        t0 = time.monotonic()
        request_bytes = b"POST /v1/check HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: y\r\n" * 40
        closed = False
        for b in request_bytes:
            try:
                s.sendall(bytes([b]))
            except OSError:
                closed = True
                break
            s.settimeout(0.1)
            try:
                if s.recv(65536) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
            except OSError:
                closed = True
                break
            if time.monotonic() - t0 > 4:
                break
        elapsed = time.monotonic() - t0
        self.assertTrue(closed, "drip-fed connection still open after %.1fs" % elapsed)
        self.assertLess(elapsed, 2.5)

    def test_idle_keep_alive_connection_is_closed(self):
        s = socket.create_connection((HOST, self.sluice.port), timeout=5)
        self.addCleanup(s.close)
        s.sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
            len(CHECK), CHECK))
        t0 = time.monotonic()
        got = read_until_close(s, 5)
        elapsed = time.monotonic() - t0
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:100])
        # Closed after min(idle_timeout, read_timeout) = 1 s of idleness.
        self.assertLess(elapsed, 3.0)

    # ---- connection limit ----

    def test_connections_beyond_max_connections_are_closed(self):
        # 5 sessions running, each has answered one request.
        held = self.hold_served_connections(5)
        extra = socket.create_connection((HOST, self.sluice.port), timeout=5)
        self.addCleanup(extra.close)
        try:
            extra.sendall(b"GET /v1/check HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            pass
        try:
            t0 = time.monotonic()
            got = read_until_close(extra, 3)
            self.assertEqual(got, b"", "the 6th connection was served")
            self.assertLess(time.monotonic() - t0, 1.0, "the 6th connection was not closed at once")
            # The held ones still work.
            held[0].sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(CHECK), CHECK))
            self.assertTrue(held[0].recv(65536).startswith(b"HTTP/1.1 200"))
        finally:
            # Once they go, new connections are served again.
            for c in held:
                c.close()
        deadline = time.monotonic() + 3
        while True:
            try:
                r = self.check("p", "again")
                if r.status == 200:
                    break
            except (ConnectionError, OSError, Exception):
                pass
            if time.monotonic() > deadline:
                self.fail("new connections still refused after the held ones closed")
            time.sleep(0.05)
        self.assertGreaterEqual(metric_value(self.metrics(), "sluice_connections_refused_total"), 1)

    def test_admin_listener_answers_while_main_listener_is_at_max_connections(self):
        # Regression (was a bug): server.max_connections counts admin connections together with
        # main-listener ones (one shared counter in Session), so when clients
        # hold max_connections connections on the main listener, /healthz and
        # /metrics on the admin listener are refused too (the connection is
        # closed at once). Expected: the admin listener (probes, scraping,
        # the dashboard) stays reachable while the main listener is full.
        held = self.hold_served_connections(5)
        try:
            r = self.get("/healthz", admin=True)
            status = r.status
        except (ConnectionError, OSError, Exception) as e:
            status = repr(e)
        for c in held:
            c.close()
        self.assertEqual(status, 200)


if __name__ == "__main__":
    unittest.main()
