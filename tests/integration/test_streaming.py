"""Bodies the gateway relays as they come: an upstream's answer whose body
is still coming after its head, and is chunked, of a length not said, or
longer than 1 MiB, goes to the client part by part (Server-Sent Events, a
model's tokens, downloads) instead of being read whole first. The upstream
here is the test's own: each answer sends part of its body, then waits for
the test to let it go on, so that what the client has read by then is what
was relayed before the rest existed."""

import socket
import ssl
import threading
import time

from certs import server_certificates

from harness import HOST, SluiceTestCase, server_block
from raw_http import RawServer, read_head


class GatedUpstream(RawServer):
    """Answers by the path: /events (chunked events), /file (3 MiB with its
    Content-Length), /cut (a chunk, then the connection's end), /old (no
    length: the body ends with the connection), /small (a short body).
    Each sends its first part, then waits for `go` (set by the test)."""

    FILE = bytes(range(256)) * (3 * 4096)  # 3 MiB

    def __init__(self, tls=None):
        self.go = threading.Event()
        super().__init__(tls)

    def close(self):
        self.go.set()
        super().close()

    def serve(self, conn):
        data = b""
        while True:
            got = read_head(conn, data)
            if got is None:
                return
            line, _, data = got
            if not self._answer(conn, line.split(" ")[1]):
                return

    def _answer(self, conn, path):
        """Answers `path`; whether the connection goes on."""
        if path == "/events":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            conn.sendall(chunk(b"data: one\n\n"))
            self.go.wait(10)
            conn.sendall(chunk(b"data: two\n\n") + chunk(b"data: three\n\n") + b"0\r\n\r\n")
            return True
        if path == "/file":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(self.FILE))
            conn.sendall(self.FILE[:1 << 20])
            self.go.wait(10)
            conn.sendall(self.FILE[1 << 20:])
            return True
        if path == "/cut":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
                         chunk(b"half of it"))
            self.go.wait(10)
            return False
        if path == "/old":
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nfirst;")
            self.go.wait(10)
            conn.sendall(b"last")
            return False
        if path.endswith("/sparse"):  # three events 0.8 s apart
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(3):
                time.sleep(0.8)
                conn.sendall(chunk(b"data: %d\n\n" % i))
            conn.sendall(b"0\r\n\r\n")
            return True
        if path == "/big":  # 80 MiB with its length, 1 MiB at a time
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (80 << 20))
            part = b"b" * (1 << 20)
            for _ in range(80):
                conn.sendall(part)
            return True
        if path == "/drip":  # an event every 0.2 s for 3 s
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(15):
                conn.sendall(chunk(b"data: %d\n\n" % i))
                time.sleep(0.2)
            conn.sendall(b"0\r\n\r\n")
            return True
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nsmall")
        return True


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


class Reader:
    """An HTTP/1.1 client on a raw socket that reads an answer's parts as
    they come."""

    def __init__(self, port):
        self.conn = socket.create_connection((HOST, port), timeout=5)
        self.data = b""

    def close(self):
        self.conn.close()

    def send(self, path, version="1.1"):
        self.conn.sendall(("GET %s HTTP/%s\r\nHost: app.test\r\n\r\n" % (path, version)).encode())

    def fill(self, n):
        """At least `n` bytes buffered, or the connection ended."""
        while len(self.data) < n:
            got = self.conn.recv(1 << 20)
            if not got:
                return False
            self.data += got
        return True

    def take(self, n):
        self.fill(n)
        out, self.data = self.data[:n], self.data[n:]
        return out

    def head(self):
        got = read_head(self.conn, self.data)
        if got is None:
            raise AssertionError("closed before a head: %r" % self.data)
        line, fields, self.data = got
        return line, fields

    def chunk(self):
        """The next chunk's data (b"" for the last one), or None when the
        connection ended first."""
        while b"\r\n" not in self.data:
            got = self.conn.recv(65536)
            if not got:
                return None
            self.data += got
        size, self.data = self.data.split(b"\r\n", 1)
        n = int(size, 16)
        if not self.fill(n + 2):
            return None
        data = self.take(n + 2)[:n]
        return data

    def ended(self, within=3):
        self.conn.settimeout(within)
        try:
            while True:
                got = self.conn.recv(65536)
                if not got:
                    return True
                self.data += got
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False


