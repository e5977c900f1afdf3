"""TLS on sluice's own listeners (server.tls, server.decision.tls): the
decision API and the gateway over HTTPS, mutual TLS on the decision
listener, the certificate renewed by a reload, and what a client that does
not speak TLS, or does not finish its handshake, gets. The certificates are
made here with the openssl command, for 127.0.0.1 and sluice.test."""

import http.client
import os
import shutil
import socket
import ssl
import struct
import time
import unittest
import warnings

from certs import check_renewal, make_ca, make_certificate, require_openssl
from harness import (HOST, SluiceTestCase, metric_value, parse_raw_response, raw_exchange,
                     request, run_check, server_block)

POLICY = """\
policies:
  - name: login
    match: {path_prefix: /login}
    key: ["header:X-User"]
    on_missing_key: client_ip
    limits:
      - {algorithm: token_bucket, rate: 3/min, burst: 3, scope: local}
"""


class HttpsTest(SluiceTestCase):
    @classmethod
    def setUpClass(cls):
        require_openssl()
        import tempfile
        cls._certs_dir = tempfile.TemporaryDirectory(prefix="sluice-https-")
        cls.addClassCleanup(cls._certs_dir.cleanup)
        cls.certs = cls._certs_dir.name
        make_ca(cls.certs, "ca")
        make_ca(cls.certs, "other-ca")
        for name in ("server", "renewed"):
            make_certificate(cls.certs, name, "ca", "DNS:sluice.test,IP:127.0.0.1", "serverAuth")
        make_certificate(cls.certs, "client", "ca", "DNS:client.test", "clientAuth")
        make_certificate(cls.certs, "client2", "ca", "DNS:client2.test", "clientAuth")
        make_certificate(cls.certs, "stranger", "other-ca", "DNS:client.test", "clientAuth")
        make_certificate(cls.certs, "login", "ca", "DNS:login.test", "serverAuth")
        make_certificate(cls.certs, "wild", "ca", "DNS:*.apps.test", "serverAuth")

    def cert(self, name):
        return os.path.join(self.certs, name)

    def tls_block(self, name="server", client_ca=None):
        """A listener's tls: map (YAML flow text)."""
        text = "{cert_file: %s, key_file: %s" % (self.cert(name + ".pem"),
                                                  self.cert(name + ".key"))
        if client_ca:
            text += ", client_ca_file: %s" % self.cert(client_ca + ".pem")
        return text + "}"

    def client_context(self, client=None, ca="ca"):
        ctx = ssl.create_default_context(cafile=self.cert(ca + ".pem"))
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        if client:
            ctx.load_cert_chain(self.cert(client + ".pem"), self.cert(client + ".key"))
        return ctx

    def https(self, port, method, path, body=None, headers=None, ctx=None, conn=None):
        own = conn is None
        if own:
            conn = http.client.HTTPSConnection(HOST, port, timeout=5,
                                               context=ctx or self.client_context())
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            if own:
                conn.close()

    def check_over_tls(self, port, user, ctx=None, conn=None):
        return self.https(port, "POST", "/v1/check",
                          body='{"policy": "login", "key": "%s"}' % user,
                          headers={"Content-Type": "application/json"}, ctx=ctx, conn=conn)

    def handshake_failures(self, reason, listener="main", expected=None):
        """The count; with `expected`, once it reaches that (within 2 s):
        the client can see its handshake fail before sluice counts it."""
        deadline = time.monotonic() + 2
        while True:
            count = metric_value(self.metrics(), "sluice_tls_handshake_failures_total",
                                 listener=listener, reason=reason)
            if expected is None or count >= expected or time.monotonic() > deadline:
                return count
            time.sleep(0.02)

    def test_the_decision_api_over_tls_is_exact_on_one_connection(self):
        s = self.start_sluice(server_block(tls=self.tls_block()) + POLICY)
        self.assertIn("tls=listen", s.output())
        conn = http.client.HTTPSConnection(HOST, s.port, timeout=5, context=self.client_context())
        self.addCleanup(conn.close)
        statuses = [self.check_over_tls(s.port, "alice", conn=conn)[0] for _ in range(4)]
        self.assertEqual(statuses, [200, 200, 200, 429])
        # One connection, kept alive, TLS 1.2 or later, HTTP/1.1 by ALPN.
        self.assertIn(conn.sock.version(), ("TLSv1.2", "TLSv1.3"))
        self.assertEqual(conn.sock.selected_alpn_protocol(), "http/1.1")
        self.assertEqual(self.check_over_tls(s.port, "bob")[0], 200)
        # A client that trusts another authority does not get through.
        with self.assertRaises(ssl.SSLCertVerificationError):
            self.check_over_tls(s.port, "carol", ctx=self.client_context(ca="other-ca"))
        # The admin listener stays plain HTTP.
        self.assert_healthy()

    def test_clients_gone_before_their_answer_do_not_end_sluice(self):
        # Each client resets its connection right after its request: the
        # answer is written to a socket the client has closed, which raises
        # SIGPIPE unless sluice ignores it (OpenSSL writes with write(2)).
        s = self.start_sluice(server_block(tls=self.tls_block()) + POLICY)
        ctx = self.client_context()
        for i in range(20):
            raw = socket.create_connection((HOST, s.port), timeout=5)
            conn = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            conn.sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 34\r\n\r\n"
                         b'{"policy": "login", "key": "u%02d"}' % i)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
        time.sleep(0.2)
        self.assertIsNone(s.proc.poll(), s.output())
        self.assertEqual(self.check_over_tls(s.port, "alice")[0], 200)

    def test_a_client_limited_to_tls_1_1_is_refused(self):
        s = self.start_sluice(server_block(tls=self.tls_block()) + POLICY)
        ctx = self.client_context()
        try:
            # TLS 1.1 needs OpenSSL's security level 0 on the client's side.
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_1
                ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        except (ValueError, ssl.SSLError):
            self.skipTest("this Python's OpenSSL cannot offer TLS 1.1")
        with self.assertRaises((ssl.SSLError, ConnectionError)):
            self.check_over_tls(s.port, "alice", ctx=ctx)
        self.assertEqual(self.handshake_failures("failed", expected=1), 1)

    def test_plain_http_to_the_tls_port_is_told_so_in_plain(self):
        s = self.start_sluice(server_block(tls=self.tls_block()) + POLICY)
        data = raw_exchange(s.port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 2"
                                    b"\r\n\r\n{}")
        r = parse_raw_response(data)
        self.assert_problem(r, 400)
        self.assertIn("plain HTTP request to a TLS (https) listener", r.json()["detail"])
        self.assertEqual(self.handshake_failures("failed", expected=1), 1)

    def test_a_handshake_not_finished_in_time_is_closed(self):
        s = self.start_sluice(server_block(tls=self.tls_block(), read_timeout="1s") + POLICY)
        silent = socket.create_connection((HOST, s.port), timeout=5)
        self.addCleanup(silent.close)
        started = socket.create_connection((HOST, s.port), timeout=5)
        self.addCleanup(started.close)
        started.sendall(b"\x16\x03\x01\x00")  # the start of a ClientHello, no more
        t0 = time.monotonic()
        self.assertEqual(silent.recv(100), b"")
        self.assertEqual(started.recv(100), b"")
        took = time.monotonic() - t0
        self.assertLess(took, 2.5)
        self.assertEqual(self.handshake_failures("timeout", expected=2), 2)
        # Nobody else waited for them.
        self.assertEqual(self.check_over_tls(s.port, "alice")[0], 200)

    def test_the_gateway_over_tls_tells_its_upstream_the_scheme(self):
        up = self.start_upstream()
        config = server_block(tls=self.tls_block()) + POLICY + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:%d
