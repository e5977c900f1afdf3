"""TLS to Redis (store.redis: rediss://, tls:): decisions go over TLS to a
redis-server that speaks only TLS on the port sluice is given, and every
certificate is verified: a node whose certificate no trusted authority
signed, or that names another host, is refused at start with a message
that names the node and the reason; a server that wants a client
certificate gets the configured one. The certificates are made here with
the openssl command, for 127.0.0.1 and redis.sluice.test."""

import os
import shutil
import signal
import socket
import time
import unittest

from certs import make_ca, make_certificate, require_openssl
from harness import server_block
from redis_harness import (FIVE_A_MINUTE, SENTINEL_MASTER, RedisCluster, RedisFleetTestCase,
                           RedisServer, Sentinel, fleet_statuses, free_port, readyz,
                           redis_status, redis_store_block, serve_until_exit, wait_until)

class TlsRedis(RedisServer):
    """A redis-server with a TLS port beside its plain one: sluice is given
    the TLS port only; the test's own client reads keys on the plain one."""

    def __init__(self, directory, certs, clients_need_certificates=False, cluster=False):
        # A Cluster's bus listens 10000 above the TLS port.
        self.tls_port = free_port(cluster_bus=cluster)
        super().__init__(directory, cluster=cluster, extra_args=[
            "--tls-port", str(self.tls_port),
            "--tls-cert-file", os.path.join(certs, "server.pem"),
            "--tls-key-file", os.path.join(certs, "server.key"),
            "--tls-ca-cert-file", os.path.join(certs, "ca.pem"),
            "--tls-auth-clients", "yes" if clients_need_certificates else "no",
            # A Cluster's bus too (Redis then tells a TLS client the nodes'
            # TLS ports, a plain one their plain ports).
            "--tls-cluster", "yes" if cluster else "no"])

    def tls_url(self, host="127.0.0.1"):
        return "rediss://%s:%d" % (host, self.tls_port)