class StreamingTest(SluiceTestCase):
    def start(self, limits="{algorithm: token_bucket, rate: 100/s}", upstream_tls=None,
              route_extra="", **server):
        self.up = GatedUpstream(upstream_tls)
        self.addCleanup(self.up.close)
        return self.start_sluice(
            server_block(**server) + "routes:\n"
            "  - {name: app, match: {path_prefix: /}, upstream: %s%s}\n"
            "policies:\n  - name: all\n    match: {path_prefix: /}\n    limits: [%s]\n"
            % (self.up.url, route_extra, limits))

    def reader(self, s):
        r = Reader(s.port)
        self.addCleanup(r.close)
        return r

    def test_events_reach_the_client_as_they_come(self):
        s = self.start()
        r = self.reader(s)
        r.send("/events")
        status, fields = r.head()
        self.assertEqual(status, "HTTP/1.1 200 OK")
        self.assertEqual(fields["transfer-encoding"], "chunked")
        self.assertEqual(fields["content-type"], "text/event-stream")
        self.assertIn("ratelimit", fields)
        # The first event, while the upstream has not sent the second yet.
        self.assertEqual(r.chunk(), b"data: one\n\n")
        self.up.go.set()
        rest = []  # chunks as sluice read them (two events may come as one)
        while (part := r.chunk()):
            rest.append(part)
        self.assertEqual(b"".join(rest), b"data: two\n\ndata: three\n\n")
        self.assertEqual(part, b"")  # the last chunk, not the connection's end
        # The connection goes on, and so does the upstream's: one for both.
        r.send("/small")
        self.assertEqual(r.head()[0], "HTTP/1.1 200 OK")
        self.assertEqual(r.take(5), b"small")
        self.assertEqual(self.up.connections, 1)

    def test_a_long_body_goes_as_it_comes_with_its_length(self):
        s = self.start()
        r = self.reader(s)
        r.send("/file")
        status, fields = r.head()
        self.assertEqual(fields["content-length"], str(len(GatedUpstream.FILE)))
        self.assertNotIn("transfer-encoding", fields)
        self.assertEqual(r.take(1 << 20), GatedUpstream.FILE[:1 << 20])  # before the rest exists
        self.up.go.set()
        self.assertEqual(r.take(2 << 20), GatedUpstream.FILE[1 << 20:])
        r.send("/small")
        self.assertEqual(r.head()[0], "HTTP/1.1 200 OK")

    def test_a_download_said_to_be_longer_than_any_bound_goes_whole(self):
        # 80 MiB: past the 64 MiB that once bounded an answer's said length
        # (a 502 then); a body streamed has no bound.
        s = self.start()
        r = self.reader(s)
        r.send("/big")
        status, fields = r.head()
        self.assertEqual((status, fields["content-length"]), ("HTTP/1.1 200 OK", str(80 << 20)))
        got = len(r.data)
        r.data = b""
        r.conn.settimeout(10)
        while got < 80 << 20:
            part = r.conn.recv(1 << 20)
            if not part:
                break
            self.assertEqual(part.strip(b"b"), b"")
            got += len(part)
        self.assertEqual(got, 80 << 20)
        r.send("/small")
        self.assertEqual(r.head()[0], "HTTP/1.1 200 OK")

    def test_a_body_cut_short_ends_the_clients_connection(self):
        s = self.start()
        r = self.reader(s)
        r.send("/cut")
        r.head()
        self.assertEqual(r.chunk(), b"half of it")
        self.up.go.set()  # the upstream closes without the last chunk
        self.assertIsNone(r.chunk(), "the client was told the body was whole")

    def test_an_http_1_0_client_reads_the_body_to_the_connections_end(self):
        s = self.start()
        r = self.reader(s)
        r.send("/events", version="1.0")
        status, fields = r.head()
        self.assertEqual(status, "HTTP/1.0 200 OK")
        self.assertNotIn("transfer-encoding", fields)
        self.assertNotIn("content-length", fields)
        self.assertTrue(r.fill(len(b"data: one\n\n")))
        self.up.go.set()
        self.assertTrue(r.ended())
        self.assertEqual(r.data, b"data: one\n\ndata: two\n\ndata: three\n\n")

    def test_a_concurrency_slot_is_held_until_the_body_has_gone(self):
        s = self.start(limits="{algorithm: concurrency, limit: 1, lease_ttl: 60s}")
        first = self.reader(s)
        first.send("/events")
        first.head()
        self.assertEqual(first.chunk(), b"data: one\n\n")
        second = self.reader(s)
        second.send("/small")
        self.assertEqual(second.head()[0], "HTTP/1.1 429 Too Many Requests")
        self.up.go.set()
        while first.chunk():
            pass
        deadline = time.monotonic() + 5
        while True:
            third = self.reader(s)
            third.send("/small")
            status = third.head()[0]
            if status == "HTTP/1.1 200 OK" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(status, "HTTP/1.1 200 OK")

    def test_a_long_body_keeps_its_slot_past_its_lease(self):
        s = self.start(limits="{algorithm: concurrency, limit: 1, lease_ttl: 1s}",
                       upstream_timeout="500ms")
        first = self.reader(s)
        first.send("/drip")
        first.head()
        time.sleep(2.5)  # two and a half leases into a 3 s body
        second = self.reader(s)
        second.send("/small")
        self.assertEqual(second.head()[0], "HTTP/1.1 429 Too Many Requests")
        events = []
        while (part := first.chunk()):
            events.append(part)
        self.assertEqual(b"".join(events), b"".join(b"data: %d\n\n" % i for i in range(15)))

    def test_a_routes_upstream_timeout_lets_a_sparse_stream_wait_longer(self):
        # The server's 500 ms cuts a stream quiet for 0.8 s; the route of
        # /quiet waits up to 2 s between reads.
        self.up = GatedUpstream()
        self.addCleanup(self.up.close)
        s = self.start_sluice(
            server_block(upstream_timeout="500ms") + "routes:\n"
            "  - {name: quiet, match: {path_prefix: /quiet/}, upstream: %s, upstream_timeout: 2s}\n"
            "  - {name: app, match: {path_prefix: /}, upstream: %s}\n" % (self.up.url, self.up.url))
        routes = self.get("/v1/config", admin=True).json()["routes"]
        self.assertEqual([r.get("upstream_timeout") for r in routes], ["2s", None])
        waits = self.reader(s)
        waits.send("/quiet/sparse")
        self.assertEqual(waits.head()[0], "HTTP/1.1 200 OK")
        events = []
        while (part := waits.chunk()):
            events.append(part)
        self.assertEqual((b"".join(events), part), (b"data: 0\n\ndata: 1\n\ndata: 2\n\n", b""))
        cut = self.reader(s)
        cut.send("/other/sparse")
        self.assertEqual(cut.head()[0], "HTTP/1.1 200 OK")
        self.assertIsNone(cut.chunk(), "a read past the server's 500 ms was waited for")

    def test_a_drain_lets_a_body_stream_for_drain_timeout_then_cuts_it(self):
        s = self.start(drain_timeout="1s")
        r = self.reader(s)
        r.send("/events")
        r.head()
        self.assertEqual(r.chunk(), b"data: one\n\n")
        t0 = time.monotonic()
        self.assertEqual(s.stop(), 0)  # the upstream never sends the rest
        elapsed = time.monotonic() - t0
        self.assertGreater(elapsed, 0.9)
        self.assertLess(elapsed, 4)
        self.assertIsNone(r.chunk())

    def test_over_tls_at_both_ends(self):
        path, upstream_tls = server_certificates(self, "sluice-stream-")
        s = self.start(upstream_tls=upstream_tls,
                       route_extra=", upstream_ca_file: %s" % path("ca.pem"),
                       tls="{cert_file: %s, key_file: %s}" % (path("server.pem"),
                                                              path("server.key")))
        r = Reader(s.port)
        self.addCleanup(r.close)
        r.conn = ssl.create_default_context(cafile=path("ca.pem")).wrap_socket(
            r.conn, server_hostname="sluice.test")
        r.send("/events")
        self.assertEqual(r.head()[1]["transfer-encoding"], "chunked")
        self.assertEqual(r.chunk(), b"data: one\n\n")
        self.up.go.set()
        rest = []
        while (part := r.chunk()):
            rest.append(part)
        self.assertEqual((b"".join(rest), part), (b"data: two\n\ndata: three\n\n", b""))
        r.send("/small")  # the kept connections, both ends
        self.assertEqual(r.head()[0], "HTTP/1.1 200 OK")
        self.assertEqual(r.take(5), b"small")
        self.assertEqual(self.up.connections, 1)
