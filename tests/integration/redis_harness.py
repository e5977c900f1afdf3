"""Real Redis servers and a real Redis Cluster for the integration tests.

Python standard library only, 127.0.0.1 only:

- RedisConnection: a minimal RESP client (enough for PING, TIME, CLUSTER,
  SCRIPT, MIGRATE, SCAN ...), with a timeout on every socket operation.
- RedisServer: one `redis-server` on a free loopback port, without
  persistence, in a temporary directory; stopped by PID (SIGKILL is fine:
  nothing is saved), and restartable on the same port.
- RedisCluster: 3 masters with 1 replica each, built with
  `redis-cli --cluster create`, ready when every node says cluster_state:ok
  and every replica is attached to its master.
- start_fleet(): several `sluice serve` processes on one config.
- burst(): many concurrent decisions on pre-opened keep-alive connections
  spread over several sluice processes, timed from the first request sent
  to the last answer received.
- Load: background decisions that record every answer and its latency.
- RedisFleetTestCase: a unittest.TestCase whose servers may live for the
  whole class (setUpClass) or for one test.

The servers started here are stopped only by their own PID, and every start
registers its stop with the caller's cleanup (addCleanup / tearDownClass), so
a failing test leaves nothing running.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from harness import (BINARY, HOST, START_TIMEOUT, Sluice, Upstream, metric_value,
                     parse_metrics, request, require_binary, server_block)

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
REDIS_TIMEOUT = 5.0        # every socket operation of the test's own client
REDIS_START_TIMEOUT = 10.0


def require_redis():
    if not REDIS_SERVER or not REDIS_CLI:
        raise unittest.SkipTest("redis-server and redis-cli are needed for the Redis tests")


# ---------------------------------------------------------------------------
# Ports
# ---------------------------------------------------------------------------

def _port_is_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((HOST, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port(cluster_bus=False):
    """A loopback port nobody listens on now (bound to port 0, read back).
    cluster_bus=True: P + 10000 (the Cluster bus) is free too."""
    for _ in range(200):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((HOST, 0))
        port = s.getsockname()[1]
        s.close()
        if not cluster_bus:
            return port
        if port + 10000 <= 65535 and _port_is_free(port + 10000):
            return port
    raise RuntimeError("found no free port (with a free cluster bus port)")


# ---------------------------------------------------------------------------
# RESP client
# ---------------------------------------------------------------------------

class RedisError(Exception):
    """An error reply (-ERR ..., -MOVED ..., ...)."""


class RedisConnection:
    """One connection; call() sends a command and returns the decoded reply
    (str for simple strings, bytes->str for bulk strings, int, list, None)."""

    def __init__(self, port, timeout=REDIS_TIMEOUT, password=None):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""
        if password is not None:
            self.call("AUTH", password)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            data = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self.sock.sendall(b"".join(out))
        reply = self._read()
        if isinstance(reply, RedisError):
            raise reply
        return reply

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode("utf-8", "replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise ConnectionError("unexpected RESP line %r" % line)


def redis_call(port, *args, timeout=REDIS_TIMEOUT, password=None):
    """One command on a fresh connection."""
    with RedisConnection(port, timeout=timeout, password=password) as c:
        return c.call(*args)


def redis_time(port):
    """Redis' clock (TIME) in seconds, as a float."""
    sec, usec = redis_call(port, "TIME")
    return int(sec) + int(usec) / 1e6


