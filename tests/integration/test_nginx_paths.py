"""A policy's path against NGINX's reading of it: Debian's nginx as the
upstream, with a `location /login` of its own, and sluice in front of it with
a prefix policy on /login. Every spelling of a path made of a few pieces
(slashes, dots, escapes, parameters, backslashes) that NGINX serves from
`location /login` must be counted by the policy: otherwise a client walks
past a login limit by spelling /login so."""

import itertools
import os
import shutil
import socket
import subprocess
import time
import unittest

from harness import HOST, SluiceTestCase, server_block

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)

# What a path is made of here: two to SLUICE_PATH_PIECES (default 3) of
# these after a first "/". Each names a way an upstream may read a path
# otherwise than as sent.
PIECES = [b"/", b"//", b"%2f", b"%2F", b".", b"..", b"%2e", b"%2e%2e", b".%2e", b";", b";x",
          b"..;", b"\\", b"%5c", b"%5c..", b"/..", b"%2f..", b"x", b"login", b"%6cogin",
          b"LOGIN", b"%3b", b"%20", b"?", b"#", b"%252f"]
MAX_PIECES = int(os.environ.get("SLUICE_PATH_PIECES", "3"))


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def status_and_body(port, target, headers=b""):
    """The status line's code and the body of one GET of `target`, sent as
    these bytes (no client library rewrites them)."""
    with socket.create_connection((HOST, port), timeout=5) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: app.example\r\n" + headers +
                  b"Connection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


class NginxPathReadingTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        if NGINX is None:
            self.fail("nginx is not installed (scripts/test installs nginx-light)")
        self.nginx_port = free_port()
        conf = """worker_processes 1; daemon off; pid %(dir)s/nginx.pid;
error_log stderr error;
events { worker_connections 64; }
http { access_log off;
  server { listen %(host)s:%(port)d;
    location /login { return 200 "LOGIN"; }
    location / { return 200 "OTHER"; } } }
""" % {"dir": self.tmpdir, "host": HOST, "port": self.nginx_port}
        path = os.path.join(self.tmpdir, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        os.chmod(self.tmpdir, 0o755)  # NGINX's worker runs as an unprivileged user
        self.nginx = subprocess.Popen([NGINX, "-p", self.tmpdir, "-c", path],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.addCleanup(self._stop_nginx)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((HOST, self.nginx_port), timeout=1).close()
                break
            except OSError:
                if self.nginx.poll() is not None or time.monotonic() > deadline:
                    self.fail("nginx did not start: %s" % self.nginx.stderr.read().decode())
                time.sleep(0.05)
        self.start_sluice(server_block(threads=1) + """\
routes: [{name: app, match: {path_prefix: /}, upstream: "http://%s:%d"}]
policies:
  - name: login
    match: {path_prefix: /login}
    key: ["header:X-Try"]
    limits:
      - {algorithm: fixed_window, rate: 1/1m}
""" % (HOST, self.nginx_port))

    def _stop_nginx(self):
        if self.nginx.poll() is None:
            self.nginx.terminate()  # by PID: only the process this test started
            try:
                self.nginx.wait(10)
            except subprocess.TimeoutExpired:
                self.nginx.kill()
                self.nginx.wait()
        self.nginx.stderr.close()

    def test_every_spelling_nginx_serves_as_login_is_counted(self):
        served, walked_past = 0, []
        for n in range(2, MAX_PIECES + 1):
            for pieces in itertools.product(PIECES, repeat=n):
                target = b"/" + b"".join(pieces)
                if b"login" not in target.lower() and b"%6cogin" not in target:
                    continue
                status, body = status_and_body(self.nginx_port, target)
                if status != 200 or body != b"LOGIN":
                    continue
                served += 1
                # A key of its own: the first request passes; the second
                # is denied only if the first was counted.
                key = b"X-Try: %d\r\n" % served
                first, _ = status_and_body(self.sluice.port, target, key)
                second, _ = status_and_body(self.sluice.port, target, key)
                self.assertEqual(first, 200, target)
                if second != 429:
                    walked_past.append(target)
        self.assertGreater(served, 1000, served)  # the pieces make what NGINX serves as /login
        self.assertEqual(walked_past, [])


if __name__ == "__main__":
    unittest.main()
