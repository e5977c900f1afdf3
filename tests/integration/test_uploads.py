"""Request bodies through the gateway as they come: a route's own
max_body_bytes may pass server.max_body_bytes, and a body that is chunked
or said to be over 1 MiB goes to the upstream while the client still sends
it (uploads), with its Content-Length, or chunked as it came. Each test
watches the upstream receive the first part before the client has sent the
rest."""

import hashlib
import os
import socket
import ssl
import threading
import time

from certs import server_certificates
from harness import HOST, SluiceTestCase, metric_value, server_block
from raw_http import RawServer, read_head

MiB = 1024 * 1024


class UploadUpstream(RawServer):
    """Reads each request's body as it comes (Content-Length or chunked),
    counting it in `received`; answers 200 with "<length> <sha256>" once it
    is whole. `cut` is set when a connection ends in the middle of a body."""

    def __init__(self, tls=None):
        self.received = 0
        self.heads = []
        self.cut = threading.Event()
        super().__init__(tls)

    def serve(self, conn):
        data = b""
        while True:
            got = read_head(conn, data)
            if got is None:
                return
            line, fields, data = got
            self.heads.append((line, fields))
            digest, length = hashlib.sha256(), 0
            if fields.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    while b"\r\n" not in data:
                        data = self._more(conn, data)
                        if data is None:
                            return
                    size_line, data = data.split(b"\r\n", 1)
                    size = int(size_line.split(b";")[0], 16)
                    while len(data) < size + 2:
                        data = self._more(conn, data)
                        if data is None:
                            return
                    digest.update(data[:size])
                    length += size
                    self.received += size
                    data = data[size + 2:]
                    if size == 0:
                        break
            else:
                left = int(fields.get("content-length", "0"))
                while left > 0:
                    if not data:
                        data = self._more(conn, data)
                        if data is None:
                            return
                    take = data[:left]
                    digest.update(take)
                    length += len(take)
                    self.received += len(take)
                    left -= len(take)
                    data = data[len(take):]
            body = ("%d %s" % (length, digest.hexdigest())).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def _more(self, conn, data):
        chunk = conn.recv(262144)
        if not chunk:
            self.cut.set()
            return None
        return data + chunk

    def wait_for(self, n, within=5.0):
        deadline = time.monotonic() + within
        while self.received < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.received >= n


class AnswersEarly(RawServer):
    """Reads 100,000 bytes of a body, answers 413 and closes: reading the
    rest first and dropping it (`linger`), or at once (the client's bytes
    still coming then get a reset)."""

    def __init__(self, linger):
        self.linger = linger
        super().__init__()

    def serve(self, conn):
        _, _, data = read_head(conn)
        while len(data) < 100000:
            data += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n"
                     b"Connection: close\r\n\r\nnope")
        if self.linger:
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(65536):
                pass


class SlowUpstream(UploadUpstream):
    """An UploadUpstream that takes a body 64 KiB every 50 ms (about 1.3
    MB/s), its receive buffer small: a disk slower than the client."""

    def serve(self, conn):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        super().serve(conn)

    def _more(self, conn, data):
        time.sleep(0.05)
        chunk = conn.recv(65536)
        if not chunk:
            self.cut.set()
            return None
        return data + chunk


def expected(body):
    return ("%d %s" % (len(body), hashlib.sha256(body).hexdigest())).encode()


def read_answer(conn):
    line, fields, rest = read_head(conn)
    length = int(fields.get("content-length", "0"))
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return line, fields, rest[:length]