def wait_until(predicate, timeout, interval=0.02, what="condition"):
    """Polls predicate() until it returns a true value; returns it, or raises
    AssertionError after `timeout` seconds. Exceptions count as false."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, RedisError, ValueError) as e:
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1fs waiting for %s (last error: %r)" % (
                timeout, what, last_error))
        time.sleep(interval)


# ---------------------------------------------------------------------------
# One redis-server
# ---------------------------------------------------------------------------

class RedisServer:
    """A redis-server on 127.0.0.1 without persistence. start() picks a free
    port the first time and keeps it for restarts."""

    def __init__(self, directory, port=None, cluster=False, extra_args=()):
        require_redis()
        self.dir = directory
        self.port = port
        self.cluster = cluster
        self.extra_args = list(extra_args)
        self.proc = None
        self.password = None
        for i, a in enumerate(self.extra_args[:-1]):
            if a == "--requirepass":
                self.password = self.extra_args[i + 1]
        self.log_path = None

    def _args(self):
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", HOST, "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--logfile",
                os.path.join(self.dir, "redis-%d.log" % self.port)]
        if self.cluster:
            args += ["--cluster-enabled", "yes",
                     "--cluster-config-file", os.path.join(self.dir, "nodes-%d.conf" % self.port),
                     "--cluster-node-timeout", "1000",
                     # A replica's first sync starts at once (Redis 7 waits
                     # 5 s for more replicas to share a diskless transfer).
                     "--repl-diskless-sync-delay", "0"]
        return args + self.extra_args

    def start(self):
        """Starts the server; waits until it answers PING. A first start
        whose port was taken meanwhile retries on another free port."""
        attempts = 1 if self.port is not None else 5
        for attempt in range(attempts):
            if self.port is None or attempt > 0:
                self.port = free_port(cluster_bus=self.cluster)
            self.log_path = os.path.join(self.dir, "redis-%d.log" % self.port)
            self.proc = subprocess.Popen(self._args(), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + REDIS_START_TIMEOUT
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    reply = redis_call(self.port, "PING", timeout=1, password=self.password)
                    if reply == "PONG":
                        return self
                except (OSError, RedisError):
                    pass
                time.sleep(0.02)
            self.kill()
        raise AssertionError("redis-server did not start on port %s; log:\n%s" % (
            self.port, self.log()))

    def log(self):
        try:
            with open(self.log_path) as f:
                return f.read()[-4000:]
        except (OSError, TypeError):
            return ""

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """SIGKILL by PID (nothing to save) and wait. Safe to call twice."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # A stopped process gets SIGKILL all the same.
            self.proc.send_signal(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    stop = kill

    def pause(self):
        """SIGSTOP: the server keeps its connections but answers nothing."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def call(self, *args, timeout=REDIS_TIMEOUT):
        return redis_call(self.port, *args, timeout=timeout, password=self.password)

    @property
    def url(self):
        return "redis://%s:%d" % (HOST, self.port)

    @property
    def address(self):
        return "%s:%d" % (HOST, self.port)


# ---------------------------------------------------------------------------
# A sentinel
# ---------------------------------------------------------------------------

SENTINEL_MASTER = "sluice-master"


class Sentinel(RedisServer):
    """`redis-server CONF --sentinel` on a free port, monitoring
    SENTINEL_MASTER at `master_port` with a quorum of 1 (it may fail over
    on its own); `extra_conf`: more lines of its config file (TLS);
    `password`: the sentinel's own (requirepass)."""

    def __init__(self, directory, master_port, extra_conf=(), password=None):
        super().__init__(directory)
        self.master_port = master_port
        self.extra_conf = list(extra_conf)
        if password is not None:
            self.extra_conf.append("requirepass %s" % password)
            self.password = password

    def _args(self):
        conf = os.path.join(self.dir, "sentinel-%d.conf" % self.port)
        name = SENTINEL_MASTER
        with open(conf, "w") as f:  # the sentinel rewrites it as it learns
            f.write("sentinel monitor %s %s %d 1\n" % (name, HOST, self.master_port))
            f.write("sentinel down-after-milliseconds %s 1000\n" % name)
            f.write("sentinel failover-timeout %s 5000\n" % name)
            f.writelines(line + "\n" for line in self.extra_conf)
        return [REDIS_SERVER, conf, "--sentinel", "--port", str(self.port), "--bind", HOST,
                "--dir", self.dir,
                "--logfile", os.path.join(self.dir, "sentinel-%d.log" % self.port)]

    def master_address(self):
        host, port = self.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER)
        return host, int(port)


# ---------------------------------------------------------------------------
# A Redis Cluster: 3 masters, 1 replica each
# ---------------------------------------------------------------------------

