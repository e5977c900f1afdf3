"""Test certificates, made with the openssl command: an authority, and
certificates it signs for the names and uses a test gives. Shared by the
tests of TLS to Redis and of sluice's own TLS listeners."""

import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import unittest

OPENSSL = shutil.which("openssl")


def require_openssl():
    if not OPENSSL:
        raise unittest.SkipTest("the openssl command makes the test certificates")


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)


def make_ca(directory, name):
    """A certificate authority: NAME.pem and NAME.key."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", name + ".key", "-out", name + ".pem", "-days", "2",
            "-subj", "/CN=sluice test " + name, cwd=directory)


def make_certificate(directory, name, ca, alt_names, usage):
    """NAME.pem and NAME.key, signed by CA, for the subjectAltName and the
    extendedKeyUsage given (a Cluster node is its peers' client too)."""
    with open(os.path.join(directory, name + ".ext"), "w") as f:
        f.write("subjectAltName=%s\nextendedKeyUsage=%s\n" % (alt_names, usage))
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name,
            cwd=directory)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
            "-CAcreateserial", "-days", "2", "-extfile", name + ".ext", "-out", name + ".pem",
            cwd=directory)


def server_certificates(test, prefix):
    """An authority ("ca") and a server certificate it signs ("server", for
    sluice.test and 127.0.0.1) in a folder of their own, removed after
    `test`: returns `path(name)` in that folder, and an ssl.SSLContext an
    https:// upstream serves the certificate with."""
    require_openssl()
    certs = tempfile.mkdtemp(prefix=prefix)
    test.addCleanup(shutil.rmtree, certs, True)
    make_ca(certs, "ca")
    make_certificate(certs, "server", "ca", "DNS:sluice.test,IP:127.0.0.1", "serverAuth")
    path = lambda name: os.path.join(certs, name)
    upstream_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    upstream_tls.load_cert_chain(path("server.pem"), path("server.key"))
    return path, upstream_tls


def check_renewal(test, sluice, certs, in_force, who, served_name, kept):
    """Renews the certificate a listener of `sluice` serves from the files
    `in_force` ({"pem": path, "key": path}, first copies of `certs`'s
    server.*) with renewed.* by SIGHUP: a key that is not the certificate's
    fails the reload (its error naming `who`, "server.tls") and nothing
    changes; both files renewed, new connections get the new certificate
    (`served_name()` says whose: its common name) and the open one, `kept`,
    its own."""
    def reload():
        count = sluice.output().count("event=reload")
        sluice.signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while sluice.output().count("event=reload") == count and time.monotonic() < deadline:
            time.sleep(0.02)
        return sluice.output()

    shutil.copyfile(os.path.join(certs, "renewed.pem"), in_force["pem"])
    out = reload()
    test.assertIn(who + " key_file", out)
    test.assertIn("not the key of cert_file", out)
    test.assertEqual(served_name(), "server")
    shutil.copyfile(os.path.join(certs, "renewed.key"), in_force["key"])
    reload()
    deadline = time.monotonic() + 5
    while served_name() != "renewed" and time.monotonic() < deadline:
        time.sleep(0.05)
    test.assertEqual(served_name(), "renewed")
    test.assertEqual(served_name(kept), "server")
