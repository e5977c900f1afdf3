"""A policy's path against Apache's reading of it: Debian's Apache httpd
with PHP (mod_php, the PHP handler as Debian configures it) as the upstream,
serving a WordPress-like tree, and sluice in front of it. Every spelling of
a path made of a few pieces that Apache answers by running a script must be
counted by a policy on that script's path: otherwise a client walks past a
login limit by spelling the path so. Apache runs `/wp-login.php` for
`/wp-login.php/x` too (the rest is its PATH_INFO), and `/cgi-bin/login` for
`/cgi-bin/login/x` (any file under its ScriptAlias /cgi-bin/ is a CGI
script), `/login/index.php` for the folder `/login/`, and a front
controller installed in `/blog` routes `/blog/index.php/login` as its
`/login`, which is `/blog/login`. With MultiViews (where PHP's files are
negotiated, as `AddType application/x-httpd-php .php` makes them) it runs
`/wp-login.php` for `/wp-login` and `/wp-login/x` too, and `/blog/index.php`
for `/blog/index/login`."""

import glob
import itertools
import os
import unittest

from harness import APACHE_MODULES, HOST, SluiceTestCase, free_port, start_apache
from raw_http import status_and_body, uncounted

# What a path is made of here: one to SLUICE_PATH_PIECES (default 3) of
# these after a first "/".
PIECES = [b"/", b"//", b"%2f", b".", b"..", b"%2e", b"%2e%2e", b";x", b"\\", b"x", b"x.php",
          b"wp-login.php", b"wp-login%2ephp", b"%77p-login.php", b"login", b"index.php",
          b"login/index.php",
          b"%20", b"?", b"%00"]
MAX_PIECES = int(os.environ.get("SLUICE_PATH_PIECES", "3"))

# Each script answers with the name Apache ran it by; the front controller
# in /blog with the route it reads (its folder, then PATH_INFO, as Laravel
# and Symfony installed there route).
SCRIPT = b'<?php echo "SCRIPT=", $_SERVER["SCRIPT_NAME"];'
FRONT_CONTROLLER = b'<?php echo "SCRIPT=/blog", $_SERVER["PATH_INFO"] ?? "/";'
CGI_SCRIPT = b'#!/bin/sh\nprintf "Content-Type: text/plain\\n\\nSCRIPT=%s" "$SCRIPT_NAME"\n'


class ApacheTestCase(SluiceTestCase):
    """Apache serving the tree, on self.apache_port."""

    # Apache's configuration for the tree, after Debian's PHP handler.
    EXTRA_CONFIG = ""
    # Modules besides those every configuration here needs.
    EXTRA_MODULES = ()

    def setUp(self):
        super().setUp()
        php = sorted(glob.glob(os.path.join(APACHE_MODULES, "libphp*.so")))
        if not php:
            self.fail("mod_php is not installed (scripts/test installs libapache2-mod-php)")
        www = os.path.join(self.tmpdir, "www")
        for folder in ("", "login", "blog"):  # Apache's workers run unprivileged
            os.makedirs(os.path.join(www, folder), exist_ok=True)
            os.chmod(os.path.join(www, folder), 0o755)
        for page in ("wp-login.php", "index.php", "login/index.php", "blog/index.php"):
            with open(os.path.join(www, page), "wb") as f:
                f.write(FRONT_CONTROLLER if page.startswith("blog/") else SCRIPT)
            os.chmod(os.path.join(www, page), 0o644)
        cgi = os.path.join(self.tmpdir, "cgi")  # ScriptAlias /cgi-bin/: any file a script
        os.makedirs(cgi, mode=0o755)
        with open(os.path.join(cgi, "login"), "wb") as f:
            f.write(CGI_SCRIPT)
        os.chmod(cgi, 0o755)
        os.chmod(os.path.join(cgi, "login"), 0o755)
        self.apache_port = free_port()
        modules = "".join("LoadModule %s_module %s/mod_%s.so\n" % (m, APACHE_MODULES, m)
                          for m in ("mpm_prefork", "authz_core", "dir", "mime", "alias", "cgi")
                          + self.EXTRA_MODULES)
        start_apache(self, """ServerRoot %(dir)s
ServerName localhost
PidFile %(dir)s/httpd.pid
Listen %(host)s:%(port)d
%(modules)sLoadModule php_module %(php)s
ErrorLog %(dir)s/apache-error.log
StartServers 2
DocumentRoot %(www)s
ScriptAlias /cgi-bin/ %(cgi)s/
DirectoryIndex index.php
TypesConfig /etc/mime.types
<FilesMatch ".+\\.ph(ar|p|tml)$">
    SetHandler application/x-httpd-php
</FilesMatch>
%(extra)s""" % {"dir": self.tmpdir, "host": HOST, "port": self.apache_port, "modules": modules,
                "php": php[-1], "www": www, "cgi": cgi, "extra": self.EXTRA_CONFIG},
                     self.apache_port)

    def scripts_run(self, targets):
        """Of `targets`, those naming "login" that Apache answers by running
        a script, with what the script said."""
        scripts = {}
        for target in targets:
            if b"login" not in target:
                continue
            status, body = status_and_body(self.apache_port, target)
            if status == 200 and body.startswith(b"SCRIPT="):
                scripts[target] = body[len(b"SCRIPT="):]
        return scripts


