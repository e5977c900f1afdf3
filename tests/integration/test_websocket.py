"""WebSockets through the gateway (routes[].websocket): the handshake is
decided by the policies like any request, passed to the upstream with its
Upgrade, and once the upstream answers 101 the client's connection and the
upstream's are one tunnel, until either side ends it, it idles for
server.idle_timeout, or sluice drains. The upstream here is a small server
of the test's: it answers the handshake as RFC 6455 says (its
Sec-WebSocket-Accept), then sends back what it reads; frames are bytes to
sluice, so the test sends bytes."""

import base64
import hashlib
import os
import socket
import ssl
import threading
import time

from certs import server_certificates
from harness import HOST, SluiceTestCase, metric_value, server_block
from raw_http import RawServer, read_head
from redis_harness import RedisFleetTestCase, redis_store_block

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455's example
ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


class WebSocketUpstream(RawServer):
    """Answers a handshake with 101 (and a greeting), then echoes (until
    "bye", which ends the tunnel); any other request with 200 and the
    Upgrade field it saw. `refuse`: a handshake gets 200 too. Records each
    request's head and whether a tunnel was closed by its client."""

    def __init__(self, refuse=False, tls=None, switch_to="websocket"):
        self.refuse = refuse
        self.switch_to = switch_to  # what its 101 names
        self.heads = []
        self.ended = threading.Event()
        super().__init__(tls)

    def serve(self, conn):
        got = read_head(conn)
        if got is None:
            return
        line, fields, rest = got
        self.heads.append((line, fields))
        if fields.get("upgrade", "").lower() != "websocket" or self.refuse:
            body = ("upgrade=%s" % fields.get("upgrade", "")).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            return
        accept = base64.b64encode(
            hashlib.sha1(fields["sec-websocket-key"].encode() + GUID).digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + self.switch_to.encode() +
                     b"\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                     b"\r\n\r\ngreeting;")
        if rest:
            conn.sendall(rest)
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                self.ended.set()
                return
            if chunk == b"bye":  # the upstream ends the tunnel
                return
            conn.sendall(chunk)


def handshake(path="/ws", key=KEY, extra=b""):
    return (("GET %s HTTP/1.1\r\nHost: app.test\r\nUpgrade: websocket\r\n"
             "Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: %s\r\n"
             "Sec-WebSocket-Version: 13\r\n\r\n" % (path, key)).encode() + extra)


def read_head_of(conn, have=b""):
    """The answer's status line and fields, and what came after its head
    (`have`: what was read of it already)."""
    got = read_head(conn, have)
    if got is None:
        raise AssertionError("closed before a head")
    return got


def read_exactly(conn, n, have=b""):
    while len(have) < n:
        chunk = conn.recv(65536)
        if not chunk:
            break
        have += chunk
    return have


def send_while_reading(conn, message, within=10):
    """Sends `message` on a TLS socket while reading what comes back; what
    came back once it is as long (or `within` seconds passed)."""
    import select
    conn.setblocking(False)
    sent, back = 0, b""
    deadline = time.monotonic() + within
    while len(back) < len(message) and time.monotonic() < deadline:
        want_write = sent < len(message)
        r, w, _ = select.select([conn], [conn] if want_write else [], [], 0.5)
        if r or conn.pending():
            try:
                back += conn.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
        if w and want_write:
            try:
                sent += conn.send(message[sent:sent + 16384])
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
    conn.setblocking(True)
    conn.settimeout(5)
    return back


def closed(conn, within):
    """Whether the peer closed `conn` within `within` seconds."""
    conn.settimeout(within)
    try:
        while conn.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def switched_within(test, port, seconds):
    """Handshakes on new connections to `port` until one is switched (a slot
    given back may take a moment to be free) or `seconds` have passed: the
    last one's status line."""
    deadline = time.monotonic() + seconds
    while True:
        conn = socket.create_connection((HOST, port), timeout=5)
        test.addCleanup(conn.close)
        conn.sendall(handshake())
        status = read_head_of(conn)[0]
        if status.startswith("HTTP/1.1 101") or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


class WebSocketTest(SluiceTestCase):
    def start(self, upstream, websocket=True, limits="{algorithm: token_bucket, rate: 100/s}",
              route_extra="", **server):
        return self.start_sluice(
            server_block(**server) + "routes:\n"
            "  - {name: app, match: {path_prefix: /}, upstream: %s, websocket: %s%s}\n"
            "policies:\n"
            "  - name: sockets\n    match: {path_prefix: /ws}\n    limits: [%s]\n"
            % (upstream.url, "true" if websocket else "false", route_extra, limits))

    def connect(self, s):
        conn = socket.create_connection((HOST, s.port), timeout=5)
        self.addCleanup(conn.close)
        return conn

    def test_a_websocket_is_a_tunnel_both_ways_until_its_client_ends_it(self):
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        s = self.start(up)
        conn = self.connect(s)
        # Bytes sent right behind the handshake reach the upstream too.
        conn.sendall(handshake(extra=b"early;"))
        status, fields, rest = read_head_of(conn)
        self.assertEqual(status, "HTTP/1.1 101 Switching Protocols")
        self.assertEqual(fields["upgrade"], "websocket")
        self.assertEqual(fields["connection"].lower(), "upgrade")
        self.assertEqual(fields["sec-websocket-accept"], ACCEPT)
        self.assertIn("ratelimit", fields)  # the handshake was decided
        line, seen = up.heads[0]
        self.assertEqual(line, "GET /ws HTTP/1.1")
        self.assertEqual((seen["upgrade"], seen["connection"]), ("websocket", "upgrade"))
        self.assertEqual(seen["sec-websocket-key"], KEY)
        self.assertEqual(seen["x-forwarded-for"], "127.0.0.1")
        self.assertEqual(read_exactly(conn, 15, rest), b"greeting;early;")
        for message in (b"one", b"x" * 200000, b"three"):
            conn.sendall(message)
            self.assertEqual(read_exactly(conn, len(message)), message)
        self.assertEqual(
            metric_value(self.metrics(), "sluice_http_responses_total", listener="main",
                         code="101"), 1)
        conn.close()
        self.assertTrue(up.ended.wait(5), "the upstream never saw the tunnel end")

    def test_the_upstream_ends_a_tunnel_and_the_client_sees_it_end(self):
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        s = self.start(up)
        conn = self.connect(s)
        conn.sendall(handshake())
        _, _, rest = read_head_of(conn)
        self.assertEqual(read_exactly(conn, 9, rest), b"greeting;")
        conn.sendall(b"bye")
        self.assertTrue(closed(conn, 3), "the client's side stayed open")
        self.assertEqual(self.get("/plain").status, 200)  # and sluice goes on

    def test_without_websocket_on_its_route_the_upgrade_is_not_passed_on(self):
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        s = self.start(up, websocket=False)
        conn = self.connect(s)
        conn.sendall(handshake())
        status, fields, rest = read_head_of(conn)
        self.assertEqual(status, "HTTP/1.1 200 OK")
        self.assertEqual(read_exactly(conn, 8, rest), b"upgrade=")
        self.assertNotIn("upgrade", up.heads[0][1])

    def test_an_upstream_that_does_not_switch_is_answered_as_usual(self):
        up = WebSocketUpstream(refuse=True)
        self.addCleanup(up.close)
        s = self.start(up)
        conn = self.connect(s)
        # A request right behind the handshake: with no switch it is an HTTP
        # request sluice reads and decides, never bytes slipped into a
        # tunnel the upstream did not open.
        conn.sendall(handshake() + b"GET /other HTTP/1.1\r\nHost: app.test\r\n\r\n")
        status, fields, rest = read_head_of(conn)
        self.assertEqual(status, "HTTP/1.1 200 OK")
        # The second answer may come in the same read as the first's body.
        body = read_exactly(conn, 17, rest)
        self.assertEqual(body[:17], b"upgrade=websocket")
        self.assertEqual(read_head_of(conn, body[17:])[0], "HTTP/1.1 200 OK")
        self.assertEqual([line for line, _ in up.heads], ["GET /ws HTTP/1.1", "GET /other HTTP/1.1"])

    def test_a_switch_to_another_protocol_is_a_502(self):
        up = WebSocketUpstream(switch_to="h2c")
        self.addCleanup(up.close)
        s = self.start(up)
        conn = self.connect(s)
        conn.sendall(handshake())
        status, fields, _ = read_head_of(conn)
        self.assertEqual(status, "HTTP/1.1 502 Bad Gateway")
        self.assertNotIn("upgrade", fields)

    def test_a_concurrency_limit_counts_open_websockets(self):
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        s = self.start(up, limits="{algorithm: concurrency, limit: 1, lease_ttl: 60s}")
        first = self.connect(s)
        first.sendall(handshake())
        self.assertEqual(read_head_of(first)[0], "HTTP/1.1 101 Switching Protocols")
        second = self.connect(s)
        second.sendall(handshake())
        status, fields, _ = read_head_of(second)
        self.assertEqual(status, "HTTP/1.1 429 Too Many Requests")
        self.assertEqual(len(up.heads), 1)  # the denied one never reached it
        first.close()  # its slot comes back when the tunnel ends
        self.assertEqual(switched_within(self, s.port, 5), "HTTP/1.1 101 Switching Protocols")

    def test_a_long_tunnel_keeps_its_slot_past_its_lease(self):
        # A slot's lease (lease_ttl) is renewed while the tunnel is open,
        # however quiet: two leases later the second is still refused.
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        s = self.start(up, limits="{algorithm: concurrency, limit: 1, lease_ttl: 1s}",
                       upstream_timeout="500ms")
        first = self.connect(s)
        first.sendall(handshake())
        status, _, rest = read_head_of(first)
        self.assertEqual(status, "HTTP/1.1 101 Switching Protocols")
        time.sleep(2.2)  # more than two leases
        second = self.connect(s)
        second.sendall(handshake())
        self.assertEqual(read_head_of(second)[0], "HTTP/1.1 429 Too Many Requests")
        first.sendall(b"still here")
        self.assertEqual(read_exactly(first, 19, rest), b"greeting;still here")

    def test_a_tunnel_idle_for_idle_timeout_is_closed(self):
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        s = self.start(up, idle_timeout="1s")
        conn = self.connect(s)
        conn.sendall(handshake())
        _, _, rest = read_head_of(conn)
        self.assertEqual(read_exactly(conn, 9, rest), b"greeting;")
        # Traffic keeps it open past the timeout...
        for _ in range(3):
            time.sleep(0.5)
            conn.sendall(b"tick")
            self.assertEqual(read_exactly(conn, 4), b"tick")
        # ...and silence ends it.
        t0 = time.monotonic()
        self.assertTrue(closed(conn, 4), "the idle tunnel was not closed")
        self.assertGreater(time.monotonic() - t0, 0.9)
        self.assertTrue(up.ended.wait(5), "the upstream's side was not closed")

    def test_a_routes_idle_timeout_lets_its_tunnels_stay_quiet_longer(self):
        # The server's 500 ms would close a tunnel quiet for 1 s; the
        # route's 1500 ms keeps it, then closes it once it is quiet that long.
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        s = self.start(up, route_extra=", idle_timeout: 1500ms", idle_timeout="500ms")
        route = self.get("/v1/config", admin=True, s=s).json()["routes"][0]
        self.assertEqual(route["idle_timeout"], "1500ms")
        conn = self.connect(s)
        conn.sendall(handshake())
        _, _, rest = read_head_of(conn)
        self.assertEqual(read_exactly(conn, 9, rest), b"greeting;")
        time.sleep(1.0)
        conn.sendall(b"tick")
        self.assertEqual(read_exactly(conn, 4), b"tick")
        t0 = time.monotonic()
        self.assertTrue(closed(conn, 4), "the idle tunnel was not closed")
        self.assertGreater(time.monotonic() - t0, 1.4)

    def test_a_drain_ends_open_tunnels_and_does_not_wait_for_them(self):
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        s = self.start(up, drain_timeout="20s")
        conns = []
        for _ in range(3):
            conn = self.connect(s)
            conn.sendall(handshake())
            self.assertEqual(read_head_of(conn)[0], "HTTP/1.1 101 Switching Protocols")
            conns.append(conn)
        t0 = time.monotonic()
        self.assertEqual(s.stop(), 0)
        self.assertLess(time.monotonic() - t0, 5, "the drain waited for the tunnels")
        for conn in conns:
            self.assertTrue(closed(conn, 2))

    def test_over_tls_at_both_ends(self):
        # An HTTPS listener and an https:// upstream: each side of the tunnel
        # is read and written through its own TLS, both ways at once.
        path, upstream_tls = server_certificates(self, "sluice-ws-")
        up = WebSocketUpstream(tls=upstream_tls)
        self.addCleanup(up.close)
        s = self.start(up, route_extra=", upstream_ca_file: %s" % path("ca.pem"),
                       tls="{cert_file: %s, key_file: %s}" % (path("server.pem"),
                                                              path("server.key")))
        route = self.get("/v1/config", admin=True).json()["routes"][0]
        self.assertEqual((route["upstream"], route["websocket"]), (up.url, True))
        client_tls = ssl.create_default_context(cafile=path("ca.pem"))
        conn = client_tls.wrap_socket(socket.create_connection((HOST, s.port), timeout=5),
                                      server_hostname="sluice.test")
        self.addCleanup(conn.close)
        conn.sendall(handshake())
        status, fields, rest = read_head_of(conn)
        self.assertEqual(status, "HTTP/1.1 101 Switching Protocols")
        self.assertEqual(fields["sec-websocket-accept"], ACCEPT)
        self.assertEqual(read_exactly(conn, 9, rest), b"greeting;")
        # A large message both ways at once: the client goes on sending
        # while the echo comes back (one thread: Python's TLS socket is not
        # for two).
        message = os.urandom(300000)
        self.assertEqual(send_while_reading(conn, message), message)
        conn.close()
        self.assertTrue(up.ended.wait(5), "the upstream never saw the tunnel end")


class RedisWebSocketTest(RedisFleetTestCase):
    def start_sockets(self, lease_ttl, instances):
        """A Redis, and `instances` sluice on it whose route tunnels
        WebSockets under a concurrency limit of one in Redis (`lease_ttl`)."""
        redis = self.start_redis()
        up = WebSocketUpstream()
        self.addCleanup(up.close)
        config = (server_block(upstream_timeout="500ms")
                  + redis_store_block(url=redis.url, timeout="1s")
                  + "routes:\n  - {name: app, match: {path_prefix: /}, upstream: %s, "
                  "websocket: true}\n"
                  "policies:\n  - name: sockets\n    match: {path_prefix: /ws}\n"
                  "    limits: [{algorithm: concurrency, limit: 1, lease_ttl: %s}]\n"
                  % (up.url, lease_ttl))
        return redis, self.start_fleet(config, instances)

    def test_two_instances_share_a_slot_that_an_open_tunnel_renews_in_redis(self):
        # A concurrency limit in Redis: the slot a tunnel on one instance
        # holds is renewed there (answered on the store's thread, taken back
        # to the tunnel's loop), so two leases later the other instance
        # still refuses the user a second one.
        _, fleet = self.start_sockets("1s", 2)
        first = socket.create_connection((HOST, fleet[0].port), timeout=5)
        self.addCleanup(first.close)
        first.sendall(handshake())
        self.assertEqual(read_head_of(first)[0], "HTTP/1.1 101 Switching Protocols")
        time.sleep(2.2)  # more than two leases
        second = socket.create_connection((HOST, fleet[1].port), timeout=5)
        self.addCleanup(second.close)
        second.sendall(handshake())
        self.assertEqual(read_head_of(second)[0], "HTTP/1.1 429 Too Many Requests")
        first.close()  # given back in Redis: the other instance may now
        self.assertEqual(switched_within(self, fleet[1].port, 5),
                         "HTTP/1.1 101 Switching Protocols")

    def test_a_renewal_redis_refused_is_tried_again_sooner(self):
        # Redis refuses the renewals for 2 s (maxmemory reached: every call
        # that may write is refused) while a tunnel holds a slot of a 3 s
        # lease: renewed every second, a refused renewal is tried again
        # after 0.3 s (a tenth of the lease), not a second later; once Redis
        # takes them again the slot is renewed, and still held past the
        # lease it was taken with.
        redis, (s,) = self.start_sockets("3s", 1)

        def refused_calls():
            for line in redis.call("INFO", "commandstats").split("\r\n"):
                if line.startswith("cmdstat_fcall:"):
                    fields = dict(f.split("=") for f in line.split(":", 1)[1].split(","))
                    return int(fields["rejected_calls"])
            return 0

        def handshake_status():
            conn = socket.create_connection((HOST, s.port), timeout=5)
            self.addCleanup(conn.close)
            conn.sendall(handshake())
            return read_head_of(conn)[0]

        first = socket.create_connection((HOST, s.port), timeout=5)
        self.addCleanup(first.close)
        first.sendall(handshake())
        self.assertEqual(read_head_of(first)[0], "HTTP/1.1 101 Switching Protocols")
        t0 = time.monotonic()
        redis.call("CONFIG", "SET", "maxmemory-policy", "noeviction")
        before = refused_calls()
        redis.call("CONFIG", "SET", "maxmemory", "1")
        time.sleep(max(0, t0 + 2.2 - time.monotonic()))
        redis.call("CONFIG", "SET", "maxmemory", "0")
        refused = refused_calls() - before
        # Renewals due at about 1 s, then every 0.3-0.4 s: 1.0, 1.35, 1.7,
        # 2.05 (at a third of the lease apart: 1.0 and 2.0 only).
        self.assertGreaterEqual(refused, 3)
        time.sleep(max(0, t0 + 3.6 - time.monotonic()))  # past the lease it was taken with
        self.assertEqual(handshake_status(), "HTTP/1.1 429 Too Many Requests")