def parse_cluster_nodes(text):
    """CLUSTER NODES -> list of dicts: id, port, flags (set), master_id,
    connected (bool), slots (list of (first, last))."""
    nodes = []
    for line in text.strip().split("\n"):
        parts = line.split()
        if len(parts) < 8:
            continue
        addr = parts[1].split("@")[0]
        slots = []
        for s in parts[8:]:
            if s.startswith("["):
                continue  # a slot being migrated or imported
            first, _, last = s.partition("-")
            slots.append((int(first), int(last or first)))
        nodes.append({
            "id": parts[0],
            "port": int(addr.rsplit(":", 1)[1]) if ":" in addr else 0,
            "flags": set(parts[2].split(",")),
            "master_id": parts[3] if parts[3] != "-" else None,
            "connected": parts[7] == "connected",
            "slots": slots,
        })
    return nodes


class RedisCluster:
    """Six cluster-mode servers joined by `redis-cli --cluster create
    --cluster-replicas 1`: three masters covering the 16384 slots, one
    replica each."""

    def __init__(self, directory, masters=3, replicas=1, make_server=None):
        """make_server(directory): a cluster-mode RedisServer not yet started
        (default: RedisServer(directory, cluster=True))."""
        require_redis()
        self.dir = directory
        make_server = make_server or (lambda d: RedisServer(d, cluster=True))
        self.servers = [make_server(directory) for _ in range(masters * (replicas + 1))]
        self.replicas = replicas

    def start(self):
        try:
            for s in self.servers:
                s.start()
            p = subprocess.run(
                [REDIS_CLI, "--cluster", "create", *[s.address for s in self.servers],
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
            if p.returncode != 0:
                raise AssertionError("redis-cli --cluster create failed (%d):\n%s\n%s" % (
                    p.returncode, p.stdout.decode(errors="replace"),
                    p.stderr.decode(errors="replace")))
            self.wait_healthy(30)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        for s in self.servers:
            s.kill()

    def live(self):
        return [s for s in self.servers if s.alive()]

    def server_on(self, port):
        for s in self.servers:
            if s.port == port:
                return s
        raise KeyError(port)

    def nodes(self, via=None):
        """CLUSTER NODES as seen by one live node."""
        via = via or self.live()[0]
        return parse_cluster_nodes(via.call("CLUSTER", "NODES"))

    def masters(self):
        """Masters that serve slots and are not marked failed:
        [(port, [(first, last)])]."""
        return [(n["port"], n["slots"]) for n in self.nodes()
                if "master" in n["flags"] and n["slots"] and "fail" not in n["flags"]]

    def master_of_slot(self, slot):
        for port, ranges in self.masters():
            if any(a <= slot <= b for a, b in ranges):
                return port
        return None

    def replica_of(self, master_port):
        nodes = self.nodes()
        master_id = next(n["id"] for n in nodes if n["port"] == master_port)
        for n in nodes:
            if n["master_id"] == master_id and "fail" not in n["flags"]:
                return n["port"]
        return None

    def keyslot(self, key):
        return self.live()[0].call("CLUSTER", "KEYSLOT", key)

    def _healthy(self):
        live = self.live()
        for s in live:
            info = s.call("CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                return False
        nodes = self.nodes(live[0])
        masters = [n for n in nodes if "master" in n["flags"] and n["slots"]
                   and "fail" not in n["flags"]]
        if sum(b - a + 1 for m in masters for a, b in m["slots"]) != 16384:
            return False
        # Every live replica has finished its sync with its master.
        for s in live:
            role = s.call("ROLE")
            if role[0] == "slave" and role[3] != "connected":
                return False
        # Every master has as many replicas as live servers allow.
        if self.replicas and len(live) == len(self.servers):
            for m in masters:
                if not any(n["master_id"] == m["id"] for n in nodes):
                    return False
        # All live nodes agree on who serves what.
        views = set()
        for s in live:
            view = tuple(sorted((n["port"], tuple(n["slots"]))
                                for n in self.nodes(s) if "master" in n["flags"] and n["slots"]
                                and "fail" not in n["flags"]))
            views.add(view)
        return len(views) == 1

    def wait_healthy(self, timeout):
        """Waits until cluster_state:ok everywhere, replicas attached and
        all live nodes agree on the slot map."""
        wait_until(self._healthy, timeout, interval=0.1, what="a healthy Redis Cluster")

    @property
    def seeds(self):
        return [s.address for s in self.live()]


# ---------------------------------------------------------------------------
# sluice fleets
# ---------------------------------------------------------------------------

def redis_store_block(url=None, cluster=None, timeout="50ms", connect_timeout="1s",
                      key_prefix=None, password=None, window_state=None):
    """The `store:` section for one Redis (url) or a Cluster (list of
    host:port); `window_state`: store.redis.window_state, or the default."""
    lines = ["store:", "  redis:"]
    if url is not None:
        lines.append("    url: %s" % url)
    if cluster is not None:
        lines.append("    cluster: [%s]" % ", ".join(cluster))
    if password is not None:
        lines.append("    password: %s" % json.dumps(password))
    lines.append("    timeout: %s" % timeout)
    lines.append("    connect_timeout: %s" % connect_timeout)
    if key_prefix is not None:
        lines.append("    key_prefix: %s" % json.dumps(key_prefix))
    if window_state is not None:
        lines.append("    window_state: %s" % window_state)
    return "\n".join(lines) + "\n"


# A fleet-wide limit of 5 a minute that fails closed: each 200 is a decision
# Redis made (test_redis_tls, test_redis_sentinel, test_redis_unix). A
# bucket, not a window: six checks in a row admit five whenever they come
# (a window's boundary between them would admit six).
FIVE_A_MINUTE = """\
policies:
  - name: fleet
    on_store_error: deny
    limits:
      - {algorithm: token_bucket, rate: 5/m, burst: 5, scope: global}
"""


def fleet_statuses(sluice, key, times):
    """`times` checks of `key` on FIVE_A_MINUTE's policy -> their statuses."""
    return [request(sluice.port, "POST", "/v1/check", body={"policy": "fleet", "key": key},
                    headers={"Content-Type": "application/json"}).status
            for _ in range(times)]


def redis_status(s):
    """store.redis of GET /v1/status on the admin listener."""
    return request(s.admin_port, "GET", "/v1/status", timeout=2).json()["store"]["redis"]


def serve_until_exit(test, directory, config_text, quickly=4.0):
    """Runs `sluice serve` on config_text in `directory`: it must exit by
    itself, non-zero, within `quickly` seconds (default: start-up, a 1 s
    connect timeout and the exit, on a loaded machine), before it served
    anything.
    -> (exit code, stderr, seconds it ran)."""
    path = os.path.join(directory, "config.yaml")
    with open(path, "w") as f:
        f.write(config_text)
    start = time.monotonic()
    try:
        p = subprocess.run([BINARY, "serve", "--config", path], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=15, cwd=directory)
    except subprocess.TimeoutExpired as e:
        test.fail("sluice kept running with a bad store; stderr:\n%s" % (
            (e.stderr or b"").decode(errors="replace")))
    took = time.monotonic() - start
    err = p.stderr.decode("utf-8", "replace")
    test.assertNotEqual(p.returncode, 0, err)
    test.assertLess(took, quickly, err)
    test.assertNotIn("event=start", err)
    return p.returncode, err, took


def start_fleet(add_cleanup, config_text, count, directory):
    """Starts `count` sluice processes on the same config, each on its own
    free ports, and waits until every one answers /healthz. Each stop is
    registered with `add_cleanup` (a test's addCleanup or a class's
    addClassCleanup) before the process starts."""
    fleet = []
    for i in range(count):
        s = Sluice(config_text, directory, name="sluice-%d.yaml" % i)
        add_cleanup(_stop_and_report, s)
        s.start()
        fleet.append(s)
    for s in fleet:
        wait_until(lambda: request(s.admin_port, "GET", "/healthz", timeout=2).status == 200,
                   START_TIMEOUT, what="/healthz of sluice")
    return fleet


def _stop_and_report(s):
    code = s.stop()
    if code not in (0, None) and code != -signal.SIGKILL:
        sys.stderr.write("sluice exited with %r; output:\n%s\n" % (code, s.output()))


def readyz(s):
    """(status, body) of GET /readyz on the admin listener."""
    r = request(s.admin_port, "GET", "/readyz", timeout=2)
    return r.status, r.body.decode("utf-8", "replace")


# ---------------------------------------------------------------------------
# Concurrent decisions
# ---------------------------------------------------------------------------

class HttpClient:
    """One keep-alive connection speaking just enough HTTP/1.1 for
    POST /v1/check, with a timeout on every socket operation."""

    def __init__(self, port, timeout=5.0):
        self.port = port
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
        self.sock.close()

    @staticmethod
    def check_request(policy, key):
        body = json.dumps({"policy": policy, "key": key}).encode()
        return (b"POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def send(self, data):
        self.sock.sendall(data)

    def read_response(self):
        """-> (status, {lower-case header: value}, body bytes)."""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("sluice closed the connection")
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("sluice closed the connection mid-body")
            rest += chunk
        self.buf = rest[length:]
        return status, headers, rest[:length]

    def check(self, policy, key):
        """One decision: (status, headers, parsed JSON body, seconds taken)."""
        start = time.monotonic()
        self.send(self.check_request(policy, key))
        status, headers, body = self.read_response()
        return status, headers, json.loads(body), time.monotonic() - start


class BurstResult:
    def __init__(self):
        self.statuses = []     # per request
        self.bodies = []
        self.errors = []
        self.first_sent = None
        self.last_received = None
        self.allowed_by_port = {}   # sluice port -> requests it allowed

    @property
    def elapsed(self):
        return self.last_received - self.first_sent

    @property
    def allowed(self):
        return sum(1 for b in self.bodies if b.get("allowed") is True)

    def count(self, status):
        return sum(1 for s in self.statuses if s == status)


def burst(fleet, policy, key, total, connections_per_process=16, depth=4):
    """Sends `total` decisions for one key, spread evenly over the sluice
    processes of `fleet`, from one thread per connection, all connections
    opened beforehand and released together by a barrier.

    Each connection keeps up to `depth` requests in flight (HTTP/1.1
    pipelining), so that the whole burst fits in a short time even on a
    busy machine. Answers come back in order on each connection."""
    conns = []
    for s in fleet:
        for _ in range(connections_per_process):
            conns.append(HttpClient(s.port))
    per_conn = [total // len(conns)] * len(conns)
    for i in range(total % len(conns)):
        per_conn[i] += 1
    payload = HttpClient.check_request(policy, key)
    result = BurstResult()
    lock = threading.Lock()
    barrier = threading.Barrier(len(conns))

    def run(conn, n):
        statuses, bodies = [], []
        try:
            barrier.wait(10)
            sent = received = 0
            t0 = time.monotonic()
            first = min(depth, n)
            conn.send(payload * first)
            sent = first
            while received < n:
                status, _, body = conn.read_response()
                received += 1
                statuses.append(status)
                bodies.append(json.loads(body))
                if sent < n:
                    conn.send(payload)
                    sent += 1
            t1 = time.monotonic()
            with lock:
                result.first_sent = t0 if result.first_sent is None else min(result.first_sent, t0)
                result.last_received = t1 if result.last_received is None else \
                    max(result.last_received, t1)
        except Exception as e:  # reported by the caller's assertions
            with lock:
                result.errors.append(repr(e))
        finally:
            with lock:
                result.statuses.extend(statuses)
                result.bodies.extend(bodies)
                result.allowed_by_port[conn.port] = result.allowed_by_port.get(conn.port, 0) + \
                    sum(1 for b in bodies if b.get("allowed") is True)
            conn.close()

    threads = [threading.Thread(target=run, args=(c, n), daemon=True)
               for c, n in zip(conns, per_conn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if any(t.is_alive() for t in threads):
        result.errors.append("a client thread did not finish within 60 s")
    return result


# ---------------------------------------------------------------------------
# Test case support
# ---------------------------------------------------------------------------

def fleet_metric(fleet, name, **labels):
    """The sum of a metric over the sluice processes of a fleet."""
    total = 0.0
    for s in fleet:
        r = request(s.admin_port, "GET", "/metrics", timeout=5)
        if r.status != 200:
            raise AssertionError("GET /metrics answered %r" % r)
        total += metric_value(parse_metrics(r.body.decode()), name, **labels)
    return total


def key_state(s, policy, key):
    """GET /v1/keys/{policy}/{key}: the list of per-limit states."""
    r = request(s.admin_port, "GET", "/v1/keys/%s/%s" % (policy, key), timeout=5)
    if r.status != 200:
        raise AssertionError("GET /v1/keys/%s/%s answered %r" % (policy, key, r))
    return r.json()["limits"]


def wait_clear_of_window_boundary(redis_port, period=60.0, margin=3.0):
    """Windows start at multiples of their period on Redis' clock. When less
    than `margin` seconds are left in the current window, waits for the next
    one, so that a short burst cannot straddle a boundary. Returns the
    seconds waited."""
    now = redis_time(redis_port)
    left = period - (now % period)
    if left >= margin:
        return 0.0
    time.sleep(left + 0.05)
    return left + 0.05


class RedisFleetTestCase(unittest.TestCase):
    """Base for tests that share servers over a whole class: a class-level
    temporary directory, and helpers that register every stop with the
    class cleanup, so nothing outlives the class even when setUpClass
    fails half-way."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        require_binary()
        require_redis()
        tmp = tempfile.TemporaryDirectory(prefix="sluice-redis-")
        cls.addClassCleanup(tmp.cleanup)
        cls.class_dir = tmp.name

    @classmethod
    def start_class_redis(cls, *extra_args):
        r = RedisServer(cls.class_dir, extra_args=extra_args)
        cls.addClassCleanup(r.kill)
        return r.start()

    @classmethod
    def start_class_cluster(cls):
        c = RedisCluster(cls.class_dir)
        cls.addClassCleanup(c.stop)
        return c.start()

    @classmethod
    def start_class_fleet(cls, config_text, count):
        return start_fleet(cls.addClassCleanup, config_text, count, cls.class_dir)

    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory(prefix="sluice-redis-")
        self.addCleanup(tmp.cleanup)
        self.tmpdir = tmp.name

    def start_redis(self, *extra_args):
        r = RedisServer(self.tmpdir, extra_args=extra_args)
        self.addCleanup(r.kill)
        return r.start()

    def start_fleet(self, config_text, count):
        return start_fleet(self.addCleanup, config_text, count, self.tmpdir)

    def start_gateway(self, policies, **server):
        """A Redis of its own, an upstream, and one sluice (server_block's
        `server` settings) whose `policies` text is in that Redis and whose
        one route sends every path to the upstream. Returns (sluice,
        upstream, redis)."""
        redis = self.start_redis()
        upstream = Upstream()
        self.addCleanup(upstream.close)
        config = (server_block(threads=2, **server)
                  + redis_store_block(url=redis.url, timeout="1s")
                  + policies + "routes:\n  - name: app\n    match: {path_prefix: /}\n"
                  "    upstream: http://127.0.0.1:%d\n" % upstream.port)
        return self.start_fleet(config, 1)[0], upstream, redis

    @staticmethod
    def unique_key(name):
        return "%s-%d" % (name, time.time_ns())


class Load:
    """Background decisions: `threads` threads, each on its own keep-alive
    connection to one of the sluice processes, deciding (policy, a key of
    its own) in a loop until stop(). Records every answer's status and
    latency, and any failure (a refused or dropped connection, a stall past
    the socket timeout, an unexpected status)."""

    def __init__(self, fleet, policy, threads=4, pause=0.002):
        self.fleet = fleet
        self.policy = policy
        self.pause = pause
        self.lock = threading.Lock()
        self.samples = []     # (monotonic time, status, seconds)
        self.failures = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]

    def start(self):
        for t in self._threads:
            t.start()
        return self

    def _run(self, i):
        s = self.fleet[i % len(self.fleet)]
        key = "load-%d-%d" % (i, time.time_ns())
        try:
            client = HttpClient(s.port, timeout=5)
        except OSError as e:
            with self.lock:
                self.failures.append(repr(e))
            return
        try:
            while not self._stop.is_set():
                status, _, _, took = client.check(self.policy, key)
                with self.lock:
                    self.samples.append((time.monotonic(), status, took))
                    if status not in (200, 429):
                        self.failures.append("status %d" % status)
                time.sleep(self.pause)
        except Exception as e:
            with self.lock:
                self.failures.append(repr(e))
        finally:
            client.close()

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(10)
        return self

    def between(self, start, end):
        with self.lock:
            return [x for x in self.samples if start <= x[0] <= end]
