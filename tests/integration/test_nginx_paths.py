"""A policy's path against NGINX's reading of it: Debian's nginx as the
upstream, with a `location /login` of its own (and PHP's location, which
hands PHP-FPM a script and its PATH_INFO, alone and behind the extensionless
rewrite hosts write), and sluice in front of it with
a policy on /login (on /wp-login.php). Every spelling of a path made of a
few pieces (slashes, dots, escapes, parameters, backslashes) that NGINX
serves from `location /login` (hands PHP as /wp-login.php) must be counted
by the policy: otherwise a client walks past a login limit by spelling the
path so."""

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
# And of these, for the PHP location.
PHP_PIECES = [b"/", b"//", b"%2f", b".", b"..", b"%2e", b";x", b"..;", b"\\", b"%5c", b"x",
              b"x.php", b"wp-login.php", b"%77p-login.php", b"wp-login%2ephp", b"login", b"%20",
              b"?"]
MAX_PIECES = int(os.environ.get("SLUICE_PATH_PIECES", "3"))


class NginxPathReadingTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        self.nginx_port, self.php_port, self.bare_port = free_port(), free_port(), free_port()
        www = os.path.join(self.tmpdir, "www")
        os.makedirs(www)
        os.chmod(www, 0o755)  # NGINX's workers run unprivileged
        open(os.path.join(www, "wp-login.php"), "w").close()
        # The second server is PHP's location as NGINX's own example for
        # PHP-FPM writes it (and Debian's snippets/fastcgi-php.conf splits
        # the path so): the script NGINX would hand PHP-FPM, an existing
        # file, is the answer. (Checked against PHP 8.2's FPM behind it:
        # the same scripts for every target.)
        start_nginx(self, """pid %(dir)s/nginx.pid;
events { worker_connections 64; }
http { access_log off;
  server { listen %(host)s:%(port)d;
    location = /login { return 200 "EXACT"; }
    location /login { return 200 "LOGIN"; }
    location / { return 200 "OTHER"; } }
  server { listen %(host)s:%(php_port)d; root %(www)s;
    location / { return 404; }
    location ~ [^/]\\.php(/|$) {
      fastcgi_split_path_info ^(.+?\\.php)(/.*)$;
      if (!-f $document_root$fastcgi_script_name) { return 404; }
      return 200 "SCRIPT=$fastcgi_script_name"; } }
  server { listen %(host)s:%(bare_port)d; root %(www)s;
    location / { try_files $uri $uri/ @extensionless; }
    location @extensionless { rewrite ^(.*)$ $1.php last; }
    location ~ [^/]\\.php(/|$) {
      fastcgi_split_path_info ^(.+?\\.php)(/.*)$;
      if (!-f $document_root$fastcgi_script_name) { return 404; }
      return 200 "SCRIPT=$fastcgi_script_name"; } } }
""" % {"dir": self.tmpdir, "host": HOST, "port": self.nginx_port, "php_port": self.php_port,
       "bare_port": self.bare_port, "www": www}, self.nginx_port)

    def served(self, answers, port=None, pieces=PIECES, first=2):
        """Every target made of `first` or more of `pieces` that NGINX (on
        `port`: the first server's by default) answers with one of
        `answers`."""
        served = []
        for n in range(first, MAX_PIECES + 1):
            for made in itertools.product(pieces, repeat=n):
                target = b"/" + b"".join(made)
                if b"login" not in target.lower() and b"%6cogin" not in target:
                    continue
                status, body = status_and_body(port or self.nginx_port, target)
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


    def test_every_spelling_nginx_hands_php_as_a_script_is_counted(self):
        # The PHP location (fastcgi_split_path_info: the script, then
        # PATH_INFO, of the path NGINX decoded and normalized) against a
        # policy's `path: /wp-login.php`: `/wp-login.php%2fx` is the script
        # /wp-login.php with PATH_INFO /x.
        served = self.served((b"SCRIPT=/wp-login.php",), self.php_port, PHP_PIECES, first=1)
        self.assertGreater(len(served), 300, len(served))
        self.assertIn(b"/wp-login.php%2fx", served)
        self.assertEqual(uncounted(self, self.php_port, "{path: /wp-login.php}", served), [])

    def test_every_spelling_nginx_hands_php_without_the_extension_is_counted(self):
        # The third server: PHP's location behind the extensionless rewrite
        # hosts write (`try_files $uri $uri/ @extensionless`, where
        # `rewrite ^(.*)$ $1.php last`): /wp-login is /wp-login.php.
        served = self.served((b"SCRIPT=/wp-login.php",), self.bare_port, [
            b"/", b"//", b"%2f", b".", b"..", b"%2e", b"x", b"wp-login", b"%77p-login",
            b"WP-LOGIN", b"wp-login.php", b"%20", b"?", b";x"], first=1)
        self.assertIn(b"/wp-login", served)
        self.assertGreater(len(served), 100, len(served))
        self.assertEqual(uncounted(self, self.bare_port, "{path: /wp-login.php}", served), [])


if __name__ == "__main__":
    unittest.main()
