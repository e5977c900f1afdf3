#!/usr/bin/env python3
"""What a large body through the gateway costs, each way: an upload (one
body of SIZE bytes at a time, POSTed with its Content-Length to a sink that
reads and drops it and answers 200) and a download (a GET the sink answers
with SIZE bytes and their Content-Length, read and dropped by the client),
three ways, one after the other in each round:

  direct: the client to the sink (the floor);
  sluice: through `sluice serve`, a route with max_body_bytes of 1 TiB (an
          upload goes to the sink as it comes: docs/api.md, "Uploads"; a
          download over 1 MiB goes to the client as it comes), 2 threads,
          one token-bucket policy nobody reaches;
  nginx:  through NGINX proxy_pass with proxy_request_buffering off and
          client_max_body_size 0 (uploads streamed the same way; downloads
          through its default proxy buffers), 2 workers, keep-alive to the
          sink.

Reported for each way and each: MiB a second (the medians of ROUNDS), the
proxy's CPU time (user + system of its processes, /proc/PID/stat) per GiB,
and how much its peak RSS (VmHWM, summed over its processes) rose over the
run. The sink and the client are Python threads reading and writing 1 MiB
at a time; all share the machine's cores.

Usage: bench/http/bodies.py [SLUICE_BINARY]   (build/release/sluice)
Variables: SIZE (536870912 bytes), ROUNDS (3), NGINX (the binary, or 0:
  none; default nginx on the PATH).
Loopback only; every wait is bounded; it stops only the processes it
started, by PID.
"""

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from proc_stats import HOST, cpu_seconds, free_port, peak_rss_kib, stop

SIZE = int(os.environ.get("SIZE", str(512 * 1024 * 1024)))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
MiB = 1024 * 1024


class Sink:
    """Reads each request's body (Content-Length) and drops it; answers 200."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind((HOST, 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        room = bytearray(MiB)
        view = memoryview(room)
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                left = length - len(data)
                data = b""
                while left > 0:
                    n = conn.recv_into(view, min(left, MiB))
                    if n == 0:
                        return
                    left -= n
                if head.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % SIZE)
                    part = b"d" * MiB
                    for _ in range(SIZE // MiB):
                        conn.sendall(part)
                    conn.sendall(part[:SIZE % MiB])
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def upload(port):
    """One upload of SIZE bytes; its seconds."""
    part = b"u" * MiB
    start = time.monotonic()
    with socket.create_connection((HOST, port), timeout=60) as s:
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % SIZE)
        for _ in range(SIZE // MiB):
            s.sendall(part)
        s.sendall(part[:SIZE % MiB])
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError("expected a 200, got %r" % data[:100])
    return time.monotonic() - start


def download(port):
    """One download of SIZE bytes; its seconds."""
    room = bytearray(MiB)
    view = memoryview(room)
    start = time.monotonic()
    with socket.create_connection((HOST, port), timeout=60) as s:
        s.sendall(b"GET /download HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("closed before the answer's head")
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError("expected a 200, got %r" % head[:100])
        got = len(rest)
        while got < SIZE:
            n = s.recv_into(view)
            if n == 0:
                raise RuntimeError("the download ended after %d bytes" % got)
            got += n
    return time.monotonic() - start


def wait_port(port, proc, what):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %d" % (what, proc.returncode))
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("%s did not listen on %d" % (what, port))


def start_sluice(binary, work, sink_port):
    port = free_port()
    config = os.path.join(work, "sluice.yaml")
    with open(config, "w") as f:
        f.write("server:\n  listen: %s:%d\n  admin: %s:0\n  threads: 2\n"
                "routes:\n  - {name: up, match: {path_prefix: /}, upstream: http://%s:%d, "
                "max_body_bytes: 1099511627776}\n"
                "policies:\n  - name: uploads\n"
                "    limits: [{algorithm: token_bucket, rate: 1000000/s}]\n"
                % (HOST, port, HOST, HOST, sink_port))
    proc = subprocess.Popen([binary, "serve", "--config", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc, "sluice")
    return proc, port


def start_nginx(binary, work, sink_port):
    port = free_port()
    prefix = os.path.join(work, "nginx")
    os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
    conf = os.path.join(prefix, "nginx.conf")
    with open(conf, "w") as f:
        f.write("worker_processes 2; daemon off; pid %s/nginx.pid; error_log %s/error.log error;\n"
                "events { worker_connections 1024; }\n"
                "http { access_log off;\n"
                "  upstream sink { server %s:%d; keepalive 8; }\n"
                "  server { listen %s:%d; client_max_body_size 0;\n"
                "    location / { proxy_pass http://sink; proxy_http_version 1.1;\n"
                "      proxy_set_header Connection \"\"; proxy_request_buffering off; } } }\n"
                % (prefix, prefix, HOST, sink_port, HOST, port))
    proc = subprocess.Popen([binary, "-c", conf, "-p", prefix, "-e", os.path.join(prefix, "e")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc, "nginx")
    return proc, port


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "build/release/sluice"
    nginx = os.environ.get("NGINX", shutil.which("nginx") or "/usr/sbin/nginx")
    if nginx == "0" or not os.path.exists(nginx):
        nginx = None
    work = tempfile.mkdtemp(prefix="sluice-bodies-")
    sink = Sink()
    procs = {}
    try:
        procs["sluice"] = start_sluice(binary, work, sink.port)
        if nginx:
            procs["nginx"] = start_nginx(nginx, work, sink.port)
        rss0 = {k: peak_rss_kib(p.pid) for k, (p, _) in procs.items()}
        gib = SIZE * ROUNDS / (1024 ** 3)
        print("%d MiB a body, %d rounds; median MiB/s, and the proxy's CPU s per GiB"
              % (SIZE // MiB, ROUNDS))
        for way, transfer in (("upload", upload), ("download", download)):
            seconds = {k: [] for k in ["direct"] + list(procs)}
            cpu = {k: 0.0 for k in procs}
            for _ in range(ROUNDS):
                seconds["direct"].append(transfer(sink.port))
                for k, (p, port) in procs.items():
                    before = cpu_seconds(p.pid)
                    seconds[k].append(transfer(port))
                    cpu[k] += cpu_seconds(p.pid) - before
            direct = SIZE / MiB / statistics.median(seconds["direct"])
            for k, s in seconds.items():
                rate = SIZE / MiB / statistics.median(s)
                line = "%-8s %-7s %8.0f MiB/s  %.2f of direct" % (way, k, rate, rate / direct)
                if k in procs:
                    line += "  %.2f CPU s/GiB" % (cpu[k] / gib)
                print(line)
        for k, (p, _) in procs.items():
            print("%s: peak RSS +%d KiB over the run" % (k, peak_rss_kib(p.pid) - rss0[k]))
    finally:
        for p, _ in procs.values():
            stop(p)
        sink.listener.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