class UploadTest(SluiceTestCase):
    def start(self, route_max="8388608", policy_rate="100/s", upload_extra="", **server):
        return self.start_sluice_with(
            "    limits: [{algorithm: fixed_window, rate: %s}]\n" % policy_rate, route_max,
            upload_extra=upload_extra, **server)

    def start_sluice_with(self, limits, route_max="8388608", upstream_tls=None, route_extra="",
                          upload_extra="", **server):
        """sluice with server.max_body_bytes 64 KiB, a route for /upload that
        takes `route_max` bytes under a policy of `limits` (with
        `upload_extra` more of its keys), and another."""
        self.up = UploadUpstream(upstream_tls)
        self.addCleanup(self.up.close)
        settings = {"max_body_bytes": 65536}
        settings.update(server)
        return self.start_sluice(
            server_block(**settings) + "routes:\n"
            "  - {name: uploads, match: {path_prefix: /upload}, upstream: %s, "
            "max_body_bytes: %s%s%s}\n"
            "  - {name: app, match: {path_prefix: /}, upstream: %s%s}\n"
            "policies:\n  - name: uploads\n    match: {path_prefix: /upload}\n%s"
            % (self.up.url, route_max, route_extra, upload_extra, self.up.url, route_extra,
               limits))

    def connect(self, s):
        conn = socket.create_connection((HOST, s.port), timeout=10)
        self.addCleanup(conn.close)
        return conn

    def test_a_large_body_reaches_the_upstream_while_the_client_still_sends_it(self):
        s = self.start()
        routes = self.get("/v1/config", admin=True, s=s).json()["routes"]
        self.assertEqual([r.get("max_body_bytes") for r in routes], [8388608, None])
        self.assertEqual([r.get("min_upload_rate") for r in routes], [1024, None])
        body = bytes(range(256)) * (4 * MiB // 256)
        conn = self.connect(s)
        conn.sendall(b"POST /upload/a HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                     % len(body))
        conn.sendall(body[:2 * MiB])
        self.assertTrue(self.up.wait_for(MiB), "the upstream got %d bytes" % self.up.received)
        conn.sendall(body[2 * MiB:])
        line, fields, answer = read_answer(conn)
        self.assertEqual((line, answer), ("HTTP/1.1 200 OK", expected(body)))
        _, upstream_fields = self.up.heads[0]
        self.assertEqual(upstream_fields["content-length"], str(len(body)))
        self.assertNotIn("transfer-encoding", upstream_fields)
        self.assertIn("ratelimit", fields)
        # The connection goes on: a small request after it.
        conn.sendall(b"POST /upload/b HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        self.assertEqual(read_answer(conn)[2], expected(b"hello"))

    def test_a_chunked_body_goes_chunked_as_it_comes(self):
        s = self.start()
        conn = self.connect(s)
        conn.sendall(b"PUT /upload/c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        sent = b""
        for i in range(48):
            part = bytes([i]) * 65536
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            sent += part
            if i == 23:
                self.assertTrue(self.up.wait_for(MiB),
                                "the upstream got %d bytes" % self.up.received)
        conn.sendall(b"0\r\n\r\n")
        line, _, answer = read_answer(conn)
        self.assertEqual((line, answer), ("HTTP/1.1 200 OK", expected(sent)))
        self.assertEqual(self.up.heads[0][1]["transfer-encoding"], "chunked")
        self.assertNotIn("content-length", self.up.heads[0][1])

    def test_a_client_that_expects_100_continue_is_asked_once_admitted(self):
        s = self.start()
        body = b"x" * (2 * MiB)
        conn = self.connect(s)
        conn.sendall(b"POST /upload/d HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        line, _, rest = read_head(conn)
        self.assertEqual((line, rest), ("HTTP/1.1 100 Continue", b""))
        conn.sendall(body)
        self.assertEqual(read_answer(conn)[2], expected(body))

    def test_a_body_past_the_routes_bound_is_refused_and_others_keep_the_servers(self):
        s = self.start(route_max="3145728")
        # Said too long: 413 at once, before any of it is sent, naming the
        # route's bound.
        conn = self.connect(s)
        conn.sendall(b"POST /upload/e HTTP/1.1\r\nHost: t\r\nContent-Length: 3145729\r\n\r\n")
        line, _, problem = read_answer(conn)
        self.assertEqual(line, "HTTP/1.1 413 Payload Too Large")
        self.assertIn(b"larger than 3145728 bytes", problem)
        # Chunked past it: 413 once it is, the upstream's request cut.
        conn = self.connect(s)
        conn.sendall(b"POST /upload/f HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(64):
                conn.sendall(b"10000\r\n" + b"y" * 65536 + b"\r\n")
        except OSError:
            pass  # sluice stopped reading
        self.assertEqual(read_head(conn)[0], "HTTP/1.1 413 Payload Too Large")
        self.assertTrue(self.up.cut.wait(5), "the upstream's request was not cut")
        # Another route, and the decision API, keep server.max_body_bytes.
        for path in (b"/other", b"/v1/check"):
            conn = self.connect(s)
            conn.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: 70000\r\n\r\n" % path)
            self.assertEqual(read_head(conn)[0], "HTTP/1.1 413 Payload Too Large", path)

    def test_a_client_gone_in_the_middle_cuts_the_upstreams_request(self):
        s = self.start()
        conn = self.connect(s)
        conn.sendall(b"POST /upload/g HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                     % (4 * MiB))
        conn.sendall(b"z" * (2 * MiB))
        self.assertTrue(self.up.wait_for(MiB))
        conn.close()
        self.assertTrue(self.up.cut.wait(5), "the upstream's request was not cut")

    def test_a_denied_upload_never_reaches_the_upstream(self):
        s = self.start(policy_rate="1/1m")
        conn = self.connect(s)
        conn.sendall(b"POST /upload/h HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nfirst")
        self.assertEqual(read_answer(conn)[0], "HTTP/1.1 200 OK")
        connections = self.up.connections
        conn = self.connect(s)
        conn.sendall(b"POST /upload/h HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                     % (4 * MiB))
        self.assertEqual(read_head(conn)[0], "HTTP/1.1 429 Too Many Requests")
        self.assertEqual(self.up.connections, connections)

    def test_a_concurrency_limit_counts_uploads_while_their_bodies_come(self):
        # Decided on its header even with a concurrency limit (a route
        # whose bodies stream): the slot is held while the body comes.
        s = self.start_sluice_with(
            "    limits: [{algorithm: concurrency, limit: 1, lease_ttl: 60s}]\n")
        first = self.connect(s)
        first.sendall(b"POST /upload/i HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                      % (2 * MiB))
        first.sendall(b"a" * MiB)
        self.assertTrue(self.up.wait_for(MiB // 2))
        second = self.connect(s)
        second.sendall(b"POST /upload/j HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                       % (2 * MiB))
        self.assertEqual(read_head(second)[0], "HTTP/1.1 429 Too Many Requests")
        first.sendall(b"a" * MiB)
        self.assertEqual(read_answer(first)[0], "HTTP/1.1 200 OK")
        third = self.connect(s)
        third.sendall(b"POST /upload/k HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nthird")
        self.assertEqual(read_answer(third)[2], expected(b"third"))

    def test_over_tls_at_both_ends(self):
        path, upstream_tls = server_certificates(self, "sluice-upload-")
        s = self.start_sluice_with(
            "    limits: [{algorithm: fixed_window, rate: 100/s}]\n", upstream_tls=upstream_tls,
            route_extra=", upstream_ca_file: %s" % path("ca.pem"),
            tls="{cert_file: %s, key_file: %s}" % (path("server.pem"), path("server.key")))
        conn = ssl.create_default_context(cafile=path("ca.pem")).wrap_socket(
            self.connect(s), server_hostname="sluice.test")
        body = os.urandom(3 * MiB)
        conn.sendall(b"POST /upload/l HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                     % len(body))
        conn.sendall(body[:2 * MiB])
        self.assertTrue(self.up.wait_for(MiB), "the upstream got %d bytes" % self.up.received)
        conn.sendall(body[2 * MiB:])
        self.assertEqual(read_answer(conn)[2], expected(body))

    def test_an_upload_longer_than_its_lease_keeps_its_slot(self):
        # Renewed as its parts come: two leases later the second is still
        # refused. (A lease must outlast server.read_timeout on a route that
        # streams uploads.)
        s = self.start_sluice_with(
            "    limits: [{algorithm: concurrency, limit: 1, lease_ttl: 1s}]\n",
            read_timeout="500ms", upstream_timeout="500ms")
        first = self.connect(s)
        first.sendall(b"POST /upload/m HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                      % (2 * MiB))
        sent = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.3:  # more than two leases
            first.sendall(b"b" * 32768)
            sent += 32768
            time.sleep(0.1)
        second = self.connect(s)
        second.sendall(b"POST /upload/n HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        self.assertEqual(read_head(second)[0], "HTTP/1.1 429 Too Many Requests")
        first.sendall(b"b" * (2 * MiB - sent))
        self.assertEqual(read_answer(first)[2], expected(b"b" * (2 * MiB)))

    def test_a_large_upload_is_never_held_whole(self):
        # 256 MiB through a route that takes 1 GiB: sluice's peak memory
        # grows by a small part of it (a read's worth at a time goes on).
        s = self.start(route_max=str(1 << 30))

        def peak_kib():
            with open("/proc/%d/status" % s.proc.pid) as f:
                return int([l for l in f if l.startswith("VmHWM")][0].split()[1])

        before = peak_kib()
        conn = self.connect(s)
        # (A sanitizer build keeps what is freed in quarantine, hundreds of
        # MiB: there the body goes through, a smaller one, and its memory
        # is not measured.)
        sanitized = bool(os.environ.get("SLUICE_SANITIZE"))
        size = (32 if sanitized else 256) * MiB
        conn.sendall(b"POST /upload/o HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
        part = b"p" * MiB
        for _ in range(size // MiB):
            conn.sendall(part)
        line, _, answer = read_answer(conn)
        self.assertEqual((line, answer.split()[0]), ("HTTP/1.1 200 OK", str(size).encode()))
        grown = peak_kib() - before
        if not sanitized:
            self.assertLess(grown, 32 * 1024, "sluice's peak memory grew by %d KiB" % grown)

    def test_an_upstream_that_answers_before_the_body_has_gone_is_relayed(self):
        ups = [AnswersEarly(linger=True), AnswersEarly(linger=False)]
        for up in ups:
            self.addCleanup(up.close)
        s = self.start_sluice(
            server_block(max_body_bytes=65536) + "routes:\n"
            "  - {name: l, match: {path_prefix: /l}, upstream: %s, max_body_bytes: 100000000}\n"
            "  - {name: c, match: {path_prefix: /c}, upstream: %s, max_body_bytes: 100000000}\n"
            % (ups[0].url, ups[1].url))
        for path in (b"/l", b"/c"):
            conn = self.connect(s)
            conn.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: 20000000\r\n\r\n"
                         % path)
            try:
                for _ in range(20):
                    conn.sendall(b"q" * MiB)
            except OSError:
                pass  # sluice closed it once the answer had gone
            line, _, body = read_answer(conn)
            self.assertEqual((line, body), ("HTTP/1.1 413 Payload Too Large", b"nope"), path)

    def test_an_upstream_slow_to_take_the_body_does_not_count_against_the_client(self):
        # The floor (8 MB/s) is above what the upstream takes (about 1.3
        # MB/s): the reads slow down, but only the waits for the client
        # count against it, and the client has sent everything at once.
        self.up = SlowUpstream()
        self.addCleanup(self.up.close)
        s = self.start_sluice(
            server_block(max_body_bytes=65536, read_timeout="1s") + "routes:\n"
            "  - {name: uploads, match: {path_prefix: /}, upstream: %s, "
            "max_body_bytes: 16777216, min_upload_rate: 8000000}\n" % self.up.url)
        body = bytes(range(256)) * (4 * MiB // 256)
        conn = self.connect(s)
        began = time.monotonic()
        conn.sendall(b"POST /upload/k HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body)
        line, _, answer = read_answer(conn)
        self.assertEqual((line, answer), ("HTTP/1.1 200 OK", expected(body)))
        self.assertGreater(time.monotonic() - began, 2.5)  # the upstream's pace: 4 MiB at 1.3 MB/s
        self.assertEqual(metric_value(self.metrics(s), "sluice_slow_uploads_total",
                                      route="uploads"), 0)

    def trickle(self, conn, path, part, every, until):
        """A chunked upload of `part` every `every` seconds, for `until`
        seconds at most; the seconds it went on (until sluice cut it)."""
        conn.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     % path)
        began = time.monotonic()
        try:
            while time.monotonic() - began < until:
                conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
                time.sleep(every)
                if self.up.cut.is_set():
                    break
        except OSError:
            pass  # sluice closed the connection
        return time.monotonic() - began

    def test_a_client_below_the_routes_floor_is_cut_off_and_one_above_it_is_not(self):
        # routes[].min_upload_rate: each part well within server.read_timeout
        # is not enough when too little comes in all.
        s = self.start(read_timeout="2s", upload_extra=", min_upload_rate: 2000")
        # 4,000 bytes every 0.4 s: five times the floor, for 2.5 s, then the end.
        conn = self.connect(s)
        self.trickle(conn, b"/upload/fast", b"f" * 4000, 0.4, 2.5)
        self.assertFalse(self.up.cut.is_set())
        conn.sendall(b"0\r\n\r\n")
        line, _, answer = read_answer(conn)
        self.assertEqual(line, "HTTP/1.1 200 OK")
        self.assertEqual(int(answer.split()[0]), self.up.received)
        # 100 bytes every 0.4 s, each wait a fifth of read_timeout, 250 bytes
        # a second in all: cut when the grace of 2 s and a second a 2,000
        # bytes have passed (at about 2.3 s), and the upstream's request too.
        conn = self.connect(s)
        took = self.trickle(conn, b"/upload/slow", b"s" * 100, 0.4, 10)
        self.assertTrue(self.up.cut.wait(5), "the upstream's request was not cut")
        self.assertLess(took, 5)
        try:
            self.assertEqual(conn.recv(65536), b"")  # closed, without an answer
        except ConnectionResetError:
            pass  # closed with bytes of ours unread: as closed
        self.assertEqual(metric_value(self.metrics(s), "sluice_slow_uploads_total",
                                      route="uploads"), 1)
