#!/usr/bin/env python3
"""Concurrency limits at the issue's scale (docs/concurrency.md): 3
`sluice serve` processes on one Redis in front of one upstream that holds
every request 200 ms and counts the requests it is serving at once; one
key, `concurrency` limit 10; 500 concurrent clients (threads, each on its
own keep-alive connection, spread over the 3 processes) for --seconds.
Prints what the upstream saw at most at once (target: never above 10), the
requests admitted and denied, and the admitted rate against the ceiling
(10 slots / 200 ms = 50 per second).

Then a process is killed (SIGKILL) while it holds all 10 slots with
requests the upstream holds 3 s: the two others deny the key until the
slots' leases end (lease_ttl 4 s here) and admit right after. Prints when.

Then the same 500 clients against one process on the memory store.

Usage: bench/concurrency/fleet.py [--seconds 10] [--clients 500]
Uses the binary in build/release (SLUICE_BINARY to override) and
redis-server from Debian; everything on loopback, stopped by PID at the end.
"""

import argparse
import http.client
import http.server
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
os.environ.setdefault("SLUICE_BINARY", os.path.join(ROOT, "build", "release", "sluice"))
os.environ.setdefault("SLUICE_SOURCE_DIR", ROOT)

from harness import HOST, Sluice, request  # noqa: E402
from redis_harness import RedisServer, redis_store_block, start_fleet  # noqa: E402
from test_concurrency import gateway_config  # noqa: E402

USER = {"X-User": "tenant-1"}  # one key

LIMIT = 10
HOLD = 0.2
TTL = "4s"


class Upstream:
    """The upstream, in a process of its own (the 500 client threads would
    starve it of this one's interpreter): holds each request to /slow `hold`
    seconds and counts, in shared memory, the requests it serves at once and
    those under a path prefix. With `tokens_max`, each answer says it cost
    a random 0..tokens_max (X-Tokens-Used, seeded), and `tokens` sums them."""

    def __init__(self, hold, tokens_max=0, seed=1):
        self.hold = multiprocessing.Value("d", hold)
        self.max = multiprocessing.Value("i", 0)
        self.held = multiprocessing.Value("i", 0)  # requests to /slow/held seen
        self.tokens = multiprocessing.Value("q", 0)
        self.served = multiprocessing.Value("q", 0)
        self.tokens_max = tokens_max
        self.seed = seed
        ready = multiprocessing.Queue()
        self.proc = multiprocessing.Process(target=self._serve, args=(ready,), daemon=True)
        self.proc.start()
        self.url = "http://%s:%d" % (HOST, ready.get(timeout=10))

    def _serve(self, ready):
        lock = threading.Lock()
        now = [0]
        up = self
        rng = random.Random(self.seed)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with lock:
                    now[0] += 1
                    if now[0] > up.max.value:
                        up.max.value = now[0]
                    if self.path.startswith("/slow/held"):
                        up.held.value += 1
                    cost = rng.randint(0, up.tokens_max) if up.tokens_max else None
                    up.served.value += 1
                    if cost is not None:
                        up.tokens.value += cost
                try:
                    if self.path.startswith("/slow"):
                        time.sleep(up.hold.value)
                finally:
                    with lock:
                        now[0] -= 1
                try:
                    self.send_response(200)
                    if cost is not None:
                        self.send_header("X-Tokens-Used", str(cost))
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    self.close_connection = True

        server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        server.daemon_threads = True
        ready.put(server.server_address[1])
        server.serve_forever(poll_interval=0.05)

    @property
    def max_in_flight(self):
        return self.max.value

    def close(self):
        self.proc.kill()
        self.proc.join(5)


def config(upstream, store=""):
    """The integration test's gateway (tests/integration/test_concurrency.py):
    a concurrency limit on /slow, keyed by X-User."""
    return gateway_config(upstream, LIMIT, TTL, store, threads=2, upstream_timeout="3500ms")


