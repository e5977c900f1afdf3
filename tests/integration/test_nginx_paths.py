"""A policy's path against NGINX's reading of it: Debian's nginx as the
upstream, with a `location /login` of its own, and sluice in front of it with
a prefix policy on /login. Every spelling of a path made of a few pieces
(slashes, dots, escapes, parameters, backslashes) that NGINX serves from
`location /login` must be counted by the policy: otherwise a client walks
past a login limit by spelling /login so."""

import itertools
import os
import unittest

from harness import HOST, SluiceTestCase, free_port, start_nginx
from raw_http import status_and_body, uncounted

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

    def served(self, answers):
        """Every target made of the pieces that NGINX answers with one of
        `answers`."""
        served = []
        for n in range(2, MAX_PIECES + 1):
            for pieces in itertools.product(PIECES, repeat=n):
                target = b"/" + b"".join(pieces)
                if b"login" not in target.lower() and b"%6cogin" not in target:
                    continue
                status, body = status_and_body(self.nginx_port, target)
                if status == 200 and body in answers:
                    served.append(target)
        return served

    def test_every_spelling_nginx_serves_from_a_prefix_is_counted(self):
        # `location /login` (or `= /login`, which wins for /login itself)
        # against a policy's `path_prefix: /login`.
        served = self.served((b"LOGIN", b"EXACT"))
        self.assertGreater(len(served), 1000, len(served))  # the pieces make what NGINX serves
        self.assertEqual(uncounted(self, self.nginx_port, "{path_prefix: /login}", served), [])

    def test_every_spelling_nginx_serves_as_the_path_is_counted(self):
        # `location = /login` against a policy's `path: /login`.
        served = self.served((b"EXACT",))
        self.assertGreater(len(served), 100, len(served))
        self.assertEqual(uncounted(self, self.nginx_port, "{path: /login}", served), [])


if __name__ == "__main__":
    unittest.main()
