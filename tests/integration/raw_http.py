"""HTTP/1.1 on raw sockets, for tests that watch bytes as they come: a
server whose connections a test's handler serves one by one on threads of
their own, the reading of a message's head, a GET sent as given bytes,
and the targets a policy in front of an upstream leaves uncounted."""

import socket
import threading

from harness import HOST, server_block


class RawServer:
    """Listens on a free loopback port; `serve(conn)` (the subclass's) runs
    for each connection on a thread of its own. `tls`: an ssl.SSLContext
    that wraps each connection first (an https:// server)."""

    def __init__(self, tls=None):
        self.tls = tls
        self.connections = 0
        self.listener = socket.socket()
        self.listener.bind((HOST, 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.url = "%s://%s:%d" % ("https" if tls else "http", HOST, self.port)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn):
        if self.tls:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:  # ssl.SSLError is one
                return
        with conn:
            try:
                self.serve(conn)
            except OSError:
                pass

    def serve(self, conn):
        raise NotImplementedError


def read_head(conn, data=b""):
    """The head of the next message on `conn` (`data`: what was read of it
    already): its first line, its fields (names lower-cased, the first of
    each), and what came after it. None when the connection ended first."""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields.setdefault(name.strip().lower(), value.strip())
    return lines[0], fields, rest


def status_and_body(port, target, headers=b"", host_field=True):
    """The status line's code and the body (de-chunked) of one GET of `target` with
    `headers` (and a Host field of its own unless `host_field` is false),
    sent as these bytes (no client library rewrites them)."""
    host = b"Host: app.example\r\n" if host_field else b""
    with socket.create_connection((HOST, port), timeout=5) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\n" + host + headers +
                  b"Connection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"\r\ntransfer-encoding: chunked" in head.lower():
        body = dechunked(body)
    return int(head.split(b" ", 2)[1]), body


def dechunked(body):
    """A chunked body's data (RFC 9112 section 7.1), its extensions and
    trailer fields left out."""
    data = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        data, body = data + body[:size], body[size + 2:]
    return data


def uncounted(test, upstream_port, match, targets):
    """Starts sluice (test.start_sluice) in front of the upstream on
    HOST:`upstream_port` with one policy, `match` (YAML text), 1 a minute
    for each X-Try; sends each of `targets` (a GET's target, as bytes)
    twice under an X-Try of its own and returns those whose second request
    was not denied: those the policy did not count. The upstream serves
    every one of them (each first request must pass)."""
    test.start_sluice(server_block(threads=1) + """\
routes: [{name: app, match: {path_prefix: /}, upstream: "http://%s:%d"}]
policies:
  - name: login
    match: %s
    key: ["header:X-Try"]
    limits:
      - {algorithm: fixed_window, rate: 1/1m}
""" % (HOST, upstream_port, match))
    walked_past = []
    for i, target in enumerate(targets):
        key = b"X-Try: %d\r\n" % i
        first, _ = status_and_body(test.sluice.port, target, key)
        second, _ = status_and_body(test.sluice.port, target, key)
        test.assertEqual(first, 200, target)
        if second != 429:
            walked_past.append(target)
    return walked_past
