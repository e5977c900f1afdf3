#!/usr/bin/env python3
"""What an open connection to the gRPC listener costs in memory, over TLS
(grpc.tls, a certificate made for the run: EC P-256, by the openssl
command) and in plaintext, one `sluice serve` each.

N connections are opened, each finishes its handshake (TLS, ALPN h2),
sends HTTP/2's preface and reads gRPC's SETTINGS; then the server's
resident memory (VmRSS) is read. Printed: KiB a connection (the growth
over the server's memory before, divided by N).

Usage: bench/grpc/tls_memory.py SLUICE_BINARY
Variables: N (500).
Loopback only; every wait is bounded; it stops only the processes it
started, by PID.
"""

import os
import re
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "http"))
from tls_memory import make_certificate, rss_kib  # noqa: E402  (bench/http/tls_memory.py)

N = int(os.environ.get("N", "500"))
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def start(binary, work, tls):
    config = os.path.join(work, "sluice.yaml")
    with open(config, "w") as f:
        f.write("server: {listen: 127.0.0.1:0, admin: 127.0.0.1:0, threads: 2}\n"
                "grpc: {listen: 127.0.0.1:0, max_connections: 100000%s}\n"
                "policies:\n  - name: bench\n    limits: [{algorithm: gcra, rate: 1000/s}]\n"
                % (", tls: {cert_file: tls.pem, key_file: tls.key}" if tls else ""))
    log = open(os.path.join(work, "sluice.log"), "w")
    p = subprocess.Popen([binary, "serve", "--config", config], cwd=work,
                         stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and p.poll() is None:
        with open(os.path.join(work, "sluice.log")) as f:
            m = re.search(r"event=start listener=grpc listen=\S*:(\d+)", f.read())
        if m:
            return p, int(m.group(1))
        time.sleep(0.05)
    p.kill()
    sys.exit("no gRPC listener in sluice's start lines")


def measure(pid, port, ctx):
    """KiB a connection that sent its preface and got gRPC's SETTINGS."""
    base = rss_kib(pid)
    conns = []
    try:
        for _ in range(N):
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn = ctx.wrap_socket(raw, server_hostname="127.0.0.1") if ctx else raw
            conns.append(conn)
            conn.sendall(PREFACE)
            if len(conn.recv(4096)) < 9:
                sys.exit("no HTTP/2 frame from gRPC")
        time.sleep(0.5)
        return (rss_kib(pid) - base) / N
    finally:
        for c in conns:
            c.close()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < N + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(N + 100, hard), hard))
    work = tempfile.mkdtemp(prefix="sluice-grpc-tls-memory-")
    try:
        ctx = make_certificate(work)
        ctx.set_alpn_protocols(["h2"])
        print("%d connections; KiB a connection after its preface" % N)
        for tls in (True, False):
            p, port = start(os.path.abspath(sys.argv[1]), work, tls)
            try:
                # The first connections grow what every later one shares.
                warm = []
                for _ in range(20):
                    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
                    warm.append(ctx.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw)
                    warm[-1].sendall(PREFACE)
                    warm[-1].recv(4096)
                print("%-10s %8.1f" % ("tls" if tls else "plaintext",
                                       measure(p.pid, port, ctx if tls else None)))
                for c in warm:
                    c.close()
            finally:
                p.terminate()
                p.wait(timeout=15)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