class ApachePathReadingTest(ApacheTestCase):

    _scripts = None  # served()'s answer, the same for every test

    def served(self):
        """Every target made of the pieces that Apache answers by running a
        script, with the script's name."""
        if ApachePathReadingTest._scripts is None:
            ApachePathReadingTest._scripts = self.scripts_run(
                b"/" + b"".join(pieces) for n in range(1, MAX_PIECES + 1)
                for pieces in itertools.product(PIECES, repeat=n))
        return ApachePathReadingTest._scripts

    def test_every_spelling_apache_runs_a_script_for_is_counted(self):
        # wp-login.php, PATH_INFO and all, against a policy's
        # `path: /wp-login.php`.
        targets = [t for t, script in self.served().items() if script == b"/wp-login.php"]
        self.assertGreater(len(targets), 100, len(targets))  # the pieces make what it runs
        self.assertIn(b"/wp-login.php/x", targets)
        self.assertEqual(uncounted(self, self.apache_port, "{path: /wp-login.php}", targets), [])

    def test_every_spelling_apache_runs_a_folders_index_page_for_is_counted(self):
        # /login/index.php (the folder /login/ by its index page, PATH_INFO
        # and all) against a policy's `path: /login/`.
        targets = [t for t, script in self.served().items() if script == b"/login/index.php"]
        self.assertGreater(len(targets), 20, len(targets))
        self.assertIn(b"/login/index.php/x", targets)
        self.assertEqual(uncounted(self, self.apache_port, "{path: /login/}", targets), [])

    def test_every_spelling_a_front_controller_routes_as_a_path_is_counted(self):
        # /blog/index.php routing /blog/login (its /login) against a
        # policy's `path: /blog/login`: the front controller, a separator,
        # the route, each spelled in a few ways.
        targets = [t for t, route in self.scripts_run(
            a + b + c for a, b, c in itertools.product(
                (b"/blog/index.php", b"/blog//index.php", b"/blog/./index.php",
                 b"/x/../blog/index.php", b"/blog/index%2ephp", b"/%62log/index.php"),
                (b"/", b"//", b"/./", b"/x/../", b"/%2e/"),
                (b"login", b"login/", b"%6cogin", b"login//", b"login/."))).items()
            if route in (b"/blog/login", b"/blog/login/")]
        self.assertGreater(len(targets), 100, len(targets))
        self.assertIn(b"/blog/index.php/login", targets)
        self.assertEqual(uncounted(self, self.apache_port, "{path: /blog/login}", targets), [])

    def test_every_spelling_apache_runs_a_cgi_script_for_is_counted(self):
        # /cgi-bin/login (any file under ScriptAlias /cgi-bin/ is a script,
        # PATH_INFO and all) against a policy's `path: /cgi-bin/login`.
        targets = [t for t, script in self.scripts_run(
            a + b for a, b in itertools.product(
                (b"/cgi-bin/login", b"//cgi-bin/login", b"/x/../cgi-bin/login",
                 b"/%63gi-bin/login"),
                (b"", b"/", b"/x", b"//x", b"/x.php", b"/..;", b"?x"))).items()
            if script == b"/cgi-bin/login"]
        self.assertGreater(len(targets), 15, len(targets))
        self.assertIn(b"/cgi-bin/login/x", targets)
        self.assertEqual(uncounted(self, self.apache_port, "{path: /cgi-bin/login}", targets), [])


class ApacheMultiViewsTest(ApacheTestCase):
    """Apache with MultiViews, PHP's files negotiated (their extension a
    type, as `AddType application/x-httpd-php .php` makes it): it finds
    `/wp-login.php` for `/wp-login`, PATH_INFO and all, and a folder's
    index.php for its `index` (a front controller too)."""

    EXTRA_MODULES = ("negotiation",)
    EXTRA_CONFIG = """<Directory />
    Options +MultiViews
</Directory>
AddType application/x-httpd-php .php
"""

    def test_every_spelling_apache_negotiates_a_script_for_is_counted(self):
        scripts = self.scripts_run(
            a + b + c for a, b, c in itertools.product(
                (b"/", b"//", b"/x/../", b"/./", b"/%2e/", b"/login/", b"/login/../"),
                (b"wp-login", b"WP-LOGIN", b"%77p-login", b"wp%2dlogin", b"index", b"wp-login.php",
                 b"wp-login%2ephp"),
                (b"", b"/", b"/x", b"//x", b"/x.php", b"/..;", b"?x", b"%2fx", b"/.", b";x")))
        targets = [t for t, script in scripts.items() if script == b"/wp-login.php"]
        self.assertIn(b"/wp-login", targets)
        self.assertIn(b"/wp-login/x", targets)
        self.assertGreater(len(targets), 150, len(targets))
        self.assertEqual(uncounted(self, self.apache_port, "{path: /wp-login.php}", targets), [])
        # The folder /login/ by its index page, found by its name.
        targets = [t for t, script in scripts.items() if script == b"/login/index.php"]
        self.assertIn(b"/login/index", targets)
        self.assertEqual(uncounted(self, self.apache_port, "{path: /login/}", targets), [])

    def test_every_spelling_a_front_controller_found_by_its_name_routes_is_counted(self):
        # /blog/index.php found for /blog/index, routing /blog/login (its
        # /login) against a policy's `path: /blog/login`.
        targets = [t for t, route in self.scripts_run(
            a + b + c for a, b, c in itertools.product(
                (b"/blog/index", b"/blog//index", b"/blog/./index", b"/x/../blog/index",
                 b"/%62log/index", b"/blog/INDEX"),
                (b"/", b"//", b"/./", b"/x/../", b"/%2e/"),
                (b"login", b"login/", b"%6cogin", b"login//", b"login/."))).items()
            if route in (b"/blog/login", b"/blog/login/")]
        self.assertIn(b"/blog/index/login", targets)
        self.assertGreater(len(targets), 80, len(targets))
        self.assertEqual(uncounted(self, self.apache_port, "{path: /blog/login}", targets), [])


if __name__ == "__main__":
    unittest.main()
