"""Regression: idle TCP connections to the gRPC listener starved the process.

The bug: grpc.listen had no connection limit and no timeout for connections
that never send anything. With a file descriptor limit of 512, 600 plain TCP
connections to the gRPC port (connect, send nothing) used up every
descriptor, and the HTTP and admin listeners stopped answering.

Now the gRPC listener refuses connections beyond grpc.max_connections at
once, closes those that send nothing within grpc.handshake_timeout, and gRPC
closes connections idle for grpc.idle_timeout or older than
grpc.max_connection_age (+ grace). These tests start the real binary with a
low RLIMIT_NOFILE (set in the child only) and check each bound, all on
127.0.0.1, every socket closed at the end.
"""

import resource
import selectors
import socket
import time
import unittest

from harness import (FRAME_GOAWAY, FRAME_SETTINGS, HOST, HTTP2_PREFACE, SluiceTestCase, frame_types,
                     metric_value, request, server_block)

NOFILE = 512            # the child's descriptor limit
MAX_CONNECTIONS = 50    # grpc.max_connections
IDLE_CONNECTIONS = 600  # more than NOFILE, far more than the cap
HANDSHAKE_S = 2.0       # grpc.handshake_timeout
IDLE_S = 3.0            # grpc.idle_timeout
SETTLE_S = 0.5          # for the server to accept what the kernel queued
ANSWER_WITHIN_S = 2.0   # the other listeners' answers, while the gRPC one is flooded
SLACK_S = 2.0           # timers firing late on a busy machine



def config(**grpc):
    settings = {"listen": "127.0.0.1:0", "max_connections": MAX_CONNECTIONS,
                "handshake_timeout": "%gs" % HANDSHAKE_S, "idle_timeout": "%gs" % IDLE_S}
    settings.update(grpc)
    return (server_block(threads=2)
            + "grpc:\n" + "".join("  %s: %s\n" % kv for kv in settings.items())
            + "policies:\n"
              "  - name: api\n"
              "    limits: [{algorithm: token_bucket, rate: 1000/s}]\n")