class RedisTlsTest(RedisFleetTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        require_openssl()
        cls.certs = os.path.join(cls.class_dir, "certs")
        os.mkdir(cls.certs)
        make_ca(cls.certs, "ca")
        make_ca(cls.certs, "other-ca")
        make_certificate(cls.certs, "server", "ca", "DNS:redis.sluice.test,IP:127.0.0.1",
                         "serverAuth,clientAuth")
        make_certificate(cls.certs, "client", "ca", "DNS:sluice.client.test", "clientAuth")
        cls.redis = cls.start_tls_redis(cls.class_dir, cls.addClassCleanup)

    @classmethod
    def start_tls_redis(cls, directory, add_cleanup, clients_need_certificates=False):
        r = TlsRedis(directory, cls.certs, clients_need_certificates)
        add_cleanup(r.kill)
        return r.start()

    def cert(self, name):
        return os.path.join(self.certs, name)

    def store(self, url, tls_lines=()):
        block = redis_store_block(url=url, timeout="1s", connect_timeout="1s")
        if tls_lines:
            block += "    tls:\n" + "".join("      %s\n" % line for line in tls_lines)
        return block

    def fleet_keys(self, redis):
        return redis.call("KEYS", "sluice:*")

    def test_decisions_over_tls_are_exact_and_land_in_redis(self):
        """Two instances on the TLS port, with the test's authority: six
        checks of one user, three from each, admit exactly five."""
        fleet = self.start_fleet(server_block() + self.store(
            self.redis.tls_url(), ["ca_file: %s" % self.cert("ca.pem")]) + FIVE_A_MINUTE, 2)
        user = self.unique_key("tls")
        statuses = fleet_statuses(fleet[0], user, 3) + fleet_statuses(fleet[1], user, 3)
        self.assertEqual(sorted(statuses), [200] * 5 + [429], statuses)
        status = redis_status(fleet[0])
        self.assertEqual((status["server"], status["tls"]),
                         ("127.0.0.1:%d" % self.redis.tls_port, True))
        self.assertTrue(any(user in k for k in self.fleet_keys(self.redis)),
                        "no key of %s in Redis" % user)

    def test_a_certificate_no_trusted_authority_signed_is_refused(self):
        """Another authority's file, or the system's authorities: sluice does
        not start, and says which node and why."""
        for lines in (["ca_file: %s" % self.cert("other-ca.pem")], []):
            with self.subTest(tls=lines):
                _, err, _ = serve_until_exit(
                    self, self.tmpdir,
                    server_block() + self.store(self.redis.tls_url(), lines) + FIVE_A_MINUTE)
                self.assertIn("redis 127.0.0.1:%d" % self.redis.tls_port, err)
                self.assertIn("the certificate is not trusted", err)

    def test_the_name_on_the_certificate_is_verified(self):
        """server_name: a name the certificate does not carry is refused; the
        one it carries is accepted, whatever host the URL names."""
        _, err, _ = serve_until_exit(self, self.tmpdir, server_block() + self.store(
            self.redis.tls_url(), ["ca_file: %s" % self.cert("ca.pem"),
                                   "server_name: other.sluice.test"]) + FIVE_A_MINUTE)
        self.assertIn("redis 127.0.0.1:%d" % self.redis.tls_port, err)
        self.assertIn("hostname mismatch", err)
        fleet = self.start_fleet(server_block() + self.store(
            self.redis.tls_url(), ["ca_file: %s" % self.cert("ca.pem"),
                                   "server_name: redis.sluice.test"]) + FIVE_A_MINUTE, 1)
        self.assertEqual(fleet_statuses(fleet[0], self.unique_key("named"), 1), [200])

    def test_files_that_are_not_what_they_claim_do_not_start(self):
        """A ca_file that holds no certificate, a key that is not the
        certificate's: refused at start, naming the file."""
        garbage = os.path.join(self.tmpdir, "garbage.pem")
        with open(garbage, "w") as f:
            f.write("not a certificate\n")
        for lines, message in (
                (["ca_file: %s" % garbage], "redis tls ca_file %s: " % garbage),
                (["ca_file: %s" % self.cert("ca.pem"), "cert_file: %s" % self.cert("client.pem"),
                  "key_file: %s" % self.cert("server.key")],
                 "redis tls key_file %s: key values mismatch: not the key of cert_file"
                 % self.cert("server.key"))):
            with self.subTest(tls=lines):
                _, err, _ = serve_until_exit(self, self.tmpdir, server_block() + self.store(
                    self.redis.tls_url(), lines) + FIVE_A_MINUTE)
                self.assertIn(message, err)

    def test_a_plain_url_to_the_tls_port_does_not_start(self):
        """redis:// to a port that speaks TLS: refused at start (no answer
        Redis can read), never taken for a working store."""
        _, err, _ = serve_until_exit(self, self.tmpdir, server_block() + self.store(
            "redis://127.0.0.1:%d" % self.redis.tls_port) + FIVE_A_MINUTE)
        self.assertIn("redis 127.0.0.1:%d" % self.redis.tls_port, err)

    def test_a_node_that_never_answers_the_handshake_is_given_up(self):
        """A port that takes the connection and says nothing: the TLS
        handshake counts against the connect timeout, and sluice exits
        naming the node."""
        silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(silent.close)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the connection; nobody reads
        port = silent.getsockname()[1]
        _, err, took = serve_until_exit(self, self.tmpdir, server_block() + self.store(
            "rediss://127.0.0.1:%d" % port, ["ca_file: %s" % self.cert("ca.pem")]) + FIVE_A_MINUTE)
        self.assertIn("redis 127.0.0.1:%d" % port, err)
        self.assertIn("connect timeout", err)
        self.assertGreater(took, 0.9, err)

    def test_a_server_that_wants_a_client_certificate_gets_it(self):
        """tls-auth-clients yes: without cert_file and key_file sluice is
        refused at start; with them it decides."""
        redis = self.start_tls_redis(self.tmpdir, self.addCleanup,
                                     clients_need_certificates=True)
        _, err, _ = serve_until_exit(self, self.tmpdir, server_block() + self.store(
            redis.tls_url(), ["ca_file: %s" % self.cert("ca.pem")]) + FIVE_A_MINUTE)
        self.assertIn("redis 127.0.0.1:%d" % redis.tls_port, err)
        fleet = self.start_fleet(server_block() + self.store(
            redis.tls_url(), ["ca_file: %s" % self.cert("ca.pem"),
                              "cert_file: %s" % self.cert("client.pem"),
                              "key_file: %s" % self.cert("client.key")]) + FIVE_A_MINUTE, 1)
        user = self.unique_key("mutual")
        self.assertEqual(fleet_statuses(fleet[0], user, 6), [200] * 5 + [429])

    def test_a_cluster_over_tls(self):
        """Three masters with TLS on their ports and their bus: sluice, given
        one node's TLS port (after a seed that never answers), finds the
        others' (Redis answers a TLS client with TLS ports), verifies each,
        and decides every user exactly."""
        cluster = RedisCluster(self.tmpdir, masters=3, replicas=0,
                               make_server=lambda d: TlsRedis(d, self.certs, cluster=True))
        self.addCleanup(cluster.stop)
        cluster.start()
        # A first seed that takes the connection and never answers delays
        # nothing: the second seed's answer is enough (connect timeout 3 s).
        silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(silent.close)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        started = time.monotonic()
        fleet = self.start_fleet(server_block() + redis_store_block(
            cluster=["127.0.0.1:%d" % silent.getsockname()[1],
                     "127.0.0.1:%d" % cluster.servers[0].tls_port],
            timeout="1s", connect_timeout="3s") +
            "    tls: {ca_file: %s}\n" % self.cert("ca.pem") + FIVE_A_MINUTE, 1)
        self.assertLess(time.monotonic() - started, 2.0, "sluice waited for the silent seed")
        # 30 users: the chance that a master holds none is 3 (2/3)^30, 1e-5.
        users = [self.unique_key("user%d" % i) for i in range(30)]
        for user in users:
            self.assertEqual(fleet_statuses(fleet[0], user, 6), [200] * 5 + [429], user)
        holding = [s for s in cluster.servers if self.fleet_keys(s)]
        self.assertEqual(len(holding), 3, "the users' keys are not on every master")

    def test_the_master_a_sentinel_names_over_tls(self):
        """A sentinel that speaks TLS, monitoring the master's TLS port: the
        same authority verifies both, and decisions are exact."""
        tls_port = free_port()
        sentinel = Sentinel(self.tmpdir, self.redis.tls_port, extra_conf=[
            "tls-port %d" % tls_port,
            "tls-cert-file %s" % self.cert("server.pem"),
            "tls-key-file %s" % self.cert("server.key"),
            "tls-ca-cert-file %s" % self.cert("ca.pem"),
            "tls-auth-clients no",
            "tls-replication yes"])  # the sentinel reaches the master by TLS too
        self.addCleanup(sentinel.kill)
        sentinel.start()
        fleet = self.start_fleet(server_block() + redis_store_block(
            timeout="1s", connect_timeout="1s") +
            "    sentinel: {master: %s, nodes: [\"127.0.0.1:%d\"]}\n" % (
                SENTINEL_MASTER, tls_port) +
            "    tls: {ca_file: %s}\n" % self.cert("ca.pem") + FIVE_A_MINUTE, 1)
        user = self.unique_key("sentinel")
        self.assertEqual(fleet_statuses(fleet[0], user, 6), [200] * 5 + [429])
        self.assertTrue(any(user in k for k in self.fleet_keys(self.redis)))

    def test_the_files_are_read_again_on_a_reload(self):
        """A renewed file is read at a reload (SIGHUP) and used by the
        connections made from then on: here the trusted authority is
        replaced by one that did not sign the server, the connection is
        killed, and the reconnect is refused; the right one back, the store
        is used again. A file that cannot be used fails the reload and
        changes nothing."""
        redis = self.start_tls_redis(self.tmpdir, self.addCleanup)
        in_force = os.path.join(self.tmpdir, "ca-in-force.pem")
        shutil.copyfile(self.cert("ca.pem"), in_force)
        sluice = self.start_fleet(server_block() + self.store(
            redis.tls_url(), ["ca_file: %s" % in_force]) + FIVE_A_MINUTE, 1)[0]
        self.assertEqual(readyz(sluice)[0], 200)

        def reload(source, result):
            shutil.copyfile(source, in_force)
            mark = sluice.line_count()
            sluice.signal(signal.SIGHUP)
            line = sluice.wait_for_line(r"event=reload result=%s" % result, 10, mark)
            self.assertIsNotNone(line, sluice.output()[-2000:])
            return line.string

        garbage = os.path.join(self.tmpdir, "garbage.pem")
        with open(garbage, "w") as f:
            f.write("not a certificate\n")
        self.assertIn("redis tls ca_file %s" % in_force, reload(garbage, "failure"))
        reload(self.cert("other-ca.pem"), "success")
        self.assertEqual(fleet_statuses(sluice, self.unique_key("open"), 1), [200],
                         "the open connection keeps its session")
        redis.call("CLIENT", "KILL", "TYPE", "normal")  # sluice's; not this one
        wait_until(lambda: readyz(sluice)[0] == 503, 5, what="/readyz 503")
        self.assertIsNotNone(sluice.wait_for_line(
            r"event=redis_reconnect_failed .*the certificate is not trusted", 5))
        reload(self.cert("ca.pem"), "success")
        wait_until(lambda: readyz(sluice)[0] == 200, 5, what="/readyz 200")
        user = self.unique_key("renewed")
        self.assertEqual(fleet_statuses(sluice, user, 6), [200] * 5 + [429])

    def test_a_restarted_redis_is_reached_again_over_tls(self):
        """The server is killed and started again on the same ports: each
        reconnect makes a new TLS connection, and decisions resume."""
        redis = self.start_tls_redis(self.tmpdir, self.addCleanup)
        fleet = self.start_fleet(server_block() + self.store(
            redis.tls_url(), ["ca_file: %s" % self.cert("ca.pem")]) + FIVE_A_MINUTE, 1)
        self.assertEqual(fleet_statuses(fleet[0], self.unique_key("before"), 1), [200])
        redis.kill()
        redis.start()
        user = self.unique_key("after")
        wait_until(lambda: fleet_statuses(fleet[0], user, 1) == [200], 10,
                   what="a decision over TLS after the restart")
        self.assertTrue(any(user in k for k in self.fleet_keys(redis)))


if __name__ == "__main__":
    unittest.main()
