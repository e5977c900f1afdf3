#!/usr/bin/env python3
"""What a denied request with a large body costs `sluice serve`.

A route whose policy (one global token bucket, 1 an hour) has already been
spent, so every request is denied; clients POST bodies of BODY bytes to it,
CONNS at a time, one request a connection, N requests in all, two ways:

  whole:  the client sends its header and its whole body at once, then reads
          the answer (what a flood does);
  expect: the client sends its header with "Expect: 100-continue" and sends
          the body only if asked for it (curl does so for bodies over 1 MiB).

The peer: NGINX's `limit_req` doing the same (a zone of 1 request a minute
keyed on a header every request carries, the first request spent), 2
workers, as bench/http/run.sh runs it; NGINX=0 leaves it out.

Reported for each server and case: requests a second, the server's CPU
time (user + system of every process, /proc/PID/stat) per request, the
body bytes the clients got to send, and how much its peak RSS (VmHWM,
summed over its processes) rose over the run. Each round runs every
server, one after the other; the medians of ROUNDS rounds are shown.

Usage: bench/http/denied_bodies.py SLUICE_BINARY [ANOTHER_SLUICE_BINARY]
Variables: N (400 requests a case), CONNS (8), BODY (1048576 bytes),
  ROUNDS (3), NGINX (the binary, or 0: none; default nginx on the PATH).
Loopback only; every wait is bounded; it stops only the processes it
started, by PID.
"""

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from proc_stats import HOST, cpu_seconds, free_port, peak_rss_kib, stop

N = int(os.environ.get("N", "400"))
CONNS = int(os.environ.get("CONNS", "8"))
BODY = int(os.environ.get("BODY", str(1024 * 1024)))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def read_answer(s, data=b"", expect_continue=None, timeout=30):
    """The bytes of the final answer, read to its end (its Content-Length),
    not to the close: NGINX keeps a connection whose body it did not read
    open for its lingering_timeout. A 100 Continue before it is dropped, and
    `expect_continue()` called (it sends the body)."""
    deadline = time.monotonic() + timeout
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            head = data[:end]
            if head.startswith(b"HTTP/1.1 100"):
                data = data[end + 4:]
                if expect_continue:
                    expect_continue()
                continue
            m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
            whole = end + 4 + (int(m.group(1)) if m else 0)
            if len(data) >= whole:
                return data[:whole]
        if time.monotonic() > deadline:
            return data
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return data
        if not chunk:
            return data
        data += chunk


def one_request(port, case, body, sent):
    head = (b"POST /upload HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n" % BODY)
    with socket.create_connection((HOST, port), timeout=30) as s:
        if case == "whole":
            s.sendall(head + b"\r\n")
            try:
                s.sendall(body)
                sent[0] += BODY
            except (BrokenPipeError, ConnectionResetError):
                pass
            data = read_answer(s)
        else:
            def send_body():
                s.sendall(body)
                sent[0] += BODY
            s.sendall(head + b"Expect: 100-continue\r\n\r\n")
            data = read_answer(s, expect_continue=send_body)
    if not data.startswith(b"HTTP/1.1 429"):
        raise RuntimeError("expected a 429, got %r" % data[:100])


def run_case(port, pid, case):
    body = b"x" * BODY
    sent = [0]
    left = [N]
    lock = threading.Lock()
    errors = []

    def client():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            try:
                one_request(port, case, body, sent)
            except Exception as e:  # reported after the run
                errors.append(e)
                return

    cpu0, start = cpu_seconds(pid), time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(CONNS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    elapsed = time.monotonic() - start
    if errors:
        raise RuntimeError("%s: %s" % (case, errors[0]))
    return {"rps": N / elapsed, "cpu_us": (cpu_seconds(pid) - cpu0) / N * 1e6,
            "sent_mib": sent[0] / (1024 * 1024)}


def wait_listening(port, proc, log):
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the server did not start; see " + log)
            time.sleep(0.05)


def spend(port):
    """The one request the limit admits (to an upstream nobody listens on)."""
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(b"GET /upload HTTP/1.1\r\nHost: x\r\nX-Key: k\r\nConnection: close\r\n\r\n")
        read_answer(s, timeout=10)


def start_nginx(binary, work):
    port, upstream = free_port(), free_port()
    root = os.path.join(work, "nginx")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "nginx.conf"), "w") as f:
        f.write("""\
worker_processes 2;
daemon off; pid %s/nginx.pid; error_log %s/error.log error;
events { worker_connections 4096; }
http { access_log off;
  limit_req_zone $http_x_key zone=z:1m rate=1r/m;
  limit_req_status 429;
  client_max_body_size %d;
  server { listen %s:%d;
    location / { limit_req zone=z nodelay; proxy_pass http://%s:%d; } } }
""" % (root, root, BODY * 2, HOST, port, HOST, upstream))
    proc = subprocess.Popen([binary, "-c", os.path.join(root, "nginx.conf"), "-p", root],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_listening(port, proc, os.path.join(root, "error.log"))
    spend(port)
    return proc, port


def start_sluice(binary, work):
    port, admin, upstream = free_port(), free_port(), free_port()
    config = os.path.join(work, "sluice.yaml")
    with open(config, "w") as f:
        f.write("""\
server:
  listen: %s:%d
  admin: %s:%d
  threads: 2
  max_body_bytes: %d
routes:
  - name: app
    match: {path_prefix: /}
    upstream: http://%s:%d
policies:
  - name: uploads
    match: {path_prefix: /upload}
    key: [global]
    limits:
      - {algorithm: token_bucket, rate: 1/h, burst: 1}
""" % (HOST, port, HOST, admin, BODY * 2, HOST, upstream))
    log = open(os.path.join(work, "sluice.log"), "w")
    proc = subprocess.Popen([binary, "serve", "--config", config], stdout=log,
                            stderr=subprocess.STDOUT)
    wait_listening(port, proc, log.name)
    spend(port)
    return proc, port


def main():
    binaries = sys.argv[1:3]
    if not binaries:
        sys.exit(__doc__)
    servers = [(b, start_sluice) for b in binaries]
    nginx = os.environ.get("NGINX", shutil.which("nginx") or "/usr/sbin/nginx")
    if nginx != "0" and os.access(nginx, os.X_OK):
        servers.append((nginx, start_nginx))
    results = {}  # (server, case) -> [result per round]
    with tempfile.TemporaryDirectory(prefix="sluice-denied-bodies-") as work:
        for _ in range(ROUNDS):
            for binary, start in servers:
                proc, port = start(binary, work)
                try:
                    rss0 = peak_rss_kib(proc.pid)
                    for case in ("whole", "expect"):
                        r = run_case(port, proc.pid, case)
                        results.setdefault((binary, case), []).append(r)
                    r["rss_rise_mib"] = (peak_rss_kib(proc.pid) - rss0) / 1024
                finally:
                    stop(proc)
    print("N=%d CONNS=%d BODY=%d ROUNDS=%d, medians" % (N, CONNS, BODY, ROUNDS))
    print("| server | case | requests/s | CPU us per request | body MiB sent |"
          " peak RSS rise over both cases, MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for binary, _ in servers:
        for case in ("whole", "expect"):
            rs = results[(binary, case)]
            med = lambda k: statistics.median(r[k] for r in rs)
            rss = "%.1f" % med("rss_rise_mib") if case == "expect" else ""
            print("| %s | %s | %.0f | %.0f | %.0f | %s |" % (
                binary, case, med("rps"), med("cpu_us"), med("sent_mib"), rss))


if __name__ == "__main__":
    main()