def limit_descriptors():
    """Runs in the child: RLIMIT_NOFILE down to NOFILE, the hard limit too,
    since sluice raises its soft limit to the hard one at start."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


class GrpcConnectionLimits(SluiceTestCase):
    def setUp(self):
        super().setUp()
        # This process holds the idle connections: it needs more than NOFILE.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = IDLE_CONNECTIONS + 200
        if soft != resource.RLIM_INFINITY and soft < need:
            if hard != resource.RLIM_INFINITY and hard < need:
                self.skipTest("this test needs %d file descriptors, the hard limit is %d"
                              % (need, hard))
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))

    def start(self, config_text=None):
        s = self.start_sluice(config_text or config(), preexec_fn=limit_descriptors)
        self.assertIsNotNone(s.grpc_port, "no gRPC listener in the log:\n" + s.output())
        return s

    def connect_idle(self, port, count):
        """`count` plain TCP connections that send nothing; closed at cleanup."""
        socks = []
        self.addCleanup(lambda: [x.close() for x in socks])
        for _ in range(count):
            x = socket.create_connection((HOST, port), timeout=5)
            socks.append(x)
        return socks

    def wait_closed(self, socks, until):
        """{socket: time.monotonic() when its close was seen}, waiting until
        the monotonic time `until`; sockets still open then are missing."""
        closed = {}
        with selectors.DefaultSelector() as sel:
            for x in socks:
                x.setblocking(False)
                sel.register(x, selectors.EVENT_READ)
            while len(closed) < len(socks):
                left = until - time.monotonic()
                if left <= 0:
                    break
                for key, _ in sel.select(left):
                    x = key.fileobj
                    try:
                        if x.recv(65536):
                            continue  # a frame; the close comes later
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass  # reset: closed too
                    closed[x] = time.monotonic()
                    sel.unregister(x)
        return closed

    def assert_other_listeners_answer(self, s):
        for name, call in (
                ("admin /healthz", lambda: request(s.admin_port, "GET", "/healthz",
                                                   timeout=ANSWER_WITHIN_S)),
                ("/v1/check", lambda: request(s.port, "POST", "/v1/check",
                                              body={"policy": "api", "key": "k"},
                                              headers={"Content-Type": "application/json"},
                                              timeout=ANSWER_WITHIN_S))):
            started = time.monotonic()
            try:
                r = call()
            except OSError as e:
                self.fail("%s did not answer within %.0f s while the gRPC listener held idle "
                          "connections: %r; output:\n%s"
                          % (name, ANSWER_WITHIN_S, e, s.output()[-3000:]))
            self.assertEqual(r.status, 200, "%s: %r" % (name, r))
            self.assertLess(time.monotonic() - started, ANSWER_WITHIN_S, name)

    def test_idle_connections_to_grpc_do_not_starve_the_other_listeners(self):
        s = self.start()
        opened = time.monotonic()
        socks = self.connect_idle(s.grpc_port, IDLE_CONNECTIONS)
        connected = time.monotonic()
        # connect() returns once the kernel queued the connection; the
        # descriptors are used up when the server accepts them.
        time.sleep(SETTLE_S)
        self.assert_other_listeners_answer(s)
        open_now = metric_value(self.metrics(), "sluice_grpc_connections")
        if time.monotonic() - opened < HANDSHAKE_S:  # none timed out yet: the gate is full
            self.assertEqual(open_now, MAX_CONNECTIONS)

        # Beyond the cap, connections were closed at once; the ones let in
        # are closed at the handshake timeout, having sent nothing.
        closed = self.wait_closed(socks, connected + HANDSHAKE_S + SLACK_S)
        self.assertEqual(len(closed), IDLE_CONNECTIONS,
                         "%d idle connections still open %.1f s after the handshake timeout"
                         % (IDLE_CONNECTIONS - len(closed), SLACK_S))
        held = sorted(closed.values())[-MAX_CONNECTIONS:]
        self.assertGreaterEqual(held[0] - opened, HANDSHAKE_S * 0.9,
                                "closed before the handshake timeout")

        m = self.metrics()
        refused = metric_value(m, "sluice_grpc_connections_refused_total")
        timed_out = metric_value(m, "sluice_grpc_handshake_timeouts_total")
        self.assertEqual(refused + timed_out, IDLE_CONNECTIONS, m)
        if connected - opened < HANDSHAKE_S / 2:  # all queued well before any slot came free
            self.assertEqual(timed_out, MAX_CONNECTIONS)
        self.assertEqual(metric_value(m, "sluice_grpc_connections"), 0)

        # The slots are free again: a gRPC client gets in and is answered.
        with socket.create_connection((HOST, s.grpc_port), timeout=5) as c:
            c.sendall(HTTP2_PREFACE)
            self.assertIn(FRAME_SETTINGS, frame_types(c.recv(65536)))
        self.assert_other_listeners_answer(s)

    def test_an_http2_connection_without_calls_is_closed_after_idle_timeout(self):
        s = self.start()
        with socket.create_connection((HOST, s.grpc_port), timeout=5) as c:
            opened = time.monotonic()
            c.sendall(HTTP2_PREFACE)
            received = c.recv(65536)
            self.assertIn(FRAME_SETTINGS, frame_types(received))  # it is gRPC's now
            closed = self.wait_closed([c], opened + IDLE_S + SLACK_S)
            self.assertIn(c, closed, "open %.1f s after the idle timeout" % SLACK_S)
            # Past the handshake timeout, which is for connections that send nothing.
            self.assertGreaterEqual(closed[c] - opened, IDLE_S * 0.9)
        self.assertEqual(metric_value(self.metrics(), "sluice_grpc_handshake_timeouts_total"), 0)

    def test_a_connection_is_closed_after_max_connection_age_and_grace(self):
        # The idle timeout is longer than the age here: the age closes it.
        s = self.start(config(idle_timeout="60s", max_connection_age="1s",
                              max_connection_age_grace="1s"))
        with socket.create_connection((HOST, s.grpc_port), timeout=5) as c:
            opened = time.monotonic()
            c.sendall(HTTP2_PREFACE)
            self.assertIn(FRAME_SETTINGS, frame_types(c.recv(65536)))
            # Closed at the age (1 s, give or take 10%) + the grace (1 s) at the latest.
            closed = self.wait_closed([c], opened + 2.1 + SLACK_S)
            self.assertIn(c, closed, "still open after max_connection_age and its grace")
            self.assertGreaterEqual(closed[c] - opened, 0.9)


if __name__ == "__main__":
    unittest.main()
