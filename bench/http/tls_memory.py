#!/usr/bin/env python3
"""What an open TLS connection costs in memory: sluice (server.tls) and
NGINX (`listen ... ssl`, one worker), side by side, with one certificate
made for the run (EC P-256, by the openssl command).

For each server: N TLS connections are opened and their handshakes
finished, then the server's resident memory (VmRSS) is read; then each
connection sends one request and reads its answer, and it is read again.
Printed: KiB a connection (the growth over the server's memory before the
first connection, divided by N), idle after the handshake and after one
request. With PLAIN=1 the same for sluice without TLS, for comparison.

Usage: bench/http/tls_memory.py SLUICE_BINARY [ANOTHER_SLUICE_BINARY ...]
Variables: N (1000), PLAIN (0).
Loopback only; every wait is bounded; it stops only the processes it
started, by PID.
"""

import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

N = int(os.environ.get("N", "1000"))
PLAIN = os.environ.get("PLAIN", "0") == "1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("the server exited: %r" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("nothing listens on port %d" % port)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def make_certificate(work):
    """tls.pem and tls.key in `work`, for 127.0.0.1 (EC P-256, self-signed);
    returns a client context that trusts it."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout",
                    os.path.join(work, "tls.key"), "-out", os.path.join(work, "tls.pem")],
                   check=True, capture_output=True, timeout=30)
    return ssl.create_default_context(cafile=os.path.join(work, "tls.pem"))


def measure(pid, port, ctx, path):
    """KiB a connection: idle after the handshake, after one request."""
    base = rss_kib(pid)
    conns = []
    try:
        for _ in range(N):
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            conns.append(ctx.wrap_socket(raw, server_hostname="127.0.0.1") if ctx else raw)
        time.sleep(0.5)
        idle = rss_kib(pid)
        request = b"GET %s HTTP/1.1\r\nHost: x\r\nX-Key: k\r\n\r\n" % path
        for c in conns:
            c.sendall(request)
        for c in conns:
            if not c.recv(4096).startswith(b"HTTP/1.1 2"):
                sys.exit("an answer that is not 2xx")
        time.sleep(0.5)
        used = rss_kib(pid)
    finally:
        for c in conns:
            c.close()
    return (idle - base) / N, (used - base) / N


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    need = N + 100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    work = tempfile.mkdtemp(prefix="sluice-tls-memory-")
    procs = []
    try:
        ctx = make_certificate(work)
        rows = []
        for binary in sys.argv[1:]:
            for tls in ([True, False] if PLAIN else [True]):
                port, admin = free_port(), free_port()
                config = os.path.join(work, "sluice.yaml")
                with open(config, "w") as f:
                    f.write("server: {listen: 127.0.0.1:%d, admin: 127.0.0.1:%d, threads: 2, "
                            "max_connections: 100000%s}\n" % (
                                port, admin,
                                ", tls: {cert_file: tls.pem, key_file: tls.key}" if tls else ""))
                    f.write("policies:\n  - name: bench\n    key: ['header:X-Key']\n"
                            "    limits: [{algorithm: gcra, rate: 1000000/s, burst: 1000}]\n")
                p = subprocess.Popen([os.path.abspath(binary), "serve", "--config", config], cwd=work,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                procs.append(p)
                wait_port(port, p)
                idle, used = measure(p.pid, port, ctx if tls else None, b"/v1/auth/bench")
                rows.append(("sluice %s%s" % (binary, "" if tls else " (plain)"), idle, used))
                p.terminate()
                p.wait(timeout=15)
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if os.path.exists(nginx):
            port = free_port()
            with open(os.path.join(work, "nginx.conf"), "w") as f:
                f.write("worker_processes 1; daemon off; pid %s/nginx.pid; error_log %s/error.log "
                        "error;\nevents { worker_connections %d; }\nhttp { access_log off;\n"
                        "  server { listen 127.0.0.1:%d ssl; ssl_certificate %s/tls.pem;\n"
                        "    ssl_certificate_key %s/tls.key; ssl_protocols TLSv1.2 TLSv1.3;\n"
                        "    location / { empty_gif; } } }\n" % (
                            work, work, N + 100, port, work, work))
            p = subprocess.Popen([nginx, "-c", os.path.join(work, "nginx.conf"), "-p", work],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            wait_port(port, p)
            worker = None
            deadline = time.monotonic() + 5
            while worker is None and time.monotonic() < deadline:
                out = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True)
                worker = int(out.stdout.split()[0]) if out.stdout.split() else None
                time.sleep(0.05)
            idle, used = measure(worker, port, ctx, b"/")
            rows.append(("nginx (one worker)", idle, used))
        print("%d connections a server; KiB a connection" % N)
        print("%-60s %10s %14s" % ("server", "idle", "after a request"))
        for name, idle, used in rows:
            print("%-60s %10.1f %14.1f" % (name, idle, used))
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
