#!/usr/bin/env python3
"""What a long path full of escapes, a long X-Forwarded-Host, or a long
query costs the gateway's policy matching.

Policies match a request's path as sent and, where that does not match, the
paths an upstream may route it by (decoded whole, behind a PHP front
controller); a policy's host, the hosts named in X-Forwarded-Host too.
With CASE=path (the default) this times a request whose path is LENGTH
bytes of `a%2F` repeated (an escape that stays after normalization), under
POLICIES `path` policies none of which matches it; with CASE=host, a
request whose X-Forwarded-Host is LENGTH bytes of `x.example, ` repeated,
under POLICIES `host` policies none of which matches it; with CASE=query, a
POST whose query is LENGTH bytes of `a.b=%2Fx&` repeated (parameters to
decode, with names PHP reads otherwise), under POLICIES policies, half
`path` policies (the paths the query names are read once a request), half
`method: DELETE` (a POST's method override is read in the query, once a
policy), none of which matches it. Each policy looks at every reading. The one route goes to a closed port: every answer is a
502, after matching.

One connection sends N requests one after the other; the time a request is
printed for each binary, binaries alternated ROUNDS times.

Usage: bench/http/long_paths.py SLUICE_BINARY [ANOTHER_SLUICE_BINARY ...]
Variables: CASE (path, host or query), N (300), LENGTH (14000 bytes), POLICIES
(50), ROUNDS (2).
Loopback only; every wait is bounded; it stops only the processes it
started, by PID.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port, admin, policies, length, case):
    def match(i):
        if case == "host" or (case == "query" and i % 2):
            return "{host: api%d.example%s}" % (i, ", method: DELETE" if case == "query" else "")
        return "{path: /login%d}" % i
    rules = "".join(
        "  - name: p%d\n    match: %s\n"
        "    limits: [{algorithm: gcra, rate: 1000000/s}]\n" % (i, match(i))
        for i in range(policies))
    return ("server: {listen: 127.0.0.1:%d, admin: 127.0.0.1:%d, threads: 1,\n"
            "         max_header_bytes: %d}\n"
            "routes: [{name: up, match: {path_prefix: /}, upstream: \"http://127.0.0.1:1\"}]\n"
            "policies:\n%s" % (port, admin, max(16384, 2 * length + 1024), rules))


def wait_port(port, proc, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("sluice exited early")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("sluice did not listen within %d s" % seconds)


def read_answer(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit("connection closed")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        rest += s.recv(65536)
    return head.split(b"\r\n")[0]


def run(binary, n, length, policies, case, workdir):
    port, admin = free_port(), free_port()
    path = os.path.join(workdir, "long_paths.yaml")
    with open(path, "w") as f:
        f.write(config(port, admin, policies, length, case))
    proc = subprocess.Popen([binary, "serve", "--config", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        if case == "host":
            hosts = ", ".join(["x.example"] * (length // 11))
            request = ("GET /x HTTP/1.1\r\nHost: a\r\nX-Forwarded-Host: %s\r\n\r\n"
                       % hosts).encode()
        elif case == "query":
            query = "a.b=%2Fx&" * (length // 9)
            request = ("POST /x?%s HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
                       % query).encode()
        else:
            target = "/" + "a%2F" * (length // 4)
            request = ("GET %s HTTP/1.1\r\nHost: a\r\n\r\n" % target).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            start = time.monotonic()
            for _ in range(n):
                s.sendall(request)
                status = read_answer(s)
            elapsed = time.monotonic() - start
        return status, elapsed / n * 1e6
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    binaries = sys.argv[1:]
    if not binaries:
        raise SystemExit(__doc__)
    n = int(os.environ.get("N", "300"))
    length = int(os.environ.get("LENGTH", "14000"))
    policies = int(os.environ.get("POLICIES", "50"))
    rounds = int(os.environ.get("ROUNDS", "2"))
    case = os.environ.get("CASE", "path")
    if case not in ("path", "host", "query"):
        raise SystemExit("CASE is path, host or query")
    results = {b: [] for b in binaries}
    with tempfile.TemporaryDirectory(prefix="sluice-long-paths-") as workdir:
        for _ in range(rounds):
            for b in binaries:
                status, us = run(b, n, length, policies, case, workdir)
                results[b].append(us)
                print("%s: %s, %.0f us a request" % (b, status.decode(), us), flush=True)
    print("%s of %d bytes, %d policies, %d requests a run" % (case, length, policies, n))
    for b, times in results.items():
        print("%-60s %s us a request" % (b, ", ".join("%.0f" % t for t in times)))


if __name__ == "__main__":
    main()