""" % up.port
        s = self.start_sluice(config)
        # The client's own X-Forwarded-Proto says http: sluice knows better.
        status, _, _ = self.https(s.port, "GET", "/login",
                                  headers={"X-User": "dave", "X-Forwarded-Proto": "http"})
        self.assertEqual(status, 200)
        headers = {k.lower(): v for k, v in up.hits("/login")[-1]["headers"].items()}
        self.assertEqual(headers["x-forwarded-proto"], "https")
        self.assertEqual(headers["x-forwarded-for"], "127.0.0.1")
        for _ in range(2):
            self.https(s.port, "GET", "/login", headers={"X-User": "dave"})
        status, headers, _ = self.https(s.port, "GET", "/login", headers={"X-User": "dave"})
        self.assertEqual(status, 429)
        self.assertIn("Retry-After", headers)
        self.assertEqual(up.count("/login"), 3)

    def test_mutual_tls_on_the_decision_listener(self):
        up = self.start_upstream()
        config = server_block(decision="{listen: 127.0.0.1:0, tls: %s}"
                              % self.tls_block(client_ca="ca")) + POLICY + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:%d
""" % up.port
        s = self.start_sluice(config)
        self.assertIn("tls=decision", s.output())
        port = s.decision_port
        self.assertEqual(self.check_over_tls(port, "erin", ctx=self.client_context("client"))[0],
                         200)
        # No certificate, or one another authority signed: no handshake.
        for client in (None, "stranger"):
            with self.assertRaises((ssl.SSLError, ConnectionError), msg=client):
                self.check_over_tls(port, "erin", ctx=self.client_context(client))
        self.assertEqual(self.handshake_failures("failed", listener="decision", expected=2), 2)
        # The gateway listener is plain HTTP, as configured.
        conn = http.client.HTTPConnection(HOST, s.port, timeout=5)
        self.addCleanup(conn.close)
        conn.request("GET", "/x", headers={"X-User": "frank"})
        r = conn.getresponse()
        r.read()
        self.assertEqual(r.status, 200)
        self.assertNotIn("X-Forwarded-Proto", up.hits("/x")[-1]["headers"])

    def test_a_client_certificate_is_a_key(self):
        up = self.start_upstream()
        config = server_block(tls=self.tls_block(client_ca="ca")) + """\
policies:
  - name: per_client
    match: {path_prefix: /api}
    key: [client_cert]
    limits:
      - {algorithm: token_bucket, rate: 2/min, burst: 2, scope: local}
routes:
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:%d
""" % up.port
        s = self.start_sluice(config)
        statuses = {}
        for client in ("client", "client2"):
            ctx = self.client_context(client)
            statuses[client] = [self.https(s.port, "GET", "/api/x", ctx=ctx)[0] for _ in range(3)]
        # Each certificate its own bucket, whatever address (all 127.0.0.1).
        self.assertEqual(statuses, {"client": [200, 200, 429], "client2": [200, 200, 429]})
        self.assertEqual(up.count("/api"), 4)
        r = self.get("/v1/config", admin=True)
        self.assertEqual(r.json()["policies"][0]["key"], ["client_cert"])
        # The keys denied: each certificate's subject, as RFC 2253 writes it.
        r = self.get("/v1/top/per_client", admin=True)
        self.assertEqual(r.status, 200, r)
        self.assertIn("CN=client2", r.body.decode())
        self.assertIn("CN=client", r.body.decode())

    def upstream_tls(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert("server.pem"), self.cert("server.key"))
        return ctx

    def test_an_https_upstream_is_verified_and_its_connections_kept(self):
        up = self.start_upstream(tls=self.upstream_tls())
        port = up.port
        # One thread: its pool holds the connection /app made when /stranger
        # and /misnamed come, which trust other authorities or another name
        # and must not take it.
        config = server_block(threads=1) + """\
routes:
  - {name: app, match: {path_prefix: /app}, upstream: "https://127.0.0.1:%d",
     upstream_ca_file: %s}
  - {name: stranger, match: {path_prefix: /stranger}, upstream: "https://127.0.0.1:%d",
     upstream_ca_file: %s}
  - {name: misnamed, match: {path_prefix: /misnamed}, upstream: "https://localhost:%d",
     upstream_ca_file: %s}
  - {name: named, match: {path_prefix: /named}, upstream: "https://127.0.0.1:%d",
     upstream_ca_file: %s, host_header: upstream}
  - {name: by_name, match: {path_prefix: /by-name}, upstream: "https://localhost:%d",
     upstream_ca_file: %s, upstream_server_name: sluice.test}
""" % (port, self.cert("ca.pem"), port, self.cert("other-ca.pem"), port, self.cert("ca.pem"),
       port, self.cert("ca.pem"), port, self.cert("ca.pem"))
        s = self.start_sluice(config)
        conn = http.client.HTTPConnection(HOST, s.port, timeout=5)
        self.addCleanup(conn.close)
        for i in range(5):
            conn.request("POST", "/app/%d" % i, body=b"x" * 20000)
            r = conn.getresponse()
            body = r.read()
            self.assertEqual(r.status, 200, body)
        hits = up.hits("/app")
        self.assertEqual([h["path"] for h in hits], ["/app/%d" % i for i in range(5)])
        self.assertEqual(len(hits[-1]["body"]), 20000)
        # One TLS connection to the upstream, kept between requests.
        self.assertEqual(len({tuple(h["peer"]) for h in hits}), 1)
        # Plain HTTP from the client: the upstream is not told https.
        self.assertNotIn("X-Forwarded-Proto", hits[-1]["headers"])
        # The client's Host goes, unless the route says the upstream's.
        self.assertEqual(hits[-1]["headers"]["Host"], "127.0.0.1:%d" % s.port)
        self.assertEqual(self.get("/named", headers={"Host": "gateway.example"}).status, 200)
        self.assertEqual(up.hits("/named")[-1]["headers"]["Host"], "127.0.0.1:%d" % port)
        # A certificate another authority signed, or that names another
        # host: no request goes, 502 says why.
        for path, why in (("/stranger", "the certificate is not trusted"),
                          ("/misnamed", "hostname mismatch")):
            r = self.get(path)
            self.assertEqual(r.status, 502, r)
            self.assertIn("TLS handshake", r.json()["detail"])
            self.assertIn(why, r.json()["detail"])
        self.assertEqual(up.count("/stranger") + up.count("/misnamed"), 0)
        # The name verified may differ from the host reached.
        self.assertEqual(self.get("/by-name").status, 200)
        self.assertEqual(up.count("/by-name"), 1)
        self.assertIn("event=upstream_error route=stranger", s.output())

    def test_sluice_presents_its_certificate_to_an_upstream_that_asks(self):
        # The upstream requires a client certificate its authority signed.
        ctx = self.upstream_tls()
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(self.cert("ca.pem"))
        up = self.start_upstream(tls=ctx)
        # One thread: /as-client's pooled connection is there when /anonymous
        # comes to the same upstream, and must not be taken (it was made with
        # the certificate /anonymous does not present).
        config = server_block(threads=1) + """\
routes:
  - {name: as_client, match: {path_prefix: /as-client}, upstream: "https://127.0.0.1:%d",
     upstream_ca_file: %s, upstream_cert_file: %s, upstream_key_file: %s}
  - {name: anonymous, match: {path_prefix: /anonymous}, upstream: "https://127.0.0.1:%d",
     upstream_ca_file: %s}
""" % (up.port, self.cert("ca.pem"), self.cert("client.pem"), self.cert("client.key"),
       up.port, self.cert("ca.pem"))
        s = self.start_sluice(config)
        conn = http.client.HTTPConnection(HOST, s.port, timeout=5)
        self.addCleanup(conn.close)
        for _ in range(2):
            conn.request("GET", "/as-client")
            r = conn.getresponse()
            self.assertEqual(r.status, 200, r.read())
            r.read()
        hits = up.hits("/as-client")
        subject = dict(x[0] for x in hits[-1]["client_cert"]["subject"])
        self.assertEqual(subject["commonName"], "client")
        self.assertEqual(len({tuple(h["peer"]) for h in hits}), 1)  # kept
        # TLS 1.3: the upstream refuses once sluice's side of the handshake
        # is done, by closing the connection: the request is not served.
        r = self.get("/anonymous")
        self.assertEqual(r.status, 502, r)
        self.assertEqual(up.count("/anonymous"), 0)

    def test_a_certificate_is_chosen_by_the_name_the_client_asks_for(self):
        more = ("[{cert_file: %s, key_file: %s}, {cert_file: %s, key_file: %s}]" % (
            self.cert("login.pem"), self.cert("login.key"), self.cert("wild.pem"),
            self.cert("wild.key")))
        tls = "{cert_file: %s, key_file: %s, certificates: %s}" % (
            self.cert("server.pem"), self.cert("server.key"), more)
        mutual = "{cert_file: %s, key_file: %s, client_ca_file: %s, certificates: %s}" % (
            self.cert("server.pem"), self.cert("server.key"), self.cert("ca.pem"), more)
        s = self.start_sluice(server_block(tls=tls, decision="{listen: 127.0.0.1:0, tls: %s}"
                                           % mutual) + POLICY)

        def served(port, name, client=None):
            ctx = self.client_context(client)
            ctx.check_hostname = False  # the certificate is read, whatever it names
            raw = socket.create_connection((HOST, port), timeout=5)
            with ctx.wrap_socket(raw, server_hostname=name) as conn:
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                self.assertTrue(conn.recv(100).startswith(b"HTTP/1.1 "))
                self.assertEqual(conn.selected_alpn_protocol(), "http/1.1")  # every context's
                return dict(x[0] for x in conn.getpeercert()["subject"])["commonName"]

        self.assertEqual(served(s.port, "login.test"), "login")
        self.assertEqual(served(s.port, "a.apps.test"), "wild")
        self.assertEqual(served(s.port, "sluice.test"), "server")
        self.assertEqual(served(s.port, "other.test"), "server")  # no certificate names it
        self.assertEqual(served(s.port, None), "server")          # no SNI
        self.assertEqual(served(s.port, "b.c.apps.test"), "server")  # * is one label
        # /v1/status tells which listeners speak TLS.
        status = request(s.admin_port, "GET", "/v1/status").json()
        self.assertEqual([(l["name"], l["listen"], l["tls"]) for l in status["listeners"]],
                         [("main", "127.0.0.1:%d" % s.port, "on"),
                          ("decision", "127.0.0.1:%d" % s.decision_port, "mutual"),
                          ("admin", "127.0.0.1:%d" % s.admin_port, "off")])
        # A certificate chosen by name still requires the client's.
        self.assertEqual(served(s.decision_port, "login.test", client="client"), "login")
        with self.assertRaises((ssl.SSLError, ConnectionResetError)):
            served(s.decision_port, "login.test")

    def test_a_reload_serves_the_renewed_certificate_to_new_connections(self):
        in_force = {ext: os.path.join(self.tmpdir, "in-force." + ext) for ext in ("pem", "key")}
        for ext in in_force:
            shutil.copyfile(self.cert("server." + ext), in_force[ext])
        config = server_block(tls="{cert_file: in-force.pem, key_file: in-force.key}") + POLICY
        s = self.start_sluice(config)

        def served_name(conn=None):
            own = conn is None
            if own:
                conn = http.client.HTTPSConnection(HOST, s.port, timeout=5,
                                                   context=self.client_context())
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            subject = dict(x[0] for x in conn.sock.getpeercert()["subject"])
            if own:
                conn.close()
            return subject["commonName"]

        kept = http.client.HTTPSConnection(HOST, s.port, timeout=5, context=self.client_context())
        self.addCleanup(kept.close)
        self.assertEqual(served_name(kept), "server")

        check_renewal(self, s, self.certs, in_force, "server.tls", served_name, kept)

    def test_files_that_cannot_serve_do_not_load(self):
        cases = [
            ("tls: {cert_file: %s}" % self.cert("server.pem"), "give cert_file and key_file"),
            ("tls: {cert_file: %s, key_file: missing.key}" % self.cert("server.pem"),
             "missing.key"),
            ("decision: {tls: %s}" % self.tls_block(), "decision.listen, which is not set"),
            # A key that is not the certificate's: found by --check, as by a start.
            ("tls: {cert_file: %s, key_file: %s}" % (self.cert("renewed.pem"),
                                                    self.cert("server.key")),
             "server.tls key_file %s: key values mismatch" % self.cert("server.key")),
        ]
        for line, expected in cases:
            with self.subTest(line=line):
                key, value = line.split(": ", 1)
                code, out, err = run_check(server_block(**{key: value}) + POLICY, self.tmpdir)
                self.assertNotEqual(code, 0)
                self.assertIn(expected, out + err)


if __name__ == "__main__":
    unittest.main()
