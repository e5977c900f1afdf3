"""A policy's path against NGINX's reading of it: Debian's nginx as the
upstream, with a `location /login` of its own, and sluice in front of it with
a prefix policy on /login. Every spelling of a path made of a few pieces
(slashes, dots, escapes, parameters, backslashes) that NGINX serves from
`location /login` must be counted by the policy: otherwise a client walks
past a login limit by spelling /login so."""

import itertools
import os
import unittest

from harness import HOST, SluiceTestCase, free_port, server_block, start_nginx
from raw_http import status_and_body

# What a path is made of here: two to SLUICE_PATH_PIECES (default 3) of
# these after a first "/". Each names a way an upstream may read a path
# otherwise than as sent.
PIECES = [b"/", b"//", b"%2f", b"%2F", b".", b"..", b"%2e", b"%2e%2e", b".%2e", b";", b";x",
          b"..;", b"\\", b"%5c", b"%5c..", b"/..", b"%2f..", b"x", b"login", b"%6cogin",
          b"LOGIN", b"%3b", b"%20", b"?", b"#", b"%252f"]
MAX_PIECES = int(os.environ.get("SLUICE_PATH_PIECES", "3"))


class NginxPathReadingTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        self.nginx_port = free_port()
        start_nginx(self, """pid %(dir)s/nginx.pid;
events { worker_connections 64; }
http { access_log off;
  server { listen %(host)s:%(port)d;
    location = /login { return 200 "EXACT"; }
    location /login { return 200 "LOGIN"; }
    location / { return 200 "OTHER"; } } }
""" % {"dir": self.tmpdir, "host": HOST, "port": self.nginx_port}, self.nginx_port)

    def walked_past(self, match, answers):
        """Starts sluice with one policy, `match`, in front of NGINX; returns
        how many spellings NGINX answered with one of `answers` and those the
        policy did not count."""
        self.start_sluice(server_block(threads=1) + """\
routes: [{name: app, match: {path_prefix: /}, upstream: "http://%s:%d"}]
policies:
  - name: login
    match: %s
    key: ["header:X-Try"]
    limits:
      - {algorithm: fixed_window, rate: 1/1m}
""" % (HOST, self.nginx_port, match))
        served, walked_past = 0, []
        for n in range(2, MAX_PIECES + 1):
            for pieces in itertools.product(PIECES, repeat=n):
                target = b"/" + b"".join(pieces)
                if b"login" not in target.lower() and b"%6cogin" not in target:
                    continue
                status, body = status_and_body(self.nginx_port, target)
                if status != 200 or body not in answers:
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
        return served, walked_past

    def test_every_spelling_nginx_serves_from_a_prefix_is_counted(self):
        # `location /login` (or `= /login`, which wins for /login itself)
        # against a policy's `path_prefix: /login`.
        served, walked_past = self.walked_past("{path_prefix: /login}", (b"LOGIN", b"EXACT"))
        self.assertGreater(served, 1000, served)  # the pieces make what NGINX serves as /login
        self.assertEqual(walked_past, [])

    def test_every_spelling_nginx_serves_as_the_path_is_counted(self):
        # `location = /login` against a policy's `path: /login`.
        served, walked_past = self.walked_past("{path: /login}", (b"EXACT",))
        self.assertGreater(served, 100, served)
        self.assertEqual(walked_past, [])


if __name__ == "__main__":
    unittest.main()
