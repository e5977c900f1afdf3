#!/usr/bin/env python3
"""What a denied request with a large body costs `sluice serve`.

A route whose policy (one global token bucket, 1 an hour) has already been
spent, so every request is denied; clients POST bodies of BODY bytes to it,
CONNS at a time, one request a connection, N requests in all, two ways:

  whole:  the client sends its header and its whole body at once, then reads
          the answer (what a flood does);
  expect: the client sends its header with "Expect: 100-continue" and sends
          the body only if asked for it (curl does so for bodies over 1 MiB).

Reported for each binary and case: requests a second, sluice's CPU time
(user + system, /proc/PID/stat) per request, the body bytes the clients got
to send, and how much sluice's peak RSS (VmHWM) rose over the run. With
two binaries (A and B) each round runs both, alternately, on the same
machine at the same time of day; the medians of ROUNDS rounds are shown.

Usage: bench/http/denied_bodies.py A_BINARY [B_BINARY]
Variables: N (400 requests a case), CONNS (8), BODY (1048576 bytes),
  ROUNDS (3).
Loopback only; every wait is bounded; it stops only the processes it
started, by PID.
"""

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

N = int(os.environ.get("N", "400"))
CONNS = int(os.environ.get("CONNS", "8"))
BODY = int(os.environ.get("BODY", str(1024 * 1024)))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
HOST = "127.0.0.1"
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def peak_rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int([l for l in f if l.startswith("VmHWM")][0].split()[1])


def read_answer(s, timeout=30):
    """The bytes of the final answer (after any 100 Continue), to the close."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        data += chunk
    return data


def one_request(port, case, body, sent):
    head = b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n" % BODY
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
            s.sendall(head + b"Expect: 100-continue\r\n\r\n")
            first = s.recv(65536)
            if first.startswith(b"HTTP/1.1 100"):
                s.sendall(body)
                sent[0] += BODY
                data = read_answer(s)
            else:
                data = first + read_answer(s)
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
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("sluice did not start; see " + log.name)
            time.sleep(0.05)
    # Spend the bucket (the request goes to an upstream nobody listens on).
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(b"GET /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        read_answer(s, 10)
    return proc, port


def main():
    binaries = sys.argv[1:3]
    if not binaries:
        sys.exit(__doc__)
    results = {}  # (binary, case) -> [result per round]
    with tempfile.TemporaryDirectory(prefix="sluice-denied-bodies-") as work:
        for _ in range(ROUNDS):
            for binary in binaries:
                proc, port = start_sluice(binary, work)
                try:
                    rss0 = peak_rss_kib(proc.pid)
                    for case in ("whole", "expect"):
                        r = run_case(port, proc.pid, case)
                        results.setdefault((binary, case), []).append(r)
                    r["rss_rise_mib"] = (peak_rss_kib(proc.pid) - rss0) / 1024
                finally:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(10)
    print("N=%d CONNS=%d BODY=%d ROUNDS=%d, medians" % (N, CONNS, BODY, ROUNDS))
    print("| binary | case | requests/s | sluice CPU us per request | body MiB sent |"
          " peak RSS rise over both cases, MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for binary in binaries:
        for case in ("whole", "expect"):
            rs = results[(binary, case)]
            med = lambda k: statistics.median(r[k] for r in rs)
            rss = "%.1f" % med("rss_rise_mib") if case == "expect" else ""
            print("| %s | %s | %.0f | %.0f | %.0f | %s |" % (
                binary, case, med("rps"), med("cpu_us"), med("sent_mib"), rss))


if __name__ == "__main__":
    main()
