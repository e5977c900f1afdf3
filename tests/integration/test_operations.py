"""Operations: reload by SIGHUP and by file change, invalid reloads, reload
under load, graceful SIGTERM, listeners nobody else can join."""

import errno
import http.client
import os
import re
import signal
import socket
import subprocess
import threading
import time
import unittest

from harness import BINARY, HOST, SluiceTestCase, metric_value, request, server_block

KEEP_POLICY = """\
  - name: keep
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 2}
"""

BASE = server_block() + "policies:\n" + KEEP_POLICY

WITH_NEW = BASE + """\
  - name: new
    limits:
      - {algorithm: fixed_window, rate: 5/min}
"""


class ReloadTest(SluiceTestCase):
    def policy_names(self):
        r = self.get("/v1/config", admin=True)
        self.assertEqual(r.status, 200, r)
        return [p["name"] for p in r.json()["policies"]]

    def wait_for_policies(self, names, timeout):
        deadline = time.monotonic() + timeout
        while True:
            current = self.policy_names()
            if current == names:
                return time.monotonic()
            if time.monotonic() > deadline:
                self.fail("policies still %r after %.1fs, wanted %r; log:\n%s" % (
                    current, timeout, names, self.sluice.output()))
            time.sleep(0.05)

    def exhaust_keep(self):
        self.assertEqual([self.check("keep", "k").status for _ in range(3)], [200, 200, 429])

    def test_sighup_reloads_and_unchanged_policy_keeps_state(self):
        # Start with a long config so that the new one can be padded to the
        # same size and mtime: the file watcher cannot see it, only SIGHUP.
        s = self.start_sluice(WITH_NEW.replace("new", "old") + "#" + "p" * 200 + "\n")
        self.assertEqual(self.policy_names(), ["keep", "old"])
        self.exhaust_keep()
        mark = s.line_count()
        s.write_config(WITH_NEW, keep_stamp=True)
        time.sleep(1.2)  # two watcher polls: it must not have noticed
        self.assertEqual(self.policy_names(), ["keep", "old"])
        s.signal(signal.SIGHUP)
        self.assertIsNotNone(s.wait_for_line(r"event=reload result=success trigger=SIGHUP", 5, mark),
                             s.output())
        self.assertEqual(self.policy_names(), ["keep", "new"])
        # The exhausted key is still exhausted: the state survived the reload.
        self.assertEqual(self.check("keep", "k").status, 429)
        self.assertEqual(self.check("keep", "fresh").status, 200)
        # The new policy decides.
        self.assertEqual(self.check("new", "x").json()["limit"], 5)
        self.assertEqual(self.check("old", "x").status, 404)
        m = self.metrics()
        self.assertEqual(metric_value(m, "sluice_config_reloads_total", result="success"), 1)
        self.assertEqual(metric_value(m, "sluice_config_reloads_total", result="failure"), 0)

    def test_sighup_with_invalid_config_keeps_old_policies(self):
        s = self.start_sluice(BASE)
        self.exhaust_keep()
        mark = s.line_count()
        # Line 8 holds the broken rate.
        broken = BASE.replace("rate: 1/h", "rate: often")
        self.assertIn("rate: often", broken.split("\n")[7], broken)
        s.write_config(broken)
        s.signal(signal.SIGHUP)
        m = s.wait_for_line(r"event=reload result=failure.*", 5, mark)
        self.assertIsNotNone(m, s.output())
        # The message names the file and the line (and the key).
        self.assertRegex(m.group(0), r"config\.yaml:8\b")
        self.assertIn("rate", m.group(0))
        self.assertGreaterEqual(metric_value(self.metrics(), "sluice_config_reloads_total",
                                             result="failure"), 1)
        self.assertEqual(metric_value(self.metrics(), "sluice_config_reloads_total",
                                      result="success"), 0)
        # Still serving the old policies, with their state.
        self.assertEqual(self.policy_names(), ["keep"])
        self.assertEqual(self.check("keep", "k").status, 429)
        self.assertEqual(self.check("keep", "other").status, 200)
        self.assert_healthy()
        self.assertEqual(self.get("/readyz", admin=True).status, 200)

    def test_reload_with_unparseable_yaml_keeps_old_policies(self):
        s = self.start_sluice(BASE)
        mark = s.line_count()
        s.write_config(BASE + "  - name: [unclosed\n")
        s.signal(signal.SIGHUP)
        m = s.wait_for_line(r"event=reload result=failure.*", 5, mark)
        self.assertIsNotNone(m, s.output())
        self.assertRegex(m.group(0), r"config\.yaml:\d+")
        self.assertEqual(self.policy_names(), ["keep"])
        self.assertEqual(self.check("keep", "x").status, 200)

    def test_rewriting_the_file_reloads_without_a_signal(self):
        s = self.start_sluice(BASE)
        self.exhaust_keep()
        t0 = time.monotonic()
        s.write_config(WITH_NEW)
        # The watcher polls every 500 ms.
        t1 = self.wait_for_policies(["keep", "new"], 3.0)
        self.assertLess(t1 - t0, 3.0)
        self.assertIsNotNone(s.wait_for_line(r"event=reload result=success trigger=file-change", 2))
        self.assertEqual(self.check("keep", "k").status, 429)

    def test_reload_that_changes_a_limit_applies_the_new_limit(self):
        s = self.start_sluice(BASE)
        s.write_config(BASE.replace("burst: 2", "burst: 5"))
        s.signal(signal.SIGHUP)
        self.assertIsNotNone(s.wait_for_line(r"event=reload result=success", 5), s.output())
        self.assertEqual(self.check("keep", "changed").json()["limit"], 5)

    def test_reload_applies_server_settings_or_says_it_does_not(self):
        # Regression (was a bug): a reload that changes server settings other than listen, admin
        # and threads (here legacy_headers) is logged as a plain success, but
        # the change is silently ignored: the process keeps the server block
        # it started with (observed: no X-RateLimit-* after reloading with
        # legacy_headers: true, and no warning). Only listen/admin/threads get
        # the "take effect at the next start" note. Expected: the setting
        # applies after the reload, or the log says it waits for a restart.
        s = self.start_sluice(BASE)
        self.assertIsNone(self.check("keep", "legacy").header("X-RateLimit-Limit"))
        mark = s.line_count()
        s.write_config(server_block(legacy_headers="true") + "policies:\n" + KEEP_POLICY)
        s.signal(signal.SIGHUP)
        self.assertIsNotNone(s.wait_for_line(r"event=reload result=success", 5, mark), s.output())
        time.sleep(0.1)
        applied = self.check("keep", "legacy").header("X-RateLimit-Limit") is not None
        warned = s.wait_for_line(r"legacy_headers", 0.5, mark) is not None
        self.assertTrue(applied or warned, s.output())

    def test_reload_under_load_sees_no_errors(self):
        s = self.start_sluice(BASE)
        stop = threading.Event()
        outcomes = {"statuses": {}, "errors": []}
        lock = threading.Lock()

        def load(fresh_connections):
            conn = None
            while not stop.is_set():
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(HOST, s.port, timeout=5)
                    r = self.check("keep", "load-%s" % fresh_connections,
                                   conn=None if fresh_connections else conn)
                    with lock:
                        outcomes["statuses"][r.status] = outcomes["statuses"].get(r.status, 0) + 1
                except Exception as e:  # every failure is a finding
                    with lock:
                        outcomes["errors"].append(repr(e))
                    if conn is not None:
                        conn.close()
                    conn = None
            if conn is not None:
                conn.close()

        threads = [threading.Thread(target=load, args=(fresh,)) for fresh in (True, False, False)]
        for t in threads:
            t.start()
        try:
            for i in range(6):
                mark = s.line_count()
                s.write_config(WITH_NEW if i % 2 == 0 else BASE)
                s.signal(signal.SIGHUP)
                self.assertIsNotNone(s.wait_for_line(r"event=reload result=success", 5, mark),
                                     s.output())
                time.sleep(0.1)
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        self.assertEqual(outcomes["errors"], [])
        self.assertTrue(set(outcomes["statuses"]) <= {200, 429}, outcomes["statuses"])
        self.assertGreater(sum(outcomes["statuses"].values()), 50, outcomes["statuses"])
        self.assertIn(429, outcomes["statuses"])