def load(ports, clients, seconds, path="/slow", headers=None):
    """`clients` threads, each on a keep-alive connection to one of `ports`,
    GET `path`/N in a loop until `seconds` have passed; (admitted, denied,
    errors)."""
    headers = USER if headers is None else headers
    counts = {"admitted": 0, "denied": 0, "errors": 0}
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client(i):
        conn = http.client.HTTPConnection(HOST, ports[i % len(ports)], timeout=10)
        mine = {"admitted": 0, "denied": 0, "errors": 0}
        start.wait()
        while time.monotonic() < deadline[0]:
            try:
                conn.request("GET", "%s/%d" % (path, i), headers=headers)
                r = conn.getresponse()
                r.read()
                mine["admitted" if r.status == 200 else "denied" if r.status == 429
                     else "errors"] += 1
            except OSError:
                mine["errors"] += 1
                conn.close()
                conn = http.client.HTTPConnection(HOST, ports[i % len(ports)], timeout=10)
        conn.close()
        with lock:
            for k, v in mine.items():
                counts[k] += v

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.monotonic() + seconds
    start.wait()
    for t in threads:
        t.join(seconds + 30)
    return counts


def report(name, up, counts, seconds):
    print("%s: upstream at most %d at once (limit %d); admitted %d (%.1f/s, ceiling %.0f/s), "
          "denied %d, errors %d" % (name, up.max_in_flight, LIMIT, counts["admitted"],
                                    counts["admitted"] / seconds, LIMIT / HOLD, counts["denied"],
                                    counts["errors"]))


def start_one(config_text, directory, name, cleanups):
    """One `sluice serve` on `config_text`, answering /healthz."""
    s = Sluice(config_text, directory, name=name)
    cleanups.append(s.stop)
    s.start()
    while True:
        try:
            if request(s.admin_port, "GET", "/healthz", timeout=2).status == 200:
                return s
        except OSError:
            time.sleep(0.05)


def stopping(body):
    """body(directory, cleanups) in a directory of its own; what body
    started (its cleanups) is stopped at the end, whatever happens."""
    cleanups = []
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
            body(tmp, cleanups)
    finally:
        for c in reversed(cleanups):
            try:
                c()
            except Exception:  # noqa: BLE001 - best effort at the end
                pass


def bench_main(doc, seconds, clients, body):
    """--seconds and --clients, then body(args, directory, cleanups) (stopping)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--clients", type=int, default=clients)
    args = parser.parse_args()
    stopping(lambda tmp, cleanups: body(args, tmp, cleanups))


def fleet(args, tmp, cleanups):
    redis = RedisServer(tmp)
    cleanups.append(redis.kill)
    redis.start()
    up = Upstream(HOLD)
    cleanups.append(up.close)
    processes = start_fleet(lambda f, *a: cleanups.append(lambda: f(*a)),
                            config(up, redis_store_block(url=redis.url, timeout="1s")), 3, tmp)
    counts = load([s.port for s in processes], args.clients, args.seconds)
    report("3 processes, one Redis, %d clients" % args.clients, up, counts, args.seconds)

    # Process 0 takes every slot, then dies holding them.
    up.hold.value = 3.0
    held = []
    for _ in range(LIMIT):
        t = threading.Thread(target=lambda: _quiet(request, processes[0].port, "GET",
                                                   "/slow/held", headers=USER, timeout=10))
        t.start()
        held.append(t)
    while up.held.value < LIMIT:
        time.sleep(0.005)
    killed = time.monotonic()
    processes[0].proc.send_signal(signal.SIGKILL)
    processes[0].proc.wait(5)
    up.hold.value = 0.0
    denied_for = None
    while time.monotonic() < killed + 10:
        if request(processes[1].port, "GET", "/slow/after", headers=USER).status == 200:
            denied_for = time.monotonic() - killed
            break
        time.sleep(0.02)
    print("SIGKILL of a process holding all %d slots: the key denied for %s after the "
          "kill (lease_ttl %s from when they were taken)" % (
              LIMIT, "%.2f s" % denied_for if denied_for else "more than 10 s", TTL))
    for t in held:
        t.join(10)

    up.hold.value = HOLD
    up.max.value = 0
    s = start_one(config(up), tmp, "memory.yaml", cleanups)
    counts = load([s.port], args.clients, args.seconds)
    report("1 process, memory store, %d clients" % args.clients, up, counts, args.seconds)


def _quiet(f, *args, **kwargs):
    try:
        return f(*args, **kwargs)
    except OSError:
        return None


if __name__ == "__main__":
    bench_main(__doc__, 10, 500, fleet)
