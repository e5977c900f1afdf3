"""TLS on the gRPC listener (grpc.tls): Envoy's rate limit and quota
services over TLS, with HTTP/2 chosen by ALPN. sluice accepts the
connections itself (the cap of grpc.max_connections, the deadline of
grpc.handshake_timeout), makes the handshake, and relays to gRPC through a
socket pair. These tests speak HTTP/2 over Python's ssl: gRPC's first frames
come back through the relay, and gRPC's GOAWAY and close reach the client;
the calls themselves over TLS are src/envoy/rls_server_test.cc's. The
certificates are made here with the openssl command."""

import os
import random
import shutil
import socket
import ssl
import struct
import time

from certs import check_renewal, make_ca, make_certificate, require_openssl
from harness import (FRAME_GOAWAY, FRAME_SETTINGS, HOST, HTTP2_PREFACE, SluiceTestCase, frame_types,
                     metric_value, request, run_check, server_block)

POLICY = ("policies:\n"
          "  - name: api\n"
          "    limits: [{algorithm: token_bucket, rate: 1000/s}]\n")


class GrpcTlsTest(SluiceTestCase):
    @classmethod
    def setUpClass(cls):
        require_openssl()
        import tempfile
        cls._certs_dir = tempfile.TemporaryDirectory(prefix="sluice-grpc-tls-")
        cls.addClassCleanup(cls._certs_dir.cleanup)
        cls.certs = cls._certs_dir.name
        make_ca(cls.certs, "ca")
        for name in ("server", "renewed"):
            make_certificate(cls.certs, name, "ca", "DNS:sluice.test,IP:127.0.0.1", "serverAuth")
        make_certificate(cls.certs, "envoy", "ca", "DNS:envoy.test", "clientAuth")

    def cert(self, name):
        return os.path.join(self.certs, name)

    def start(self, cert="server", client_ca=None, **grpc):
        settings = {"listen": "127.0.0.1:0"}
        settings.update(grpc)
        tls = "{cert_file: %s, key_file: %s" % (cert + ".pem", cert + ".key")
        if client_ca:
            tls += ", client_ca_file: %s" % self.cert(client_ca + ".pem")
        settings["tls"] = tls + "}"
        for ext in ("pem", "key"):  # beside the config: a reload may replace them
            path = os.path.join(self.tmpdir, cert + "." + ext)
            if not os.path.exists(path):
                shutil.copyfile(self.cert("server." + ext), path)
        return self.start_sluice(server_block(threads=2) + "grpc:\n"
                                 + "".join("  %s: %s\n" % kv for kv in settings.items())
                                 + POLICY)

    def connect(self, s, client=None, alpn=("h2",)):
        ctx = ssl.create_default_context(cafile=self.cert("ca.pem"))
        ctx.set_alpn_protocols(list(alpn))
        if client:
            ctx.load_cert_chain(self.cert(client + ".pem"), self.cert(client + ".key"))
        raw = socket.create_connection((HOST, s.grpc_port), timeout=5)
        conn = ctx.wrap_socket(raw, server_hostname="sluice.test")
        self.addCleanup(conn.close)
        return conn

    def read_frames(self, conn, want, within=5.0):
        """Reads until a frame of type `want` came (its types returned) or the
        connection ended (None then)."""
        conn.settimeout(within)
        data = b""
        while want not in frame_types(data):
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        return frame_types(data)

    def counted(self, name, expected, **labels):
        """The metric once it is `expected` (within 3 s): a client may see its
        connection closed before sluice's count is read."""
        deadline = time.monotonic() + 3
        while True:
            value = metric_value(self.metrics(), name, **labels)
            if value == expected or time.monotonic() > deadline:
                return value
            time.sleep(0.02)

    def test_http2_over_tls_reaches_grpc_and_its_close_reaches_the_client(self):
        s = self.start(idle_timeout="1s")
        self.assertRegex(s.output(), r"event=start listener=grpc .* tls=on")
        grpc = request(s.admin_port, "GET", "/v1/status").json()["listeners"][-1]
        self.assertEqual((grpc["name"], grpc["listen"], grpc["tls"]),
                         ("grpc", "127.0.0.1:%d" % s.grpc_port, "on"))
        conn = self.connect(s)
        self.assertEqual(conn.selected_alpn_protocol(), "h2")
        self.assertIn(conn.version(), ("TLSv1.2", "TLSv1.3"))
        conn.sendall(HTTP2_PREFACE)
        self.assertIn(FRAME_SETTINGS, self.read_frames(conn, FRAME_SETTINGS))
        # Idle for grpc.idle_timeout: gRPC says GOAWAY and closes its end of
        # the pair; the client reads the GOAWAY, then the end of the stream.
        t0 = time.monotonic()
        self.assertIn(FRAME_GOAWAY, self.read_frames(conn, FRAME_GOAWAY))
        conn.settimeout(5)
        while conn.recv(65536):
            pass
        self.assertLess(time.monotonic() - t0, 4.5)
        self.assertEqual(self.counted("sluice_grpc_connections", 0), 0)

    def test_handshakes_refused_or_not_finished_in_time_are_counted(self):
        s = self.start(handshake_timeout="1s", client_ca="ca")
        # Plaintext HTTP/2, as a gRPC client without TLS sends it: closed.
        plain = socket.create_connection((HOST, s.grpc_port), timeout=5)
        self.addCleanup(plain.close)
        plain.sendall(HTTP2_PREFACE)
        self.assertNotIn(FRAME_SETTINGS, frame_types(plain.recv(65536)))
        # No client certificate, where one is required: refused.
        with self.assertRaises((ssl.SSLError, ConnectionResetError)):
            conn = self.connect(s)
            conn.sendall(HTTP2_PREFACE)
            self.read_frames(conn, FRAME_SETTINGS)
        self.assertEqual(self.counted("sluice_tls_handshake_failures_total", 2,
                                      listener="grpc", reason="failed"), 2)
        # A silent connection, and one that sends half a ClientHello: closed
        # at grpc.handshake_timeout, both counted as TLS timeouts, the silent
        # one as a gRPC handshake timeout too.
        silent = socket.create_connection((HOST, s.grpc_port), timeout=5)
        self.addCleanup(silent.close)
        started = socket.create_connection((HOST, s.grpc_port), timeout=5)
        self.addCleanup(started.close)
        started.sendall(b"\x16\x03\x01\x00")
        t0 = time.monotonic()
        self.assertEqual(silent.recv(100), b"")
        self.assertEqual(started.recv(100), b"")
        self.assertLess(time.monotonic() - t0, 2.5)
        self.assertEqual(self.counted("sluice_tls_handshake_failures_total", 2,
                                      listener="grpc", reason="timeout"), 2)
        self.assertEqual(self.counted("sluice_grpc_handshake_timeouts_total", 1), 1)
        # With its certificate, Envoy gets through.
        conn = self.connect(s, client="envoy")
        conn.sendall(HTTP2_PREFACE)
        self.assertIn(FRAME_SETTINGS, self.read_frames(conn, FRAME_SETTINGS))

    def test_check_finds_a_key_that_is_not_the_certificates(self):
        config = (server_block() + "grpc:\n  listen: 127.0.0.1:0\n"
                  "  tls: {cert_file: %s, key_file: %s}\n" % (self.cert("renewed.pem"),
                                                             self.cert("server.key")))
        code, out, err = run_check(config + POLICY, self.tmpdir)
        self.assertNotEqual(code, 0)
        self.assertIn("grpc.tls key_file %s: key values mismatch" % self.cert("server.key"), err)

    def test_tls_connections_count_against_max_connections(self):
        s = self.start(max_connections=2)
        held = [self.connect(s) for _ in range(2)]
        for conn in held:
            conn.sendall(HTTP2_PREFACE)
            self.assertIn(FRAME_SETTINGS, self.read_frames(conn, FRAME_SETTINGS))
        # The third is closed at once, before any handshake.
        with self.assertRaises((ssl.SSLError, ConnectionResetError, OSError)):
            self.connect(s)
        self.assertEqual(self.counted("sluice_grpc_connections_refused_total", 1), 1)
        held[0].close()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # the slot comes back once the relay ends
            try:
                conn = self.connect(s)
                break
            except (ssl.SSLError, ConnectionResetError, OSError):
                time.sleep(0.1)
        conn.sendall(HTTP2_PREFACE)
        self.assertIn(FRAME_SETTINGS, self.read_frames(conn, FRAME_SETTINGS))

    def test_a_reload_serves_the_renewed_certificate_to_new_connections(self):
        s = self.start(cert="in-force")
        kept = self.connect(s)
        in_force = {ext: os.path.join(self.tmpdir, "in-force." + ext) for ext in ("pem", "key")}

        def served_name(conn=None):
            conn = conn or self.connect(s)
            subject = dict(x[0] for x in conn.getpeercert()["subject"])
            return subject["commonName"]

        # The open one goes on with its own certificate, and still reaches gRPC.
        check_renewal(self, s, self.certs, in_force, "grpc.tls", served_name, kept)
        kept.sendall(HTTP2_PREFACE)
        self.assertIn(FRAME_SETTINGS, self.read_frames(kept, FRAME_SETTINGS))

    def test_hostile_clients_leave_nothing_behind(self):
        # Connections that stop or reset at every step of the handshake and
        # of the relay, some with junk where TLS or HTTP/2 is expected,
        # forty at a time: afterwards every descriptor and connection slot
        # is back, and an honest client still gets through.
        s = self.start(handshake_timeout="1s")
        fds = lambda: len(os.listdir("/proc/%d/fd" % s.proc.pid))
        before = fds()
        ctx = ssl.create_default_context(cafile=self.cert("ca.pem"))
        ctx.set_alpn_protocols(["h2"])
        rng = random.Random(7)

        def reset(sock):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()

        def hostile(kind):
            raw = socket.create_connection((HOST, s.grpc_port), timeout=5)
            if kind == "junk":
                raw.sendall(bytes(rng.randrange(256) for _ in range(300)))
                return raw
            if kind == "half_hello":
                raw.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
                return raw
            conn = ctx.wrap_socket(raw, server_hostname="sluice.test")
            if kind == "after_handshake":
                return conn
            if kind == "junk_after_handshake":
                conn.sendall(b"not HTTP/2 at all\r\n" * 50)
                return conn
            conn.sendall(HTTP2_PREFACE + b"\x00\x40\x00\x00\x00\x00\x00\x00\x01" + b"x" * 64)
            return conn

        kinds = ["junk", "half_hello", "after_handshake", "junk_after_handshake", "mid_stream"]
        for _ in range(3):
            held = []
            for i in range(40):
                try:
                    held.append(hostile(kinds[i % len(kinds)]))
                except (OSError, ssl.SSLError):
                    pass
            for i, sock in enumerate(held):
                (reset if i % 2 else lambda x: x.close())(sock)
        # Settled: the gate may still accept a connection its client already
        # reset (the kernel queued it), and gRPC closes its ends after the
        # relay's, so both counts must hold over several looks.
        def settled():
            return (fds() <= before
                    and metric_value(self.metrics(), "sluice_grpc_connections") == 0)
        deadline = time.monotonic() + 10
        calm = 0
        while calm < 5 and time.monotonic() < deadline:
            calm = calm + 1 if settled() else 0
            time.sleep(0.1)
        self.assertEqual(calm, 5, "descriptors %d (before: %d), sluice_grpc_connections %g" % (
            fds(), before, metric_value(self.metrics(), "sluice_grpc_connections")))
        conn = self.connect(s)
        conn.sendall(HTTP2_PREFACE)
        self.assertIn(FRAME_SETTINGS, self.read_frames(conn, FRAME_SETTINGS))
        self.assert_healthy()