class ShutdownTest(SluiceTestCase):
    def test_sigterm_drains_in_flight_request_and_refuses_new_connections(self):
        up = self.start_upstream(slow_seconds=1.5)
        s = self.start_sluice(server_block(drain_timeout="5s", upstream_timeout="5s") + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: %s
""" % up.url)
        result = {}

        def slow_request():
            try:
                result["response"] = request(s.port, "GET", "/slow/drain", timeout=10)
            except Exception as e:
                result["error"] = repr(e)
            result["done"] = time.monotonic()

        t = threading.Thread(target=slow_request)
        t.start()
        self.addCleanup(t.join, 10)
        deadline = time.monotonic() + 5
        while up.count("/slow") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(up.count("/slow"), 1, "the request never reached the upstream")
        # An admin connection opened before the signal (a load balancer's
        # health checker) learns that the server is draining.
        admin = http.client.HTTPConnection(HOST, s.admin_port, timeout=5)
        self.addCleanup(admin.close)
        self.assertEqual(request(s.admin_port, "GET", "/readyz", conn=admin).status, 200)
        signalled = time.monotonic()
        s.signal(signal.SIGTERM)
        # New connections are refused once the listeners are closed (give the
        # server up to 0.5 s to act on the signal).
        refused_at = None
        while time.monotonic() - signalled < 0.5:
            try:
                c = socket.create_connection((HOST, s.port), timeout=1)
                c.close()
                time.sleep(0.02)
            except (ConnectionRefusedError, ConnectionResetError):
                # Reset: the connection reached a listen queue just as that
                # listener closed; it is not served either.
                refused_at = time.monotonic()
                break
        self.assertIsNotNone(refused_at, "new connections still accepted 0.5 s after SIGTERM")
        self.assertNotIn("done", result, "refusal must be observed while the request is in flight")
        readyz = request(s.admin_port, "GET", "/readyz", conn=admin)
        self.assertEqual(readyz.status, 503, readyz)
        try:
            socket.create_connection((HOST, s.admin_port), timeout=1).close()
            admin_refused = False
        except ConnectionRefusedError:
            admin_refused = True
        self.assertTrue(admin_refused, "the admin listener still accepts after SIGTERM")
        code = s.proc.wait(6)
        exited = time.monotonic()
        t.join(5)
        self.assertNotIn("error", result, result)
        r = result["response"]
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["path"], "/slow/drain")
        self.assertEqual(code, 0, s.output())
        self.assertLess(exited - signalled, 5.0 + 0.5)
        self.assertIsNotNone(s.wait_for_line(r"event=stop", 2), s.output())

    def test_sigterm_when_idle_exits_promptly_with_0(self):
        s = self.start_sluice(server_block() + "policies:\n" + KEEP_POLICY)
        # An idle keep-alive client must not hold the shutdown up.
        conn = http.client.HTTPConnection(HOST, s.port, timeout=5)
        self.addCleanup(conn.close)
        self.assertEqual(self.check("keep", "idle", conn=conn).status, 200)
        t0 = time.monotonic()
        s.signal(signal.SIGTERM)
        code = s.proc.wait(5)
        self.assertEqual(code, 0, s.output())
        self.assertLess(time.monotonic() - t0, 2.0)

    def test_sigterm_past_drain_timeout_exits(self):
        up = self.start_upstream(slow_seconds=3.0)
        s = self.start_sluice(server_block(drain_timeout="500ms", upstream_timeout="10s") + """\
routes:
  - name: app
    match: {path_prefix: /}
    upstream: %s
""" % up.url)
        t = threading.Thread(target=lambda: _swallow(request, s.port, "GET", "/slow/x", timeout=5))
        t.start()
        self.addCleanup(t.join, 10)
        deadline = time.monotonic() + 5
        while up.count("/slow") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        s.signal(signal.SIGTERM)
        code = s.proc.wait(5)
        self.assertLess(time.monotonic() - t0, 0.5 + 1.0)
        self.assertEqual(code, 0, s.output())
        self.assertIsNotNone(s.wait_for_line(r"event=drain result=deadline", 2), s.output())


def _swallow(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception:
        pass


class ListenerTest(SluiceTestCase):
    """A second process cannot take sluice's connections. With
    server.cpu_affinity (on a machine with a CPU per thread) each loop has a socket in an SO_REUSEPORT group whose program hands a
    connection to the loop on the CPU it came from, and only ever to sluice's
    own sockets: one that joins the group later gets nothing. Without it,
    the listener is one socket that nobody else can bind. A second sluice on
    the port exits either way."""

    def second_sluice_fails(self, name, port):
        path = os.path.join(self.tmpdir, "second-%s.yaml" % name)
        main = port if name == "listen" else 0
        extra = "" if name == "listen" else "  decision: {listen: 127.0.0.1:%d}\n" % port
        with open(path, "w") as f:
            f.write("server:\n  listen: 127.0.0.1:%d\n  admin: 127.0.0.1:0\n%s"
                    "policies:\n%s" % (main, extra, KEEP_POLICY))
        p = subprocess.run([BINARY, "serve", "--config", path], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=15, cwd=self.tmpdir)
        err = p.stderr.decode("utf-8", "replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("cannot listen on 127.0.0.1:%d" % port, err)
        self.assertNotRegex(err, r"event=start listen=")

    def test_a_second_process_cannot_take_the_connections(self):
        for affinity in ("true", "false"):
            with self.subTest(cpu_affinity=affinity):
                s = self.start_sluice(
                    server_block(threads=2, decision="{listen: 127.0.0.1:0}",
                                 cpu_affinity=affinity) + "policies:\n" + KEEP_POLICY)
                m = re.search(r"event=start .* cpus=(\S+)", s.output())
                self.assertIsNotNone(m, s.output())
                steered = m.group(1) != "any"
                if affinity == "false":
                    self.assertFalse(steered, m.group(0))
                elif len(os.sched_getaffinity(0)) == 2:  # a thread for each CPU
                    self.assertEqual(m.group(1), ",".join(
                        str(c) for c in sorted(os.sched_getaffinity(0))))
                else:
                    self.assertFalse(steered, m.group(0))
                for name, port, status in (("listen", s.port, 404),
                                           ("decision", s.decision_port, 200)):
                    with self.subTest(listener=name):
                        self.second_sluice_fails(name, port)
                        joiner = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                        self.addCleanup(joiner.close)
                        joiner.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                        try:
                            joiner.bind((HOST, port))
                        except OSError as e:
                            # One socket: nobody joins it.
                            self.assertFalse(steered)
                            self.assertEqual(e.errno, errno.EADDRINUSE)
                            joined = False
                        else:
                            self.assertTrue(steered, "joined a port that is one socket")
                            joiner.listen(64)
                            joiner.setblocking(False)
                            joined = True
                        # Every connection is answered by sluice (the main
                        # listener has no routes here: 404), none reaches
                        # the joiner.
                        conns = [http.client.HTTPConnection(HOST, port, timeout=5)
                                 for _ in range(40)]
                        try:
                            for i, conn in enumerate(conns):
                                self.assertEqual(self.check("keep", "k%d" % i, s=s,
                                                            conn=conn).status, status)
                        finally:
                            for conn in conns:
                                conn.close()
                        if joined:
                            with self.assertRaises(BlockingIOError):
                                joiner.accept()
                        joiner.close()
                self._stop_and_report(s)


class MovingConnectionTest(SluiceTestCase):
    """With a thread kept on each CPU (server.cpu_affinity), a keep-alive connection whose client
    now sends from another CPU is moved, between two requests, to the thread
    on that CPU, and goes on answering as before."""

    def test_a_connection_follows_its_client_to_another_cpu(self):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) != 2:
            self.skipTest("needs a thread for each CPU: 2 threads on 2 CPUs")
        s = self.start_sluice(server_block(threads=2, cpu_affinity="true") + """policies:
  - name: wide
    limits:
      - {algorithm: token_bucket, rate: 1000/s, burst: 1000}
""")
        self.assertRegex(s.output(), r"event=start .* cpus=%d,%d" % tuple(cpus))
        moved = lambda: metric_value(self.metrics(), "sluice_connections_moved_total") or 0
        before = moved()
        mine = os.sched_getaffinity(0)
        self.addCleanup(os.sched_setaffinity, 0, mine)
        conn = http.client.HTTPConnection(HOST, s.port, timeout=5)
        self.addCleanup(conn.close)
        for i in range(120):
            # This thread sends from the first CPU, then from the second.
            if i in (0, 60):
                os.sched_setaffinity(0, {cpus[0] if i == 0 else cpus[1]})
            r = self.check("wide", "k%d" % i, conn=conn)
            self.assertEqual(r.status, 200, r)
            self.assertTrue(r.json()["allowed"], r)
        os.sched_setaffinity(0, mine)
        self.assertGreaterEqual(moved() - before, 1, "the connection never moved")
        # The moved connection still closes cleanly, and the count is right.
        conn.close()
        deadline = time.monotonic() + 5
        while metric_value(self.metrics(), "sluice_connections", listener="main") != 0:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)


class ThreadsOverCpusTest(SluiceTestCase):
    def test_more_threads_than_cpus_is_warned_of(self):
        # Two loops on the one CPU sluice may run on (taskset narrows it).
        cpu = min(os.sched_getaffinity(0))
        s = self.start_sluice(server_block(threads=2),
                              preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        self.assertIn("server.threads (2) is more than the CPUs sluice may run on (1)",
                      s.output())
        self.assert_healthy()
        # Its default, one loop a CPU, is not warned of.
        s = self.start_sluice(server_block(threads=0),
                              preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        self.assertNotIn("is more than the CPUs", s.output())


class LargeAnswersTest(SluiceTestCase):
    """An answer is written at once when the socket takes it, and what the
    socket does not take goes when it has room: eighty pipelined requests
    for the dashboard's script (77 KB each) to a client that reads nothing
    for half a second through a 4 KB receive buffer fill the socket, and
    every answer arrives whole."""

    def test_answers_larger_than_the_socket_takes_arrive_whole(self):
        s = self.start_sluice(server_block() + "policies:\n" + KEEP_POLICY)
        whole = request(s.admin_port, "GET", "/assets/dashboard.js").body
        self.assertGreater(len(whole), 16 * 1024)
        count = 80
        c = socket.socket()
        self.addCleanup(c.close)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect((HOST, s.admin_port))
        c.sendall(b"GET /assets/dashboard.js HTTP/1.1\r\nHost: x\r\n\r\n" * count)
        time.sleep(0.5)
        c.settimeout(10)
        chunks, size = [], 0
        while size < count * len(whole) or b"".join(chunks).count(whole) < count:
            chunk = c.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        self.assertEqual(data.count(whole), count)
        self.assertEqual(data.count(b"HTTP/1.1 200 "), count)

if __name__ == "__main__":
    unittest.main()
