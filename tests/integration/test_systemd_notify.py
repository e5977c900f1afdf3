"""`sluice serve` under systemd (`Type=notify`, packaging/sluice.service):
what it tells the notify socket (sd_notify), read here from a socket of the
test's own, named by NOTIFY_SOCKET as systemd names its own.

- READY=1 once every listener is bound: the admin listener answers then;
- SIGHUP: RELOADING=1, then READY=1 when the reload is done, with a STATUS
  line that says how it went (a broken file: the config in force serves);
- SIGTERM: STOPPING=1 as the drain begins, then exit 0, and nothing after.
"""

import os
import signal
import socket
import time
import unittest

from harness import Sluice, SluiceTestCase, request, server_block

CONFIG = server_block() + """\
policies:
  - name: a
    limits:
      - {algorithm: gcra, rate: 10/s, burst: 5}
"""
WAIT = 10.0  # seconds for any one message


class SystemdNotifyTest(SluiceTestCase):
    def setUp(self):
        super().setUp()
        self.path = os.path.join(self.tmpdir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(self.sock.close)
        self.sock.bind(self.path)

    def start_notified(self, wait_for_healthz=True):
        """sluice with NOTIFY_SOCKET set (only for the process it starts)."""
        old = os.environ.get("NOTIFY_SOCKET")
        os.environ["NOTIFY_SOCKET"] = self.path
        try:
            if wait_for_healthz:
                return self.start_sluice(CONFIG)
            s = Sluice(CONFIG, self.tmpdir)
            self.addCleanup(self._stop_and_report, s)
            self.sluice = s
            return s.start()  # returns at the event=start log line
        finally:
            if old is None:
                del os.environ["NOTIFY_SOCKET"]
            else:
                os.environ["NOTIFY_SOCKET"] = old

    def next_message(self, timeout=WAIT):
        """The next datagram as {field: value}; None when none came in time."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except socket.timeout:
            return None
        fields = {}
        for line in data.decode().split("\n"):
            if "=" in line:
                key, value = line.split("=", 1)
                fields[key] = value
        return fields

    def expect(self, field):
        m = self.next_message()
        self.assertIsNotNone(m, "no %s=1 within %.0f s; output:\n%s"
                             % (field, WAIT, self.sluice.output()))
        self.assertEqual(m.get(field), "1", m)
        return m

    def test_ready_once_listening(self):
        s = self.start_notified(wait_for_healthz=False)
        ready = self.expect("READY")
        self.assertIn("serving", ready.get("STATUS", ""), ready)
        self.assertIn("admin 127.0.0.1:%d" % s.admin_port, ready["STATUS"])
        # Told ready: both listeners answer at once, no retry needed.
        self.assertEqual(request(s.admin_port, "GET", "/healthz").status, 200)
        r = request(s.port, "POST", "/v1/check", body={"policy": "a", "key": "k"},
                    headers={"Content-Type": "application/json"})
        self.assertEqual(r.status, 200, r)
        # Nothing more while nothing happens.
        self.assertIsNone(self.next_message(timeout=0.5))

    def test_reload_is_framed_by_reloading_and_ready(self):
        s = self.start_notified()
        self.expect("READY")
        s.signal(signal.SIGHUP)
        reloading = self.expect("RELOADING")
        self.assertIn("MONOTONIC_USEC", reloading)
        self.assertIn("SIGHUP", reloading.get("STATUS", ""))
        ready = self.expect("READY")
        self.assertIn("config reloaded (SIGHUP)", ready.get("STATUS", ""), ready)

    def test_failed_reload_still_ends_in_ready(self):
        s = self.start_notified()
        self.expect("READY")
        # Unseen by the file watcher (same size and mtime): only SIGHUP reads it.
        s.write_config("policies: [oops\n", keep_stamp=True)
        s.signal(signal.SIGHUP)
        self.expect("RELOADING")
        ready = self.expect("READY")
        self.assertIn("reload (SIGHUP) failed", ready.get("STATUS", ""), ready)
        self.assertEqual(request(s.admin_port, "GET", "/healthz").status, 200)

    def test_sigterm_says_stopping_and_then_nothing(self):
        s = self.start_notified()
        self.expect("READY")
        s.signal(signal.SIGTERM)
        stopping = self.expect("STOPPING")
        self.assertIn("draining", stopping.get("STATUS", ""), stopping)
        deadline = time.monotonic() + WAIT
        while s.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertEqual(s.proc.returncode, 0, s.output())
        self.assertIsNone(self.next_message(timeout=0.2))


if __name__ == "__main__":
    unittest.main()
